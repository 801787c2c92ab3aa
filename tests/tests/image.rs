//! The operator's container image, built without a container engine by
//! `deploy/image/build.sh` (a layer tar made by GNU tar, made an image and
//! pushed by crane) from the binary the test build produced: built twice
//! to the same digest, once pushed to a real registry on loopback
//! (`wasmop_tests::registry`) and once not, pulled back by digest and its
//! filesystem exported (`crane export`), and its binary run from the
//! extracted layer as the image's user, uid/gid 65532 (`chroot
//! --userspec`: needs root, like the two tests tests/run.sh names), first
//! `--version`, then `run` against the local control plane. And the image
//! by digest where the operator is deployed: `deploy/image/build.sh --push
//! --manifest` writes deploy/wasmop.yaml naming the pushed digest, and the
//! chart with `image.digest` names it too; the API server accepts both
//! Deployments so (server-side dry run).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde::Deserialize;
use serde_json::json;
use wasmop_tests::operator::plugin_path;
use wasmop_tests::registry::Registry;
use wasmop_tests::widgets::TempDir;
use wasmop_tests::{
    DEFAULT_DEADLINE, TestNamespace, apply_test_crds, kubeconfig_path, pinned_version, repo_root,
    wait_for, wasmop_bin, wasmop_cache,
};

/// `bash deploy/image/build.sh ARGS...` with the test build's binary: its
/// standard output, trimmed.
fn build_image(args: &[&str]) -> Result<String> {
    let out = Command::new("bash")
        .arg(repo_root().join("deploy/image/build.sh"))
        .args(args)
        .env("WASMOP_BIN", wasmop_bin()?)
        .output()
        .context("running deploy/image/build.sh")?;
    ensure!(
        out.status.success(),
        "build.sh {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?.trim().to_owned())
}

/// crane, as `tests/cluster/build.sh` builds it (`CRANE_VERSION`).
fn crane() -> Result<PathBuf> {
    let version = pinned_version("CRANE_VERSION")?;
    let crane = wasmop_cache()?.join(format!("bin/crane-{version}/crane"));
    ensure!(
        crane.is_file(),
        "crane {version} not found at {}: run `bash tests/cluster/build.sh crane`",
        crane.display()
    );
    Ok(crane)
}

/// Runs `command`, failing with its standard error when it fails.
fn run(command: &mut Command) -> Result<()> {
    let out = command
        .output()
        .with_context(|| format!("running {command:?}"))?;
    ensure!(
        out.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// `chroot --userspec=65532:65532 ROOTFS ARGS...`.
fn as_image_user(rootfs: &Path, args: &[&str]) -> Command {
    let mut c = Command::new("chroot");
    c.arg("--userspec=65532:65532").arg(rootfs).args(args);
    c.env("HOME", "/home/nonroot");
    c
}

#[tokio::test]
async fn the_image_builds_reproducibly_and_its_binary_runs_as_65532_from_the_pulled_layer()
-> Result<()> {
    let dir = TempDir::new("image");
    let registry = Registry::start().await?;
    let pushed = build_image(&[
        "--push",
        &format!("{}/wasmop:test", registry.host),
        "--insecure",
    ])?;
    let again = build_image(&[])?;
    assert!(again.starts_with("sha256:"), "{again}");
    assert_eq!(
        pushed,
        format!("{}/wasmop@{again}", registry.host),
        "the same binary gives the same digest"
    );

    // Pulled by digest (crane checks the manifest's), its one layer extracted
    // as root keeps the owners it names.
    let layer = dir.0.join("layer.tar");
    run(Command::new(crane()?)
        .args(["export", &pushed])
        .arg(&layer)
        .arg("--insecure"))?;
    let rootfs = dir.0.join("rootfs");
    std::fs::create_dir_all(&rootfs)?;
    run(Command::new("tar")
        .arg("-xf")
        .arg(&layer)
        .arg("-C")
        .arg(&rootfs)
        .arg("--numeric-owner"))?;
    let home = std::fs::metadata(rootfs.join("home/nonroot"))?;
    assert_eq!(
        (home.uid(), home.gid(), home.mode() & 0o7777),
        (65532, 65532, 0o700),
        "/home/nonroot is the image user's"
    );

    let version = as_image_user(&rootfs, &["/wasmop", "--version"]).output()?;
    assert!(
        version.status.success(),
        "{}",
        String::from_utf8_lossy(&version.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("wasmop {}", env!("CARGO_PKG_VERSION"))
    );

    // `run` from the image against the control plane, as 65532.
    let ns = TestNamespace::new("image").await?;
    apply_test_crds(&ns.client).await?;
    std::fs::copy(plugin_path("good")?, rootfs.join("plugins/good.wasm"))?;
    let kubeconfig = rootfs.join("tmp/kubeconfig");
    std::fs::copy(kubeconfig_path(), &kubeconfig)?;
    std::fs::set_permissions(
        &kubeconfig,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )?;
    let mut child = as_image_user(
        &rootfs,
        &[
            "/wasmop",
            "run",
            "--plugins",
            "/plugins",
            "--kubeconfig",
            "/tmp/kubeconfig",
            "--namespace",
            &ns.name,
        ],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::inherit())
    .spawn()
    .context("spawning wasmop run from the image")?;
    let pid = child.id();
    let result = async {
        let gvk = GroupVersionKind::gvk("test.wasmop.dev", "v1", "Widget");
        let widgets: Api<DynamicObject> = Api::namespaced_with(
            ns.client.clone(),
            &ns.name,
            &ApiResource::from_gvk_with_plural(&gvk, "widgets"),
        );
        let w: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
            "metadata": {"name": "w"}, "spec": {"value": "from-the-image"},
        }))?;
        widgets.create(&PostParams::default(), &w).await?;
        wait_for(
            "Widget w reconciled by the image's binary",
            DEFAULT_DEADLINE,
            || {
                let widgets = widgets.clone();
                async move {
                    let w = widgets.get("w").await?;
                    let ok = w.data["status"]["conditions"].as_array().is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c["type"] == "Reconciled" && c["status"] == "True")
                    });
                    Ok(ok.then_some(()))
                }
            },
        )
        .await?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let uid = status
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .context("no Uid line")?;
        if uid.split_whitespace().skip(1).any(|id| id != "65532") {
            bail!("the operator runs as {uid}, not 65532");
        }
        Ok::<(), anyhow::Error>(())
    }
    .await;
    let _ = child.kill();
    let _ = child.wait();
    result
}

/// The one Deployment of multi-document YAML `text`, as the API server
/// would store it in `ns` (server-side dry run: validated, defaulted,
/// nothing written).
async fn dry_run_deployment(ns: &TestNamespace, text: &str) -> Result<Deployment> {
    let mut found = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let value = serde_json::Value::deserialize(doc)?;
        if value["kind"] == "Deployment" {
            found.push(value);
        }
    }
    ensure!(
        found.len() == 1,
        "{} Deployments in the manifest",
        found.len()
    );
    let mut deployment: Deployment = serde_json::from_value(found.remove(0))?;
    deployment.metadata.namespace = None;
    let api: Api<Deployment> = ns.api();
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    Ok(api.create(&params, &deployment).await?)
}

/// The image of the Deployment's only container.
fn image_of(d: &Deployment) -> Option<String> {
    let pod = d.spec.as_ref()?.template.spec.as_ref()?;
    match pod.containers.as_slice() {
        [only] => only.image.clone(),
        _ => None,
    }
}

/// Issue 40: `image@digest` for `deploy/wasmop.yaml` and the chart, from
/// the digest `build.sh --push` pushed.
#[tokio::test]
async fn the_manifest_and_the_chart_run_the_pushed_image_by_digest() -> Result<()> {
    let dir = TempDir::new("image-digest");
    let registry = Registry::start().await?;
    let manifest = dir.0.join("wasmop.yaml");
    // A manifest for nothing pushed is refused.
    let refused = Command::new("bash")
        .arg(repo_root().join("deploy/image/build.sh"))
        .args(["--manifest", manifest.to_str().context("path")?])
        .env("WASMOP_BIN", wasmop_bin()?)
        .output()?;
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--manifest needs --push"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    let layout = dir.0.join("layout");
    let pushed = build_image(&[
        "--out",
        layout.to_str().context("path")?,
        "--push",
        &format!("{}/wasmop:digest", registry.host),
        "--insecure",
        "--manifest",
        manifest.to_str().context("path")?,
    ])?;
    let repository = format!("{}/wasmop", registry.host);
    let digest = pushed
        .strip_prefix(&format!("{repository}@"))
        .with_context(|| format!("{pushed} is not {repository}@DIGEST"))?
        .to_owned();
    assert!(
        digest.len() == 71
            && digest.starts_with("sha256:")
            && digest[7..].bytes().all(|b| b.is_ascii_hexdigit()),
        "{digest}"
    );
    // --out: the same image as an OCI image layout.
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(layout.join("index.json"))?)?;
    assert_eq!(index["manifests"][0]["digest"], digest.as_str());
    ensure!(
        layout.join("blobs/sha256").join(&digest[7..]).is_file(),
        "the layout holds no manifest {digest}"
    );

    // deploy/wasmop.yaml with the one image line changed.
    let original = std::fs::read_to_string(repo_root().join("deploy/wasmop.yaml"))?;
    let written = std::fs::read_to_string(&manifest)?;
    assert_eq!(original.lines().count(), written.lines().count());
    let changed: Vec<(&str, &str)> = original
        .lines()
        .zip(written.lines())
        .filter(|(a, b)| a != b)
        .collect();
    assert_eq!(changed.len(), 1, "{changed:?}");
    assert_eq!(changed[0].1.trim(), format!("image: {pushed}"));

    let ns = TestNamespace::new("image-digest").await?;
    let from_manifest = dry_run_deployment(&ns, &written).await?;
    assert_eq!(image_of(&from_manifest).as_deref(), Some(pushed.as_str()));

    // The chart with image.digest.
    let helm = wasmop_cache()?.join(format!("bin/helm-{}/helm", pinned_version("HELM_VERSION")?));
    ensure!(
        helm.is_file(),
        "helm not found at {}: run `bash tests/cluster/build.sh`",
        helm.display()
    );
    let rendered = Command::new(&helm)
        .arg("template")
        .arg("wasmop")
        .arg(repo_root().join("deploy/chart"))
        .args(["-n", &ns.name, "--set"])
        .arg(format!("image.repository={repository}"))
        .arg("--set")
        .arg(format!("image.digest={digest}"))
        .env("HELM_CACHE_HOME", dir.0.join("helm/cache"))
        .env("HELM_CONFIG_HOME", dir.0.join("helm/config"))
        .env("HELM_DATA_HOME", dir.0.join("helm/data"))
        .output()?;
    ensure!(
        rendered.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&rendered.stderr)
    );
    let from_chart = dry_run_deployment(&ns, &String::from_utf8(rendered.stdout)?).await?;
    assert_eq!(image_of(&from_chart).as_deref(), Some(pushed.as_str()));
    Ok(())
}
