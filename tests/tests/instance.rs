//! The `instance` plugin (FireboltInstance) on the local control plane:
//! the real `instance.wasm`, the real host, kube-apiserver with the CRD
//! from `crds/`, controller-manager (Deployments, StatefulSets, garbage
//! collection) and kwok (Pods become Ready, PVCs bind through the
//! `kwok-volume` StorageClass). Nothing here talks to a Pod.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use wasmop_tests::envoy;
use wasmop_tests::operator::{RunningOperator, load_plugin};
use wasmop_tests::{TestNamespace, apply_project_crds, wait_for};

/// Rollouts go through the scheduler, kwok and the controller-manager.
const DEADLINE: Duration = Duration::from_secs(120);

fn instances(ns: &TestNamespace) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("compute.firebolt.io", "v1alpha1", "FireboltInstance");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "fireboltinstances");
    Api::namespaced_with(ns.client.clone(), &ns.name, &ar)
}

fn instance_object(name: &str, spec: Value) -> Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "compute.firebolt.io/v1alpha1",
        "kind": "FireboltInstance",
        "metadata": {"name": name},
        "spec": spec,
    }))?)
}

async fn start(ns: &TestNamespace) -> Result<RunningOperator> {
    apply_project_crds(&ns.client).await?;
    let plugin = load_plugin("instance", json!({}))?;
    RunningOperator::start(ns.client.clone(), vec![ns.name.clone()], vec![plugin]).await
}

/// Waits until condition `type_` of instance `name` has `status`; returns
/// the instance.
async fn wait_condition(
    api: &Api<DynamicObject>,
    name: &str,
    type_: &str,
    status: &str,
) -> Result<DynamicObject> {
    wait_for(&format!("{name}: {type_}={status}"), DEADLINE, || {
        let api = api.clone();
        async move {
            let obj = api.get(name).await?;
            let found = obj.data["status"]["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == type_).cloned());
            match found {
                Some(c) if c["status"] == status => Ok(Some(obj)),
                Some(c) => bail!("{type_} is {c}"),
                None => bail!("no {type_} yet; status: {}", obj.data["status"]),
            }
        }
    })
    .await
}

fn condition(obj: &DynamicObject, type_: &str) -> Value {
    obj.data["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_).cloned())
        .unwrap_or(Value::Null)
}

fn config_hash(
    template_meta: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
) -> String {
    template_meta
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get("firebolt.io/config-hash"))
        .cloned()
        .unwrap_or_default()
}

fn deployment_hash(d: &Deployment) -> String {
    config_hash(d.spec.as_ref().and_then(|s| s.template.metadata.as_ref()))
}

fn statefulset_hash(s: &StatefulSet) -> String {
    config_hash(s.spec.as_ref().and_then(|s| s.template.metadata.as_ref()))
}

/// Checks that `meta` is controlled by the instance with `uid` and
/// labelled with its component.
fn owned_by(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    uid: &str,
    component: &str,
) -> Result<()> {
    let name = meta.name.clone().unwrap_or_default();
    let owner = meta
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .with_context(|| format!("{name} has no controller ownerReference"))?;
    if owner.kind != "FireboltInstance" || owner.uid != uid {
        bail!("{name} is controlled by {} {}", owner.kind, owner.uid);
    }
    let labels = meta.labels.clone().unwrap_or_default();
    if labels.get("firebolt.io/component").map(String::as_str) != Some(component) {
        bail!("{name} has labels {labels:?}");
    }
    Ok(())
}

async fn pods_ready(ns: &TestNamespace, component: &str, want: usize) -> Result<Option<()>> {
    let pods: Api<Pod> = ns.api();
    let lp = ListParams::default().labels(&format!(
        "firebolt.io/instance=fb,firebolt.io/component={component}"
    ));
    let list = pods.list(&lp).await?.items;
    let ready = list
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .count();
    if ready == want {
        Ok(Some(()))
    } else {
        bail!(
            "{component}: {ready} of {want} pods ready ({} pods)",
            list.len()
        )
    }
}

#[tokio::test]
async fn instance_becomes_ready_rolls_only_the_gateway_and_is_garbage_collected() -> Result<()> {
    let ns = TestNamespace::new("instance").await?;
    let _op = start(&ns).await?;
    let api = instances(&ns);
    api.create(
        &PostParams::default(),
        &instance_object("fb", json!({"metadata": {}, "gateway": {}}))?,
    )
    .await?;

    // spec.id is generated once and written back to the spec.
    let id = wait_for("spec.id to be generated", DEADLINE, || {
        let api = api.clone();
        async move {
            let obj = api.get("fb").await?;
            Ok(obj.data["spec"]["id"]
                .as_str()
                .filter(|s| !s.is_empty())
                .map(str::to_owned))
        }
    })
    .await?;
    assert_eq!(id.len(), 26, "a ULID: {id}");
    let uid = api.get("fb").await?.metadata.uid.context("uid")?;

    // Ready, with the endpoints published.
    let fb = wait_condition(&api, "fb", "Ready", "True").await?;
    let status = &fb.data["status"];
    assert_eq!(status["phase"], "Ready");
    assert_eq!(
        status["metadataEndpoint"],
        format!("fb-metadata.{}.svc.cluster.local:7000", ns.name)
    );
    assert_eq!(
        status["gatewayEndpoint"],
        format!("fb-gateway.{}.svc.cluster.local", ns.name)
    );
    assert_eq!(status["metadataReady"], true);
    assert_eq!(
        status["observedGeneration"],
        fb.metadata.generation.context("generation")?
    );
    for c in ["PostgresReady", "MetadataReady", "GatewayReady"] {
        assert_eq!(condition(&fb, c)["status"], "True", "{c}");
    }
    assert_eq!(
        api.get("fb").await?.data["spec"]["id"],
        id.as_str(),
        "never regenerated"
    );

    // Every workload and its support objects, owned by the instance.
    let statefulsets: Api<StatefulSet> = ns.api();
    let deployments: Api<Deployment> = ns.api();
    let services: Api<Service> = ns.api();
    let configmaps: Api<ConfigMap> = ns.api();
    let secrets: Api<Secret> = ns.api();
    let budgets: Api<PodDisruptionBudget> = ns.api();
    let claims: Api<PersistentVolumeClaim> = ns.api();
    owned_by(
        &statefulsets.get("fb-metadata-pg").await?.metadata,
        &uid,
        "postgres",
    )?;
    owned_by(
        &services.get("fb-metadata-pg").await?.metadata,
        &uid,
        "postgres",
    )?;
    owned_by(
        &secrets.get("fb-metadata-postgres-creds").await?.metadata,
        &uid,
        "postgres",
    )?;
    owned_by(
        &deployments.get("fb-metadata").await?.metadata,
        &uid,
        "metadata",
    )?;
    owned_by(
        &services.get("fb-metadata").await?.metadata,
        &uid,
        "metadata",
    )?;
    owned_by(
        &configmaps.get("fb-metadata-config").await?.metadata,
        &uid,
        "metadata",
    )?;
    owned_by(
        &deployments.get("fb-gateway").await?.metadata,
        &uid,
        "gateway",
    )?;
    owned_by(&services.get("fb-gateway").await?.metadata, &uid, "gateway")?;
    owned_by(
        &configmaps.get("fb-gateway-config").await?.metadata,
        &uid,
        "gateway",
    )?;
    owned_by(&budgets.get("fb-gateway").await?.metadata, &uid, "gateway")?;
    let config = configmaps.get("fb-metadata-config").await?;
    let xml = config
        .data
        .unwrap_or_default()
        .remove("config.xml")
        .unwrap_or_default();
    assert!(
        xml.contains(&format!("<account_id>{id}</account_id>")),
        "{xml}"
    );

    // The simulated Pods are Ready and PostgreSQL's volume is bound.
    for (component, want) in [("postgres", 1), ("metadata", 1), ("gateway", 2)] {
        wait_for(&format!("{component} pods Ready"), DEADLINE, || {
            pods_ready(&ns, component, want)
        })
        .await?;
    }
    let pvc = claims.get("data-fb-metadata-pg-0").await?;
    assert_eq!(pvc.status.and_then(|s| s.phase).as_deref(), Some("Bound"));
    let password_before = secrets.get("fb-metadata-postgres-creds").await?.data;

    // Edit the gateway settings: only the gateway rolls.
    let pg_before = statefulsets.get("fb-metadata-pg").await?;
    let md_before = deployments.get("fb-metadata").await?;
    let gw_before = deployments.get("fb-gateway").await?;
    let edited = api
        .patch(
            "fb",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"gateway": {"metricsPort": 9091}}})),
        )
        .await?;
    let generation = edited.metadata.generation.context("generation")?;
    let gw_hash_before = deployment_hash(&gw_before);
    let gw_after = wait_for(
        "the gateway Deployment to get a new pod template",
        DEADLINE,
        || {
            let deployments = deployments.clone();
            let old = gw_hash_before.clone();
            async move {
                let d = deployments.get("fb-gateway").await?;
                Ok((deployment_hash(&d) != old).then_some(d))
            }
        },
    )
    .await?;
    let ports: Vec<i32> = gw_after
        .spec
        .as_ref()
        .map(|s| {
            s.template
                .spec
                .iter()
                .flat_map(|p| &p.containers)
                .flat_map(|c| c.ports.iter().flatten())
                .map(|p| p.container_port)
                .collect()
        })
        .unwrap_or_default();
    assert!(ports.contains(&9091), "metrics port moved: {ports:?}");
    // The roll completes: the new pods are the available ones.
    wait_for("the gateway rollout to complete", DEADLINE, || {
        let deployments = deployments.clone();
        async move {
            let d = deployments.get("fb-gateway").await?;
            let generation = d.metadata.generation.unwrap_or_default();
            let s = d.status.unwrap_or_default();
            let done = s.observed_generation == Some(generation)
                && s.updated_replicas == Some(2)
                && s.available_replicas == Some(2)
                && s.replicas == Some(2);
            if done {
                Ok(Some(()))
            } else {
                bail!("gateway rollout status: {s:?}")
            }
        }
    })
    .await?;
    let replicasets: Api<ReplicaSet> = ns.api();
    let sets = |component: &'static str| {
        let replicasets = replicasets.clone();
        async move {
            let lp = ListParams::default().labels(&format!(
                "firebolt.io/instance=fb,firebolt.io/component={component}"
            ));
            anyhow::Ok(replicasets.list(&lp).await?.items.len())
        }
    };
    assert_eq!(
        sets("gateway").await?,
        2,
        "the gateway rolled onto a new ReplicaSet"
    );

    // Another field manager takes the gateway's replicas over (what
    // `kubectl scale` amounts to); the plugin's forced apply takes them back.
    deployments
        .patch(
            "fb-gateway",
            &PatchParams::apply("someone-else").force(),
            &Patch::Apply(json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "fb-gateway"}, "spec": {"replicas": 5}
            })),
        )
        .await?;
    wait_for("the gateway's replicas to be taken back", DEADLINE, || {
        let deployments = deployments.clone();
        async move {
            let d = deployments.get("fb-gateway").await?;
            let replicas = d.spec.and_then(|s| s.replicas);
            if replicas == Some(2) {
                Ok(Some(()))
            } else {
                bail!("gateway replicas are {replicas:?}")
            }
        }
    })
    .await?;
    let fb = wait_for(
        "the instance to report the edited generation Ready",
        DEADLINE,
        || {
            let api = api.clone();
            async move {
                let obj = api.get("fb").await?;
                let ready = condition(&obj, "Ready")["status"] == "True";
                let observed = obj.data["status"]["observedGeneration"] == generation;
                Ok((ready && observed).then_some(obj))
            }
        },
    )
    .await?;
    assert_eq!(fb.data["status"]["phase"], "Ready");
    let md_after = deployments.get("fb-metadata").await?;
    let pg_after = statefulsets.get("fb-metadata-pg").await?;
    assert_eq!(
        deployment_hash(&md_after),
        deployment_hash(&md_before),
        "metadata must not roll"
    );
    assert_eq!(md_after.metadata.generation, md_before.metadata.generation);
    assert_eq!(
        sets("metadata").await?,
        1,
        "the metadata service kept its ReplicaSet"
    );
    assert_eq!(
        statefulset_hash(&pg_after),
        statefulset_hash(&pg_before),
        "postgres must not roll"
    );
    assert_eq!(pg_after.metadata.generation, pg_before.metadata.generation);
    assert_eq!(
        secrets.get("fb-metadata-postgres-creds").await?.data,
        password_before,
        "the generated credentials are never rewritten"
    );

    // Deleting the instance garbage-collects everything it created.
    api.delete("fb", &DeleteParams::background()).await?;
    wait_for(
        "everything the instance created to be gone",
        DEADLINE,
        || {
            let ns = &ns;
            async move {
                let lp = ListParams::default().labels("firebolt.io/instance=fb");
                let all = ListParams::default();
                let mut left: Vec<String> = Vec::new();
                left.extend(ns.names::<StatefulSet>(&lp).await?);
                left.extend(ns.names::<Deployment>(&lp).await?);
                left.extend(ns.names::<Service>(&lp).await?);
                left.extend(ns.names::<ConfigMap>(&lp).await?);
                left.extend(ns.names::<Secret>(&lp).await?);
                left.extend(ns.names::<PodDisruptionBudget>(&lp).await?);
                left.extend(ns.names::<ReplicaSet>(&lp).await?);
                left.extend(ns.names::<Pod>(&lp).await?);
                // PVCs of the StatefulSet's claim templates carry no instance label.
                left.extend(ns.names::<PersistentVolumeClaim>(&all).await?);
                if left.is_empty() {
                    Ok(Some(()))
                } else {
                    bail!("still there: {left:?}")
                }
            }
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn external_postgres_secret_is_reported_until_it_exists() -> Result<()> {
    let ns = TestNamespace::new("instance-extpg").await?;
    let _op = start(&ns).await?;
    let api = instances(&ns);
    api.create(
        &PostParams::default(),
        &instance_object(
            "fb",
            json!({"metadata": {"postgres": {"host": "pg.example.internal", "database": "meta",
                                             "credentialsSecretRef": {"name": "pg-creds"}}},
                   "gateway": {"replicas": 1}}),
        )?,
    )
    .await?;
    let fb = wait_condition(&api, "fb", "PostgresReady", "False").await?;
    let c = condition(&fb, "PostgresReady");
    assert_eq!(c["reason"], "PostgresSecretPreflightFailed");
    assert!(
        c["message"]
            .as_str()
            .unwrap_or_default()
            .contains("\"pg-creds\""),
        "{c}"
    );

    // The other components went ahead; nothing was invented for PostgreSQL.
    wait_condition(&api, "fb", "MetadataReady", "True").await?;
    let secrets: Api<Secret> = ns.api();
    assert!(
        secrets.get_opt("pg-creds").await?.is_none(),
        "the Secret is never invented"
    );
    assert!(
        secrets
            .get_opt("fb-metadata-postgres-creds")
            .await?
            .is_none()
    );
    let statefulsets: Api<StatefulSet> = ns.api();
    assert!(statefulsets.get_opt("fb-metadata-pg").await?.is_none());
    assert_eq!(
        condition(&api.get("fb").await?, "Ready")["reason"],
        "PostgresSecretPreflightFailed"
    );

    // A Secret without the password is still reported ...
    let secret = |data: BTreeMap<&str, &str>| -> Result<Secret> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pg-creds"},
            "stringData": data,
        }))?)
    };
    secrets
        .create(
            &PostParams::default(),
            &secret(BTreeMap::from([("username", "meta")]))?,
        )
        .await?;
    wait_for("the missing password to be reported", DEADLINE, || {
        let api = api.clone();
        async move {
            let c = condition(&api.get("fb").await?, "PostgresReady");
            let msg = c["message"].as_str().unwrap_or_default();
            if msg.contains("\"password\"") {
                Ok(Some(()))
            } else {
                bail!("PostgresReady: {c}")
            }
        }
    })
    .await?;
    // ... and a complete one makes the instance Ready, without a restart
    // or an edit of the instance (the reference re-triggers it).
    secrets
        .patch(
            "pg-creds",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"password": "s3cret"}})),
        )
        .await?;
    let fb = wait_condition(&api, "fb", "Ready", "True").await?;
    assert_eq!(condition(&fb, "PostgresReady")["reason"], "Ready");
    assert_eq!(
        fb.data["status"]["metadataEndpoint"],
        format!("fb-metadata.{}.svc.cluster.local:7000", ns.name)
    );
    Ok(())
}

/// The `password` of the provisioned PostgreSQL's Secret, once it is there.
async fn generated_password(secrets: &Api<Secret>) -> Result<Option<Vec<u8>>> {
    let Some(s) = secrets.get_opt("fb-metadata-postgres-creds").await? else {
        return Ok(None);
    };
    Ok(s.data
        .and_then(|mut d| d.remove("password"))
        .map(|b| b.0)
        .filter(|b| !b.is_empty()))
}

/// The fields of `f:data` that field manager `manager` owns in `secret`.
fn data_fields_of(secret: &Secret, manager: &str) -> Vec<String> {
    secret
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| m.manager.as_deref() == Some(manager))
        .filter_map(|m| m.fields_v1.as_ref())
        .flat_map(|f| {
            f.0.get("f:data")
                .and_then(Value::as_object)
                .map(|d| d.keys().cloned().collect::<Vec<_>>())
                .unwrap_or_default()
        })
        .collect()
}

/// The provisioned PostgreSQL password is random bytes the host makes once
/// (the plan names the key, never a value): nothing a reader of the
/// instance sees derives it, and restarts, hot swaps and later applies
/// keep it. A key a person deletes is made again.
#[tokio::test]
async fn the_postgres_password_is_generated_once_by_the_host_and_kept() -> Result<()> {
    let ns = TestNamespace::new("instance-password").await?;
    let op = start(&ns).await?;
    let api = instances(&ns);
    let secrets: Api<Secret> = ns.api();
    api.create(
        &PostParams::default(),
        &instance_object("fb", json!({"metadata": {}, "gateway": {"replicas": 1}}))?,
    )
    .await?;
    let password = wait_for("the generated password", DEADLINE, || {
        generated_password(&secrets)
    })
    .await?;
    assert_eq!(password.len(), 48, "24 random bytes as hex");
    assert!(password.iter().all(u8::is_ascii_hexdigit));
    let uid = api.get("fb").await?.metadata.uid.context("uid")?;
    assert!(
        !String::from_utf8_lossy(&password).contains(&uid[..8]),
        "nothing of the UID in it"
    );
    let secret = secrets.get("fb-metadata-postgres-creds").await?;
    owned_by(&secret.metadata, &uid, "postgres")?;
    assert_eq!(
        secret
            .metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .get("wasmop.dev/generated-keys")
            .map(String::as_str),
        Some("password")
    );
    // The plugin's manager owns the username it renders, never the
    // password: no later apply of it can rewrite or drop the value.
    let plugin_fields = data_fields_of(&secret, "wasmop-instance");
    assert!(
        plugin_fields.contains(&"f:username".to_owned()),
        "{plugin_fields:?}"
    );
    assert!(
        !plugin_fields.contains(&"f:password".to_owned()),
        "{plugin_fields:?}"
    );
    assert_eq!(
        data_fields_of(&secret, "wasmop-instance-generated"),
        ["f:password"]
    );
    wait_condition(&api, "fb", "PostgresReady", "True").await?;

    // Later applies (a spec edit reconciles everything), a hot swap (the
    // plugin loaded again, with other settings) and a restart keep it.
    api.patch(
        "fb",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"gateway": {"metricsPort": 9092}}})),
    )
    .await?;
    op.operator
        .add_plugin(load_plugin(
            "instance",
            json!({"credentialSeed": "ignored"}),
        )?)
        .await?;
    wait_for("the edit to be reconciled", DEADLINE, || {
        let api = api.clone();
        async move {
            let fb = api.get("fb").await?;
            let done = fb.data["status"]["observedGeneration"] == json!(fb.metadata.generation)
                && condition(&fb, "Ready")["status"] == "True";
            Ok(done.then_some(()))
        }
    })
    .await?;
    op.stop().await;
    let op = start(&ns).await?;
    // The restarted operator reconciles the instance (a label edit is a
    // change it sees) and leaves the password as it is.
    api.patch(
        "fb",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"touched": "1"}}})),
    )
    .await?;
    let before = secrets
        .get("fb-metadata-postgres-creds")
        .await?
        .metadata
        .resource_version;
    api.patch(
        "fb",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"gateway": {"metricsPort": 9093}}})),
    )
    .await?;
    wait_for(
        "the restarted operator to reconcile the edit",
        DEADLINE,
        || {
            let api = api.clone();
            let deployments: Api<Deployment> = ns.api();
            async move {
                let d = deployments.get("fb-gateway").await?;
                let ports: Vec<i32> = d
                    .spec
                    .iter()
                    .flat_map(|s| &s.template.spec)
                    .flat_map(|p| &p.containers)
                    .flat_map(|c| c.ports.iter().flatten())
                    .map(|p| p.container_port)
                    .collect();
                let fb = api.get("fb").await?;
                let observed =
                    fb.data["status"]["observedGeneration"] == json!(fb.metadata.generation);
                Ok((ports.contains(&9093) && observed).then_some(()))
            }
        },
    )
    .await?;
    let kept = secrets.get("fb-metadata-postgres-creds").await?;
    assert_eq!(
        kept.data
            .clone()
            .unwrap_or_default()
            .get("password")
            .map(|b| b.0.clone()),
        Some(password.clone()),
        "restarts, swaps and applies keep the password"
    );
    assert_eq!(
        kept.metadata.resource_version, before,
        "a converged Secret is not written again"
    );

    // A person removes the key: the host makes a new one (the old value is
    // gone; nothing could bring it back), and only then.
    secrets
        .patch(
            "fb-metadata-postgres-creds",
            &PatchParams::default(),
            &Patch::Json::<()>(serde_json::from_value(json!([
                {"op": "remove", "path": "/data/password"}
            ]))?),
        )
        .await?;
    let refilled = wait_for("a new password for the removed key", DEADLINE, || {
        generated_password(&secrets)
    })
    .await?;
    assert_eq!(refilled.len(), 48);
    assert_ne!(refilled, password);
    drop(op);
    Ok(())
}

/// The FireboltInstance objects of upstream's samples
/// (`config/samples/…-basic.yaml`, `examples/instance-basic.yaml`,
/// `examples/instance-full.yaml`, `examples/instance-auth-tls.yaml`),
/// comments removed: the CRD must take them unchanged.
const UPSTREAM_SAMPLES: &str = r#"
apiVersion: compute.firebolt.io/v1alpha1
kind: FireboltInstance
metadata: {name: production}
spec:
  metadata: {}
  gateway: {}
---
apiVersion: compute.firebolt.io/v1alpha1
kind: FireboltInstance
metadata: {name: firebolt}
spec:
  metadata:
    postgres:
      host: postgres.firebolt.svc
      port: 5432
      database: firebolt_metadata
      credentialsSecretRef:
        name: metadata-postgres-credentials
    engineRegistration: true
    template:
      spec:
        serviceAccountName: metadata
        nodeSelector:
          firebolt.dev/pool: system
        containers:
          - name: metadata
            image: ghcr.io/firebolt-db/metadata:latest
            imagePullPolicy: IfNotPresent
            resources:
              requests:
                cpu: 200m
                memory: 1Gi
              limits:
                memory: 2Gi
  gateway:
    replicas: 2
    template:
      spec:
        nodeSelector:
          firebolt.dev/pool: system
        containers:
          - name: envoy
            resources:
              requests:
                cpu: 100m
                memory: 256Mi
---
apiVersion: compute.firebolt.io/v1alpha1
kind: FireboltInstance
metadata: {name: firebolt-auth-tls}
spec:
  metadata: {}
  gateway:
    replicas: 2
  auth:
    enabled: true
    preferredAuthorizationServer: okta
    local:
      passwordLogin: admin_only
      admin:
        name: firebolt
        password:
          name: firebolt-admin-credentials
          key: password
      signingAlgorithm: ES384
      signingKeys:
        certManager:
          issuerRef:
            name: internal-ca
            kind: ClusterIssuer
          algorithm: ECDSA
          size: 384
        rotationInterval: 720h
        retainDuration: 24h
    oidc:
      providers:
        - name: okta
          title: Okta
          discoveryURL: https://company.okta.com/oauth2/default/.well-known/openid-configuration
          usernameMapping: "{{ iss }}|{{ sub }}"
          jitProvisioning:
            enabled: true
            defaultRoles: [public]
  tls:
    engine:
      enabled: true
      certManager:
        issuerRef:
          name: internal-ca
          kind: ClusterIssuer
    gateway:
      enabled: true
      certManager:
        issuerRef:
          name: internal-ca
          kind: ClusterIssuer
      dnsNames:
        - firebolt.example.com
"#;

/// Expects the API server to refuse `result` as Invalid with a message
/// containing `needle`.
fn refused<T: std::fmt::Debug>(result: kube::Result<T>, needle: &str) -> Result<()> {
    match result {
        Err(kube::Error::Api(s)) if s.code == 422 && s.message.contains(needle) => Ok(()),
        Err(kube::Error::Api(s)) => bail!(
            "refused, but not for {needle:?}: {} ({})",
            s.message,
            s.code
        ),
        other => bail!("expected a refusal mentioning {needle:?}, got {other:?}"),
    }
}

#[tokio::test]
async fn crd_accepts_upstream_samples_and_refuses_what_its_rules_forbid() -> Result<()> {
    let ns = TestNamespace::new("instance-crd").await?;
    apply_project_crds(&ns.client).await?;
    let api = instances(&ns);

    // Upstream's samples, stored as written (defaults applied, nothing pruned).
    let mut stored = 0;
    for doc in serde_yaml::Deserializer::from_str(UPSTREAM_SAMPLES) {
        let value = <Value as serde::Deserialize>::deserialize(doc)?;
        let obj: DynamicObject = serde_json::from_value(value.clone())?;
        let name = obj.metadata.name.clone().unwrap_or_default();
        let created = api
            .create(&PostParams::default(), &obj)
            .await
            .with_context(|| format!("upstream sample {name} refused"))?;
        assert_eq!(
            created.data["spec"]["gateway"]["metricsPort"], 9090,
            "{name}: defaults apply"
        );
        for path in ["/spec/metadata", "/spec/gateway", "/spec/auth", "/spec/tls"] {
            if let Some(sent) = value.pointer(path) {
                assert!(
                    contains(created.data.pointer(path).unwrap_or(&Value::Null), sent),
                    "{name}{path} kept as sent"
                );
            }
        }
        stored += 1;
    }
    assert_eq!(stored, 3);

    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let create = |spec: Value, name: &str| {
        let api = api.clone();
        let dry_run = dry_run.clone();
        let obj = instance_object(name, spec);
        async move { Ok::<_, anyhow::Error>(api.create(&dry_run, &obj?).await) }
    };
    refused(
        create(
            json!({"metadata": {"postgres": {"host": "pg", "database": "d",
                                                "credentialsSecretRef": {}}},
                      "gateway": {}}),
            "x",
        )
        .await?,
        "credentialsSecretRef.name must name the Secret",
    )?;
    refused(
        create(
            json!({"metadata": {}, "gateway": {"template": {"spec": {
            "containers": [{"name": "envoy", "args": ["--debug"]}]}}}}),
            "x",
        )
        .await?,
        "the envoy container's command, args, ports, probes and lifecycle are set by the operator",
    )?;
    refused(
        create(
            json!({"metadata": {"template": {"spec": {
            "containers": [{"name": "metadata", "ports": [{"containerPort": 1}]}]}}},
                      "gateway": {}}),
            "x",
        )
        .await?,
        "the metadata container's command",
    )?;
    refused(
        create(json!({"metadata": {"replicas": 2}, "gateway": {}}), "x").await?,
        "spec.metadata.replicas must be 1",
    )?;
    refused(
        create(json!({"metadata": {}, "gateway": {}}), &"n".repeat(41)).await?,
        "at most 40 characters",
    )?;
    refused(create(json!({"gateway": {}}), "x").await?, "spec.metadata")?;

    // Transition rules: spec.id is set once; provisioned and external
    // PostgreSQL cannot be swapped.
    api.patch(
        "production",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"id": "01JGFJJZ00KV6Z8Q2XN5R1M3TB"}})),
    )
    .await
    .context("setting spec.id once is allowed")?;
    refused(
        api.patch(
            "production",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"id": "01JGFJJZ00FB0VHNR11EVCTEHY"}})),
        )
        .await,
        "spec.id cannot change once set",
    )?;
    refused(
        api.patch(
            "production",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"id": null}})),
        )
        .await,
        "spec.id cannot be removed once set",
    )?;
    refused(
        api.patch(
            "production",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"metadata": {"postgres": {"host": "pg", "database": "d",
                "credentialsSecretRef": {"name": "c"}}}}}),
            ),
        )
        .await,
        "spec.metadata.postgres cannot be added or removed",
    )?;
    refused(
        api.patch(
            "firebolt",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"metadata": {"postgres": null}}})),
        )
        .await,
        "spec.metadata.postgres cannot be added or removed",
    )?;

    // The three transition rules of auth and TLS, on upstream's auth-tls
    // sample: the signing algorithm and key size are frozen once set, and
    // so is the engine issuer while engine TLS stays enabled.
    let edit = |patch: Value| {
        let api = api.clone();
        async move {
            api.patch(
                "firebolt-auth-tls",
                &PatchParams::default(),
                &Patch::Merge(patch),
            )
            .await
        }
    };
    refused(
        edit(json!({"spec": {"auth": {"local": {"signingAlgorithm": "ES256"}}}})).await,
        "spec.auth.local.signingAlgorithm cannot change once set",
    )?;
    refused(
        edit(json!({"spec": {"auth": {"local": {"signingKeys": {"certManager": {"size": 256}}}}}}))
            .await,
        "spec.auth.local.signingKeys.certManager.size cannot change once set",
    )?;
    refused(
        edit(json!({"spec": {"tls": {"engine": {"certManager": {"issuerRef": {"name": "other-ca"}}}}}}))
            .await,
        "spec.tls.engine.certManager.issuerRef cannot change while engine TLS stays enabled",
    )?;
    // Each rule is about the transition only: other edits go through, and
    // so does the issuer once engine TLS is being disabled.
    edit(json!({"spec": {"auth": {"local": {"signingKeys": {"rotationInterval": "360h"}}}}}))
        .await
        .context("an unfrozen auth field can change")?;
    edit(json!({"spec": {"tls": {"engine": {"enabled": false,
                                              "certManager": {"issuerRef": {"name": "other-ca"}}}}}}))
        .await
        .context("the issuer can change while engine TLS is being disabled")?;

    // metricScrapeMode: only PodIP is served.
    refused(
        create(
            json!({"metadata": {}, "gateway": {}, "metricScrapeMode": "ApiserverProxy"}),
            "x",
        )
        .await?,
        "spec.metricScrapeMode ApiserverProxy is not supported",
    )?;
    create(
        json!({"metadata": {}, "gateway": {}, "metricScrapeMode": "PodIP"}),
        "x",
    )
    .await?
    .context("PodIP is accepted")?;
    Ok(())
}

/// True when every field of `want` is in `have` with the same value
/// (`have` may hold more, such as defaults).
fn contains(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (Value::Object(h), Value::Object(w)) => w
            .iter()
            .all(|(k, v)| h.get(k).is_some_and(|hv| contains(hv, v))),
        (Value::Array(h), Value::Array(w)) => {
            h.len() == w.len() && h.iter().zip(w).all(|(a, b)| contains(a, b))
        }
        (h, w) => h == w,
    }
}

/// The gateway as an instance renders it, run by a real Envoy on loopback
/// (see `wasmop_tests::envoy`): two "ready pods" of engine `eng`, the
/// gateway Deployment's container, the Envoy process.
struct LoopbackGateway {
    envoy: envoy::Envoy,
    ports: envoy::Ports,
    backends: Vec<envoy::Backend>,
    deployment: Deployment,
    _dns: envoy::Dns,
    _op: RunningOperator,
}

impl LoopbackGateway {
    /// The gateway container of the rendered Deployment.
    fn container(&self) -> Result<k8s_openapi::api::core::v1::Container> {
        self.deployment
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|p| p.containers.iter().find(|c| c.name == "envoy"))
            .cloned()
            .context("no envoy container")
    }
}

/// Creates instance `fb` on the API server, takes the gateway config and
/// Deployment the plugin wrote, and runs them in a real Envoy whose engine
/// `eng` resolves to two loopback "pods" answering `slow` paths after
/// `slow`.
async fn loopback_gateway(ns: &TestNamespace, slow: Duration) -> Result<LoopbackGateway> {
    let binary = envoy::binary()?;
    let op = start(ns).await?;
    let api = instances(ns);
    api.create(
        &PostParams::default(),
        &instance_object("fb", json!({"metadata": {}, "gateway": {"replicas": 1}}))?,
    )
    .await?;
    let configmaps: Api<ConfigMap> = ns.api();
    let deployments: Api<Deployment> = ns.api();
    let (config, deployment) = wait_for("the gateway config and Deployment", DEADLINE, || {
        let (configmaps, deployments) = (configmaps.clone(), deployments.clone());
        async move {
            let (Some(cm), Some(d)) = (
                configmaps.get_opt("fb-gateway-config").await?,
                deployments.get_opt("fb-gateway").await?,
            ) else {
                return Ok(None);
            };
            let text = cm
                .data
                .unwrap_or_default()
                .remove("envoy.json")
                .context("no envoy.json")?;
            Ok(Some((serde_json::from_str::<Value>(&text)?, d)))
        }
    })
    .await?;
    // Two ready pods of one engine Service, on loopback addresses of their
    // own (the engine query port is fixed: 3473).
    // The gateway tests of this binary run at once in one process: each
    // call takes addresses of its own (the process id keeps two binaries
    // apart, the counter two calls of one).
    static CALLS: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
    let seed = u8::try_from(std::process::id() % 200).unwrap_or(7) + 20;
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let pods = [[127, seed, 47 + call, 2], [127, seed, 47 + call, 3]];
    let mut backends = Vec::new();
    for p in pods {
        backends.push(envoy::Backend::start(p, 3473, slow).await?);
    }
    let dns = envoy::Dns::start(
        &format!("eng-service.{}.svc.cluster.local", ns.name),
        pods.to_vec(),
    )
    .await?;
    let ports = envoy::Ports::free(dns.port)?;
    let local = envoy::localize(&config, ports, 9090)?;
    let gateway = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.iter().find(|c| c.name == "envoy"))
        .context("no envoy container")?;
    let dir = std::env::temp_dir().join(format!("wasmop-envoy-{}", ns.name));
    let mut proxy = envoy::Envoy::start(
        &binary,
        &dir,
        &local,
        gateway.args.as_deref().unwrap_or_default(),
    )?;
    let ready = wait_for("Envoy to be ready", DEADLINE, || {
        let running = proxy.running();
        async move {
            if !running {
                bail!("envoy exited");
            }
            Ok(envoy::request(ports.metrics, "/ready")
                .await
                .ok()
                .filter(|a| a.status == 200))
        }
    })
    .await;
    if let Err(e) = ready {
        bail!("{e}\nenvoy log:\n{}", proxy.log_tail());
    }
    Ok(LoopbackGateway {
        envoy: proxy,
        ports,
        backends,
        deployment,
        _dns: dns,
        _op: op,
    })
}

/// Queries for one engine reach every ready pod behind its Service, not
/// one address: per-engine sub-clusters of every resolved address.
#[tokio::test]
async fn the_gateway_spreads_queries_over_every_ready_pod_of_an_engine() -> Result<()> {
    let ns = TestNamespace::new("instance-spread").await?;
    let gw = loopback_gateway(&ns, Duration::from_millis(1)).await?;
    for _ in 0..20 {
        let a = envoy::request(gw.ports.queries, "/?engine=eng").await?;
        if a.status != 200 {
            bail!("{a:?}\nenvoy log:\n{}", gw.envoy.log_tail());
        }
    }
    let counts: Vec<usize> = gw.backends.iter().map(envoy::Backend::count).collect();
    assert_eq!(counts.iter().sum::<usize>(), 20, "{counts:?}");
    assert!(
        counts.iter().all(|c| *c >= 5),
        "both ready pods get queries: {counts:?}"
    );
    let no_engine = envoy::request(gw.ports.queries, "/").await?;
    assert_eq!(no_engine.status, 400, "{no_engine:?}");
    Ok(())
}

/// A gateway pod that stops (a roll) runs its preStop as the kubelet does,
/// then gets SIGTERM: a query in flight completes, an idle keep-alive
/// connection does not hold the pod, new connections are served during
/// the hold and refused after the drain, the metrics listener keeps
/// answering, and the grace period covers it all.
#[tokio::test]
async fn a_gateway_roll_does_not_cut_a_query_in_flight() -> Result<()> {
    let ns = TestNamespace::new("instance-drain").await?;
    let slow = Duration::from_secs(8);
    let mut gw = loopback_gateway(&ns, slow).await?;
    let container = gw.container()?;
    let grace = gw
        .deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.termination_grace_period_seconds)
        .unwrap_or(30);
    let command = container
        .lifecycle
        .as_ref()
        .and_then(|l| l.pre_stop.as_ref())
        .and_then(|h| h.exec.as_ref())
        .and_then(|e| e.command.clone())
        .context("no preStop command")?;
    // The pod's admin port is 9901; this Envoy's is another.
    let command: Vec<String> = command
        .iter()
        .map(|part| part.replace("admin_port=9901", &format!("admin_port={}", gw.ports.admin)))
        .collect();

    // A client with an idle keep-alive connection, and a query in flight.
    let mut idle = tokio::io::BufReader::new(
        tokio::net::TcpStream::connect(("127.0.0.1", gw.ports.queries)).await?,
    );
    assert_eq!(
        envoy::request_on(&mut idle, "/?engine=eng").await?.status,
        200
    );
    let slow_started = [
        gw.backends[0].slow_started.clone(),
        gw.backends[1].slow_started.clone(),
    ];
    let queries = gw.ports.queries;
    let in_flight = tokio::spawn(async move {
        let mut conn = tokio::io::BufReader::new(
            tokio::net::TcpStream::connect(("127.0.0.1", queries)).await?,
        );
        let answer = envoy::request_on(&mut conn, "/slow?engine=eng").await;
        let answered = std::time::Instant::now();
        // Drained: the gateway closes the connection after the answer.
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(
            Duration::from_secs(10),
            tokio::io::AsyncReadExt::read_to_end(&mut conn, &mut rest),
        )
        .await
        .is_ok();
        anyhow::Ok((answer?, answered, closed))
    });
    tokio::select! {
        () = slow_started[0].notified() => {}
        () = slow_started[1].notified() => {}
        () = tokio::time::sleep(DEADLINE) => bail!("the slow query never reached an engine pod"),
    }

    // The kubelet runs the preStop hook ...
    let began = std::time::Instant::now();
    let mut hook = tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .kill_on_drop(true)
        .spawn()?;
    // ... during the hold, readiness fails and queries are still served.
    let ready = wait_for("readiness to fail", Duration::from_secs(4), || async {
        let a = envoy::request(gw.ports.metrics, "/ready").await?;
        Ok((a.status == 503).then_some(()))
    })
    .await;
    if let Err(e) = ready {
        bail!("{e}\nenvoy log:\n{}", gw.envoy.log_tail());
    }
    let during = envoy::request(gw.ports.queries, "/?engine=eng")
        .await
        .with_context(|| {
            format!(
                "a request {:?} into the hold\nenvoy log:\n{}",
                began.elapsed(),
                gw.envoy.log_tail()
            )
        })?;
    assert_eq!(during.status, 200, "served during the hold: {during:?}");
    let status = tokio::time::timeout(
        Duration::from_secs(u64::try_from(grace).unwrap_or(30)),
        hook.wait(),
    )
    .await
    .context("the preStop hook outlived the grace period")??;
    let hook_done = std::time::Instant::now();
    assert!(status.success(), "preStop: {status}");

    // The query in flight was answered in full, before the hook returned.
    let (answer, answered, closed) = in_flight.await??;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(
        answer.body.starts_with("slow answer from 127."),
        "{answer:?}"
    );
    assert!(
        answered <= hook_done,
        "the hook returned {:?} before the query was answered",
        answered.duration_since(hook_done)
    );
    assert!(closed, "the drained connection is closed after its answer");
    assert!(
        hook_done.duration_since(answered) < Duration::from_secs(4),
        "the hook returns soon after the last connection: {:?}",
        hook_done.duration_since(answered)
    );
    assert!(
        hook_done.duration_since(began) >= Duration::from_secs(5),
        "the hold"
    );
    assert!(
        i64::try_from(hook_done.duration_since(began).as_secs()).unwrap_or(i64::MAX) < grace,
        "the grace period ({grace} s) covers the drain"
    );
    // The idle keep-alive connection (no query on it) did not hold the
    // hook; new connections are not taken; the metrics listener still
    // answers.
    assert!(
        envoy::request(gw.ports.queries, "/?engine=eng")
            .await
            .is_err(),
        "no new connection after the drain"
    );
    let metrics = envoy::request(gw.ports.metrics, "/stats/prometheus").await?;
    assert_eq!(metrics.status, 200);

    // Then SIGTERM: Envoy exits.
    let pid = gw.envoy.id().context("envoy pid")?;
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()?;
    wait_for("Envoy to exit on SIGTERM", Duration::from_secs(10), || {
        let running = gw.envoy.running();
        async move { Ok((!running).then_some(())) }
    })
    .await?;
    let mut rest = Vec::new();
    let idle_closed = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::io::AsyncReadExt::read_to_end(&mut idle, &mut rest),
    )
    .await
    .is_ok();
    assert!(idle_closed, "the idle connection ends with Envoy");
    Ok(())
}
