//! The three-layer pod template merge and the `customEngineConfig` deep
//! merge.
//!
//! # Pod templates
//!
//! Layers, bottom to top: the operator's defaults,
//! `FireboltEngineClass.spec.template`, `FireboltEngine.spec.template`.
//! [`merge_templates`] folds them with [`merge_template`]:
//!
//! - `metadata.labels`, `metadata.annotations` and `spec.nodeSelector`
//!   merge key by key, the top layer winning a key;
//! - the list fields concatenate bottom-then-top: `tolerations`,
//!   `imagePullSecrets`, `volumes`, `initContainers`, the sidecars (every
//!   container but `engine`), and on the `engine` container `env`,
//!   `envFrom` and `volumeMounts`. Named entries of `volumes`,
//!   `initContainers` and sidecars that the top layer repeats replace the
//!   lower entry in place (two entries with one name would be rejected by
//!   the API server);
//! - the `engine` container merges field by field, every other field of
//!   it the top layer sets wins (image, imagePullPolicy, resources, …);
//! - any other field the top layer sets replaces the lower one whole
//!   (affinity, serviceAccountName, securityContext, …).
//!
//! The merge never reads what it does not know: unknown fields follow the
//! "top wins" rule, so new Kubernetes fields pass through.

use serde_json::{Map, Value};

/// Name of the operator-owned container.
pub const ENGINE_CONTAINER: &str = "engine";

/// Pod spec lists concatenated as they are.
const CONCAT_SPEC_LISTS: [&str; 2] = ["tolerations", "imagePullSecrets"];
/// Pod spec lists concatenated with same-name replacement.
const NAMED_SPEC_LISTS: [&str; 2] = ["volumes", "initContainers"];
/// Lists of the engine container concatenated as they are.
const CONCAT_CONTAINER_LISTS: [&str; 3] = ["env", "envFrom", "volumeMounts"];
/// Maps merged key by key.
const MERGED_SPEC_MAPS: [&str; 1] = ["nodeSelector"];

/// Merges `layers`, bottom first, into one pod template. `None` layers and
/// non-object layers are skipped.
pub fn merge_templates<'a>(layers: impl IntoIterator<Item = Option<&'a Value>>) -> Value {
    let mut merged = Value::Object(Map::new());
    for layer in layers.into_iter().flatten() {
        if layer.is_object() {
            merge_template(&mut merged, layer);
        }
    }
    merged
}

/// Merges the pod template `top` onto `base` (see the module docs).
pub fn merge_template(base: &mut Value, top: &Value) {
    let base = object(base);
    if let Some(meta) = top.get("metadata").and_then(Value::as_object) {
        let base_meta = object(base.entry("metadata").or_insert_with(empty));
        for key in ["labels", "annotations"] {
            if let Some(map) = meta.get(key).and_then(Value::as_object) {
                let target = object(base_meta.entry(key).or_insert_with(empty));
                for (k, v) in map {
                    target.insert(k.clone(), v.clone());
                }
            }
        }
    }
    let Some(spec) = top.get("spec").and_then(Value::as_object) else {
        return;
    };
    let base_spec = object(base.entry("spec").or_insert_with(empty));
    for (key, value) in spec {
        let slot = base_spec.entry(key.as_str()).or_insert(Value::Null);
        match key.as_str() {
            k if CONCAT_SPEC_LISTS.contains(&k) => concat(slot, value),
            k if NAMED_SPEC_LISTS.contains(&k) => concat_named(slot, value),
            k if MERGED_SPEC_MAPS.contains(&k) => merge_map(slot, value),
            "containers" => merge_containers(slot, value),
            _ => *slot = value.clone(),
        }
    }
}

/// Deep-merges `top` onto `base`: objects key by key, anything else
/// replaced.
pub fn deep_merge(base: &mut Value, top: &Value) {
    match (base, top) {
        (Value::Object(b), Value::Object(t)) => {
            for (k, v) in t {
                deep_merge(b.entry(k.as_str()).or_insert(Value::Null), v);
            }
        }
        (b, t) => *b = t.clone(),
    }
}

fn merge_containers(base: &mut Value, top: &Value) {
    let Some(top) = top.as_array() else {
        *base = top.clone();
        return;
    };
    let list = array(base);
    for container in top {
        let name = container.get("name");
        match list
            .iter_mut()
            .find(|c| c.get("name") == name && name.is_some())
        {
            Some(existing) if name.and_then(Value::as_str) == Some(ENGINE_CONTAINER) => {
                merge_engine_container(existing, container);
            }
            Some(existing) => *existing = container.clone(),
            None => list.push(container.clone()),
        }
    }
}

fn merge_engine_container(base: &mut Value, top: &Value) {
    let Some(top) = top.as_object() else {
        return;
    };
    let base = object(base);
    for (key, value) in top {
        let slot = base.entry(key.as_str()).or_insert(Value::Null);
        if CONCAT_CONTAINER_LISTS.contains(&key.as_str()) {
            concat(slot, value);
        } else {
            *slot = value.clone();
        }
    }
}

fn concat(base: &mut Value, top: &Value) {
    match top.as_array() {
        Some(items) => array(base).extend(items.iter().cloned()),
        None => *base = top.clone(),
    }
}

fn concat_named(base: &mut Value, top: &Value) {
    let Some(items) = top.as_array() else {
        *base = top.clone();
        return;
    };
    let list = array(base);
    for item in items {
        let name = item.get("name");
        match list
            .iter_mut()
            .find(|e| name.is_some() && e.get("name") == name)
        {
            Some(existing) => *existing = item.clone(),
            None => list.push(item.clone()),
        }
    }
}

fn merge_map(base: &mut Value, top: &Value) {
    match top.as_object() {
        Some(map) => {
            let target = object(base);
            for (k, v) in map {
                target.insert(k.clone(), v.clone());
            }
        }
        None => *base = top.clone(),
    }
}

fn empty() -> Value {
    Value::Object(Map::new())
}

/// `value` as an object, replacing anything else with `{}`.
fn object(value: &mut Value) -> &mut Map<String, Value> {
    if !value.is_object() {
        *value = empty();
    }
    match value {
        Value::Object(m) => m,
        _ => unreachable!("just made an object"),
    }
}

/// `value` as an array, replacing anything else with `[]`.
fn array(value: &mut Value) -> &mut Vec<Value> {
    if !value.is_array() {
        *value = Value::Array(Vec::new());
    }
    match value {
        Value::Array(a) => a,
        _ => unreachable!("just made an array"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn defaults() -> Value {
        json!({
            "metadata": {"labels": {"firebolt.io/engine": "e"}},
            "spec": {"containers": [{"name": "engine", "image": "default:1",
                                     "env": [{"name": "OP", "value": "1"}],
                                     "volumeMounts": [{"name": "config", "mountPath": "/etc/firebolt"}]}],
                     "volumes": [{"name": "config", "configMap": {"name": "e-g0-config"}}]}
        })
    }

    #[test]
    fn top_layer_wins_scalars_and_whole_objects() {
        let class = json!({"spec": {"serviceAccountName": "class-sa",
                                    "affinity": {"podAffinity": {"x": 1}},
                                    "priorityClassName": "low"}});
        let engine = json!({"spec": {"serviceAccountName": "engine-sa",
                                     "affinity": {"nodeAffinity": {"y": 2}}}});
        let m = merge_templates([Some(&defaults()), Some(&class), Some(&engine)]);
        assert_eq!(m["spec"]["serviceAccountName"], "engine-sa");
        assert_eq!(
            m["spec"]["affinity"],
            json!({"nodeAffinity": {"y": 2}}),
            "objects are replaced whole, not merged"
        );
        assert_eq!(m["spec"]["priorityClassName"], "low", "class fills in");
    }

    #[test]
    fn every_list_field_concatenates_class_then_engine() {
        let class = json!({
            "spec": {
                "tolerations": [{"key": "pool", "value": "class"}],
                "imagePullSecrets": [{"name": "class-pull"}],
                "volumes": [{"name": "class-vol", "emptyDir": {}}],
                "initContainers": [{"name": "class-init", "image": "busybox"}],
                "containers": [
                    {"name": "engine", "image": "class:2",
                     "env": [{"name": "CLASS", "value": "c"}],
                     "envFrom": [{"secretRef": {"name": "class-env"}}],
                     "volumeMounts": [{"name": "class-vol", "mountPath": "/class"}]},
                    {"name": "class-sidecar", "image": "fluent-bit"}
                ]
            }
        });
        let engine = json!({
            "spec": {
                "tolerations": [{"key": "pool", "value": "engine"}],
                "imagePullSecrets": [{"name": "engine-pull"}],
                "volumes": [{"name": "engine-vol", "emptyDir": {}}],
                "initContainers": [{"name": "engine-init", "image": "busybox"}],
                "containers": [
                    {"name": "engine",
                     "env": [{"name": "ENGINE", "value": "e"}],
                     "envFrom": [{"configMapRef": {"name": "engine-env"}}],
                     "volumeMounts": [{"name": "engine-vol", "mountPath": "/engine"}]},
                    {"name": "engine-sidecar", "image": "proxy"}
                ]
            }
        });
        let m = merge_templates([Some(&defaults()), Some(&class), Some(&engine)]);
        let names = |list: &Value, key: &str| -> Vec<String> {
            list.as_array()
                .unwrap()
                .iter()
                .map(|v| v[key].as_str().unwrap_or_default().to_owned())
                .collect()
        };
        let spec = &m["spec"];
        assert_eq!(names(&spec["tolerations"], "value"), ["class", "engine"]);
        assert_eq!(
            names(&spec["imagePullSecrets"], "name"),
            ["class-pull", "engine-pull"]
        );
        assert_eq!(
            names(&spec["volumes"], "name"),
            ["config", "class-vol", "engine-vol"]
        );
        assert_eq!(
            names(&spec["initContainers"], "name"),
            ["class-init", "engine-init"]
        );
        assert_eq!(
            names(&spec["containers"], "name"),
            ["engine", "class-sidecar", "engine-sidecar"]
        );
        let c = &spec["containers"][0];
        assert_eq!(c["image"], "class:2", "the engine layer sets no image");
        assert_eq!(names(&c["env"], "name"), ["OP", "CLASS", "ENGINE"]);
        assert_eq!(
            c["envFrom"],
            json!([{"secretRef": {"name": "class-env"}}, {"configMapRef": {"name": "engine-env"}}])
        );
        assert_eq!(
            names(&c["volumeMounts"], "mountPath"),
            ["/etc/firebolt", "/class", "/engine"]
        );
    }

    #[test]
    fn a_repeated_name_replaces_the_lower_entry_in_place() {
        let class = json!({"spec": {"volumes": [{"name": "v", "emptyDir": {}}],
                                    "containers": [{"name": "side", "image": "a"}]}});
        let engine = json!({"spec": {"volumes": [{"name": "v", "hostPath": {"path": "/x"}}],
                                     "containers": [{"name": "side", "image": "b"}]}});
        let m = merge_templates([Some(&class), Some(&engine)]);
        assert_eq!(
            m["spec"]["volumes"],
            json!([{"name": "v", "hostPath": {"path": "/x"}}])
        );
        assert_eq!(
            m["spec"]["containers"],
            json!([{"name": "side", "image": "b"}])
        );
    }

    #[test]
    fn labels_annotations_and_node_selector_merge_key_by_key() {
        let class = json!({"metadata": {"labels": {"team": "data", "tier": "a"},
                                        "annotations": {"iam": "class-role"}},
                           "spec": {"nodeSelector": {"pool": "compute", "zone": "a"}}});
        let engine = json!({"metadata": {"labels": {"tier": "b"}},
                            "spec": {"nodeSelector": {"zone": "b"}}});
        let m = merge_templates([Some(&defaults()), Some(&class), Some(&engine)]);
        assert_eq!(
            m["metadata"]["labels"],
            json!({"firebolt.io/engine": "e", "team": "data", "tier": "b"})
        );
        assert_eq!(m["metadata"]["annotations"], json!({"iam": "class-role"}));
        assert_eq!(
            m["spec"]["nodeSelector"],
            json!({"pool": "compute", "zone": "b"})
        );
    }

    #[test]
    fn engine_container_fields_the_top_sets_win() {
        let class = json!({"spec": {"containers": [{"name": "engine", "image": "class:2",
            "imagePullPolicy": "IfNotPresent", "resources": {"requests": {"cpu": "1"}}}]}});
        let engine = json!({"spec": {"containers": [{"name": "engine",
            "resources": {"limits": {"memory": "4Gi"}}}]}});
        let m = merge_templates([Some(&defaults()), Some(&class), Some(&engine)]);
        let c = &m["spec"]["containers"][0];
        assert_eq!(c["image"], "class:2");
        assert_eq!(c["imagePullPolicy"], "IfNotPresent");
        assert_eq!(c["resources"], json!({"limits": {"memory": "4Gi"}}));
    }

    #[test]
    fn missing_or_empty_layers_change_nothing() {
        let d = defaults();
        assert_eq!(merge_templates([Some(&d), None, Some(&json!({}))]), d);
        assert_eq!(merge_templates([Some(&d), Some(&json!({"spec": {}}))]), d);
        assert_eq!(merge_templates([None]), json!({}));
    }

    #[test]
    fn deep_merge_merges_objects_and_replaces_the_rest() {
        let mut base = json!({"a": {"b": 1, "c": [1, 2]}, "d": "x"});
        deep_merge(
            &mut base,
            &json!({"a": {"c": [3], "e": true}, "d": {"f": 1}}),
        );
        assert_eq!(
            base,
            json!({"a": {"b": 1, "c": [3], "e": true}, "d": {"f": 1}})
        );
    }
}
