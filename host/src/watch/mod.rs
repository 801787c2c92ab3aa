//! Watching the API: one shared watch cache per kind with the indexes the
//! snapshot and routing need ([`cache`]), Secrets read by name instead of
//! watched ([`by_name`]), and the retry policy of a failing watch
//! ([`retry`]). Each cached object is held as its JSON text ([`stored`]).
//! Label selectors are part of what a plugin declares: the `contract`
//! layer's, re-exported here as [`selector`].

pub mod by_name;
pub mod cache;
pub mod retry;
pub mod stored;

pub use crate::contract::selector;
pub use cache::{Cache, Change, KindCache, KindKey, WatchSpec};
pub use selector::{LabelSelector, selector_matches};
pub use stored::CachedObject;
