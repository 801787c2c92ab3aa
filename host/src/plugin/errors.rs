//! What a failed load or call of a plugin is: [`LoadError`] (the file,
//! the component, the manifest, the settings), [`CallError`] (a trap, a
//! timeout, memory, a malformed answer) with a stable reason, and how a
//! wasmtime error becomes one (`classify`, with a bounded trap message).
//!
//! # Guarantees
//! - Running out of time or memory is reported as such, not as the trap
//!   the guest turned it into.
//! - A trap's message is bounded whatever the guest wrote to stderr.

use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

use super::{BoxError, OutputProblem, SettingsProblem};
use crate::contract::manifest::ManifestProblem;
use crate::sandbox::{DeadlineExceeded, Limits, StoreState};

/// Timeout and out-of-memory, told apart from other failures.
pub(super) fn classify(
    e: &wasmtime::Error,
    state: &StoreState,
    limits: Limits,
) -> Option<CallError> {
    if e.downcast_ref::<wasmtime::Trap>() == Some(&wasmtime::Trap::Interrupt)
        || e.downcast_ref::<DeadlineExceeded>().is_some()
    {
        return Some(CallError::Timeout {
            deadline: limits.deadline,
        });
    }
    if state.memory_cap_hit() {
        return Some(CallError::OutOfMemory {
            cap_bytes: state.memory_cap(),
        });
    }
    None
}

/// Longest trap message kept.
pub(super) const MAX_TRAP_MESSAGE: usize = 1024;

/// One line: the panic text from stderr (without Rust's backtrace hint)
/// followed by the wasm trap.
pub(super) fn trap_message(e: &wasmtime::Error, stderr: &str) -> String {
    let trap = match e.downcast_ref::<wasmtime::Trap>() {
        Some(trap) => trap.to_string(),
        None => e.to_string(),
    };
    let printed: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("note: run with `RUST_BACKTRACE"))
        .collect();
    let mut message = if printed.is_empty() {
        trap
    } else {
        format!("{} ({trap})", printed.join(" "))
    };
    if message.len() > MAX_TRAP_MESSAGE {
        let mut cut = MAX_TRAP_MESSAGE;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push('…');
    }
    message
}

pub(super) fn join<T: std::fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Why a plugin could not be loaded. Every variant displays as one line.
#[derive(Debug, Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read plugin {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not a valid WebAssembly component.
    #[error("{origin} is not a valid WebAssembly component")]
    Compile {
        /// The file (or other origin) of the bytes.
        origin: String,
        /// wasmtime's complaint.
        #[source]
        source: BoxError,
    },
    /// The component does not fit the `plugin` world, or imports something
    /// the sandbox does not provide.
    #[error("{origin} does not implement the wasmop:reconciler@0.4.0 plugin world")]
    Link {
        /// The file (or other origin).
        origin: String,
        /// wasmtime's complaint.
        #[source]
        source: BoxError,
    },
    /// The requested limits exceed what the sandbox was built for.
    #[error("memory cap of {requested} bytes exceeds the sandbox maximum of {maximum}")]
    LimitsTooLarge {
        /// The per-plugin cap asked for.
        requested: usize,
        /// The sandbox's slot size.
        maximum: usize,
    },
    /// Calling `manifest` or `validate-settings` failed.
    #[error("{origin}: calling {export} failed")]
    Call {
        /// The file (or other origin).
        origin: String,
        /// `manifest` or `validate-settings`.
        export: &'static str,
        /// What went wrong in the call.
        #[source]
        source: CallError,
    },
    /// The manifest breaks the rules of [`manifest::problems`](crate::contract::manifest::problems).
    #[error("{origin} has an invalid manifest: {}", join(problems))]
    InvalidManifest {
        /// The file (or other origin).
        origin: String,
        /// Every problem found.
        problems: Vec<ManifestProblem>,
    },
    /// The plugin rejected its settings.
    #[error("plugin {plugin} rejected its settings: {}", join(problems))]
    InvalidSettings {
        /// The plugin's name.
        plugin: String,
        /// Every problem the plugin reported.
        problems: Vec<SettingsProblem>,
    },
    /// A `setting:<key>` entry of `write-namespaces` names a setting that is
    /// present but not a string naming a valid namespace.
    #[error(
        "plugin {plugin}: a write namespace taken from its settings is invalid: {}",
        join(problems)
    )]
    WriteNamespaceSetting {
        /// The plugin's name.
        plugin: String,
        /// Every unresolvable entry.
        problems: Vec<ManifestProblem>,
    },
}

/// Which of the plugin's own errors it returned (WIT `reconcile-error`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PluginErrorKind {
    /// The primary's spec cannot be reconciled as written.
    InvalidSpec,
    /// Something the plugin needs is not there yet.
    NotReady,
    /// The snapshot was not what the plugin expected (a bug).
    Internal,
}

impl std::fmt::Display for PluginErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PluginErrorKind::InvalidSpec => "invalid spec",
            PluginErrorKind::NotReady => "not ready",
            PluginErrorKind::Internal => "internal plugin error",
        })
    }
}

/// Why one call produced no plan. Nothing may be written for any of these.
#[derive(Debug, Error)]
pub enum CallError {
    /// The plugin trapped (a panic, an `unreachable`, an out-of-bounds
    /// access). `message` is the panic message from its stderr when there
    /// is one, followed by the wasm trap.
    #[error("plugin trapped: {message}")]
    Trap {
        /// What the plugin printed and the trap, trimmed to one line.
        message: String,
    },
    /// The call ran past its deadline and was interrupted.
    #[error("plugin exceeded its deadline of {} ms", deadline.as_millis())]
    Timeout {
        /// The deadline.
        deadline: Duration,
    },
    /// The plugin tried to grow its memory past its cap.
    #[error("plugin exceeded its memory cap of {} MiB", cap_bytes >> 20)]
    OutOfMemory {
        /// The cap, in bytes.
        cap_bytes: usize,
    },
    /// The call returned, but its output is not a usable plan.
    #[error("plugin output is malformed: {0}")]
    MalformedOutput(OutputProblem),
    /// The plugin returned one of its own errors.
    #[error("{kind}: {message}")]
    PluginError {
        /// Which error.
        kind: PluginErrorKind,
        /// The plugin's message.
        message: String,
    },
    /// The sandbox could not instantiate the plugin (e.g. every pool slot
    /// is busy); retrying later may succeed.
    #[error("cannot instantiate the plugin")]
    Instantiate(#[source] BoxError),
}

impl CallError {
    /// A stable CamelCase reason for Conditions and Events.
    pub fn reason(&self) -> &'static str {
        match self {
            CallError::Trap { .. } => "PluginTrapped",
            CallError::Timeout { .. } => "PluginTimedOut",
            CallError::OutOfMemory { .. } => "PluginOutOfMemory",
            CallError::MalformedOutput(_) => "PluginOutputMalformed",
            CallError::PluginError {
                kind: PluginErrorKind::InvalidSpec,
                ..
            } => "InvalidSpec",
            CallError::PluginError {
                kind: PluginErrorKind::NotReady,
                ..
            } => "NotReady",
            CallError::PluginError {
                kind: PluginErrorKind::Internal,
                ..
            } => "PluginError",
            CallError::Instantiate(_) => "PluginUnavailable",
        }
    }
}
