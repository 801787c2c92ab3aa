//! The operator's container image, built without a container engine by
//! `deploy/image/oci-image.py` from the binary the test build produced:
//! built twice to the same digest, pushed to a real registry on loopback
//! (`wasmop_tests::registry`), pulled by digest, and its binary run from
//! the extracted layer as the image's user, uid/gid 65532 (`chroot
//! --userspec`: needs root, like the two tests tests/run.sh names), first
//! `--version`, then `run` against the local control plane.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail, ensure};
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;
use wasmop_tests::operator::plugin_path;
use wasmop_tests::registry::Registry;
use wasmop_tests::widgets::TempDir;
use wasmop_tests::{
    DEFAULT_DEADLINE, TestNamespace, apply_test_crds, kubeconfig_path, repo_root, wait_for,
    wasmop_bin,
};

fn image_tool(args: &[&str]) -> Result<String> {
    let out = Command::new("python3")
        .arg(repo_root().join("deploy/image/oci-image.py"))
        .args(args)
        .output()
        .context("running deploy/image/oci-image.py")?;
    ensure!(
        out.status.success(),
        "oci-image.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?.trim().to_owned())
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
    let bin = wasmop_bin()?;
    let bin = bin.to_str().context("binary path")?;
    let dir = TempDir::new("image");
    let (a, b) = (dir.0.join("a"), dir.0.join("b"));
    let first = image_tool(&["build", bin, a.to_str().context("path")?])?;
    let second = image_tool(&["build", bin, b.to_str().context("path")?])?;
    assert!(first.starts_with("sha256:"), "{first}");
    assert_eq!(first, second, "the same binary gives the same digest");

    let registry = Registry::start().await?;
    let pushed = image_tool(&[
        "push",
        a.to_str().context("path")?,
        &format!("{}/wasmop:test", registry.host),
        "--insecure",
    ])?;
    assert_eq!(pushed, format!("{}/wasmop@{first}", registry.host));
    let rootfs = dir.0.join("rootfs");
    image_tool(&[
        "pull",
        &pushed,
        rootfs.to_str().context("path")?,
        "--insecure",
    ])?;

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
