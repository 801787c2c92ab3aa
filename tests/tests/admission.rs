//! Admission from plugins on the local control plane: the real
//! kube-apiserver calls the host's HTTPS admission server over loopback
//! (`clientConfig.url`), the host calls the real `.wasm` plugins.
//!
//! Each test admits only its own namespace (the webhooks' namespaceSelector
//! follows the operator's watched namespaces), so tests running at the
//! same time do not see each other's webhooks; each deletes its
//! configuration at the end.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind, Status};
use serde_json::json;
use wasmop::delivery::hotswap::{OptionsFor, PluginDir};
use wasmop_tests::admission::{Admission, AdmissionOptions, delete_configuration};
use wasmop_tests::net::round_robin;
use wasmop_tests::operator::{RunningOperator, load_plugin, plugin_path, sandbox};
use wasmop_tests::{
    DEFAULT_DEADLINE, TestNamespace, apply_project_crds, apply_test_crds, wait_for,
};

const GROUP: &str = "compute.firebolt.io";
const VERSION: &str = "v1alpha1";

fn firebolt_api(ns: &TestNamespace, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(GROUP, VERSION, kind);
    let ar = ApiResource::from_gvk_with_plural(&gvk, plural);
    Api::namespaced_with(ns.client.clone(), &ns.name, &ar)
}

fn engines(ns: &TestNamespace) -> Api<DynamicObject> {
    firebolt_api(ns, "FireboltEngine", "fireboltengines")
}

fn classes(ns: &TestNamespace) -> Api<DynamicObject> {
    firebolt_api(ns, "FireboltEngineClass", "fireboltengineclasses")
}

fn widgets(ns: &TestNamespace) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("test.wasmop.dev", "v1", "Widget");
    Api::namespaced_with(
        ns.client.clone(),
        &ns.name,
        &ApiResource::from_gvk_with_plural(&gvk, "widgets"),
    )
}

fn engine(name: &str, class: &str) -> Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "FireboltEngine",
        "metadata": {"name": name},
        "spec": {
            "instanceRef": "fb",
            "engineClassRef": class,
            "replicas": 1,
            "drainCheckEnabled": false,
            "template": {"spec": {"containers": [{"name": "engine"}]}},
        },
    }))?)
}

fn class(name: &str) -> Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "FireboltEngineClass",
        "metadata": {"name": name},
        "spec": {"template": {"spec": {"containers": [{"name": "engine", "image": "engine:v1"}]}}},
    }))?)
}

fn widget(name: &str) -> Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
        "metadata": {"name": name}, "spec": {"value": name},
    }))?)
}

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..PostParams::default()
    }
}

/// The API server's refusal, or `Ok(())` when the create went through.
async fn create(
    api: &Api<DynamicObject>,
    object: &DynamicObject,
    params: &PostParams,
) -> Result<std::result::Result<(), Status>> {
    match api.create(params, object).await {
        Ok(_) => Ok(Ok(())),
        Err(kube::Error::Api(e)) => Ok(Err(*e)),
        Err(e) => Err(e.into()),
    }
}

/// The names of the configuration's webhooks, when it exists.
async fn webhook_names(client: &kube::Client, name: &str) -> Result<Option<Vec<String>>> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    Ok(api.get_opt(name).await?.map(|c| {
        c.webhooks
            .unwrap_or_default()
            .into_iter()
            .map(|w| w.name)
            .collect()
    }))
}

/// Waits until a dry-run create of `object` is refused with a message
/// containing `needle`: the webhook is registered and the API server uses
/// it.
async fn wait_until_refused(
    what: &str,
    api: &Api<DynamicObject>,
    object: &DynamicObject,
    needle: &str,
) -> Result<Status> {
    wait_for(what, DEFAULT_DEADLINE, || async {
        match create(api, object, &dry_run()).await? {
            Err(e) if e.message.contains(needle) => Ok(Some(e)),
            other => bail!("not refused as expected yet: {other:?}"),
        }
    })
    .await
}

/// Engine admission: a missing class is refused, a present one admitted;
/// a referenced class cannot be deleted until its engines are gone; with
/// the operator stopped the API server refuses the delete itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn engines_need_their_class_and_a_used_class_cannot_be_deleted() -> Result<()> {
    let ns = TestNamespace::new("admission-engine").await?;
    let ops = TestNamespace::new("admission-ops").await?;
    apply_project_crds(&ns.client).await?;
    let configuration = format!("wasmop-admission-{}", ns.name);
    let run = async {
        let op = RunningOperator::start(
            ns.client.clone(),
            vec![ns.name.clone()],
            vec![load_plugin("engine", json!({}))?],
        )
        .await?;
        let mut admission = Admission::start(
            ns.client.clone(),
            &op.operator,
            op.operator.leader_flag(),
            AdmissionOptions {
                operator_namespace: ops.name.clone(),
                watched: vec![ns.name.clone()],
                configuration: configuration.clone(),
                url: None,
                cert_validity: Duration::from_secs(3600),
            },
        )
        .await?;

        // Bootstrap on a fresh cluster: the Secret holds a CA, and the
        // configuration carries it as caBundle.
        let secrets: Api<Secret> = ops.api();
        let secret = wait_for("the certificate Secret", DEFAULT_DEADLINE, || async {
            secrets
                .get_opt(&admission.secret)
                .await?
                .context("no Secret yet")
                .map(Some)
        })
        .await?;
        let ca = secret
            .data
            .as_ref()
            .and_then(|d| d.get("ca.crt"))
            .context("no ca.crt")?;
        let hooks = wait_for("both engine webhooks", DEFAULT_DEADLINE, || async {
            match webhook_names(&ns.client, &configuration).await? {
                Some(names) if names.len() == 2 => Ok(Some(names)),
                other => bail!("webhooks: {other:?}"),
            }
        })
        .await?;
        assert_eq!(
            hooks,
            [
                "class-in-use.engine.admission.wasmop.dev",
                "engine-class-exists.engine.admission.wasmop.dev"
            ]
        );
        let config: ValidatingWebhookConfiguration =
            Api::all(ns.client.clone()).get(&configuration).await?;
        for hook in config.webhooks.unwrap_or_default() {
            assert_eq!(hook.client_config.ca_bundle.as_ref(), Some(ca));
            assert_eq!(hook.failure_policy.as_deref(), Some("Fail"));
            assert_eq!(hook.side_effects, "None");
            assert_eq!(hook.match_policy.as_deref(), Some("Equivalent"));
        }

        // An engine naming a missing class is refused with the plugin's message.
        let engines = engines(&ns);
        let classes = classes(&ns);
        let denied = wait_until_refused(
            "the class webhook to refuse a missing class",
            &engines,
            &engine("e1", "small")?,
            "does not exist",
        )
        .await?;
        let refused = create(&engines, &engine("e1", "small")?, &PostParams::default())
            .await?
            .expect_err("an engine naming a missing class must be refused");
        assert_eq!(refused.code, 403, "{refused:?}");
        assert!(
            refused.message.contains(
                "admission webhook \"engine-class-exists.engine.admission.wasmop.dev\" denied the request: \
                 spec.engineClassRef: FireboltEngineClass \"small\" does not exist"
            ),
            "{}",
            refused.message
        );
        assert_eq!(denied.code, 403);
        assert!(engines.get_opt("e1").await?.is_none());

        // With the class present it is admitted.
        classes
            .create(&PostParams::default(), &class("small")?)
            .await?;
        engines
            .create(&PostParams::default(), &engine("e1", "small")?)
            .await?;
        engines
            .create(&PostParams::default(), &engine("e2", "small")?)
            .await?;

        // The class cannot be deleted while engines name it.
        let err = classes
            .delete("small", &DeleteParams::default())
            .await
            .expect_err("deleting a used class must be refused");
        let kube::Error::Api(err) = err else {
            bail!("unexpected error {err}")
        };
        assert_eq!(err.code, 403, "{err:?}");
        assert!(
            err.message.contains("is referenced by 2 FireboltEngine(s)")
                && err.message.contains("e1, e2"),
            "{}",
            err.message
        );
        assert!(classes.get_opt("small").await?.is_some());

        // After the engines are gone it succeeds.
        for name in ["e1", "e2"] {
            engines.delete(name, &DeleteParams::default()).await?;
        }
        wait_for("the engines to be gone", DEFAULT_DEADLINE, || async {
            let left = engines.list(&Default::default()).await?.items.len();
            ensure!(left == 0, "{left} engines left");
            Ok(Some(()))
        })
        .await?;
        classes.delete("small", &DeleteParams::default()).await?;

        // With the operator stopped the API server refuses the delete
        // (failurePolicy: Fail): no deletion window.
        classes
            .create(&PostParams::default(), &class("kept")?)
            .await?;
        engines
            .create(&PostParams::default(), &engine("e3", "kept")?)
            .await?;
        admission.stop();
        op.stop().await;
        // The server's tasks end asynchronously: wait (with dry runs) until
        // the API server can no longer reach it.
        wait_for(
            "the webhook to be unreachable",
            DEFAULT_DEADLINE,
            || async {
                let dry = DeleteParams {
                    dry_run: true,
                    ..DeleteParams::default()
                };
                match classes.delete("kept", &dry).await {
                    Err(kube::Error::Api(e)) if e.message.contains("failed calling webhook") => {
                        Ok(Some(()))
                    }
                    other => bail!("delete not refused for an unreachable webhook yet: {other:?}"),
                }
            },
        )
        .await?;
        let err = classes
            .delete("kept", &DeleteParams::default())
            .await
            .expect_err("with the operator stopped the delete must be refused");
        let kube::Error::Api(err) = err else {
            bail!("unexpected error {err}")
        };
        assert!(
            err.message
                .contains("failed calling webhook \"class-in-use.engine.admission.wasmop.dev\""),
            "{err:?}"
        );
        assert!(classes.get_opt("kept").await?.is_some());
        anyhow::Ok(())
    };
    let result = run.await;
    delete_configuration(&ns.client, &configuration).await?;
    // The finalizers (the classes' deletion guard) have no operator to
    // remove them any more.
    for api in [engines(&ns), classes(&ns)] {
        for e in api.list(&Default::default()).await?.items {
            let name = e.metadata.name.clone().unwrap_or_default();
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await?;
        }
    }
    result
}

/// Starts the `admitter` plugin's operator and admission for `ns`.
async fn admitter(
    ns: &TestNamespace,
    ops: &TestNamespace,
    configuration: &str,
) -> Result<(RunningOperator, Admission)> {
    apply_test_crds(&ns.client).await?;
    let op = RunningOperator::start(
        ns.client.clone(),
        vec![ns.name.clone()],
        vec![load_plugin("admitter", json!({}))?],
    )
    .await?;
    let admission = Admission::start(
        ns.client.clone(),
        &op.operator,
        op.operator.leader_flag(),
        AdmissionOptions {
            operator_namespace: ops.name.clone(),
            watched: vec![ns.name.clone()],
            configuration: configuration.to_owned(),
            url: None,
            cert_validity: Duration::from_secs(3600),
        },
    )
    .await?;
    Ok((op, admission))
}

/// A plugin whose admit loops or traps: the API server gets a denial
/// within the deadline (2 s) naming the failure, as documented.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_looping_or_trapping_admit_is_denied_within_its_deadline() -> Result<()> {
    let ns = TestNamespace::new("admission-hostile").await?;
    let ops = TestNamespace::new("admission-hostile-ops").await?;
    let configuration = format!("wasmop-admission-{}", ns.name);
    let run = async {
        let (_op, _admission) = admitter(&ns, &ops, &configuration).await?;
        let widgets = widgets(&ns);
        wait_until_refused(
            "the admitter webhook to be active",
            &widgets,
            &widget("deny-1")?,
            admitter::DENIAL,
        )
        .await?;

        let started = Instant::now();
        let looped = create(&widgets, &widget("loop-1")?, &PostParams::default())
            .await?
            .expect_err("a looping admit must deny");
        let took = started.elapsed();
        assert!(
            looped
                .message
                .contains("plugin admitter could not decide (PluginTimedOut"),
            "{looped:?}"
        );
        // The plugin deadline is 2 s; the webhook timeout is 10 s.
        assert!(took < Duration::from_secs(8), "took {took:?}");

        let trapped = create(&widgets, &widget("trap-1")?, &PostParams::default())
            .await?
            .expect_err("a trapping admit must deny");
        assert!(
            trapped.message.contains("PluginTrapped") && trapped.message.contains(admitter::PANIC),
            "{trapped:?}"
        );
        assert!(widgets.get_opt("loop-1").await?.is_none());
        assert!(widgets.get_opt("trap-1").await?.is_none());

        // The host keeps serving after both.
        create(&widgets, &widget("fine")?, &PostParams::default())
            .await?
            .map_err(|e| anyhow::anyhow!("a fine widget was refused: {e:?}"))?;
        anyhow::Ok(())
    };
    let result = run.await;
    delete_configuration(&ns.client, &configuration).await?;
    result
}

/// A hot swap to a version without `admit` removes its webhook rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hot_swap_that_drops_admit_removes_the_webhook() -> Result<()> {
    let ns = TestNamespace::new("admission-swap").await?;
    let ops = TestNamespace::new("admission-swap-ops").await?;
    apply_test_crds(&ns.client).await?;
    let configuration = format!("wasmop-admission-{}", ns.name);
    let dir = std::env::temp_dir().join(format!("wasmop-admission-swap-{}", ns.name));
    std::fs::create_dir_all(&dir)?;
    let run = async {
        let op = RunningOperator::start(ns.client.clone(), vec![ns.name.clone()], vec![]).await?;
        let options: OptionsFor = Arc::new(|_| wasmop::LoadOptions::default());
        let installed = dir.join("admitter.wasm");
        std::fs::copy(plugin_path("admitter")?, &installed)?;
        let mut plugins = PluginDir::new(dir.clone(), sandbox(), op.operator.clone(), options);
        let report = plugins.scan(false).await;
        ensure!(report.activated.len() == 1, "{report:?}");
        let _admission = Admission::start(
            ns.client.clone(),
            &op.operator,
            op.operator.leader_flag(),
            AdmissionOptions {
                operator_namespace: ops.name.clone(),
                watched: vec![ns.name.clone()],
                configuration: configuration.clone(),
                url: None,
                cert_validity: Duration::from_secs(3600),
            },
        )
        .await?;
        let widgets = widgets(&ns);
        wait_until_refused(
            "the admitter webhook to be active",
            &widgets,
            &widget("deny-1")?,
            admitter::DENIAL,
        )
        .await?;

        // Swap in the same plugin without admit.
        let tmp = dir.join("admitter.tmp");
        std::fs::copy(plugin_path("admitter-plain")?, &tmp)?;
        std::fs::rename(&tmp, &installed)?;
        let report = plugins.scan(false).await;
        ensure!(
            report.activated == [("admitter".to_owned(), "0.2.0".to_owned())],
            "{report:?}"
        );
        wait_for(
            "the webhook rule to be removed",
            DEFAULT_DEADLINE,
            || async {
                match webhook_names(&ns.client, &configuration).await? {
                    Some(names) if names.is_empty() => Ok(Some(())),
                    other => bail!("webhooks: {other:?}"),
                }
            },
        )
        .await?;
        // And the API server stops asking: the widget goes through.
        wait_for("deny-1 to be admitted", DEFAULT_DEADLINE, || async {
            create(&widgets, &widget("deny-1")?, &dry_run())
                .await?
                .map(Some)
                .map_err(|e| anyhow::anyhow!("still refused: {}", e.message))
        })
        .await?;
        anyhow::Ok(())
    };
    let result = run.await;
    delete_configuration(&ns.client, &configuration).await?;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The serving certificate is renewed every few seconds while requests
/// flow; every request is answered by the plugin.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn certificate_rotation_while_requests_flow_fails_no_request() -> Result<()> {
    let ns = TestNamespace::new("admission-rotate").await?;
    let ops = TestNamespace::new("admission-rotate-ops").await?;
    apply_test_crds(&ns.client).await?;
    let configuration = format!("wasmop-admission-{}", ns.name);
    let run = async {
        let op = RunningOperator::start(
            ns.client.clone(),
            vec![ns.name.clone()],
            vec![load_plugin("admitter", json!({}))?],
        )
        .await?;
        // Renewed when a third of 6 s is left: about every 4 s.
        let admission = Admission::start(
            ns.client.clone(),
            &op.operator,
            op.operator.leader_flag(),
            AdmissionOptions {
                operator_namespace: ops.name.clone(),
                watched: vec![ns.name.clone()],
                configuration: configuration.clone(),
                url: None,
                cert_validity: Duration::from_secs(6),
            },
        )
        .await?;
        let widgets = widgets(&ns);
        wait_until_refused(
            "the admitter webhook to be active",
            &widgets,
            &widget("deny-1")?,
            admitter::DENIAL,
        )
        .await?;
        let secrets: Api<Secret> = ops.api();
        let serving = |s: Secret| {
            s.data
                .and_then(|d| d.get("tls.crt").cloned())
                .map(|b| b.0)
                .unwrap_or_default()
        };
        let first = serving(secrets.get(&admission.secret).await?);
        let mut seen = vec![first];
        let mut answered = 0usize;
        let deadline = Instant::now() + DEFAULT_DEADLINE;
        // Requests flow until the certificate changed twice.
        while seen.len() < 3 {
            ensure!(
                Instant::now() < deadline,
                "the certificate was not renewed twice"
            );
            match create(&widgets, &widget("deny-1")?, &dry_run()).await? {
                Err(e) if e.message.contains(admitter::DENIAL) => answered += 1,
                other => bail!("request {answered} was not answered by the plugin: {other:?}"),
            }
            let now = serving(secrets.get(&admission.secret).await?);
            if seen.last() != Some(&now) {
                seen.push(now);
            }
        }
        ensure!(answered > 10, "only {answered} requests");
        anyhow::Ok(())
    };
    let result = run.await;
    delete_configuration(&ns.client, &configuration).await?;
    result
}

/// Two replicas, one leader: both answer admission (the configuration
/// points at a round-robin front of both), and only the leader writes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_and_follower_both_answer_admission() -> Result<()> {
    let ns = TestNamespace::new("admission-replicas").await?;
    let ops = TestNamespace::new("admission-replicas-ops").await?;
    apply_test_crds(&ns.client).await?;
    let configuration = format!("wasmop-admission-{}", ns.name);
    let run = async {
        let leader_op = RunningOperator::start(
            ns.client.clone(),
            vec![ns.name.clone()],
            vec![load_plugin("admitter", json!({}))?],
        )
        .await?;
        let follower_op = RunningOperator::start_follower(
            ns.client.clone(),
            vec![ns.name.clone()],
            vec![load_plugin("admitter", json!({}))?],
            wasmop_tests::operator::test_config(),
        )
        .await?;
        // The front listens first, so both replicas can name its port;
        // it forwards once their ports are known.
        let front = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let front_port = front.local_addr()?.port();
        let options = AdmissionOptions {
            operator_namespace: ops.name.clone(),
            watched: vec![ns.name.clone()],
            configuration: configuration.clone(),
            url: Some(format!("https://127.0.0.1:{front_port}")),
            cert_validity: Duration::from_secs(3600),
        };
        let leader = Admission::start(
            ns.client.clone(),
            &leader_op.operator,
            leader_op.operator.leader_flag(),
            options.clone(),
        )
        .await?;
        // The follower never writes the configuration.
        let follower = Admission::start(
            ns.client.clone(),
            &follower_op.operator,
            Arc::new(AtomicBool::new(false)),
            options,
        )
        .await?;
        let proxy_port = front.local_addr()?.port();
        let counts = round_robin(front, vec![leader.port, follower.port]);
        ensure!(
            proxy_port == front_port,
            "the front listens where the webhook points"
        );
        let widgets = widgets(&ns);
        wait_until_refused(
            "the admitter webhook to be active",
            &widgets,
            &widget("deny-1")?,
            admitter::DENIAL,
        )
        .await?;
        // Concurrent requests make the API server open several
        // connections, which the front spreads over both replicas.
        wait_for("both replicas to answer", DEFAULT_DEADLINE, || async {
            let calls =
                (0..8).map(|_| async { create(&widgets, &widget("deny-1")?, &dry_run()).await });
            for answer in futures::future::join_all(calls).await {
                match answer? {
                    Err(e) if e.message.contains(admitter::DENIAL) => {}
                    other => bail!("not answered by the plugin: {other:?}"),
                }
            }
            let per: Vec<usize> = counts.iter().map(|c| c.load(Ordering::SeqCst)).collect();
            ensure!(
                per.iter().all(|n| *n > 0),
                "connections per replica: {per:?}"
            );
            Ok(Some(()))
        })
        .await?;
        anyhow::Ok(())
    };
    let result = run.await;
    delete_configuration(&ns.client, &configuration).await?;
    result
}

/// A counter of this process for one configuration (0 when never set).
fn counter(name: &str, configuration: &str) -> f64 {
    wasmop::metrics::global()
        .get(name, &[("configuration", configuration)])
        .unwrap_or(0.0)
}

/// The webhook configuration is written only within the Lease term: with
/// the leader flag set but the term's deadline passed (a replica whose
/// election loop stalled), nothing is written; once the term runs again,
/// the configuration is, marked with the install that wrote it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_webhook_configuration_is_written_only_within_the_lease_term() -> Result<()> {
    let ns = TestNamespace::new("admission-term").await?;
    let ops = TestNamespace::new("admission-term-ops").await?;
    apply_test_crds(&ns.client).await?;
    let configuration = format!("wasmop-admission-{}", ns.name);
    let run = async {
        let op = RunningOperator::start(
            ns.client.clone(),
            vec![ns.name.clone()],
            vec![load_plugin("admitter", json!({}))?],
        )
        .await?;
        let term: wasmop::controller::leader::LeaseDeadline =
            Arc::new(std::sync::Mutex::new(Some(Instant::now())));
        let _admission = Admission::start_in_term(
            ns.client.clone(),
            &op.operator,
            Arc::new(AtomicBool::new(true)),
            term.clone(),
            AdmissionOptions {
                operator_namespace: ops.name.clone(),
                watched: vec![ns.name.clone()],
                configuration: configuration.clone(),
                url: None,
                cert_validity: Duration::from_secs(3600),
            },
        )
        .await?;
        // Sync passes with a certificate and the flag set, but outside the
        // term: nothing is written (the wait ends early if it is).
        wait_for(
            "three sync passes outside the term",
            DEFAULT_DEADLINE,
            || async {
                Ok((counter(
                    "wasmop_admission_configuration_outside_term_total",
                    &configuration,
                ) >= 3.0
                    || webhook_names(&ns.client, &configuration).await?.is_some())
                .then_some(()))
            },
        )
        .await?;
        ensure!(
            webhook_names(&ns.client, &configuration).await?.is_none(),
            "the configuration was written outside the Lease term"
        );
        *term.lock().expect("term lock") = Some(Instant::now() + Duration::from_secs(3600));
        let api: Api<ValidatingWebhookConfiguration> = Api::all(ns.client.clone());
        let written = wait_for(
            "the configuration written in the term",
            DEFAULT_DEADLINE,
            || async { Ok(api.get_opt(&configuration).await?) },
        )
        .await?;
        ensure!(
            written
                .metadata
                .annotations
                .unwrap_or_default()
                .get(wasmop::admission::INSTALL_ANNOTATION)
                == Some(&format!("{}/wasmop-leader", ops.name)),
            "the configuration names its install"
        );
        anyhow::Ok(())
    };
    let result = run.await;
    delete_configuration(&ns.client, &configuration).await?;
    result
}

/// Two installs given the same configuration name (two operators in two
/// namespaces, each leading its own Lease): the first writes it, the
/// second refuses to overwrite it (counted) and the configuration stays
/// the first's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_installs_never_overwrite_each_others_webhook_configuration() -> Result<()> {
    let ns = TestNamespace::new("admission-installs").await?;
    let first_ops = TestNamespace::new("admission-installs-a").await?;
    let second_ops = TestNamespace::new("admission-installs-b").await?;
    apply_test_crds(&ns.client).await?;
    let configuration = format!("wasmop-admission-{}", ns.name);
    let run = async {
        let op = RunningOperator::start(
            ns.client.clone(),
            vec![ns.name.clone()],
            vec![load_plugin("admitter", json!({}))?],
        )
        .await?;
        let options = |ops: &TestNamespace| AdmissionOptions {
            operator_namespace: ops.name.clone(),
            watched: vec![ns.name.clone()],
            configuration: configuration.clone(),
            url: None,
            cert_validity: Duration::from_secs(3600),
        };
        let first = Admission::start(
            ns.client.clone(),
            &op.operator,
            Arc::new(AtomicBool::new(true)),
            options(&first_ops),
        )
        .await?;
        let api: Api<ValidatingWebhookConfiguration> = Api::all(ns.client.clone());
        let url_of = |c: &ValidatingWebhookConfiguration| {
            c.webhooks
                .iter()
                .flatten()
                .filter_map(|w| w.client_config.url.clone())
                .collect::<Vec<_>>()
        };
        let first_url = format!("https://127.0.0.1:{}", first.port);
        let written = wait_for(
            "the first install's configuration",
            DEFAULT_DEADLINE,
            || async {
                Ok(api
                    .get_opt(&configuration)
                    .await?
                    .filter(|c| url_of(c).iter().any(|u| u.starts_with(&first_url))))
            },
        )
        .await?;
        let refused_before = counter(
            "wasmop_admission_configuration_refused_total",
            &configuration,
        );
        let _second = Admission::start(
            ns.client.clone(),
            &op.operator,
            Arc::new(AtomicBool::new(true)),
            options(&second_ops),
        )
        .await?;
        // The second install refuses (the wait ends early if it wrote).
        wait_for("the second install to refuse", DEFAULT_DEADLINE, || async {
            let rewritten = api.get(&configuration).await?.metadata.resource_version
                != written.metadata.resource_version;
            Ok((counter(
                "wasmop_admission_configuration_refused_total",
                &configuration,
            ) > refused_before
                || rewritten)
                .then_some(()))
        })
        .await?;
        let now = api.get(&configuration).await?;
        ensure!(
            now.metadata.resource_version == written.metadata.resource_version,
            "the configuration was written again"
        );
        ensure!(
            url_of(&now).iter().all(|u| u.starts_with(&first_url)),
            "the configuration points elsewhere: {:?}",
            url_of(&now)
        );
        ensure!(
            now.metadata
                .annotations
                .unwrap_or_default()
                .get(wasmop::admission::INSTALL_ANNOTATION)
                == Some(&format!("{}/wasmop-leader", first_ops.name)),
            "the configuration is still the first install's"
        );
        anyhow::Ok(())
    };
    let result = run.await;
    delete_configuration(&ns.client, &configuration).await?;
    result
}
