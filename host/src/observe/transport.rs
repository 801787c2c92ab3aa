//! Sending one request: HTTP/1 (over TLS for `https`) on a fresh
//! connection, under a deadline and a body cap, with its outcome recorded
//! for the primary.

use super::*;

impl Observer {
    /// Sends one request under the concurrency bound, its deadline and its
    /// body cap; logs and counts it.
    pub(crate) async fn perform(
        &self,
        primary: &PrimaryInfo,
        request: &HttpRequest,
        endpoint: &Endpoint,
    ) -> Stored {
        let deadline = if request.timeout_ms == 0 {
            self.config.default_timeout
        } else {
            Duration::from_millis(u64::from(request.timeout_ms)).min(self.config.timeout_ceiling)
        };
        let cap = if request.max_response_bytes == 0 {
            self.config.default_max_response_bytes
        } else {
            usize::try_from(request.max_response_bytes)
                .unwrap_or(usize::MAX)
                .min(self.config.response_bytes_ceiling)
        };

        // The semaphore is never closed; should it be, the request goes out
        // unbounded rather than not at all.
        let _permit = self.permits.acquire().await.ok();
        self.counters.sent.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let mut progress = Progress::default();
        let exchanged = tokio::time::timeout(
            deadline,
            exchange(&primary.uid, request, endpoint, cap, &mut progress),
        )
        .await;
        let (ending, error, outcome) = match exchanged {
            Ok(Ok(false)) => (Ending::Succeeded, None, ObservationOutcome::Complete),
            Ok(Ok(true)) => (
                Ending::Cut,
                Some(format!(
                    "response body exceeds the cap of {cap} bytes and was cut at {cap} bytes"
                )),
                ObservationOutcome::Oversized,
            ),
            Ok(Err(why)) => (Ending::Failed, Some(why), ObservationOutcome::Failed),
            Err(_) => {
                let when = if progress.status.is_some() {
                    " while reading the body"
                } else {
                    ""
                };
                (
                    Ending::Failed,
                    Some(format!(
                        "deadline of {} ms exceeded{when}",
                        deadline.as_millis()
                    )),
                    ObservationOutcome::TimedOut,
                )
            }
        };
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let counter = match ending {
            Ending::Succeeded => &self.counters.succeeded,
            Ending::Failed => &self.counters.failed,
            Ending::Cut => &self.counters.cut,
        };
        counter.fetch_add(1, Ordering::Relaxed);

        // Headers are never logged: they may hold Secret values.
        macro_rules! log_call {
            ($level:ident) => {
                tracing::$level!(
                    primary = %primary, uid = %primary.uid, plugin = %primary.plugin,
                    version = %primary.plugin_version, id = %request.id,
                    method = method_name(request.method), target = %request.target,
                    url = %endpoint.uri, status = progress.status, outcome = ending.as_str(),
                    error = error.as_deref(), elapsed_ms, "observation request"
                )
            };
        }
        if ending == Ending::Succeeded {
            log_call!(info);
        } else {
            log_call!(warn);
        }

        let body = if ending == Ending::Failed {
            String::new()
        } else {
            String::from_utf8_lossy(&progress.body).into_owned()
        };
        Stored {
            status: progress.status,
            body,
            error,
            observed_at: now_ms(),
            max_age_ms: request.max_age_ms,
            outcome,
            seq: 0,
        }
    }
}

/// What arrived of a response so far; kept outside the deadline so a
/// status that arrived before it still counts.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    pub(crate) status: Option<u16>,
    pub(crate) body: Vec<u8>,
}

/// Aborts a spawned task when dropped (the connection driver of one
/// request, when the request ends or its deadline passes).
pub(crate) struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Connects, sends (with the `Idempotency-Key` of `primary_uid` when
/// mutating), and reads the body into `progress` up to `cap` bytes.
/// `Ok(true)` when the body was cut at the cap.
pub(crate) async fn exchange(
    primary_uid: &str,
    request: &HttpRequest,
    endpoint: &Endpoint,
    cap: usize,
    progress: &mut Progress,
) -> Result<bool, String> {
    let uri = &endpoint.uri;
    let authority = uri.authority().map(|a| a.as_str()).unwrap_or_default();
    let host = uri.host().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let default_port = if endpoint.tls.is_some() { 443 } else { 80 };
    let port = uri.port_u16().unwrap_or(default_port);
    let stream = TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("cannot connect to {authority}: {e}"))?;
    match &endpoint.tls {
        None => {
            talk(
                TokioIo::new(stream),
                primary_uid,
                request,
                endpoint,
                cap,
                progress,
            )
            .await
        }
        Some(config) => {
            let name = rustls::pki_types::ServerName::try_from(host.to_owned())
                .map_err(|e| format!("{host} is not a TLS server name: {e}"))?;
            let stream = tokio_rustls::TlsConnector::from(Arc::clone(config))
                .connect(name, stream)
                .await
                .map_err(|e| format!("TLS handshake with {authority} failed: {e}"))?;
            talk(
                TokioIo::new(stream),
                primary_uid,
                request,
                endpoint,
                cap,
                progress,
            )
            .await
        }
    }
}

/// HTTP/1 over an open connection (plain or TLS): see [`exchange`].
async fn talk<I>(
    io: I,
    primary_uid: &str,
    request: &HttpRequest,
    endpoint: &Endpoint,
    cap: usize,
    progress: &mut Progress,
) -> Result<bool, String>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let uri = &endpoint.uri;
    let authority = uri.authority().map(|a| a.as_str()).unwrap_or_default();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| format!("HTTP handshake with {authority} failed: {}", chain(&e)))?;
    let _driver = AbortOnDrop(tokio::spawn(async move {
        // Its errors surface through `send_request` and the body.
        let _ = connection.await;
    }));

    let target = uri
        .path_and_query()
        .map_or("/", PathAndQuery::as_str)
        .to_owned();
    let mut builder = hyper::Request::builder()
        .method(method(request.method))
        .uri(target)
        .header(HOST, authority)
        .header(USER_AGENT, concat!("wasmop/", env!("CARGO_PKG_VERSION")));
    if let Some(headers) = builder.headers_mut() {
        headers.extend(endpoint.headers.clone());
    }
    if request.method != HttpMethod::Get {
        let key = idempotency_key(
            primary_uid,
            &request.id,
            request.method,
            &request.path,
            &request.body,
        );
        builder = builder.header(IDEMPOTENCY_KEY_HEADER, key);
    }
    let outgoing = builder
        .body(Full::new(Bytes::from(request.body.clone())))
        .map_err(|e| format!("cannot build the request: {e}"))?;
    let response = sender
        .send_request(outgoing)
        .await
        .map_err(|e| format!("request to {authority} failed: {}", chain(&e)))?;
    progress.status = Some(response.status().as_u16());

    let mut body = response.into_body();
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| format!("reading the response body failed: {}", chain(&e)))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let room = cap.saturating_sub(progress.body.len());
        if data.len() > room {
            progress.body.extend_from_slice(&data[..room]);
            return Ok(true);
        }
        progress.body.extend_from_slice(&data);
    }
    Ok(false)
}

/// An error and its sources, `: `-separated (hyper's own message is terse).
pub(crate) fn chain(e: &hyper::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

pub(crate) fn method(m: HttpMethod) -> Method {
    match m {
        HttpMethod::Get => Method::GET,
        HttpMethod::Post => Method::POST,
        HttpMethod::Put => Method::PUT,
        HttpMethod::Patch => Method::PATCH,
        HttpMethod::Delete => Method::DELETE,
    }
}

pub(crate) fn method_name(m: HttpMethod) -> &'static str {
    match m {
        HttpMethod::Get => "GET",
        HttpMethod::Post => "POST",
        HttpMethod::Put => "PUT",
        HttpMethod::Patch => "PATCH",
        HttpMethod::Delete => "DELETE",
    }
}

/// Now, to the millisecond (the precision of `ageMs`).
pub(crate) fn now_ms() -> Timestamp {
    let now = Timestamp::now();
    now.round(jiff::Unit::Millisecond).unwrap_or(now)
}

/// What identifies a sent GET for the rate limit: URL, headers, body.
pub(crate) fn fingerprint(request: &HttpRequest, endpoint: &Endpoint) -> u64 {
    let mut h = DefaultHasher::new();
    endpoint.uri.to_string().hash(&mut h);
    for (name, value) in &endpoint.headers {
        name.as_str().hash(&mut h);
        value.as_bytes().hash(&mut h);
    }
    request.body.hash(&mut h);
    h.finish()
}
