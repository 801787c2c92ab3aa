//! Authentication, engine TLS, gateway TLS and signing-key rotation of the
//! `instance` and `engine` plugins on the local control plane, with
//! cert-manager's real CRDs (from its Go module, see
//! `tests/cluster/build.sh`). No cert-manager controller runs: the test
//! plays issuer ([`Issuer`]), filling every empty `kubernetes.io/tls`
//! Secret the plugins create for their Certificates with a real
//! certificate generated here with `openssl`. Nothing talks to a Pod.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, Resource};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use wasmop_tests::operator::{RunningOperator, load_plugin};
use wasmop_tests::status::{condition, reason_is};
use wasmop_tests::{TestNamespace, apply_project_crds, wait_for};

/// Rollouts of several generations go through the scheduler, kwok and the
/// controller-manager.
const DEADLINE: Duration = Duration::from_secs(240);
/// Rate of the issuer and of the samplers (not a synchronisation: tests
/// wait on conditions).
const TICK: Duration = Duration::from_millis(100);

fn api(ns: &TestNamespace, group: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(group, "v1alpha1", kind);
    let gvk = if group == "cert-manager.io" {
        GroupVersionKind::gvk(group, "v1", kind)
    } else {
        gvk
    };
    let ar = ApiResource::from_gvk_with_plural(&gvk, plural);
    Api::namespaced_with(ns.client.clone(), &ns.name, &ar)
}

fn instances(ns: &TestNamespace) -> Api<DynamicObject> {
    api(
        ns,
        "compute.firebolt.io",
        "FireboltInstance",
        "fireboltinstances",
    )
}

fn engines(ns: &TestNamespace) -> Api<DynamicObject> {
    api(
        ns,
        "compute.firebolt.io",
        "FireboltEngine",
        "fireboltengines",
    )
}

fn certificates(ns: &TestNamespace) -> Api<DynamicObject> {
    api(ns, "cert-manager.io", "Certificate", "certificates")
}

fn object(kind: &str, name: &str, spec: Value) -> Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "compute.firebolt.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    }))?)
}

async fn start(ns: &TestNamespace, with_engines: bool) -> Result<RunningOperator> {
    apply_project_crds(&ns.client).await?;
    let mut plugins = vec![load_plugin("instance", json!({}))?];
    if with_engines {
        plugins.push(load_plugin("engine", json!({}))?);
    }
    RunningOperator::start(ns.client.clone(), vec![ns.name.clone()], plugins).await
}
/// Waits until `check` accepts instance `fb`; returns it.
async fn wait_instance(
    ns: &TestNamespace,
    what: &str,
    check: impl Fn(&DynamicObject) -> bool,
) -> Result<DynamicObject> {
    let api = instances(ns);
    let check = &check;
    wait_for(what, DEADLINE, || {
        let api = api.clone();
        async move {
            let fb = api.get("fb").await?;
            if check(&fb) {
                Ok(Some(fb))
            } else {
                bail!("status: {}", fb.data["status"])
            }
        }
    })
    .await
}
/// A CA and a leaf certificate it signed, made with `openssl`.
struct Pki {
    ca: Vec<u8>,
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl Pki {
    fn generate(tag: &str) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("wasmop-pki-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let run = |args: &[&str]| -> Result<()> {
            let out = std::process::Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .output()
                .context("openssl is required (see README prerequisites)")?;
            ensure!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            Ok(())
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-384",
            "-nodes",
        ];
        run(&[
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-subj",
                "/CN=wasmop-test-ca",
                "-days",
                "1",
            ],
        ]
        .concat())?;
        run(&[
            &["req"][..],
            &ec,
            &[
                "-keyout",
                "leaf.key",
                "-out",
                "leaf.csr",
                "-subj",
                "/CN=wasmop-test",
            ],
        ]
        .concat())?;
        run(&[
            "x509",
            "-req",
            "-in",
            "leaf.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "leaf.crt",
            "-days",
            "1",
        ])?;
        let read = |f: &str| std::fs::read(dir.join(f)).with_context(|| f.to_owned());
        let pki = Pki {
            ca: read("ca.crt")?,
            cert: read("leaf.crt")?,
            key: read("leaf.key")?,
        };
        let _ = std::fs::remove_dir_all(PathBuf::from(&dir));
        Ok(pki)
    }
}

/// Plays cert-manager's issuing controller: every empty
/// `kubernetes.io/tls` Secret in the namespace (those the plugins create
/// for their Certificates) gets the certificate, key and CA.
///
/// Like a real controller it outlives a failed request: a list or patch
/// that fails (the API server slow under load, a Secret deleted between
/// the list and its patch by a rotation that retired its key) is retried
/// on the next pass. A task that ended on the first error left every later
/// Secret empty, and the test waiting on a rotation that could not go on.
struct Issuer {
    stop: Arc<AtomicBool>,
    task: JoinHandle<Result<usize>>,
}

impl Issuer {
    fn start(client: Client, namespace: &str, pki: &Pki) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let secrets: Api<Secret> = Api::namespaced(client, namespace);
        let data = json!({"data": {
            "tls.crt": STANDARD.encode(&pki.cert),
            "tls.key": STANDARD.encode(&pki.key),
            "ca.crt": STANDARD.encode(&pki.ca),
        }});
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut issued = 0;
            while !flag.load(Ordering::SeqCst) {
                match issue_empty(&secrets, &data).await {
                    Ok(n) => issued += n,
                    Err(e) => eprintln!("issuer: {e:#} (retried on the next pass)"),
                }
                // The controller's resync rate, not a synchronisation.
                tokio::time::sleep(TICK).await;
            }
            Ok(issued)
        });
        Issuer { stop, task }
    }

    async fn finish(self) -> Result<usize> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await?
    }
}

/// One pass of [`Issuer`]: fills every empty TLS Secret listed; a Secret
/// gone by the time of its patch has nothing left to issue.
async fn issue_empty(secrets: &Api<Secret>, data: &Value) -> Result<usize> {
    let mut issued = 0;
    for s in secrets.list(&ListParams::default()).await?.items {
        let empty = s
            .data
            .as_ref()
            .and_then(|d| d.get("tls.crt"))
            .is_none_or(|v| v.0.is_empty());
        if s.type_.as_deref() == Some("kubernetes.io/tls") && empty {
            let name = s.metadata.name.clone().unwrap_or_default();
            match secrets
                .patch(&name, &PatchParams::default(), &Patch::Merge(data))
                .await
            {
                Ok(_) => issued += 1,
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e).with_context(|| format!("issuing Secret {name}")),
            }
        }
    }
    Ok(issued)
}

fn auth_spec(rotation: bool) -> Value {
    let mut keys = json!({"certManager": {"issuerRef": {"name": "internal-ca"}}});
    if rotation {
        keys["rotationInterval"] = json!("2s");
        keys["retainDuration"] = json!("2s");
    }
    // A retain window must cover maxTokenAge; the test's windows are short.
    json!({"enabled": true, "local": {
        "admin": {"password": {"name": "firebolt-admin", "key": "password"}},
        "maxTokenAge": "1s",
        "signingKeys": keys}})
}

async fn create_admin_secret(ns: &TestNamespace) -> Result<()> {
    let secrets: Api<Secret> = ns.api();
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "firebolt-admin"},
                "stringData": {"password": "not-a-real-password"},
            }))?,
        )
        .await?;
    Ok(())
}

#[tokio::test]
async fn a_failed_admin_password_preflight_leaves_metadata_and_the_gateway_up() -> Result<()> {
    let ns = TestNamespace::new("sec-preflight").await?;
    let _op = start(&ns, false).await?;
    let pki = Pki::generate("preflight")?;
    let issuer = Issuer::start(ns.client.clone(), &ns.name, &pki);
    instances(&ns)
        .create(
            &PostParams::default(),
            &object(
                "FireboltInstance",
                "fb",
                json!({"metadata": {}, "gateway": {"replicas": 1}, "auth": auth_spec(false)}),
            )?,
        )
        .await?;

    let fb = wait_instance(&ns, "Ready with AuthReady=False/preflight", |fb| {
        reason_is(fb, "Ready", "True", "AllComponentsReady")
            && reason_is(
                fb,
                "AuthReady",
                "False",
                "AdminPasswordSecretPreflightFailed",
            )
    })
    .await?;
    let status = &fb.data["status"];
    assert_eq!(status["phase"], "Ready");
    assert_eq!(status["metadataReady"], true);
    assert_eq!(status["gatewayReady"], true);
    assert!(status["gatewayEndpoint"].is_string());
    assert!(status["auth"].is_null() || status["auth"]["authHash"].is_null());
    assert!(
        certificates(&ns)
            .get_opt("fb-auth-signing-1")
            .await?
            .is_none(),
        "a failed auth step writes nothing"
    );

    // The Secret appears: the key is minted through cert-manager and, once
    // issued, auth is provisioned.
    create_admin_secret(&ns).await?;
    let fb = wait_instance(&ns, "AuthReady=True/Provisioned", |fb| {
        reason_is(fb, "AuthReady", "True", "Provisioned")
    })
    .await?;
    let cert = certificates(&ns).get("fb-auth-signing-1").await?;
    assert_eq!(cert.data["spec"]["secretName"], "fb-auth-signing-1");
    assert_eq!(cert.data["spec"]["privateKey"]["rotationPolicy"], "Never");
    assert_eq!(fb.data["status"]["auth"]["signingKeys"][0]["issued"], true);
    assert!(fb.data["status"]["auth"]["authHash"].is_string());
    assert!(issuer.finish().await? >= 1);
    Ok(())
}

fn engine_spec(class: Option<&str>) -> Value {
    let mut spec = json!({
        "instanceRef": "fb",
        "replicas": 1,
        "drainCheckEnabled": false,
        "template": {"spec": {"containers": [
            {"name": "engine", "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}},
        ]}},
    });
    if let Some(c) = class {
        spec["engineClassRef"] = json!(c);
    }
    spec
}

/// Waits until engine `name` is stable and Ready; returns it.
async fn wait_engine(
    ns: &TestNamespace,
    name: &str,
    check: impl Fn(&DynamicObject) -> bool,
) -> Result<DynamicObject> {
    let api = engines(ns);
    let check = &check;
    wait_for(&format!("engine {name}"), DEADLINE, || {
        let api = api.clone();
        async move {
            let e = api.get(name).await?;
            let ok = e.data["status"]["phase"] == "stable"
                && condition(&e, "Ready")["status"] == "True"
                && check(&e);
            if ok {
                Ok(Some(e))
            } else {
                bail!("status: {}", e.data["status"])
            }
        }
    })
    .await
}

/// One sample of the engine fleet against the gateway's upstream protocol.
#[derive(Debug)]
struct FleetSample {
    /// The gateway config re-encrypts to engines.
    upstream_tls: bool,
    /// `observedEngineTLSHash` of every engine, read after the config.
    hashes: Vec<String>,
}

struct FleetSampler {
    stop: Arc<AtomicBool>,
    task: JoinHandle<Result<Vec<FleetSample>>>,
}

impl FleetSampler {
    fn start(ns: &TestNamespace) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let configs: Api<ConfigMap> = Api::namespaced(ns.client.clone(), &ns.name);
        let engines = engines(ns);
        let task = tokio::spawn(async move {
            let mut samples = Vec::new();
            while !flag.load(Ordering::SeqCst) {
                let envoy = configs
                    .get("fb-gateway-config")
                    .await?
                    .data
                    .unwrap_or_default()
                    .remove("envoy.json")
                    .unwrap_or_default();
                let config: Value = serde_json::from_str(&envoy)?;
                let upstream_tls =
                    !config["static_resources"]["clusters"][0]["transport_socket"].is_null();
                let hashes = engines
                    .list(&ListParams::default())
                    .await?
                    .items
                    .iter()
                    .map(|e| {
                        e.data["status"]["observedEngineTLSHash"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned()
                    })
                    .collect();
                samples.push(FleetSample {
                    upstream_tls,
                    hashes,
                });
                tokio::time::sleep(TICK).await;
            }
            Ok(samples)
        });
        FleetSampler { stop, task }
    }

    async fn finish(self) -> Result<Vec<FleetSample>> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await?
    }
}

#[tokio::test]
async fn engine_tls_on_a_running_fleet_re_encrypts_only_after_every_engine_converged() -> Result<()>
{
    let ns = TestNamespace::new("sec-etls").await?;
    let _op = start(&ns, true).await?;
    let pki = Pki::generate("etls")?;
    let issuer = Issuer::start(ns.client.clone(), &ns.name, &pki);
    instances(&ns)
        .create(
            &PostParams::default(),
            &object(
                "FireboltInstance",
                "fb",
                json!({"metadata": {}, "gateway": {"replicas": 1}}),
            )?,
        )
        .await?;
    for e in ["a", "b"] {
        engines(&ns)
            .create(
                &PostParams::default(),
                &object("FireboltEngine", e, engine_spec(None))?,
            )
            .await?;
    }
    for e in ["a", "b"] {
        wait_engine(&ns, e, |_| true).await?;
    }

    // Enable engine TLS on the running fleet.
    let sampler = FleetSampler::start(&ns);
    instances(&ns)
        .patch(
            "fb",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"tls": {"engine": {"enabled": true,
                "certManager": {"issuerRef": {"name": "internal-ca"}}}}}})),
        )
        .await?;
    let fb = wait_instance(&ns, "EngineTLSReady=True/Ready", |fb| {
        reason_is(fb, "EngineTLSReady", "True", "Ready")
    })
    .await?;
    let tls_hash = fb.data["status"]["engineTLS"]["tlsHash"]
        .as_str()
        .context("tlsHash")?
        .to_owned();
    assert_eq!(fb.data["status"]["engineTLS"]["reencrypting"], true);
    for e in ["a", "b"] {
        let engine = wait_engine(&ns, e, |_| true).await?;
        assert_eq!(
            engine.data["status"]["observedEngineTLSHash"],
            tls_hash.as_str()
        );
        let g = engine.data["status"]["activeGeneration"]
            .as_i64()
            .context("gen")?;
        let cert = certificates(&ns)
            .get(&format!("{e}-g{g}-engine-tls"))
            .await?;
        assert_eq!(cert.data["spec"]["issuerRef"]["name"], "internal-ca");
    }
    // The gateway trusts the CA once it has rolled.
    let ca_rolled = wait_instance(&ns, "rolledEngineTrustCAs", |fb| {
        fb.data["status"]["rolledEngineTrustCAs"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
    })
    .await?;
    assert_eq!(
        ca_rolled.data["status"]["rolledEngineTrustCAs"]
            .as_array()
            .map(Vec::len),
        Some(1),
        "one CA issued every certificate"
    );
    let samples = sampler.finish().await?;
    assert!(
        samples.iter().any(|s| !s.upstream_tls),
        "sampled before the switch"
    );
    assert!(
        samples.iter().any(|s| s.upstream_tls),
        "sampled after the switch"
    );
    for s in samples.iter().filter(|s| s.upstream_tls) {
        assert!(
            s.hashes.iter().all(|h| *h == tls_hash),
            "the gateway re-encrypted while an engine served plaintext: {s:?}"
        );
    }

    // Disable: symmetric.
    let sampler = FleetSampler::start(&ns);
    instances(&ns)
        .patch(
            "fb",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"tls": {"engine": {"enabled": false}}}})),
        )
        .await?;
    wait_instance(&ns, "EngineTLSReady=True/Disabled, engineTLS gone", |fb| {
        reason_is(fb, "EngineTLSReady", "True", "Disabled")
            && fb.data["status"]["engineTLS"].is_null()
    })
    .await?;
    let samples = sampler.finish().await?;
    assert!(samples.iter().any(|s| s.upstream_tls));
    assert!(samples.iter().any(|s| !s.upstream_tls));
    for s in samples.iter().filter(|s| !s.upstream_tls) {
        assert!(
            s.hashes.iter().all(String::is_empty),
            "the gateway stopped re-encrypting while an engine served TLS: {s:?}"
        );
    }
    wait_for("the anchor Certificate deleted", DEADLINE, || {
        let certs = certificates(&ns);
        async move {
            Ok(certs
                .get_opt("fb-engine-tls")
                .await?
                .is_none()
                .then_some(()))
        }
    })
    .await?;
    issuer.finish().await?;
    Ok(())
}

/// Gateway pods by what their client listener serves (pods being deleted
/// left out).
async fn gateway_listeners(pods: &Api<Pod>) -> Result<Vec<String>> {
    let lp = ListParams::default().labels("firebolt.io/instance=fb,firebolt.io/component=gateway");
    Ok(pods
        .list(&lp)
        .await?
        .items
        .iter()
        .filter(|p| p.meta().deletion_timestamp.is_none())
        .map(|p| {
            p.meta()
                .annotations
                .as_ref()
                .and_then(|a| a.get("firebolt.io/client-listener"))
                .cloned()
                .unwrap_or_else(|| "plaintext".to_owned())
        })
        .collect())
}

/// Whether the instance advertised gateway TLS, then the listeners of the
/// gateway pods.
type GatewaySample = (bool, Vec<String>);

#[tokio::test]
async fn tightening_gateway_tls_never_serves_fail_open() -> Result<()> {
    let ns = TestNamespace::new("sec-gtls").await?;
    let _op = start(&ns, false).await?;
    let pki = Pki::generate("gtls")?;
    let issuer = Issuer::start(ns.client.clone(), &ns.name, &pki);
    instances(&ns)
        .create(
            &PostParams::default(),
            &object(
                "FireboltInstance",
                "fb",
                json!({"metadata": {}, "gateway": {"replicas": 2}}),
            )?,
        )
        .await?;
    let pods: Api<Pod> = ns.api();
    wait_instance(&ns, "Ready", |fb| {
        reason_is(fb, "Ready", "True", "AllComponentsReady")
    })
    .await?;
    let pods_ref = &pods;
    wait_for("two plaintext gateway pods", DEADLINE, || async move {
        let l = gateway_listeners(pods_ref).await?;
        Ok((l.len() == 2 && l.iter().all(|x| x == "plaintext")).then_some(()))
    })
    .await?;

    // Every listener any gateway pod ever had, from a watch: a transient
    // state cannot fall between two samples.
    let ever: Arc<std::sync::Mutex<BTreeSet<String>>> = Arc::default();
    let watching = {
        use futures::StreamExt;
        use kube::runtime::{WatchStreamExt, watcher};
        let ever = ever.clone();
        let cfg = watcher::Config::default()
            .labels("firebolt.io/instance=fb,firebolt.io/component=gateway");
        tokio::spawn(
            watcher(pods.clone(), cfg)
                .applied_objects()
                .for_each(move |pod| {
                    if let Ok(pod) = pod {
                        let listener = pod
                            .meta()
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get("firebolt.io/client-listener"))
                            .cloned()
                            .unwrap_or_else(|| "plaintext".to_owned());
                        ever.lock().expect("listeners").insert(listener);
                    }
                    futures::future::ready(())
                }),
        )
    };
    // Sample: status, then pods. A secure pod never runs beside a
    // plaintext one, and TLS is never advertised while a plaintext pod runs.
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let api = instances(&ns);
    let sampled_pods = pods.clone();
    let sampler: JoinHandle<Result<Vec<GatewaySample>>> = tokio::spawn(async move {
        let mut samples = Vec::new();
        while !flag.load(Ordering::SeqCst) {
            let advertised = !api.get("fb").await?.data["status"]["gatewayTLS"].is_null();
            samples.push((advertised, gateway_listeners(&sampled_pods).await?));
            tokio::time::sleep(TICK).await;
        }
        Ok(samples)
    });
    instances(&ns)
        .patch(
            "fb",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"tls": {"gateway": {"enabled": true,
                "certManager": {"issuerRef": {"name": "internal-ca"}}}}}})),
        )
        .await?;
    let fb = wait_instance(&ns, "GatewayTLSReady=True", |fb| {
        reason_is(fb, "GatewayTLSReady", "True", "Ready")
            && reason_is(fb, "GatewayReady", "True", "Ready")
    })
    .await?;
    assert_eq!(fb.data["status"]["gatewayTLS"]["mode"], "TLS");
    wait_for("two TLS gateway pods", DEADLINE, || async move {
        let l = gateway_listeners(pods_ref).await?;
        Ok((l.len() == 2 && l.iter().all(|x| x == "tls")).then_some(()))
    })
    .await?;
    stop.store(true, Ordering::SeqCst);
    let samples = sampler.await??;
    watching.abort();
    let ever = ever.lock().expect("listeners").clone();
    assert!(
        ever.contains("closed"),
        "the transition went through closed pods: listeners seen {ever:?}, samples {samples:?}"
    );
    for (advertised, listeners) in &samples {
        let plaintext = listeners.iter().any(|x| x == "plaintext");
        let secure = listeners.iter().any(|x| x == "tls");
        assert!(!(plaintext && secure), "fail-open: {listeners:?}");
        assert!(
            !(*advertised && plaintext),
            "TLS advertised beside plaintext: {listeners:?}"
        );
    }
    let envoy = ns
        .api::<ConfigMap>()
        .get("fb-gateway-config")
        .await?
        .data
        .unwrap_or_default()
        .remove("envoy.json")
        .unwrap_or_default();
    assert!(envoy.contains("DownstreamTlsContext"), "{envoy}");
    issuer.finish().await?;
    Ok(())
}

#[tokio::test]
async fn a_rotation_parked_on_a_lagging_engine_is_reported_then_completes() -> Result<()> {
    let ns = TestNamespace::new("sec-rotate").await?;
    let _op = start(&ns, true).await?;
    let pki = Pki::generate("rotate")?;
    let issuer = Issuer::start(ns.client.clone(), &ns.name, &pki);
    create_admin_secret(&ns).await?;
    instances(&ns)
        .create(
            &PostParams::default(),
            &object(
                "FireboltInstance",
                "fb",
                json!({"metadata": {}, "gateway": {"replicas": 1}, "auth": auth_spec(true)}),
            )?,
        )
        .await?;
    // "slow" cannot roll: its class does not exist yet.
    engines(&ns)
        .create(
            &PostParams::default(),
            &object("FireboltEngine", "fast", engine_spec(None))?,
        )
        .await?;
    engines(&ns)
        .create(
            &PostParams::default(),
            &object("FireboltEngine", "slow", engine_spec(Some("later")))?,
        )
        .await?;

    let parked = wait_instance(&ns, "a rotation parked on slow", |fb| {
        let auth = &fb.data["status"]["auth"];
        auth["pendingRotationStep"] == "AwaitingPromotion"
            && auth["laggingEngines"] == json!(["slow"])
            && reason_is(fb, "AuthReady", "True", "RotationWaitingForEngines")
    })
    .await?;
    let auth = &parked.data["status"]["auth"];
    assert_eq!(auth["laggingEngineCount"], 1);
    assert!(auth["pendingSince"].is_string());
    assert_eq!(auth["signingKeys"][0]["id"], "signing-1");
    assert_eq!(auth["signingKeys"][0]["phase"], "Active");
    let c = condition(&parked, "AuthReady");
    assert!(
        c["message"].as_str().unwrap_or_default().contains("slow"),
        "{c}"
    );
    // The same state on /metrics, for alerting.
    let series =
        |step_and_value: &str| format!("namespace=\"{}\",name=\"fb\"{step_and_value}", ns.name);
    let parked_series = series(",step=\"AwaitingPromotion\"} 1");
    wait_for("the parked rotation's gauges", DEADLINE, || {
        let want = parked_series.clone();
        async move {
            let text = wasmop::metrics::global().render();
            let lagging = text.lines().any(|l| {
                l.starts_with("firebolt_instance_signing_key_rotation_lagging_engines{")
                    && l.contains(&want[..want.find(",step").unwrap_or(want.len())])
                    && l.ends_with(" 1")
            });
            Ok((lagging
                && text.lines().any(|l| {
                    l.starts_with("firebolt_instance_signing_key_rotation_pending{")
                        && l.ends_with(&want)
                }))
            .then_some(()))
        }
    })
    .await?;
    // The fast engine renders the current keys.
    let fast = engines(&ns).get("fast").await?;
    assert_eq!(fast.data["status"]["observedAuthHash"], auth["authHash"]);

    // The class appears: slow rolls, and the rotation runs to the end.
    let classes = api(
        &ns,
        "compute.firebolt.io",
        "FireboltEngineClass",
        "fireboltengineclasses",
    );
    classes
        .create(
            &PostParams::default(),
            &object(
                "FireboltEngineClass",
                "later",
                json!({"template": {"spec": {"containers": [{"name": "engine"}]}}}),
            )?,
        )
        .await?;
    let done = wait_instance(&ns, "signing-1 retired and deleted", |fb| {
        let keys = fb.data["status"]["auth"]["signingKeys"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        !keys.is_empty() && keys.iter().all(|k| k["id"] != "signing-1")
    })
    .await?;
    assert!(done.data["status"]["auth"]["signingKeyGeneration"].as_u64() >= Some(2));
    // Nothing waits any more: the step label is gone and the gauge reads 0.
    let idle = series("} 0");
    wait_for("the rotation gauges back to idle", DEADLINE, || {
        let want = idle.clone();
        async move {
            let text = wasmop::metrics::global().render();
            Ok(text
                .lines()
                .any(|l| {
                    l.starts_with("firebolt_instance_signing_key_rotation_pending{")
                        && l.ends_with(&want)
                })
                .then_some(()))
        }
    })
    .await?;
    wait_for("the Certificate of signing-1 deleted", DEADLINE, || {
        let certs = certificates(&ns);
        async move {
            Ok(certs
                .get_opt("fb-auth-signing-1")
                .await?
                .is_none()
                .then_some(()))
        }
    })
    .await?;
    issuer.finish().await?;
    Ok(())
}

#[tokio::test]
async fn a_re_issued_engine_certificate_rolls_a_generation_and_the_old_ca_drops_out() -> Result<()>
{
    let ns = TestNamespace::new("sec-renew").await?;
    let _op = start(&ns, true).await?;
    let pki = Pki::generate("renew")?;
    let issuer = Issuer::start(ns.client.clone(), &ns.name, &pki);
    instances(&ns)
        .create(
            &PostParams::default(),
            &object(
                "FireboltInstance",
                "fb",
                json!({"metadata": {}, "gateway": {"replicas": 1},
                       "tls": {"engine": {"enabled": true,
                               "certManager": {"issuerRef": {"name": "internal-ca"}}}}}),
            )?,
        )
        .await?;
    engines(&ns)
        .create(
            &PostParams::default(),
            &object("FireboltEngine", "a", engine_spec(None))?,
        )
        .await?;
    let engine = wait_engine(&ns, "a", |e| {
        e.data["status"]["observedEngineServingCertFP"].is_string()
    })
    .await?;
    let g = engine.data["status"]["activeGeneration"]
        .as_i64()
        .context("activeGeneration")?;
    assert_eq!(engine.data["status"]["observedEngineServingCertGen"], g);
    let fp = engine.data["status"]["observedEngineServingCertFP"].clone();
    wait_instance(&ns, "re-encrypting, one CA trusted", |fb| {
        fb.data["status"]["engineTLS"]["reencrypting"] == true
            && fb.data["status"]["rolledEngineTrustCAs"]
                .as_array()
                .is_some_and(|a| a.len() == 1)
    })
    .await?;

    // "cert-manager" re-issues generation g's certificate in place, under
    // a CA that rotated behind the issuer.
    let renewed = Pki::generate("renewed")?;
    let secrets: Api<Secret> = ns.api();
    secrets
        .patch(
            &format!("a-g{g}-engine-tls"),
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {
                "tls.crt": STANDARD.encode(&renewed.cert),
                "tls.key": STANDARD.encode(&renewed.key),
                "ca.crt": STANDARD.encode(&renewed.ca),
            }})),
        )
        .await?;
    let rolled = wait_engine(&ns, "a", |e| {
        e.data["status"]["activeGeneration"].as_i64() > Some(g)
            && e.data["status"]["drainingGeneration"].is_null()
    })
    .await?;
    let g2 = rolled.data["status"]["activeGeneration"]
        .as_i64()
        .context("activeGeneration")?;
    assert_eq!(rolled.data["status"]["observedEngineServingCertGen"], g2);
    assert_eq!(
        rolled.data["status"]["observedEngineServingCertFP"], fp,
        "the new generation's certificate comes from the issuer again"
    );
    // The old generation is gone, and with it the rotated CA: the bundle
    // is rebuilt from live generations only.
    wait_for("the old generation's TLS Secret deleted", DEADLINE, || {
        let secrets = secrets.clone();
        let name = format!("a-g{g}-engine-tls");
        async move { Ok(secrets.get_opt(&name).await?.is_none().then_some(())) }
    })
    .await?;
    let fb = wait_instance(&ns, "one CA trusted again", |fb| {
        fb.data["status"]["rolledEngineTrustCAs"]
            .as_array()
            .is_some_and(|a| a.len() == 1)
            && reason_is(fb, "EngineTLSReady", "True", "Ready")
    })
    .await?;
    let bundle = secrets.get("fb-engine-ca-bundle").await?;
    let annotation = bundle
        .metadata
        .annotations
        .unwrap_or_default()
        .remove("firebolt.io/engine-trust-cas")
        .unwrap_or_default();
    assert_eq!(
        annotation.split(',').count(),
        1,
        "only the live generation's CA: {annotation}"
    );
    assert_eq!(
        fb.data["status"]["rolledEngineTrustCAs"][0].as_str(),
        Some(annotation.as_str())
    );
    issuer.finish().await?;
    Ok(())
}
