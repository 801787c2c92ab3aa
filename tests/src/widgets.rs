//! The `Widget` kind of the test plugins (`good`, `good-v2`,
//! `good-pruner`), and a temporary plugin directory for hot-swap tests.

use std::path::{Path, PathBuf};

use anyhow::Result;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;
use wasmop::delivery::hotswap::{PluginDir, ScanReport};

use crate::TestNamespace;

/// The Widgets of `ns`.
pub fn widgets(ns: &TestNamespace) -> Api<DynamicObject> {
    widgets_in(&ns.client, &ns.name)
}

/// The Widgets of namespace `ns`, through `client`.
pub fn widgets_in(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("test.wasmop.dev", "v1", "Widget");
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(&gvk, "widgets"),
    )
}

/// Widget `w<i>` with `spec.value` `v<i>`, as the benches create them.
///
/// # Errors
/// Never in practice (a fixed shape); typed for `?`.
pub fn numbered_widget(i: usize) -> anyhow::Result<DynamicObject> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
        "metadata": {"name": format!("w{i}")}, "spec": {"value": format!("v{i}")},
    }))?)
}

/// Creates Widget `name` in `ns` with `spec.value` = its name.
///
/// # Errors
/// When the API server refuses it.
pub async fn create_widget(ns: &TestNamespace, name: &str) -> Result<()> {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
        "metadata": {"name": name}, "spec": {"value": name},
    }))?;
    widgets(ns).create(&PostParams::default(), &obj).await?;
    Ok(())
}

/// A temporary directory, removed on drop.
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A new empty directory named after `prefix`, the process and the time.
    ///
    /// # Panics
    /// When the directory cannot be created.
    pub fn new(prefix: &str) -> Self {
        let p = std::env::temp_dir().join(format!(
            "{prefix}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos()
        ));
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Replaces `dst` atomically with the bytes of `src` (write + rename, as a
/// ConfigMap volume update does).
///
/// # Errors
/// When either file cannot be written.
pub fn install(src: &Path, dst: &Path) -> Result<()> {
    let tmp = dst.with_extension("tmp");
    std::fs::copy(src, &tmp)?;
    std::fs::rename(&tmp, dst)?;
    Ok(())
}

/// Scans until a change to the directory has been applied (a changed file
/// is read once it held still for one scan).
pub async fn settle(plugins: &mut PluginDir) -> ScanReport {
    let first = plugins.scan(true).await;
    let second = plugins.scan(true).await;
    ScanReport {
        activated: [first.activated, second.activated].concat(),
        rejected: [first.rejected, second.rejected].concat(),
        removed: [first.removed, second.removed].concat(),
    }
}

/// Creates Widgets `w0` … `w<n-1>` ([`numbered_widget`]) through `api`,
/// `concurrency` at a time, as the benches fill a namespace.
///
/// # Errors
/// The first create the API server refused.
pub async fn create_numbered(
    api: &Api<DynamicObject>,
    n: usize,
    concurrency: usize,
) -> anyhow::Result<()> {
    use futures::StreamExt;
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(0..n)
        .map(|i| async move {
            api.create(&kube::api::PostParams::default(), &numbered_widget(i)?)
                .await?;
            Ok(())
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    results.into_iter().collect()
}
