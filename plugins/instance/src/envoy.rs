//! The gateway's Envoy bootstrap configuration, rendered as JSON (Envoy
//! reads a `.json` bootstrap as JSON).
//!
//! # Routing
//!
//! Clients name the engine a query is for with the query parameter
//! `engine=<name>`. A Lua filter checks the name is a DNS label and points
//! the request at that engine's query Service,
//! `<name>-service.<namespace>.svc.<domain>:3473`; a request without a
//! valid engine name gets `400`. All engine traffic goes through one
//! `dynamic_forward_proxy` cluster, which resolves the (headless) engine
//! Service to the ready engine pods and spreads connections over them.
//! Route timeouts are off: queries run as long as they run. Per-connection
//! buffers are capped at 2 MiB, listener and cluster alike.
//!
//! # Metrics and probes
//!
//! A second listener on the plaintext metrics port serves exactly
//! `/stats/prometheus` and `/ready` from Envoy's admin interface (which
//! itself listens on loopback only); the pods' probes use it, so they keep
//! working whatever the client listener does.
//!
//! # Failing closed
//!
//! When `serve_clients` is false (the instance asks for gateway TLS, which
//! this plugin does not provide yet) the client listener is left out
//! entirely: the gateway answers probes and metrics but never serves
//! queries in plaintext that were meant to be encrypted.

use serde_json::{Value, json};

use crate::names::GATEWAY_LISTEN_PORT;

/// Port of Envoy's admin interface, bound to loopback.
pub const ADMIN_PORT: i32 = 9901;
/// Per-connection buffer limit (2 MiB).
pub const BUFFER_LIMIT_BYTES: u32 = 2 * 1024 * 1024;

const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const ROUTER: &str = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router";

/// What the rendered configuration depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvoyInputs {
    /// What follows an engine name in its query Service's `host:port`.
    pub engine_authority_suffix: String,
    /// Port of the metrics and probe listener.
    pub metrics_port: i32,
    /// Whether to run the client listener at all.
    pub serve_clients: bool,
}

/// The bootstrap configuration.
pub fn bootstrap(inputs: &EnvoyInputs) -> Value {
    let dns_cache = json!({
        "name": "engines",
        "dns_lookup_family": "V4_ONLY",
        "dns_refresh_rate": "5s",
        "host_ttl": "300s",
        "max_hosts": 1024,
    });
    let mut listeners = Vec::new();
    if inputs.serve_clients {
        listeners.push(client_listener(inputs, &dns_cache));
    }
    listeners.push(metrics_listener(inputs.metrics_port));
    json!({
        "admin": {
            "address": socket("127.0.0.1", ADMIN_PORT),
        },
        "static_resources": {
            "listeners": listeners,
            "clusters": [
                {
                    "name": "engines",
                    "connect_timeout": "5s",
                    "lb_policy": "CLUSTER_PROVIDED",
                    "per_connection_buffer_limit_bytes": BUFFER_LIMIT_BYTES,
                    "cluster_type": {
                        "name": "envoy.clusters.dynamic_forward_proxy",
                        "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.clusters.dynamic_forward_proxy.v3.ClusterConfig",
                            "dns_cache_config": dns_cache,
                        },
                    },
                },
                {
                    "name": "admin",
                    "connect_timeout": "1s",
                    "type": "STATIC",
                    "load_assignment": {
                        "cluster_name": "admin",
                        "endpoints": [{"lb_endpoints": [{"endpoint": {
                            "address": socket("127.0.0.1", ADMIN_PORT),
                        }}]}],
                    },
                },
            ],
        },
    })
}

fn socket(address: &str, port: i32) -> Value {
    json!({"socket_address": {"address": address, "port_value": port}})
}

fn client_listener(inputs: &EnvoyInputs, dns_cache: &Value) -> Value {
    json!({
        "name": "queries",
        "address": socket("0.0.0.0", GATEWAY_LISTEN_PORT),
        "per_connection_buffer_limit_bytes": BUFFER_LIMIT_BYTES,
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": HCM,
                "stat_prefix": "queries",
                "route_config": {
                    "name": "engines",
                    "virtual_hosts": [{
                        "name": "engines",
                        "domains": ["*"],
                        "routes": [{
                            "match": {"prefix": "/"},
                            "route": {"cluster": "engines", "timeout": "0s"},
                        }],
                    }],
                },
                "http_filters": [
                    {
                        "name": "envoy.filters.http.lua",
                        "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                            "default_source_code": {"inline_string": route_script(&inputs.engine_authority_suffix)},
                        },
                    },
                    {
                        "name": "envoy.filters.http.dynamic_forward_proxy",
                        "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.dynamic_forward_proxy.v3.FilterConfig",
                            "dns_cache_config": dns_cache,
                        },
                    },
                    {"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}},
                ],
            },
        }]}],
    })
}

fn metrics_listener(port: i32) -> Value {
    let to_admin = |path: &str| json!({"match": {"path": path}, "route": {"cluster": "admin"}});
    json!({
        "name": "metrics",
        "address": socket("0.0.0.0", port),
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": HCM,
                "stat_prefix": "metrics",
                "route_config": {
                    "name": "metrics",
                    "virtual_hosts": [{
                        "name": "metrics",
                        "domains": ["*"],
                        "routes": [
                            to_admin("/stats/prometheus"),
                            to_admin("/ready"),
                            {"match": {"prefix": "/"}, "direct_response": {"status": 404}},
                        ],
                    }],
                },
                "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}}],
            },
        }]}],
    })
}

/// The Lua filter that turns `?engine=<name>` into the request's authority.
fn route_script(suffix: &str) -> String {
    format!(
        r#"-- Sends the request to the engine named by the `engine` query parameter.
local suffix = "{suffix}"

local function engine_of(path)
  local query = string.match(path, "%?(.*)$")
  if query == nil then
    return nil
  end
  for key, value in string.gmatch(query, "([^&=]+)=([^&]*)") do
    if key == "engine" then
      return value
    end
  end
  return nil
end

local function valid(name)
  return name ~= nil and #name > 0 and #name <= 55
    and string.match(name, "^[a-z0-9][a-z0-9%-]*$") ~= nil
    and string.sub(name, -1) ~= "-"
end

function envoy_on_request(handle)
  local engine = engine_of(handle:headers():get(":path") or "")
  if not valid(engine) then
    handle:respond({{[":status"] = "400", ["content-type"] = "text/plain"}},
      "name the engine with the query parameter engine=<name>\n")
    return
  end
  handle:headers():replace(":authority", engine .. suffix)
end
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(serve_clients: bool) -> EnvoyInputs {
        EnvoyInputs {
            engine_authority_suffix: "-service.fb.svc.cluster.local:3473".into(),
            metrics_port: 9090,
            serve_clients,
        }
    }

    fn listener_names(config: &Value) -> Vec<&str> {
        config["static_resources"]["listeners"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["name"].as_str().unwrap())
            .collect()
    }

    #[test]
    fn clients_reach_engines_through_the_forward_proxy() {
        let c = bootstrap(&inputs(true));
        assert_eq!(listener_names(&c), ["queries", "metrics"]);
        let queries = &c["static_resources"]["listeners"][0];
        assert_eq!(queries["address"]["socket_address"]["port_value"], 8080);
        let hcm = &queries["filter_chains"][0]["filters"][0]["typed_config"];
        let lua = hcm["http_filters"][0]["typed_config"]["default_source_code"]["inline_string"]
            .as_str()
            .unwrap();
        assert!(lua.contains(r#"local suffix = "-service.fb.svc.cluster.local:3473""#));
        assert_eq!(
            hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["cluster"],
            "engines"
        );
        assert_eq!(
            c["static_resources"]["clusters"][0]["cluster_type"]["name"],
            "envoy.clusters.dynamic_forward_proxy"
        );
    }

    #[test]
    fn the_metrics_listener_exposes_only_metrics_and_readiness() {
        let c = bootstrap(&inputs(true));
        let metrics = &c["static_resources"]["listeners"][1];
        assert_eq!(metrics["address"]["socket_address"]["port_value"], 9090);
        let routes = &metrics["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]["virtual_hosts"]
            [0]["routes"];
        assert_eq!(routes[0]["match"]["path"], "/stats/prometheus");
        assert_eq!(routes[1]["match"]["path"], "/ready");
        assert_eq!(routes[2]["direct_response"]["status"], 404);
        assert_eq!(
            c["admin"]["address"]["socket_address"]["address"],
            "127.0.0.1"
        );
    }

    #[test]
    fn failing_closed_drops_the_client_listener_only() {
        let c = bootstrap(&inputs(false));
        assert_eq!(listener_names(&c), ["metrics"]);
    }
}
