//! Where a request goes: resolving its target (a declared Pod or Service
//! of the snapshot, or an allow-listed base URL) to a URL, and its Secret
//! headers to values — or to a [`Refusal`] before anything is sent.

use super::*;

/// A base URL: `scheme://host:port` and an optional base path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Origin {
    pub(crate) scheme: String,
    /// Lowercase; IPv6 addresses in brackets.
    pub(crate) host: String,
    pub(crate) port: u16,
    /// Without a trailing `/`; empty for none.
    pub(crate) base_path: String,
}

impl Origin {
    pub(crate) fn parse(text: &str) -> Result<Origin, &'static str> {
        if text.contains('#') || text.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err("holds a fragment, blanks or control characters");
        }
        let uri: Uri = text.parse().map_err(|_| "is not a URL")?;
        let scheme = uri
            .scheme_str()
            .ok_or("has no scheme")?
            .to_ascii_lowercase();
        let default_port = match scheme.as_str() {
            "http" => 80,
            "https" => 443,
            _ => return Err("must start with http://"),
        };
        let authority = uri.authority().ok_or("has no host")?;
        if authority.as_str().contains('@') {
            return Err("may not hold user information");
        }
        let host = authority.host().to_ascii_lowercase();
        if host.is_empty() {
            return Err("has no host");
        }
        let port = authority.port_u16().unwrap_or(default_port);
        if port == 0 {
            return Err("has port 0");
        }
        if uri.query().is_some() {
            return Err("may not hold a query");
        }
        Ok(Origin {
            scheme,
            host,
            port,
            base_path: uri.path().trim_end_matches('/').to_owned(),
        })
    }

    pub(crate) fn same_origin(&self, other: &Origin) -> bool {
        self.scheme == other.scheme && self.host == other.host && self.port == other.port
    }
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}:{}", self.scheme, self.host, self.port)
    }
}

/// Resolves where a request goes, or why it may not go anywhere. Pure: it
/// sends nothing and reads objects only through `objects`.
///
/// - Target `allow-list`: `object` is a base URL (`http[s]://host[:port][/base]`)
///   whose scheme, host and port must equal those of an `allow_list`
///   entry; the request's `port` is 0 or that port. URL = base URL + path.
/// - Any other target names an `http-target` of the manifest (`targets`),
///   of core kind Pod or Service, declaring the request's port; `objects`
///   must find the named object (in the primary's namespace, in its
///   snapshot — which holds only what the primary owns or its controller
///   reads). URL = `http://<status.podIP>:<port><path>` for a Pod,
///   `http://<spec.clusterIP>:<port><path>` for a Service of type
///   ClusterIP with a selector (`service_base` refuses the others).
///
/// # Errors
///
/// The [`Refusal`] naming the first rule the request breaks.
pub fn resolve(
    request: &HttpRequest,
    targets: &[HttpTarget],
    allow_list: &[String],
    objects: impl Fn(&KindRef, &str) -> Option<Value>,
) -> Result<Uri, Refusal> {
    let bad_path = || Refusal::BadPath {
        path: request.path.clone(),
    };
    let path = &request.path;
    if !path.starts_with('/') || path.contains('#') || !path.chars().all(|c| c.is_ascii_graphic()) {
        return Err(bad_path());
    }
    PathAndQuery::try_from(path.as_str()).map_err(|_| bad_path())?;

    let base = match &request.target {
        RequestTarget::AllowList { base_url } => allow_listed_base(request, base_url, allow_list)?,
        RequestTarget::Declared { id, object } => {
            cluster_base(request, id, object, targets, objects)?
        }
    };
    format!("{base}{path}").parse().map_err(|_| bad_path())
}

pub(crate) fn allow_listed_base(
    request: &HttpRequest,
    base_url: &str,
    allow_list: &[String],
) -> Result<String, Refusal> {
    let origin = Origin::parse(base_url).map_err(|why| Refusal::BadBaseUrl {
        url: base_url.to_owned(),
        why,
    })?;
    let listed = allow_list
        .iter()
        .filter_map(|entry| Origin::parse(entry).ok())
        .any(|entry| entry.same_origin(&origin));
    if !listed {
        return Err(Refusal::NotAllowListed {
            origin: origin.to_string(),
        });
    }
    if request.port != 0 && request.port != origin.port {
        return Err(Refusal::PortMismatch {
            port: request.port,
            origin: origin.to_string(),
        });
    }
    Ok(format!(
        "{}://{}:{}{}",
        origin.scheme, origin.host, origin.port, origin.base_path
    ))
}

pub(crate) fn cluster_base(
    request: &HttpRequest,
    target_id: &str,
    object_name: &str,
    targets: &[HttpTarget],
    objects: impl Fn(&KindRef, &str) -> Option<Value>,
) -> Result<String, Refusal> {
    let target =
        targets
            .iter()
            .find(|t| t.id == target_id)
            .ok_or_else(|| Refusal::UnknownTarget {
                target: target_id.to_owned(),
            })?;
    let kind = target.kind.kind.as_str();
    if !target.kind.group.is_empty() || !matches!(kind, "Pod" | "Service") {
        return Err(Refusal::UnsupportedKind {
            target: target.id.clone(),
            kind: target.kind.to_string(),
        });
    }
    if request.port == 0 || !target.ports.contains(&request.port) {
        return Err(Refusal::PortNotDeclared {
            port: request.port,
            target: target.id.clone(),
        });
    }
    let found = objects(&target.kind, object_name).ok_or_else(|| Refusal::ObjectNotFound {
        kind: kind.to_owned(),
        name: object_name.to_owned(),
    })?;
    let port = request.port;
    if kind == "Pod" {
        let ip: IpAddr = object::str_at(&found, "status.podIP")
            .and_then(|ip| ip.parse().ok())
            .ok_or_else(|| Refusal::NoPodIp {
                name: object_name.to_owned(),
            })?;
        Ok(match ip {
            IpAddr::V4(v4) => format!("http://{v4}:{port}"),
            IpAddr::V6(v6) => format!("http://[{v6}]:{port}"),
        })
    } else {
        service_base(&found, object_name, port)
    }
}

/// Where a request to a Service goes: its cluster IP, and only for a
/// Service of type ClusterIP whose selector picks the Pods behind it. An
/// `ExternalName` Service is a DNS alias to anywhere, a selector-less one
/// forwards to hand-written Endpoints (any address), and a headless one
/// has no cluster IP of its own: each is refused with the reason, so a
/// request (and its Secret headers) reaches only what the Service's own
/// selector serves.
pub(crate) fn service_base(service: &Value, name: &str, port: u16) -> Result<String, Refusal> {
    let refused = |why: &'static str| Refusal::ServiceNotRoutable {
        name: name.to_owned(),
        why,
    };
    let spec = service.get("spec");
    let service_type = spec
        .and_then(|s| s.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP");
    match service_type {
        "ClusterIP" => {}
        "ExternalName" => {
            return Err(refused(
                "it is an ExternalName Service (an alias for another host)",
            ));
        }
        _ => return Err(refused("only Services of type ClusterIP can be called")),
    }
    let has_selector = spec
        .and_then(|s| s.get("selector"))
        .and_then(Value::as_object)
        .is_some_and(|m| !m.is_empty());
    if !has_selector {
        return Err(refused(
            "it has no selector, so its endpoints are hand-written and may point anywhere",
        ));
    }
    let cluster_ip = spec
        .and_then(|s| s.get("clusterIP"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    if cluster_ip == "None" {
        return Err(refused("it is headless (no cluster IP of its own)"));
    }
    let ip: IpAddr = cluster_ip
        .parse()
        .map_err(|_| refused("it has no cluster IP yet"))?;
    Ok(match ip {
        IpAddr::V4(v4) => format!("http://{v4}:{port}"),
        IpAddr::V6(v6) => format!("http://[{v6}]:{port}"),
    })
}

/// The request's plain headers and its Secret headers (prefix + the
/// base64-decoded `data[key]` of the Secret `secrets` finds by name),
/// Secret values marked sensitive. Pure.
///
/// # Errors
///
/// A [`Refusal`] for an invalid or host-reserved header, or a Secret or key
/// that is missing or unusable — naming the Secret and key, never the value.
pub fn resolve_headers(
    request: &HttpRequest,
    secrets: impl Fn(&str) -> Option<Value>,
) -> Result<HeaderMap, Refusal> {
    let mut headers = HeaderMap::new();
    for (name, value) in &request.headers {
        let header = header_name(name)?;
        let value =
            HeaderValue::from_str(value).map_err(|_| Refusal::BadHeader { name: name.clone() })?;
        headers.append(header, value);
    }
    for sh in &request.secret_headers {
        let header = header_name(&sh.name)?;
        let secret = secrets(&sh.secret).ok_or_else(|| Refusal::SecretMissing {
            secret: sh.secret.clone(),
        })?;
        let encoded = secret
            .get("data")
            .and_then(|d| d.get(&sh.key))
            .and_then(Value::as_str)
            .ok_or_else(|| Refusal::SecretKeyMissing {
                secret: sh.secret.clone(),
                key: sh.key.clone(),
            })?;
        let unusable = || Refusal::SecretValueUnusable {
            secret: sh.secret.clone(),
            key: sh.key.clone(),
            header: sh.name.clone(),
        };
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|_| unusable())?;
        let mut bytes = sh.prefix.as_bytes().to_vec();
        bytes.extend_from_slice(&decoded);
        let mut value = HeaderValue::from_bytes(&bytes).map_err(|_| unusable())?;
        value.set_sensitive(true);
        headers.append(header, value);
    }
    Ok(headers)
}

pub(crate) fn header_name(name: &str) -> Result<HeaderName, Refusal> {
    let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| Refusal::BadHeader {
        name: name.to_owned(),
    })?;
    if RESERVED_HEADERS.contains(&header.as_str()) {
        return Err(Refusal::ReservedHeader {
            name: name.to_owned(),
        });
    }
    Ok(header)
}
