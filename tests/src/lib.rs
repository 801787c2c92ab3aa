//! Test harness for wasmop's integration tests.
//!
//! Every integration test runs against the real local control plane started
//! by `tests/cluster/up.sh` (etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler, kwok). A test asks for a [`TestNamespace`]: a client for
//! that cluster and a fresh namespace, deleted when the value is dropped,
//! also when the test panics.
//!
//! Waiting is always on a condition with a deadline ([`wait_for`]); tests
//! never sleep to synchronise.

pub mod admission;
pub mod apiwrites;
pub mod audit;
pub mod chaos;
pub mod envoy;
pub mod faults;
pub mod injector;
pub mod interpose;
pub mod logs;
pub mod net;
pub mod operator;
pub mod policy;
pub mod registry;
pub mod status;
pub mod widgets;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::json;

/// Field manager the harness uses for its own server-side applies.
pub const FIELD_MANAGER: &str = "wasmop-tests";

/// Default deadline for a wait in an integration test.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(60);

/// Root of the repository (the workspace).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// Path of the local cluster's kubeconfig: `$KUBECONFIG` when set (as
/// `tests/run.sh` does), else the one `tests/cluster/up.sh` writes by default.
pub fn kubeconfig_path() -> PathBuf {
    if let Some(p) = std::env::var_os("KUBECONFIG") {
        return PathBuf::from(p);
    }
    let dir = std::env::var_os("WASMOP_CLUSTER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("wasmop-cluster"));
    dir.join("kubeconfig")
}

/// A client for the local cluster.
///
/// # Errors
/// Fails with a message saying how to start the cluster when its kubeconfig
/// is missing or unreadable.
pub async fn client() -> Result<Client> {
    let path = kubeconfig_path();
    let kubeconfig = Kubeconfig::read_from(&path).with_context(|| {
        format!(
            "cannot read kubeconfig {}: start the local control plane with \
             `bash tests/cluster/up.sh` (or run `bash tests/run.sh`)",
            path.display()
        )
    })?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .context("invalid kubeconfig for the local cluster")?;
    Client::try_from(config).context("cannot build a Kubernetes client")
}

/// Polls `check` until it yields `Some`, or fails after `deadline` with
/// `what` and the last state `check` reported.
///
/// `check` returns `Ok(Some(value))` when the condition holds, `Ok(None)`
/// while it does not, and `Err` for a state worth showing when the deadline
/// passes (the error does not stop the wait; the latest one is reported).
///
/// # Errors
/// When the deadline passes before the condition holds.
pub async fn wait_for<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let start = Instant::now();
    let mut interval = Duration::from_millis(50);
    loop {
        let last = match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => "condition not met yet".to_string(),
            Err(e) => format!("{e:#}"),
        };
        if start.elapsed() >= deadline {
            bail!("timed out after {deadline:?} waiting for {what}; last state: {last}");
        }
        // Poll interval of the wait loop, not a synchronisation sleep: the
        // loop ends on the condition, bounded by the deadline.
        tokio::time::sleep(interval).await;
        interval = (interval * 2).min(Duration::from_millis(500));
    }
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A fresh namespace on the local cluster and a client to use it, deleted
/// when dropped.
pub struct TestNamespace {
    /// Client for the local cluster.
    pub client: Client,
    /// Name of the namespace.
    pub name: String,
    keep: bool,
}

impl TestNamespace {
    /// Creates a namespace named after `prefix` plus a unique suffix.
    ///
    /// # Errors
    /// When the cluster is not reachable or the namespace cannot be created.
    pub async fn new(prefix: &str) -> Result<Self> {
        let client = client().await?;
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .subsec_nanos();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let prefix: String = prefix
            .to_ascii_lowercase()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .take(40)
            .collect();
        let name = format!(
            "{prefix}-{:x}{:x}{n}",
            std::process::id() % 4096,
            nanos % 65536
        );
        let ns: Namespace = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": {"wasmop.dev/test": "true"}}
        }))?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("cannot create namespace {name}"))?;
        Ok(Self {
            client,
            name,
            keep: std::env::var_os("WASMOP_KEEP_NAMESPACES").is_some(),
        })
    }

    /// A typed API for this namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }
}

impl TestNamespace {
    /// `Kind/name` of every object of kind `K` in this namespace matching
    /// `lp`, for messages about what is (still) there.
    ///
    /// # Errors
    /// When the list call fails.
    pub async fn names<K>(&self, lp: &kube::api::ListParams) -> Result<Vec<String>>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        <K as kube::Resource>::DynamicType: Default,
    {
        let kind = K::kind(&Default::default()).to_string();
        Ok(self
            .api::<K>()
            .list(lp)
            .await?
            .items
            .into_iter()
            .filter_map(|o| o.meta().name.clone())
            .map(|n| format!("{kind}/{n}"))
            .collect())
    }
}

impl std::fmt::Debug for TestNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestNamespace")
            .field("name", &self.name)
            .finish()
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if self.keep {
            eprintln!("keeping namespace {} (WASMOP_KEEP_NAMESPACES)", self.name);
            return;
        }
        let name = self.name.clone();
        cleanup_from_drop(move |client| async move {
            Api::<Namespace>::all(client)
                .delete(&name, &DeleteParams::background())
                .await?;
            Ok(())
        });
    }
}

/// Runs the async clean-up `f` (given a client of its own) to its end
/// from a `Drop`, which cannot await: on a separate thread with its own
/// runtime and its own client, since the test's client drives its
/// connections on the test's runtime, which is blocked while this waits.
/// Errors are ignored: it is a clean-up.
pub fn cleanup_from_drop<F, Fut>(f: F)
where
    F: FnOnce(Client) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<()>>,
{
    let done = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        if let Ok(rt) = rt {
            let _ = rt.block_on(async move { f(client().await?).await });
        }
    });
    let _ = done.join();
}

/// Server-side applies every CustomResourceDefinition in the given YAML
/// files and waits until each is Established.
///
/// # Errors
/// When a file cannot be read or parsed, the apply is refused, or a CRD is
/// not Established within the deadline.
pub async fn apply_crd_files(client: &Client, files: &[PathBuf]) -> Result<Vec<String>> {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    let mut names = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value = <serde_json::Value as serde::Deserialize>::deserialize(doc)
                .with_context(|| format!("invalid YAML in {}", file.display()))?;
            if value.is_null() {
                continue;
            }
            if value["kind"] != "CustomResourceDefinition" {
                continue;
            }
            let crd: CustomResourceDefinition = serde_json::from_value(value)
                .with_context(|| format!("invalid CRD in {}", file.display()))?;
            let name = crd
                .metadata
                .name
                .clone()
                .ok_or_else(|| anyhow!("CRD without a name in {}", file.display()))?;
            api.patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&crd),
            )
            .await
            .with_context(|| format!("cannot apply CRD {name} from {}", file.display()))?;
            names.push(name);
        }
    }
    for name in &names {
        wait_for(&format!("CRD {name} Established"), DEFAULT_DEADLINE, || {
            let api = api.clone();
            let name = name.clone();
            async move {
                let crd = api.get(&name).await?;
                let established = crd
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                Ok(established.then_some(()))
            }
        })
        .await?;
    }
    Ok(names)
}

/// Applies every CRD YAML file in the repository's `crds/` folder, and
/// cert-manager's CRDs ([`cert_manager_crd_dir`]), which the `instance` and
/// `engine` plugins own Certificates of.
///
/// # Errors
/// As [`apply_crd_files`], and when cert-manager's CRDs have not been
/// fetched (`tests/cluster/build.sh` does it).
pub async fn apply_project_crds(client: &Client) -> Result<Vec<String>> {
    let mut files = yaml_files(&repo_root().join("crds"))?;
    files.extend(yaml_files(&cert_manager_crd_dir()?)?);
    apply_crd_files(client, &files).await
}

fn yaml_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    Ok(files)
}

/// Where `tests/cluster/build.sh` keeps cert-manager's CRDs:
/// A version pinned in `tests/cluster/versions.env` (`KEY=value`).
///
/// # Errors
/// When the file is unreadable or does not pin `key`.
pub fn pinned_version(key: &str) -> Result<String> {
    let versions = repo_root().join("tests/cluster/versions.env");
    let text = std::fs::read_to_string(&versions)
        .with_context(|| format!("cannot read {}", versions.display()))?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix(key)?.strip_prefix('='))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .ok_or_else(|| anyhow!("{} pins no {key}", versions.display()))
}

/// The `wasmop` binary `tests/run.sh` builds before the tests:
/// `$WASMOP_BIN`, else `$CARGO_TARGET_DIR/debug/wasmop`, else
/// `target/debug/wasmop`.
///
/// # Errors
/// When it does not exist (with what to run).
pub fn wasmop_bin() -> Result<PathBuf> {
    let path = std::env::var_os("WASMOP_BIN")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("CARGO_TARGET_DIR").map(|d| PathBuf::from(d).join("debug/wasmop"))
        })
        .unwrap_or_else(|| repo_root().join("target/debug/wasmop"));
    if !path.is_file() {
        bail!(
            "{} not found: build it first (`cargo build -p wasmop`, as tests/run.sh does)",
            path.display()
        );
    }
    Ok(path)
}

/// The cache of built tools, as `tests/cluster/lib.sh` resolves it.
///
/// # Errors
/// When neither `WASMOP_CACHE`, `XDG_CACHE_HOME` nor `HOME` is set.
pub fn wasmop_cache() -> Result<PathBuf> {
    std::env::var_os("WASMOP_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("wasmop")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/wasmop")))
        .ok_or_else(|| anyhow!("neither WASMOP_CACHE, XDG_CACHE_HOME nor HOME is set"))
}

/// `$WASMOP_CACHE/crds/cert-manager-<CERT_MANAGER_VERSION>` (the cache as
/// `tests/cluster/lib.sh` resolves it, the version from `versions.env`).
///
/// # Errors
/// When the version is not pinned or the directory does not exist (with
/// what to run).
pub fn cert_manager_crd_dir() -> Result<PathBuf> {
    cached_crd_dir("CERT_MANAGER_VERSION", "cert-manager")
}

/// Where `tests/cluster/build.sh` keeps Gateway API's standard CRDs:
/// `$WASMOP_CACHE/crds/gateway-api-<GATEWAY_API_VERSION>`.
///
/// # Errors
/// As [`cert_manager_crd_dir`].
pub fn gateway_api_crd_dir() -> Result<PathBuf> {
    cached_crd_dir("GATEWAY_API_VERSION", "gateway-api")
}

/// Where `tests/cluster/build.sh` keeps Istio's CRDs:
/// `$WASMOP_CACHE/crds/istio-<ISTIO_API_VERSION>`.
///
/// # Errors
/// As [`cert_manager_crd_dir`].
pub fn istio_crd_dir() -> Result<PathBuf> {
    cached_crd_dir("ISTIO_API_VERSION", "istio")
}

/// Applies Gateway API's standard CRDs ([`gateway_api_crd_dir`]).
///
/// # Errors
/// As [`apply_crd_files`].
pub async fn apply_gateway_api_crds(client: &Client) -> Result<Vec<String>> {
    apply_crd_files(client, &yaml_files(&gateway_api_crd_dir()?)?).await
}

/// Applies Istio's CRDs ([`istio_crd_dir`]).
///
/// # Errors
/// As [`apply_crd_files`].
pub async fn apply_istio_crds(client: &Client) -> Result<Vec<String>> {
    apply_crd_files(client, &yaml_files(&istio_crd_dir()?)?).await
}

/// Deletes the named CRDs and waits until each is gone (with every object
/// of its kind).
///
/// # Errors
/// When a delete is refused or a CRD is still there at the deadline.
pub async fn delete_crds(client: &Client, names: &[String]) -> Result<()> {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    for name in names {
        match api.delete(name, &kube::api::DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e).with_context(|| format!("cannot delete CRD {name}")),
        }
    }
    for name in names {
        wait_for(&format!("CRD {name} gone"), DEFAULT_DEADLINE, || {
            let api = api.clone();
            let name = name.clone();
            async move { Ok(api.get_opt(&name).await?.is_none().then_some(())) }
        })
        .await?;
    }
    Ok(())
}

/// The CRD names in the YAML files of `dir`.
///
/// # Errors
/// When a file cannot be read or parsed.
pub fn crd_names_in(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for file in yaml_files(dir)? {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value = <serde_json::Value as serde::Deserialize>::deserialize(doc)
                .with_context(|| format!("invalid YAML in {}", file.display()))?;
            if value["kind"] == "CustomResourceDefinition"
                && let Some(name) = value["metadata"]["name"].as_str()
            {
                names.push(name.to_owned());
            }
        }
    }
    Ok(names)
}

fn cached_crd_dir(version_key: &str, name: &str) -> Result<PathBuf> {
    let version = pinned_version(version_key)?;
    let cache = wasmop_cache()?;
    let dir = cache.join(format!("crds/{name}-{version}"));
    if !dir.is_dir() {
        bail!(
            "{name} {version} CRDs not found in {}: run `bash tests/cluster/build.sh`",
            dir.display()
        );
    }
    Ok(dir)
}

/// Applies the CRDs of the test plugins' kinds (every YAML file in
/// `tests/fixtures/crds/`).
///
/// # Errors
/// As [`apply_crd_files`].
pub async fn apply_test_crds(client: &Client) -> Result<Vec<String>> {
    let dir = repo_root().join("tests/fixtures/crds");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    apply_crd_files(client, &files).await
}
