//! `wasmop rollout`: where the `PluginRollout` objects stand, and the
//! one-command undo (see [`crate::reconcile::rollout`]).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use kube::Api;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

use crate::controller::rollout::rollout_resource;

/// Arguments of `wasmop rollout`.
#[derive(Debug, Args)]
pub struct RolloutArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: RolloutAction,
    /// Kubeconfig to use [default: in-cluster config, `$KUBECONFIG` or
    /// `~/.kube/config`].
    #[arg(long, global = true, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
}

/// `wasmop rollout` actions.
#[derive(Debug, Subcommand)]
pub enum RolloutAction {
    /// Print each rollout (or one): plugin, phase, step, share, candidate
    /// and what it waits for or why it stopped.
    Status {
        /// Only this rollout.
        name: Option<String>,
    },
    /// Send every primary of the rollout's plugin back to the current
    /// version (sets `spec.rollback`; the leader does the rest, also after
    /// promotion). The candidate stays loaded as a shadow.
    Undo {
        /// The rollout.
        name: String,
    },
}

/// Errors of `wasmop rollout`.
#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    /// The API server could not be reached or refused the request.
    #[error("PluginRollout {name}: {message}")]
    Api {
        /// The rollout (`*` for all).
        name: String,
        /// What the API server or the client said.
        message: String,
    },
    /// The tokio runtime could not be started.
    #[error("cannot start the runtime")]
    Runtime(#[source] std::io::Error),
}

/// One line about a rollout.
fn line(obj: &Value) -> String {
    let s = &obj["status"];
    let text = |v: &Value| v.as_str().unwrap_or("-").to_owned();
    format!(
        "{}\tplugin={}\tphase={}\tstep={}\tshare={}%\tcandidate={}\tcurrent={}\t{}",
        text(&obj["metadata"]["name"]),
        text(&obj["spec"]["plugin"]),
        text(&s["phase"]),
        s["step"].as_u64().map_or("-".to_owned(), |n| n.to_string()),
        s["sharePercent"].as_f64().unwrap_or(0.0),
        text(&s["candidateVersion"]),
        text(&s["currentVersion"]),
        s["message"].as_str().unwrap_or_default(),
    )
}

/// Runs `wasmop rollout`.
///
/// # Errors
/// [`RolloutError`] when the API server cannot be reached, the rollout
/// does not exist, or the patch is refused.
pub fn rollout_command(args: RolloutArgs) -> Result<ExitCode, RolloutError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(RolloutError::Runtime)?;
    runtime.block_on(async move {
        let api_error = |name: &str, e: &dyn std::fmt::Display| RolloutError::Api {
            name: name.to_owned(),
            message: e.to_string(),
        };
        let client = crate::cli::run::client(args.kubeconfig.as_deref(), None)
            .await
            .map_err(|e| api_error("*", &e))?;
        let api: Api<DynamicObject> = Api::all_with(client, &rollout_resource());
        match args.action {
            RolloutAction::Status { name } => {
                let items = match &name {
                    Some(n) => vec![api.get(n).await.map_err(|e| api_error(n, &e))?],
                    None => {
                        api.list(&ListParams::default())
                            .await
                            .map_err(|e| api_error("*", &e))?
                            .items
                    }
                };
                for obj in items {
                    println!("{}", line(&serde_json::to_value(&obj).unwrap_or_default()));
                }
            }
            RolloutAction::Undo { name } => {
                let patch = json!({"spec": {"rollback": true}});
                let obj = api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(|e| api_error(&name, &e))?;
                let value = serde_json::to_value(&obj).unwrap_or_default();
                println!(
                    "rollout {name}: rollback requested; the leader sends every primary of plugin {} back to {}",
                    value["spec"]["plugin"].as_str().unwrap_or("-"),
                    value["status"]["currentVersion"]
                        .as_str()
                        .unwrap_or("the current version"),
                );
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}
