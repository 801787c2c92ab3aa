//! Watching the API: one shared watch cache per kind with the indexes the
//! snapshot and routing need ([`cache`]), Secrets read by name instead of
//! watched ([`by_name`]), and label selectors ([`selector`]). Each cached
//! object is held as its JSON text ([`stored`]).

pub mod by_name;
pub mod cache;
pub mod retry;
pub mod stored;

pub use crate::contract::selector;
pub use cache::{Cache, Change, KindCache, KindKey, WatchSpec};
pub use selector::{LabelSelector, selector_matches};
pub use stored::CachedObject;
