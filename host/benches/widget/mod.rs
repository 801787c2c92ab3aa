//! The inputs the benches of `good` and its ports share: a Widget and the
//! ConfigMaps it owns.

use serde_json::{Value, json};

/// The Widget's UID, which its ConfigMaps' owner references name.
pub const UID: &str = "00000000-0000-0000-0000-000000000001";

/// The Widget `w` in namespace `ns`.
pub fn primary() -> Value {
    json!({"apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
           "metadata": {"name": "w", "namespace": "ns", "uid": UID, "generation": 1},
           "spec": {"value": "hello"}})
}

/// A ConfigMap owned by the Widget, about 4 KB as JSON.
pub fn owned_config_map(i: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": format!("w-data-{i:04}"), "namespace": "ns",
                        "uid": format!("uid-{i}"), "resourceVersion": "1",
                        "ownerReferences": [{"apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
                                             "name": "w", "uid": UID, "controller": true}]},
           "data": {"payload": "x".repeat(3800)}})
}
