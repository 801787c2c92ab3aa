//! Configuration checks the plugin makes itself, whatever the CRD admitted:
//! a fleet stored before a rule existed, or written around admission, is
//! refused here with `Blocked/InvalidConfiguration` and nothing running
//! changes.

use std::collections::BTreeSet;

use crate::api::FleetSpec;

/// Most `spec.env` entries.
pub const MAX_ENV: usize = 32;

/// Variables the operator sets itself; `spec.env` may not name them.
pub const OPERATOR_OWNED: [&str; 12] = [
    "CELLD_NODE",
    "CELLD_ADVERTISE",
    "CELLD_BUCKET",
    "CELLD_DURABILITY",
    "CELLD_ADDR",
    "CELLD_INTERNAL_ADDR",
    "CELLD_WATCH",
    "CELLD_TTL_MS",
    "CELLD_SHUTDOWN_TOTAL_MS",
    "CELLD_TOKIO_THREADS",
    "CELLD_MAX_RESIDENT_CELLS",
    "CELLD_IDLE_EVICT_S",
];

/// Reserved prefixes: re-exec and strict-mode internals, the OpenTelemetry
/// namespace (its own API, `spec.telemetry`), change export (`spec.export`),
/// unsafe and test switches.
pub const RESERVED_PREFIXES: [&str; 6] = [
    "CELLD_REEXEC_",
    "CELLD_STRICT_",
    "CELLD_OTEL",
    "CELLD_EXPORT",
    "CELLD_UNSAFE_",
    "CELLD_TEST_",
];

/// Why `name` may not appear in `spec.env`, if it may not.
pub fn env_name_problem(name: &str) -> Option<String> {
    let shape_ok = name.len() <= 128
        && name.strip_prefix("CELLD_").is_some_and(|rest| {
            rest.starts_with(|c: char| c.is_ascii_uppercase())
                && rest
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        });
    if !shape_ok {
        return Some(format!(
            "env {name}: names must be CELLD_ followed by upper-case letters, digits or _"
        ));
    }
    if OPERATOR_OWNED.contains(&name) {
        return Some(format!("env {name}: operator-owned variable"));
    }
    RESERVED_PREFIXES
        .iter()
        .find(|p| name.starts_with(*p))
        .map(|p| format!("env {name}: the prefix {p} is reserved"))
}

/// Every problem with `spec`, in a stable order; empty when it is valid.
/// Messages name fields and Secret references, never values.
pub fn problems(spec: &FleetSpec) -> Vec<String> {
    let mut out = Vec::new();
    match spec.profile.as_str() {
        "Bucket" | "PersistentFleet" => {}
        other => out.push(format!(
            "profile {other:?} is neither Bucket nor PersistentFleet"
        )),
    }
    match spec.bucket_workload.as_deref() {
        None | Some("Deployment") => {}
        Some("Ordered") if !spec.persistent() => {}
        Some("Ordered") => out.push("Ordered bucketWorkload requires the Bucket profile".into()),
        Some(other) => out.push(format!(
            "bucketWorkload {other:?} is neither Deployment nor Ordered"
        )),
    }
    if spec.runtime_image.as_deref().unwrap_or("").is_empty() {
        out.push("runtimeImage is required: there is no default compatible pin".into());
    }
    if spec.persistent() != spec.storage.storage_class_name.is_some() {
        out.push("storage.storageClassName is required for, and only for, PersistentFleet".into());
    }
    let az = usize::try_from(spec.placement.az_count).unwrap_or(0);
    if az == 0 || az != spec.placement.zones.len() {
        out.push("placement.azCount must equal the number of zones".into());
    }
    if spec.replicas() < spec.placement.az_count || spec.replicas() < 1 {
        out.push("replicas must be at least placement.azCount".into());
    }
    if let Some(env) = &spec.env {
        if env.len() > MAX_ENV {
            out.push(format!("env has {} entries; at most {MAX_ENV}", env.len()));
        }
        let mut seen = BTreeSet::new();
        for e in env {
            if let Some(p) = env_name_problem(&e.name) {
                out.push(p);
            }
            if !seen.insert(e.name.as_str()) {
                out.push(format!("env {}: named twice", e.name));
            }
            if e.value.is_some() == e.secret_key_ref.is_some() {
                out.push(format!(
                    "env {}: exactly one of value or secretKeyRef is required",
                    e.name
                ));
            }
            if let Some(r) = &e.secret_key_ref
                && (r.name.is_empty() || r.key.is_empty() || r.name.contains('/'))
            {
                out.push(format!(
                    "env {}: secretKeyRef needs a same-namespace Secret name and a key",
                    e.name
                ));
            }
        }
    }
    if let Some(capacity) = &spec.capacity {
        // The CRD defaults the mode to Shadow.
        let mode = capacity["mode"].as_str().unwrap_or("Shadow");
        if mode != "External" {
            out.push(format!(
                "capacity.mode {mode:?} is not implemented by this operator (only External, \
                 scaling through /scale); remove spec.capacity or set capacity.mode: External"
            ));
        }
    }
    if let Some(cidr) = spec
        .telemetry
        .as_ref()
        .and_then(|t| t.egress.cidr.as_deref())
        && !single_address(cidr)
    {
        out.push(format!(
            "telemetry.egress.cidr {cidr:?} must be one address (/32 or /128)"
        ));
    }
    if let Some(export) = &spec.export {
        let kafka = export.sink.as_deref() == Some("Kafka");
        if kafka != export.kafka.is_some() {
            out.push("export.kafka is required with, and only with, the Kafka sink".into());
        }
    }
    out
}

/// True for a CIDR naming one address: IPv4 `/32` or IPv6 `/128`.
pub fn single_address(cidr: &str) -> bool {
    match cidr.split_once('/') {
        Some((ip, "32")) => ip.parse::<std::net::Ipv4Addr>().is_ok(),
        Some((ip, "128")) => ip.parse::<std::net::Ipv6Addr>().is_ok(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_names() {
        assert_eq!(env_name_problem("CELLD_LOG"), None);
        assert!(
            env_name_problem("CELLD_REEXEC_X")
                .unwrap()
                .contains("reserved")
        );
        assert!(
            env_name_problem("CELLD_STRICT_MODE")
                .unwrap()
                .contains("reserved")
        );
        assert!(
            env_name_problem("CELLD_OTEL_SINK")
                .unwrap()
                .contains("reserved")
        );
        assert!(
            env_name_problem("CELLD_EXPORT")
                .unwrap()
                .contains("reserved")
        );
        assert!(
            env_name_problem("CELLD_NODE")
                .unwrap()
                .contains("operator-owned")
        );
        assert!(env_name_problem("OTEL_X").is_some());
        assert!(env_name_problem("CELLD_lower").is_some());
        assert!(env_name_problem("CELLD_").is_some());
    }

    #[test]
    fn single_addresses() {
        for ok in ["10.1.2.3/32", "fd00::7/128", "::1/128"] {
            assert!(single_address(ok), "{ok}");
        }
        for bad in [
            "10.0.0.0/8",
            "10.1.2.3",
            "10.1.2.3/31",
            "fd00::/64",
            "10.1.2.3/128",
            "fd00::7/32",
            "host/32",
            "",
        ] {
            assert!(!single_address(bad), "{bad}");
        }
    }
}
