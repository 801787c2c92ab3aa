//! The engines of the instance, as the security steps see them: the
//! FireboltEngines of the namespace whose `spec.instanceRef` names this
//! instance (and that are not being deleted), with what they report.
//!
//! An engine reports `status.observedAuthHash` and
//! `status.observedEngineTLSHash` once a single generation serves (its
//! stable or stopped phase): the auth and TLS configuration every one of
//! its pods has rolled onto (empty: no auth / plaintext).

use serde_json::Value;

use crate::step::Context;

/// Id of the read bringing the namespace's FireboltEngines.
pub const ENGINES_READ: &str = "engines";

/// Most lagging engines named in status (the count is always exact).
pub const MAX_LAGGING_REPORTED: usize = 20;

/// One engine of the instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Engine {
    /// Its name.
    pub name: String,
    /// `status.observedAuthHash`.
    pub auth_hash: String,
    /// `status.observedEngineTLSHash`.
    pub tls_hash: String,
}

/// The engines of the instance in `ctx`, sorted by name.
pub fn engines(ctx: &Context<'_>) -> Vec<Engine> {
    of_instance(ctx.snapshot.related(ENGINES_READ), ctx.names.instance())
}

/// The engines among `objects` that reference `instance`.
pub fn of_instance<'a>(objects: impl Iterator<Item = &'a Value>, instance: &str) -> Vec<Engine> {
    let text = |o: &Value, p: &str| {
        o.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let mut out: Vec<Engine> = objects
        .filter(|o| text(o, "/spec/instanceRef") == instance)
        .filter(|o| {
            o.pointer("/metadata/deletionTimestamp")
                .is_none_or(Value::is_null)
        })
        .map(|o| Engine {
            name: text(o, "/metadata/name"),
            auth_hash: text(o, "/status/observedAuthHash"),
            tls_hash: text(o, "/status/observedEngineTLSHash"),
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Names of the engines for which `differs` is true.
pub fn lagging(engines: &[Engine], differs: impl Fn(&Engine) -> bool) -> Vec<String> {
    engines
        .iter()
        .filter(|e| differs(e))
        .map(|e| e.name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_live_engines_of_this_instance_count() {
        let objects = [
            json!({"metadata": {"name": "b"}, "spec": {"instanceRef": "fb"},
                   "status": {"observedAuthHash": "h1", "observedEngineTLSHash": "t"}}),
            json!({"metadata": {"name": "a"}, "spec": {"instanceRef": "fb"}}),
            json!({"metadata": {"name": "other"}, "spec": {"instanceRef": "x"}}),
            json!({"metadata": {"name": "gone", "deletionTimestamp": "2025-01-01T00:00:00Z"},
                   "spec": {"instanceRef": "fb"}}),
        ];
        let e = of_instance(objects.iter(), "fb");
        assert_eq!(
            e.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(e[1].auth_hash, "h1");
        assert_eq!(lagging(&e, |e| e.auth_hash != "h1"), ["a"]);
    }
}
