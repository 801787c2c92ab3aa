//! Proves that every component of the local control plane is real and
//! working: the API server and etcd (CRDs and custom resources round-trip),
//! the scheduler and kwok (a Deployment's Pod is bound to the fake Node and
//! becomes Ready), the controller-manager (ReplicaSets, garbage collection,
//! Jobs). Each assertion fails when its component is missing.

use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;
use wasmop_tests::{DEFAULT_DEADLINE, TestNamespace, apply_test_crds, wait_for};

fn from_json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("test object is valid")
}

#[tokio::test]
async fn crd_and_custom_resource_round_trip_through_apiserver_and_etcd() -> Result<()> {
    let ns = TestNamespace::new("smoke-crd").await?;
    let crds = apply_test_crds(&ns.client).await?;
    assert!(crds.contains(&"widgets.test.wasmop.dev".to_string()));

    let gvk = GroupVersionKind::gvk("test.wasmop.dev", "v1", "Widget");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "widgets");
    let api: Api<DynamicObject> = Api::namespaced_with(ns.client.clone(), &ns.name, &ar);
    let obj: DynamicObject = from_json(json!({
        "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
        "metadata": {"name": "w1"}, "spec": {"value": "hello"}
    }));
    let created = api.create(&PostParams::default(), &obj).await?;
    assert!(
        created.metadata.uid.is_some(),
        "the API server assigns a UID"
    );
    let read = api.get("w1").await?;
    assert_eq!(read.data["spec"]["value"], "hello");
    Ok(())
}

#[tokio::test]
async fn deployment_pod_is_scheduled_to_the_fake_node_and_ready() -> Result<()> {
    let ns = TestNamespace::new("smoke-deploy").await?;
    let nodes: Api<Node> = Api::all(ns.client.clone());
    let fake = nodes.list(&ListParams::default()).await?;
    let node_name = fake
        .items
        .iter()
        .find(|n| {
            n.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.get("kwok.x-k8s.io/node").is_some_and(|v| v == "fake"))
        })
        .and_then(|n| n.metadata.name.clone())
        .expect("a kwok-managed Node exists");

    let deployments: Api<Deployment> = ns.api();
    let d: Deployment = from_json(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "example.invalid/web:1"}]}
            }
        }
    }));
    deployments.create(&PostParams::default(), &d).await?;

    let pods: Api<Pod> = ns.api();
    let pod = wait_for(
        "the Deployment's Pod to be bound to the fake Node and Ready",
        DEFAULT_DEADLINE,
        || {
            let pods = pods.clone();
            async move {
                let list = pods.list(&ListParams::default().labels("app=web")).await?;
                Ok(list.items.into_iter().find(|p| {
                    p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        })
                }))
            }
        },
    )
    .await?;
    let spec = pod.spec.expect("pod has a spec");
    assert_eq!(spec.node_name.as_deref(), Some(node_name.as_str()));
    // The Pod was created by a ReplicaSet: the controller-manager is running.
    let owner = &pod.metadata.owner_references.expect("pod has an owner")[0];
    assert_eq!(owner.kind, "ReplicaSet");

    wait_for(
        "the Deployment to report one available replica",
        DEFAULT_DEADLINE,
        || {
            let deployments = deployments.clone();
            async move {
                let d = deployments.get("web").await?;
                let available = d.status.and_then(|s| s.available_replicas).unwrap_or(0);
                Ok((available == 1).then_some(()))
            }
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn garbage_collector_removes_objects_whose_owner_is_deleted() -> Result<()> {
    let ns = TestNamespace::new("smoke-gc").await?;
    let cms: Api<ConfigMap> = ns.api();
    let owner: ConfigMap = from_json(json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}
    }));
    let owner = cms.create(&PostParams::default(), &owner).await?;
    let uid = owner.metadata.uid.clone().expect("uid");
    let child: ConfigMap = from_json(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": "child",
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid,
                "controller": true, "blockOwnerDeletion": true
            }]
        }
    }));
    cms.create(&PostParams::default(), &child).await?;
    assert!(cms.get_opt("child").await?.is_some());

    cms.delete("owner", &DeleteParams::background()).await?;
    // Longer than the default: late in the suite (twice in CI, after the
    // chaos tests had restarted the controller manager and other tests had
    // added and removed CRDs) the collection took more than 60 s; a
    // collector that never comes still fails here.
    wait_for(
        "the garbage collector to delete the owned ConfigMap",
        Duration::from_secs(180),
        || {
            let cms = cms.clone();
            async move { Ok(cms.get_opt("child").await?.is_none().then_some(())) }
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn job_runs_to_completion() -> Result<()> {
    let ns = TestNamespace::new("smoke-job").await?;
    let jobs: Api<Job> = ns.api();
    let job: Job = from_json(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "once"},
        "spec": {
            "backoffLimit": 0,
            "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "run", "image": "example.invalid/run:1"}]
            }}
        }
    }));
    jobs.create(&PostParams::default(), &job).await?;
    let done = wait_for(
        "the Job to complete",
        DEFAULT_DEADLINE + Duration::from_secs(30),
        || {
            let jobs = jobs.clone();
            async move {
                let j = jobs.get("once").await?;
                let status = j.status.unwrap_or_default();
                Ok(status
                    .conditions
                    .unwrap_or_default()
                    .into_iter()
                    .find(|c| c.type_ == "Complete" && c.status == "True"))
            }
        },
    )
    .await?;
    assert_eq!(done.status, "True");
    let succeeded = jobs.get("once").await?.status.and_then(|s| s.succeeded);
    assert_eq!(succeeded, Some(1));
    Ok(())
}

#[tokio::test]
async fn deploy_manifests_are_accepted_by_the_api_server() -> Result<()> {
    // Server-side dry run: every object of deploy/wasmop.yaml and
    // deploy/rbac.yaml passes the API server's validation (schemas, RBAC
    // rule shapes) without being stored.
    let ns = TestNamespace::new("smoke-deploy-manifests").await?;
    let client = ns.client.clone();
    let mut text = String::new();
    for file in ["deploy/wasmop.yaml", "deploy/rbac.yaml"] {
        text.push_str(&std::fs::read_to_string(
            wasmop_tests::repo_root().join(file),
        )?);
        text.push_str("\n---\n");
    }
    let mut kinds = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value = <serde_json::Value as serde::Deserialize>::deserialize(doc)?;
        if value.is_null() {
            continue;
        }
        let mut obj: DynamicObject = serde_json::from_value(value.clone())?;
        // Namespaced objects go to the test's namespace (the manifest's own
        // Namespace is dry-run created, so it does not exist).
        if obj.metadata.namespace.is_some() {
            obj.metadata.namespace = Some(ns.name.clone());
        } else if let Some(name) = &obj.metadata.name {
            // Cluster-scoped objects get a name of this test's own: the
            // objects themselves may exist already (run-local.sh --rbac
            // installs them), and a dry-run create of an existing name is
            // refused before it is validated.
            obj.metadata.name = Some(format!("{name}-{}", ns.name));
        }
        let types = obj.types.clone().expect("apiVersion and kind");
        let (group, version) = match types.api_version.split_once('/') {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (String::new(), types.api_version.clone()),
        };
        let gvk = GroupVersionKind::gvk(&group, &version, &types.kind);
        let (ar, caps) = kube::discovery::pinned_kind(&client, &gvk).await?;
        let api: Api<DynamicObject> = match (&obj.metadata.namespace, caps.scope) {
            (Some(ns), kube::discovery::Scope::Namespaced) => {
                Api::namespaced_with(client.clone(), ns, &ar)
            }
            _ => Api::all_with(client.clone(), &ar),
        };
        let pp = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        if let Err(e) = api.create(&pp, &obj).await {
            anyhow::bail!("{} {:?} refused: {e}", types.kind, obj.metadata.name);
        }
        kinds.push(types.kind);
    }
    assert!(
        kinds.contains(&"Deployment".to_string()) && kinds.contains(&"ClusterRole".to_string()),
        "{kinds:?}"
    );
    Ok(())
}
