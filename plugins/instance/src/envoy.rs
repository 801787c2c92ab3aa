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
//! `dynamic_forward_proxy` cluster in sub-cluster mode: for each engine
//! authority Envoy makes a `STRICT_DNS` sub-cluster (a copy of the
//! `engines` cluster, transport socket included) that resolves the
//! headless engine Service to **every** ready engine pod address,
//! re-resolved every 5 s (Envoy's default), and balances requests over them
//! round robin. (A DNS cache, `dns_cache_config`, would pin one address
//! per engine.) Route timeouts are off: queries run as long as they run.
//! Per-connection buffers are capped at 2 MiB, listener and cluster alike.
//!
//! # Draining
//!
//! The client listener is marked `INBOUND` and the metrics listener
//! `OUTBOUND`, so `POST /drain_listeners?inboundonly&graceful` (the
//! gateway's preStop, [`crate::gateway`]) stops new client connections
//! while probes and metrics keep being served; a connection that carried a
//! request is closed one second (`drain_timeout`) after its answer. The
//! client listener's stats carry the prefix `queries`
//! ([`ACTIVE_REQUESTS_STAT`]), whatever its port.
//!
//! # Metrics and probes
//!
//! A second listener on the plaintext metrics port serves exactly
//! `/stats/prometheus` and `/ready` from Envoy's admin interface (which
//! itself listens on loopback only); the pods' probes use it, so they keep
//! working whatever the client listener does.
//!
//! # TLS
//!
//! The client listener serves plaintext, TLS (certificate and key mounted
//! at [`SERVING_DIR`]) or mutual TLS (client certificates verified against
//! [`CLIENT_CA_DIR`]`/ca.crt`) — or is left out entirely
//! ([`ClientListener::Closed`]): the gateway then answers probes and
//! metrics but no query. With `upstream_tls` the `engines` cluster speaks
//! TLS to every engine (one cluster, so all or none), verifying each
//! against the trust bundle at [`ENGINE_CA_DIR`]`/ca.crt` and the name the
//! request was routed to (auto SNI and SAN validation), offering
//! [`crate::security::UPSTREAM_CURVES`].

use serde_json::{Value, json};

use crate::names::GATEWAY_LISTEN_PORT;

/// Port of Envoy's admin interface, bound to loopback.
pub const ADMIN_PORT: i32 = 9901;
/// Per-connection buffer limit (2 MiB).
pub const BUFFER_LIMIT_BYTES: u32 = 2 * 1024 * 1024;
/// The admin stat counting the client requests in flight.
pub const ACTIVE_REQUESTS_STAT: &str = "http.queries.downstream_rq_active";

const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const ROUTER: &str = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router";

/// Where the gateway's serving certificate is mounted.
pub const SERVING_DIR: &str = "/etc/envoy/tls";
/// Where the client CA is mounted (mutual TLS).
pub const CLIENT_CA_DIR: &str = "/etc/envoy/client-ca";
/// Where the engine trust bundle is mounted (re-encryption).
pub const ENGINE_CA_DIR: &str = "/etc/envoy/engine-ca";
/// Where the client revocation list is mounted (mutual TLS).
pub const CLIENT_CRL_DIR: &str = "/etc/envoy/client-crl";
/// Where the engine revocation list is mounted (re-encryption).
pub const ENGINE_CRL_DIR: &str = "/etc/envoy/engine-crl";

/// What the client listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientListener {
    /// Plaintext HTTP.
    Plaintext,
    /// Nothing: no client listener (fail-closed).
    Closed,
    /// TLS.
    Tls,
    /// TLS with required, verified client certificates.
    Mutual,
}

/// What the rendered configuration depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvoyInputs {
    /// What follows an engine name in its query Service's `host:port`.
    pub engine_authority_suffix: String,
    /// Port of the metrics and probe listener.
    pub metrics_port: i32,
    /// What the client listener serves.
    pub client: ClientListener,
    /// Re-encrypt to engines.
    pub upstream_tls: bool,
    /// Check client certificates against the list at [`CLIENT_CRL_DIR`].
    pub client_crl: bool,
    /// Check engine certificates against the list at [`ENGINE_CRL_DIR`].
    pub upstream_crl: bool,
}

/// The bootstrap configuration.
pub fn bootstrap(inputs: &EnvoyInputs) -> Value {
    let mut listeners = Vec::new();
    if inputs.client != ClientListener::Closed {
        listeners.push(client_listener(inputs));
    }
    listeners.push(metrics_listener(inputs.metrics_port));
    let mut engines = json!({
        "name": "engines",
        "connect_timeout": "5s",
        "lb_policy": "CLUSTER_PROVIDED",
        "per_connection_buffer_limit_bytes": BUFFER_LIMIT_BYTES,
        // Inherited by every sub-cluster (STRICT_DNS): every A record of
        // the headless engine Service is an endpoint.
        "dns_lookup_family": "V4_ONLY",
        "cluster_type": {
            "name": "envoy.clusters.dynamic_forward_proxy",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.clusters.dynamic_forward_proxy.v3.ClusterConfig",
                "sub_clusters_config": {
                    "lb_policy": "ROUND_ROBIN",
                    "max_sub_clusters": 1024,
                    "sub_cluster_ttl": "300s",
                },
            },
        },
    });
    if inputs.upstream_tls {
        engines["transport_socket"] = json!({
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "common_tls_context": {
                    "tls_params": {"ecdh_curves": crate::security::UPSTREAM_CURVES},
                    "validation_context": {
                        "trusted_ca": {"filename": format!("{ENGINE_CA_DIR}/ca.crt")},
                    },
                },
            },
        });
        if inputs.upstream_crl {
            engines["transport_socket"]["typed_config"]["common_tls_context"]["validation_context"]
                ["crl"] = json!({"filename": format!("{ENGINE_CRL_DIR}/crl.pem")});
        }
        engines["typed_extension_protocol_options"] = json!({
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "upstream_http_protocol_options": {"auto_sni": true, "auto_san_validation": true},
                "explicit_http_config": {"http_protocol_options": {}},
            },
        });
    }
    json!({
        "admin": {
            "address": socket("127.0.0.1", ADMIN_PORT),
        },
        "static_resources": {
            "listeners": listeners,
            "clusters": [
                engines,
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

fn client_listener(inputs: &EnvoyInputs) -> Value {
    let mut listener = plain_client_listener(inputs);
    if matches!(inputs.client, ClientListener::Tls | ClientListener::Mutual) {
        let mutual = inputs.client == ClientListener::Mutual;
        let mut common = json!({
            "tls_certificates": [{
                "certificate_chain": {"filename": format!("{SERVING_DIR}/tls.crt")},
                "private_key": {"filename": format!("{SERVING_DIR}/tls.key")},
            }],
        });
        if mutual {
            common["validation_context"] =
                json!({"trusted_ca": {"filename": format!("{CLIENT_CA_DIR}/ca.crt")}});
            if inputs.client_crl {
                common["validation_context"]["crl"] =
                    json!({"filename": format!("{CLIENT_CRL_DIR}/crl.pem")});
            }
        }
        listener["filter_chains"][0]["transport_socket"] = json!({
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
                "common_tls_context": common,
                "require_client_certificate": mutual,
            },
        });
    }
    listener
}

fn plain_client_listener(inputs: &EnvoyInputs) -> Value {
    json!({
        "name": "queries",
        "stat_prefix": "queries",
        "traffic_direction": "INBOUND",
        "address": socket("0.0.0.0", GATEWAY_LISTEN_PORT),
        "per_connection_buffer_limit_bytes": BUFFER_LIMIT_BYTES,
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": HCM,
                "stat_prefix": "queries",
                // Draining: close a connection soon after its last answer.
                "drain_timeout": "1s",
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
                            "sub_cluster_config": {"cluster_init_timeout": "5s"},
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
        // Not drained with the client listener: probes keep working.
        "traffic_direction": "OUTBOUND",
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
            client: if serve_clients {
                ClientListener::Plaintext
            } else {
                ClientListener::Closed
            },
            upstream_tls: false,
            client_crl: false,
            upstream_crl: false,
        }
    }

    #[test]
    fn tls_mutual_tls_and_re_encryption_are_rendered_from_mounted_files() {
        let tls = bootstrap(&EnvoyInputs {
            client: ClientListener::Tls,
            ..inputs(true)
        });
        let socket =
            &tls["static_resources"]["listeners"][0]["filter_chains"][0]["transport_socket"];
        let ctx = &socket["typed_config"];
        assert_eq!(ctx["require_client_certificate"], false);
        assert_eq!(
            ctx["common_tls_context"]["tls_certificates"][0]["private_key"]["filename"],
            "/etc/envoy/tls/tls.key"
        );
        assert!(ctx["common_tls_context"]["validation_context"].is_null());
        assert!(tls["static_resources"]["clusters"][0]["transport_socket"].is_null());

        let mtls = bootstrap(&EnvoyInputs {
            client: ClientListener::Mutual,
            upstream_tls: true,
            client_crl: true,
            upstream_crl: true,
            ..inputs(true)
        });
        let ctx = &mtls["static_resources"]["listeners"][0]["filter_chains"][0]["transport_socket"]
            ["typed_config"];
        assert_eq!(ctx["require_client_certificate"], true);
        assert_eq!(
            ctx["common_tls_context"]["validation_context"]["trusted_ca"]["filename"],
            "/etc/envoy/client-ca/ca.crt"
        );
        assert_eq!(
            ctx["common_tls_context"]["validation_context"]["crl"]["filename"],
            "/etc/envoy/client-crl/crl.pem"
        );
        let up = &mtls["static_resources"]["clusters"][0]["transport_socket"]["typed_config"];
        assert_eq!(
            up["common_tls_context"]["validation_context"]["crl"]["filename"],
            "/etc/envoy/engine-crl/crl.pem"
        );
        assert_eq!(
            up["common_tls_context"]["validation_context"]["trusted_ca"]["filename"],
            "/etc/envoy/engine-ca/ca.crt"
        );
        let curves = up["common_tls_context"]["tls_params"]["ecdh_curves"]
            .as_array()
            .unwrap();
        assert!(
            curves.iter().any(|c| c == "P-384"),
            "the default engine key curve is offered"
        );
        let plain = bootstrap(&inputs(true));
        assert!(
            plain["static_resources"]["listeners"][0]["filter_chains"][0]["transport_socket"]
                .is_null()
        );
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
    fn each_engine_gets_a_sub_cluster_of_every_resolved_address() {
        let c = bootstrap(&inputs(true));
        let engines = &c["static_resources"]["clusters"][0];
        let config = &engines["cluster_type"]["typed_config"];
        // Sub-clusters (STRICT_DNS: every address, balanced), not a DNS
        // cache (one address per host).
        assert_eq!(config["sub_clusters_config"]["lb_policy"], "ROUND_ROBIN");
        assert!(config.get("dns_cache_config").is_none());
        assert_eq!(engines["lb_policy"], "CLUSTER_PROVIDED");
        assert_eq!(engines["dns_lookup_family"], "V4_ONLY");
        let filters = &c["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
            ["http_filters"];
        let dfp = &filters[1]["typed_config"];
        assert!(dfp.get("dns_cache_config").is_none());
        assert_eq!(dfp["sub_cluster_config"]["cluster_init_timeout"], "5s");
    }

    #[test]
    fn only_the_client_listener_drains() {
        let c = bootstrap(&inputs(true));
        let listeners = &c["static_resources"]["listeners"];
        assert_eq!(listeners[0]["traffic_direction"], "INBOUND");
        assert_eq!(listeners[0]["stat_prefix"], "queries");
        assert_eq!(listeners[1]["traffic_direction"], "OUTBOUND");
        assert_eq!(
            listeners[0]["filter_chains"][0]["filters"][0]["typed_config"]["stat_prefix"],
            "queries"
        );
        assert!(ACTIVE_REQUESTS_STAT.starts_with("http.queries."));
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
