//! Log output: `--log-format text` (the default; colours only when stderr
//! is a terminal) or `json` (one object per line, for log pipelines).
//!
//! Every line logged while a reconcile runs carries the fields Kubernetes
//! controllers use: `controller`, `namespace`, `name` and `reconcileID`
//! (from the span [`reconcile_span`] opens). In JSON they are top-level
//! keys next to `ts`, `level`, `logger` and `msg`, as controller-runtime
//! (zap) writes them.

use std::fmt;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};

use clap::ValueEnum;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

use crate::key::PrimaryKey;

/// The log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines; ANSI colours only on a terminal.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the process's log subscriber writing to stderr, filtered by
/// `filter` (an `EnvFilter` directive such as `wasmop=info`).
pub fn init(format: LogFormat, filter: tracing_subscriber::EnvFilter) {
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    match format {
        LogFormat::Text => builder
            // Colour codes only on a terminal, never in a file or a pipe.
            .with_ansi(std::io::stderr().is_terminal())
            .init(),
        LogFormat::Json => builder
            .with_ansi(false)
            .fmt_fields(JsonFields::new())
            .event_format(JsonLine)
            .init(),
    }
}

/// The span of one reconcile: every event inside carries `controller`,
/// `namespace`, `name` and a fresh `reconcileID`.
pub fn reconcile_span(key: &PrimaryKey) -> tracing::Span {
    tracing::info_span!(
        "reconcile",
        controller = %key.controller,
        namespace = %key.namespace,
        name = %key.name,
        reconcileID = %reconcile_id(),
    )
}

/// A new UUID-shaped identifier, unique within the process and unlikely to
/// repeat across processes (a hash of the time and a counter).
pub fn reconcile_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let digest = Sha256::new()
        .chain_update(now.to_le_bytes())
        .chain_update(n.to_le_bytes())
        .chain_update(std::process::id().to_le_bytes())
        .finalize();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// One JSON object per event: `ts`, `level`, `logger`, `msg`, the fields
/// of every enclosing span (outermost first), then the event's fields.
struct JsonLine;

impl<S, N> FormatEvent<S, N> for JsonLine
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut map = Map::new();
        map.insert(
            "ts".into(),
            Value::String(jiff::Timestamp::now().to_string()),
        );
        map.insert(
            "level".into(),
            Value::String(meta.level().as_str().to_ascii_lowercase()),
        );
        map.insert("logger".into(), Value::String(meta.target().to_owned()));
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let ext = span.extensions();
                if let Some(fields) = ext.get::<FormattedFields<N>>()
                    && let Ok(Value::Object(o)) = serde_json::from_str::<Value>(fields.as_str())
                {
                    map.extend(o);
                }
            }
        }
        event.record(&mut Fields(&mut map));
        writeln!(writer, "{}", Value::Object(map))
    }
}

struct Fields<'a>(&'a mut Map<String, Value>);

impl Fields<'_> {
    fn put(&mut self, field: &Field, value: Value) {
        let key = match field.name() {
            "message" => "msg",
            other => other,
        };
        self.0.insert(key.to_owned(), value);
    }
}

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::String(value.to_owned()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, value.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn json_lines_carry_the_reconcile_fields_at_top_level() {
        let buf = Buf::default();
        let out = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || out.clone())
            .with_ansi(false)
            .fmt_fields(JsonFields::new())
            .event_format(JsonLine)
            .finish();
        let key = PrimaryKey {
            controller: "good/widgets".into(),
            namespace: "default".into(),
            name: "alpha".into(),
        };
        tracing::subscriber::with_default(subscriber, || {
            let _g = reconcile_span(&key).entered();
            tracing::info!(applied = 2, "reconciled");
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let line: Value = serde_json::from_str(text.trim()).expect(&text);
        assert_eq!(line["msg"], "reconciled");
        assert_eq!(line["level"], "info");
        assert_eq!(line["controller"], "good/widgets");
        assert_eq!(line["namespace"], "default");
        assert_eq!(line["name"], "alpha");
        assert_eq!(line["applied"], 2);
        let id = line["reconcileID"].as_str().unwrap();
        assert_eq!(id.len(), 36, "{id}");
        assert!(!text.contains('\u{1b}'), "no ANSI codes: {text:?}");
    }

    #[test]
    fn reconcile_ids_differ() {
        assert_ne!(reconcile_id(), reconcile_id());
    }
}
