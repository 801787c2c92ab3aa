//! The CelldFleet API as the plugin reads it (`crds/celld.eric.dev_celldfleets.yaml`).
//!
//! Only the fields the plugin acts on are typed; the rest of the spec
//! (most of previews) is accepted by the CRD and carried through
//! untouched. The fixed and tuning parts are also read as raw JSON
//! ([`fixed_config`], [`tuning`]) so their hashes do not depend on which
//! fields this crate happens to type.

use serde::Deserialize;
use serde_json::{Map, Value, json};
use wasmop_sdk::KindRef;

/// API group of every celld kind.
pub const GROUP: &str = "celld.eric.dev";
/// API version of every celld kind.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of every celld kind.
pub const API_VERSION: &str = "celld.eric.dev/v1alpha1";

/// The CelldFleet kind.
pub fn fleet_kind() -> KindRef {
    KindRef::namespaced(GROUP, VERSION, "CelldFleet", "celldfleets")
}

/// The cluster-scoped CelldStorageReservation kind.
pub fn reservation_kind() -> KindRef {
    KindRef::cluster_scoped(
        GROUP,
        VERSION,
        "CelldStorageReservation",
        "celldstoragereservations",
    )
}

/// A CelldFleet.
#[derive(Clone, Debug, Deserialize)]
pub struct Fleet {
    /// Object metadata.
    pub metadata: Meta,
    /// The request.
    pub spec: FleetSpec,
}

/// The metadata the plugin uses.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Meta {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// UID: the identity every owned object and the reservation is bound to.
    pub uid: String,
    /// Generation.
    pub generation: Option<i64>,
    /// Annotations (the retained `celld.eric.dev/istio-control-plane`).
    pub annotations: Map<String, Value>,
}

/// `spec` of a CelldFleet.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetSpec {
    /// `Bucket` or `PersistentFleet`.
    pub profile: String,
    /// `Deployment` (default) or `Ordered`; Bucket only.
    #[serde(default)]
    pub bucket_workload: Option<String>,
    /// Desired members (default 3).
    #[serde(default)]
    pub replicas: Option<i32>,
    /// Existing ServiceAccount of the members.
    pub service_account_name: String,
    /// The dedicated bucket and claim settings.
    pub storage: Storage,
    /// Zones.
    pub placement: Placement,
    /// Digest-pinned celld image.
    #[serde(default)]
    pub runtime_image: Option<String>,
    /// Pause and restart requests.
    #[serde(default)]
    pub maintenance: Option<Maintenance>,
    /// Per-member sizing.
    #[serde(default)]
    pub execution: Option<Execution>,
    /// Shutdown budget.
    #[serde(default)]
    pub lifecycle: Option<Lifecycle>,
    /// Extra CELLD_ variables.
    #[serde(default)]
    pub env: Option<Vec<EnvEntry>>,
    /// OTLP export.
    #[serde(default)]
    pub telemetry: Option<Telemetry>,
    /// Change export.
    #[serde(default)]
    pub export: Option<Export>,
    /// Service mesh.
    #[serde(default)]
    pub mesh: Option<Mesh>,
    /// Preview pool configuration (raw; set once, immutable).
    #[serde(default)]
    pub previews: Option<Value>,
    /// Capacity policy (raw): only `External` is served (see `validate`).
    #[serde(default)]
    pub capacity: Option<Value>,
}

/// `spec.mesh`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Mesh {
    /// Istio sidecar mesh.
    pub istio: Option<Istio>,
}

/// `spec.mesh.istio`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Istio {
    /// `AllowAll` (default) or `Policies`.
    pub application_access: Option<String>,
    /// Namespace of istiod (default `istio-system`).
    pub control_plane_namespace: Option<String>,
}

impl Istio {
    /// The istiod namespace.
    pub fn control_plane(&self) -> &str {
        self.control_plane_namespace
            .as_deref()
            .filter(|n| !n.is_empty())
            .unwrap_or("istio-system")
    }

    /// Port 8080 open to any caller.
    pub fn allow_all(&self) -> bool {
        self.application_access.as_deref() != Some("Policies")
    }
}

impl FleetSpec {
    /// True for the PersistentFleet profile.
    pub fn persistent(&self) -> bool {
        self.profile == "PersistentFleet"
    }

    /// True when the members run in a StatefulSet (Ordered Bucket or PersistentFleet).
    pub fn stateful(&self) -> bool {
        self.persistent() || self.bucket_workload.as_deref() == Some("Ordered")
    }

    /// Desired replicas with the CRD default.
    pub fn replicas(&self) -> i32 {
        self.replicas.unwrap_or(3)
    }

    /// `maintenance.paused`.
    pub fn paused(&self) -> bool {
        self.maintenance
            .as_ref()
            .is_some_and(|m| m.paused == Some(true))
    }

    /// `maintenance.restartToken`, empty when none.
    pub fn restart_token(&self) -> &str {
        self.maintenance
            .as_ref()
            .and_then(|m| m.restart_token.as_deref())
            .unwrap_or("")
    }

    /// `spec.mesh.istio`, when the fleet is in the mesh.
    pub fn istio(&self) -> Option<&Istio> {
        self.mesh.as_ref().and_then(|m| m.istio.as_ref())
    }

    /// True when placement is Relaxed (preferred spreading).
    pub fn relaxed(&self) -> bool {
        self.placement.mode.as_deref() == Some("Relaxed")
    }
}

/// `spec.storage`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Storage {
    /// The dedicated bucket.
    pub bucket: String,
    /// Its region.
    pub region: String,
    /// Claim or scratch size in GiB (default 10).
    #[serde(default, rename = "sizeGiB")]
    pub size_gib: Option<i64>,
    /// PersistentFleet claim StorageClass.
    #[serde(default)]
    pub storage_class_name: Option<String>,
    /// One path segment inside the bucket (preview children).
    #[serde(default)]
    pub prefix: Option<String>,
    /// Custom object-store endpoint.
    #[serde(default)]
    pub endpoint: Option<Endpoint>,
    /// Scratch emptyDir request/limit (preview children).
    #[serde(default)]
    pub scratch: Option<Scratch>,
    /// The preview pool (a fleet with `spec.previews`) a preview fleet
    /// runs under; set together with `prefix`.
    #[serde(default)]
    pub preview_fleet_ref: Option<FleetRef>,
}

/// `storage.previewFleetRef`.
#[derive(Clone, Debug, Deserialize)]
pub struct FleetRef {
    /// The pool fleet's name.
    pub name: String,
    /// Its UID.
    pub uid: String,
}

impl Storage {
    /// `s3://bucket[/prefix]`, the value of CELLD_BUCKET.
    pub fn url(&self) -> String {
        match self.prefix.as_deref().filter(|p| !p.is_empty()) {
            Some(prefix) => format!("s3://{}/{prefix}", self.bucket),
            None => format!("s3://{}", self.bucket),
        }
    }

    /// Size in GiB with the CRD default.
    pub fn size_gib(&self) -> i64 {
        self.size_gib.unwrap_or(10)
    }
}

/// `spec.storage.endpoint`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// `http(s)://host[:port]`.
    pub url: String,
    /// Secret with `accessKeyId` and `secretAccessKey`.
    pub credentials_secret_name: String,
    /// Where the endpoint lives, for the egress rule.
    pub egress: Egress,
}

/// `spec.storage.scratch`.
#[derive(Clone, Debug, Deserialize)]
pub struct Scratch {
    /// Ephemeral-storage request.
    pub request: String,
    /// emptyDir size limit.
    pub limit: String,
}

/// A scoped egress destination: a CIDR, or labelled Pods (optionally in a namespace).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Egress {
    /// One address block.
    pub cidr: Option<String>,
    /// Namespace of the labelled Pods (the fleet's own when absent).
    pub namespace: Option<String>,
    /// Labels of the destination Pods.
    pub pod_labels: Option<Map<String, Value>>,
}

/// `spec.placement`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// Number of zones.
    pub az_count: i32,
    /// The zones.
    pub zones: Vec<String>,
    /// `Strict` (default) or `Relaxed`.
    #[serde(default)]
    pub mode: Option<String>,
}

/// `spec.maintenance`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Maintenance {
    /// Hold workload changes.
    pub paused: Option<bool>,
    /// A new value restarts members one at a time.
    pub restart_token: Option<String>,
    /// Accepted and ignored.
    pub allow_coordinated_downtime: Option<bool>,
}

/// `spec.execution`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Execution {
    /// CPU request (default 250m).
    pub cpu_request: Option<String>,
    /// CPU limit (none by default).
    pub cpu_limit: Option<String>,
    /// Memory request (default 512Mi).
    pub memory_request: Option<String>,
    /// Memory limit (default 1Gi).
    pub memory_limit: Option<String>,
    /// CELLD_MAX_RESIDENT_CELLS.
    pub max_resident_cells: Option<i64>,
    /// CELLD_IDLE_EVICT_S.
    pub idle_evict_seconds: Option<i64>,
}

/// `spec.lifecycle`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Lifecycle {
    /// CELLD_SHUTDOWN_TOTAL_MS / 1000 (default 20).
    pub shutdown_seconds: Option<i64>,
    /// terminationGracePeriodSeconds (default 30).
    pub termination_grace_seconds: Option<i64>,
}

/// One `spec.env` entry.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvEntry {
    /// `CELLD_…`.
    pub name: String,
    /// Literal value.
    #[serde(default)]
    pub value: Option<String>,
    /// Same-namespace Secret key.
    #[serde(default)]
    pub secret_key_ref: Option<SecretKeyRef>,
}

/// A same-namespace Secret key.
#[derive(Clone, Debug, Deserialize)]
pub struct SecretKeyRef {
    /// Secret name.
    pub name: String,
    /// Key.
    pub key: String,
}

/// `spec.telemetry`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Telemetry {
    /// OTLP collector URL.
    #[serde(rename = "collectorURL")]
    pub collector_url: String,
    /// Where the collector lives.
    pub egress: Egress,
    /// OTEL_TRACES_SAMPLER.
    #[serde(default)]
    pub sampler: Option<String>,
    /// OTEL_TRACES_SAMPLER_ARG.
    #[serde(default)]
    pub sampler_arg: Option<String>,
    /// CELLD_OTEL_FLUSH_MS.
    #[serde(default)]
    pub flush_milliseconds: Option<i64>,
    /// CELLD_OTEL_FLUSH_BYTES.
    #[serde(default)]
    pub flush_bytes: Option<i64>,
    /// OTEL_EXPORTER_OTLP_HEADERS from a Secret key.
    #[serde(default)]
    pub headers_secret_key_ref: Option<SecretKeyRef>,
}

/// `spec.export`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Export {
    /// `Bucket` (default) or `Kafka`.
    pub sink: Option<String>,
    /// Classes to export.
    pub classes: Option<Vec<String>>,
    /// `Class.table` entries never exported.
    pub exclude_tables: Option<Vec<String>>,
    /// CELLD_EXPORT_MAX_TX_BYTES.
    pub max_transaction_bytes: Option<i64>,
    /// CELLD_EXPORT_MAX_RECORD_BYTES.
    pub max_record_bytes: Option<i64>,
    /// CELLD_EXPORT_QUEUE_BYTES.
    pub queue_bytes: Option<i64>,
    /// Bucket sink settings.
    pub bucket: Option<ExportBucket>,
    /// Kafka sink settings.
    pub kafka: Option<ExportKafka>,
}

/// `spec.export.bucket`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ExportBucket {
    /// Export bucket other than the fleet bucket.
    pub name: Option<String>,
    /// CELLD_EXPORT_FLUSH_MS.
    pub flush_milliseconds: Option<i64>,
    /// CELLD_EXPORT_FLUSH_BYTES.
    pub flush_bytes: Option<i64>,
    /// CELLD_EXPORT_RETENTION in days.
    pub retention_days: Option<i64>,
}

/// `spec.export.kafka`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ExportKafka {
    /// `host:port` brokers.
    pub brokers: Vec<String>,
    /// Topic.
    pub topic: Option<String>,
    /// CELLD_EXPORT_RETRY_MS.
    pub retry_milliseconds: Option<i64>,
    /// librdkafka properties file in a Secret.
    pub properties_secret_key_ref: Option<SecretKeyRef>,
    /// Where the brokers live.
    pub egress: Egress,
}

/// The fields fixed at creation, as raw JSON: profile, serviceAccountName,
/// storage, bucketWorkload (with its default) and placement.
pub fn fixed_config(primary: &Value) -> Value {
    let spec = &primary["spec"];
    let layout = spec
        .get("bucketWorkload")
        .cloned()
        .unwrap_or_else(|| json!("Deployment"));
    json!({
        "profile": spec["profile"],
        "serviceAccountName": spec["serviceAccountName"],
        "storage": spec["storage"],
        "bucketWorkload": layout,
        "placement": spec["placement"],
    })
}

/// The tuning the reservation hash covers, as raw JSON: execution,
/// lifecycle, env and telemetry (`null` when absent).
pub fn tuning(primary: &Value) -> Value {
    let spec = &primary["spec"];
    json!({
        "execution": spec.get("execution").cloned().unwrap_or(Value::Null),
        "lifecycle": spec.get("lifecycle").cloned().unwrap_or(Value::Null),
        "env": spec.get("env").cloned().unwrap_or(Value::Null),
        "telemetry": spec.get("telemetry").cloned().unwrap_or(Value::Null),
    })
}
