//! What reaches a running operator while it runs: the plugin directory,
//! watched and hot swapped into the running controllers ([`hotswap`]),
//! plugins pulled from OCI registries into it ([`oci`]), the operator file
//! ([`config`]) and its reload ([`config_watch`]).
//!
//! # Guarantees
//! - A delivered plugin or configuration that is refused changes nothing
//!   that runs: the running version keeps deciding with what it had, and
//!   the refusal is logged (a rejected plugin file or configuration file
//!   also as a Warning Event on the operator's Pod).

pub mod config;
pub mod config_watch;
pub mod hotswap;
pub mod oci;
