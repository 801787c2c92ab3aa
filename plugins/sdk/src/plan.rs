//! What one reconcile answers: [`Plan`], built with chained methods, from
//! the `wasmop-contract` crate the host uses too.
//!
//! ```
//! use std::time::Duration;
//! use wasmop_sdk::Plan;
//! use serde_json::json;
//!
//! let config = json!({"apiVersion": "v1", "kind": "ConfigMap",
//!                     "metadata": {"name": "w-cm", "namespace": "ns"}});
//! let plan = Plan::new()
//!     .apply(&config)
//!     .status(json!({"phase": "Ready"}))
//!     .event("Configured", "wrote w-cm")
//!     .requeue_after(Duration::from_secs(30));
//! assert_eq!(plan.apply.len(), 1);
//! assert_eq!(plan.requeue_after_ms, Some(30_000));
//! ```
//!
//! The serde form of [`Plan`] is the JSON text the plugin hands the host and
//! the plan `wasmop plan` prints.

pub use wasmop_contract::plan::*;
