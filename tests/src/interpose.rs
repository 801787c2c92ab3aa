//! A client that sits between the operator and the API server, so a test
//! can act at an exact point of a reconcile: "just before the operator
//! sends this write, a user creates the object" — a race made
//! deterministic, without sleeps and without a fake API server.
//!
//! [`Interposer::new`] wraps a real client; give the returned client to the
//! operator. Every request goes through unchanged to the real API server.
//! A hook registered with [`Interposer::before`] runs (and is awaited) just
//! before the first request it matches is sent, once; one registered with
//! [`Interposer::after`] runs when that request's answer has come, before
//! the operator gets it. Every request other
//! than a GET is recorded with the status the API server answered
//! ([`Interposer::writes`]); every request, GETs (reads, lists, watches)
//! included, in [`Interposer::requests`].

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use http::{Method, Request};
use kube::Client;
use kube::client::Body;

type Action = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;
type Matcher = Box<dyn FnMut(&Method, &str) -> bool + Send>;

struct Hook {
    matches: Matcher,
    action: Action,
}

impl Hook {
    fn new<M, F, Fut>(matches: M, action: F) -> Self
    where
        M: FnMut(&Method, &str) -> bool + Send + 'static,
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        Hook {
            matches: Box::new(matches),
            action: Box::new(move || Box::pin(action())),
        }
    }
}

/// One request the operator sent (other than a GET), and the answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// HTTP method.
    pub method: Method,
    /// Path and query.
    pub path: String,
    /// HTTP status of the answer; 0 when the request failed without one.
    pub status: u16,
}

impl Recorded {
    /// True when this is a `method` request whose path (without the query)
    /// ends with `suffix`.
    pub fn is(&self, method: &Method, suffix: &str) -> bool {
        self.method == method
            && self
                .path
                .split('?')
                .next()
                .unwrap_or_default()
                .ends_with(suffix)
    }
}

/// The shared state of an interposed client.
#[derive(Default)]
pub struct Interposer {
    hooks: Mutex<Vec<Hook>>,
    after_hooks: Mutex<Vec<Hook>>,
    writes: Mutex<Vec<Recorded>>,
    all: Mutex<Vec<Recorded>>,
}

impl std::fmt::Debug for Interposer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interposer")
            .field("writes", &self.writes())
            .finish_non_exhaustive()
    }
}

/// A matcher for `method` requests whose path (without the query) ends
/// with `suffix`, e.g. `(Method::POST, "/namespaces/ns/configmaps")`.
pub fn request_to(
    method: Method,
    suffix: impl Into<String>,
) -> impl FnMut(&Method, &str) -> bool + Send + 'static {
    let suffix = suffix.into();
    move |m: &Method, path: &str| {
        *m == method
            && path
                .split('?')
                .next()
                .unwrap_or_default()
                .ends_with(&suffix)
    }
}

/// A matcher for the `n`th (1-based) request `inner` matches.
pub fn nth(
    n: usize,
    mut inner: impl FnMut(&Method, &str) -> bool + Send + 'static,
) -> impl FnMut(&Method, &str) -> bool + Send + 'static {
    let mut seen = 0;
    move |m: &Method, path: &str| {
        if inner(m, path) {
            seen += 1;
            seen == n
        } else {
            false
        }
    }
}

impl Interposer {
    /// Wraps `inner`: returns the shared state and the client to give the
    /// operator.
    pub fn new(inner: Client) -> (Arc<Self>, Client) {
        let this = Arc::new(Self::default());
        let state = this.clone();
        let default_ns = inner.default_namespace().to_owned();
        let service = tower::service_fn(move |req: Request<Body>| {
            let state = state.clone();
            let inner = inner.clone();
            async move {
                let method = req.method().clone();
                let path = req
                    .uri()
                    .path_and_query()
                    .map(ToString::to_string)
                    .unwrap_or_default();
                if let Some(action) = take(&state.hooks, &method, &path) {
                    action().await;
                }
                let after = take(&state.after_hooks, &method, &path);
                let answer = inner.send(req).await;
                if let Some(action) = after {
                    action().await;
                }
                let status = answer.as_ref().map_or(0, |r| r.status().as_u16());
                let recorded = Recorded {
                    method,
                    path,
                    status,
                };
                if recorded.method != Method::GET {
                    state
                        .writes
                        .lock()
                        .expect("writes lock")
                        .push(recorded.clone());
                }
                state.all.lock().expect("requests lock").push(recorded);
                answer
            }
        });
        (this, Client::new(service, default_ns))
    }

    /// Runs `action` (awaited) just before the first request `matches`
    /// accepts is sent; once.
    pub fn before<M, F, Fut>(&self, matches: M, action: F)
    where
        M: FnMut(&Method, &str) -> bool + Send + 'static,
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.hooks
            .lock()
            .expect("hooks lock")
            .push(Hook::new(matches, action));
    }

    /// Runs `action` (awaited) when the answer to the first request
    /// `matches` accepts has come, before the operator gets it; once. The
    /// operator's other requests (its watches included) go on meanwhile.
    pub fn after<M, F, Fut>(&self, matches: M, action: F)
    where
        M: FnMut(&Method, &str) -> bool + Send + 'static,
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.after_hooks
            .lock()
            .expect("hooks lock")
            .push(Hook::new(matches, action));
    }

    /// Every request other than a GET sent so far, in order.
    pub fn writes(&self) -> Vec<Recorded> {
        self.writes.lock().expect("writes lock").clone()
    }

    /// Every request sent so far, reads and watches included, in order (a
    /// watch is recorded when its answer starts).
    pub fn requests(&self) -> Vec<Recorded> {
        self.all.lock().expect("requests lock").clone()
    }

    /// True while a registered hook has not run yet.
    pub fn pending(&self) -> bool {
        !self.hooks.lock().expect("hooks lock").is_empty()
            || !self.after_hooks.lock().expect("hooks lock").is_empty()
    }
}

/// The action of the first hook of `hooks` that matches the request,
/// removed from the list.
fn take(hooks: &Mutex<Vec<Hook>>, method: &Method, path: &str) -> Option<Action> {
    let mut hooks = hooks.lock().expect("hooks lock");
    // Every matcher sees every request (counting matchers count them).
    let hit = hooks
        .iter_mut()
        .map(|h| (h.matches)(method, path))
        .collect::<Vec<_>>()
        .into_iter()
        .position(|m| m)?;
    Some(hooks.remove(hit).action)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_to_matches_method_and_path_suffix_without_the_query() {
        let mut m = request_to(Method::POST, "/namespaces/a/configmaps");
        assert!(m(
            &Method::POST,
            "/api/v1/namespaces/a/configmaps?fieldManager=x"
        ));
        assert!(!m(&Method::PATCH, "/api/v1/namespaces/a/configmaps"));
        assert!(!m(&Method::POST, "/api/v1/namespaces/a/configmaps/x"));
        assert!(!m(&Method::POST, "/api/v1/namespaces/b/configmaps"));
    }

    #[test]
    fn nth_matches_only_the_nth_match() {
        let mut m = nth(2, request_to(Method::POST, "/configmaps"));
        assert!(!m(&Method::POST, "/configmaps"));
        assert!(!m(&Method::GET, "/configmaps"));
        assert!(m(&Method::POST, "/configmaps"));
        assert!(!m(&Method::POST, "/configmaps"));
    }

    #[test]
    fn recorded_is_compares_method_and_suffix() {
        let r = Recorded {
            method: Method::PATCH,
            path: "/apis/g/v1/namespaces/n/things/t?fieldManager=x".into(),
            status: 409,
        };
        assert!(r.is(&Method::PATCH, "/things/t"));
        assert!(!r.is(&Method::PATCH, "/things/t/status"));
        assert!(!r.is(&Method::POST, "/things/t"));
    }
}
