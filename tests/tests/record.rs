//! Record and replay against the real local control plane: a live
//! operator records every reconcile (`OperatorConfig::recorder`, what
//! `wasmop run --record` sets), `wasmop replay` recomputes the recordings
//! with a candidate and diffs, and no Secret value reaches a recording.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Result, bail, ensure};
use base64::Engine as _;
use clap::Parser;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;
use wasmop::record::Recorder;
use wasmop_tests::operator::{RunningOperator, load_plugin, plugin_path, test_config};
use wasmop_tests::widgets::TempDir;
use wasmop_tests::{DEFAULT_DEADLINE, TestNamespace, apply_test_crds, wait_for};

fn api(ns: &TestNamespace, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("test.wasmop.dev", "v1", kind);
    Api::namespaced_with(
        ns.client.clone(),
        &ns.name,
        &ApiResource::from_gvk_with_plural(&gvk, plural),
    )
}

async fn create(api: &Api<DynamicObject>, obj: serde_json::Value) -> Result<()> {
    api.create(&PostParams::default(), &serde_json::from_value(obj)?)
        .await?;
    Ok(())
}

/// The recordings in `dir` (file name, text).
fn recordings(dir: &Path) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "json") {
            let name = p
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_owned();
            out.push((name, std::fs::read_to_string(&p)?));
        }
    }
    out.sort();
    Ok(out)
}

/// `wasmop replay DIR --plugin FILE [extra…]` through the real command
/// line: its exit code and whether it returned an error.
async fn replay(dir: &Path, plugin: &Path, extra: &[&str]) -> Result<Result<ExitCode, String>> {
    let mut argv: Vec<String> = vec![
        "wasmop".into(),
        "replay".into(),
        dir.display().to_string(),
        "--plugin".into(),
        plugin.display().to_string(),
    ];
    argv.extend(extra.iter().map(|s| (*s).to_owned()));
    let cli = wasmop::cli::Cli::try_parse_from(&argv)?;
    Ok(
        tokio::task::spawn_blocking(move || wasmop::cli::execute(cli))
            .await?
            .map_err(|e| e.to_string()),
    )
}

#[tokio::test]
async fn a_recording_replays_equal_and_a_changed_candidate_shows_exactly_its_changes() -> Result<()>
{
    let ns = TestNamespace::new("record").await?;
    apply_test_crds(&ns.client).await?;
    let dir = TempDir::new("wasmop-record");
    let recorder = Arc::new(Recorder::new(dir.0.clone(), 64 << 20)?);
    let config = wasmop::controller::OperatorConfig {
        recorder: Some(recorder),
        ..test_config()
    };
    let op = RunningOperator::start_with(
        ns.client.clone(),
        vec![ns.name.clone()],
        vec![
            load_plugin("good", json!({}))?,
            load_plugin("mirror", json!({}))?,
        ],
        config,
    )
    .await?;

    // A canary Secret the mirror plugin copies: its value must never be
    // written to a recording, in any form.
    let canary = format!("canary-{}", std::process::id() * 7919);
    let encoded = base64::engine::general_purpose::STANDARD.encode(&canary);
    let secrets: Api<Secret> = ns.api();
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "source"},
                "stringData": {"password": canary},
            }))?,
        )
        .await?;
    create(
        &api(&ns, "Mirror", "mirrors"),
        json!({"apiVersion": "test.wasmop.dev/v1", "kind": "Mirror",
               "metadata": {"name": "m"}, "spec": {"secretRef": "source"}}),
    )
    .await?;
    for w in ["w1", "w2"] {
        create(
            &api(&ns, "Widget", "widgets"),
            json!({"apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
                   "metadata": {"name": w}, "spec": {"value": w}}),
        )
        .await?;
    }
    let cms: Api<ConfigMap> = ns.api();
    wait_for(
        "both Widgets' ConfigMaps and the mirrored Secret",
        DEFAULT_DEADLINE,
        || {
            let cms = cms.clone();
            let secrets = secrets.clone();
            async move {
                let done = cms.get_opt("w1-cm").await?.is_some()
                    && cms.get_opt("w2-cm").await?.is_some()
                    && secrets.get_opt("m-mirror").await?.is_some();
                if done { Ok(Some(())) } else { bail!("not yet") }
            }
        },
    )
    .await?;
    // Every reconcile is recorded. Wait for a recording of each Widget whose
    // snapshot already holds its ConfigMap (the reconcile after the
    // create), and one of the Mirror.
    wait_for("recordings of every primary", DEFAULT_DEADLINE, || {
        let dir = dir.0.clone();
        async move {
            let files = recordings(&dir)?;
            let holds = |primary: &str, object: Option<&str>| {
                files.iter().any(|(f, text)| {
                    f.ends_with(&format!("-{primary}.json"))
                        && object.is_none_or(|o| {
                            serde_json::from_str::<serde_json::Value>(text)
                                .ok()
                                .and_then(|v| v["items"].as_array().cloned())
                                .unwrap_or_default()
                                .iter()
                                .any(|i| i["kind"] == "ConfigMap" && i["metadata"]["name"] == o)
                        })
                })
            };
            if holds("w1", Some("w1-cm")) && holds("w2", Some("w2-cm")) && holds("m", None) {
                Ok(Some(()))
            } else {
                bail!("{} recordings so far", files.len())
            }
        }
    })
    .await?;
    drop(op);

    let files = recordings(&dir.0)?;
    for (name, text) in &files {
        ensure!(!text.contains(&canary), "{name} holds the canary value");
        ensure!(
            !text.contains(&encoded),
            "{name} holds the canary value in base64"
        );
    }
    // The mirror's recording holds the redacted token where the value was,
    // in the source and in the planned copy.
    let mirror_text = files
        .iter()
        .find(|(f, _)| f.ends_with("-m.json"))
        .map(|(_, t)| t.clone())
        .unwrap_or_default();
    ensure!(
        mirror_text.contains("d2FzbW9wLXJlZGFjdGVk"),
        "no redaction token in {mirror_text}"
    );

    // The same plugins replay equal: exit 0.
    let good = plugin_path("good")?;
    assert_eq!(
        replay(&dir.0, &good, &[])
            .await?
            .map_err(anyhow::Error::msg)?,
        ExitCode::SUCCESS
    );
    let mirror = plugin_path("mirror")?;
    assert_eq!(
        replay(&dir.0, &mirror, &[])
            .await?
            .map_err(anyhow::Error::msg)?,
        ExitCode::SUCCESS
    );

    // good's ports to JavaScript and Python replay the Rust good's
    // recording equal.
    for port in ["good-js", "good-py"] {
        assert_eq!(
            replay(&dir.0, &plugin_path(port)?, &[])
                .await?
                .map_err(anyhow::Error::msg)?,
            ExitCode::SUCCESS,
            "{port}"
        );
    }

    // A candidate that changes a field, in any language: exit 1, and the
    // diff names the field of each Widget's ConfigMap and nothing else.
    for candidate in ["good-v2", "good-v2-js", "good-v2-py"] {
        let v2 = plugin_path(candidate)?;
        assert_eq!(
            replay(&dir.0, &v2, &[])
                .await?
                .map_err(anyhow::Error::msg)?,
            ExitCode::FAILURE,
            "{candidate}"
        );
        let report = wasmop_replay_json(&dir.0, &v2).await?;
        let diffs = differences(&report);
        ensure!(!diffs.is_empty(), "{candidate}: {report:?}");
        for d in &diffs {
            ensure!(
                d.starts_with("apply ConfigMap ")
                    && d.contains(
                        "-cm .metadata.labels[\"test.wasmop.dev/version\"]: \"v1\" → \"v2\""
                    ),
                "{candidate}: unexpected difference {d}"
            );
        }
    }
    let v2 = plugin_path("good-v2")?;
    // Expected through the allow-list: exit 0.
    let allow = dir.0.join("allow.yaml");
    std::fs::write(
        &allow,
        "- {op: apply, object: 'ConfigMap */*-cm', path: '.metadata.labels*'}\n",
    )?;
    let allow_arg = allow.display().to_string();
    assert_eq!(
        replay(&dir.0, &v2, &["--allow", &allow_arg])
            .await?
            .map_err(anyhow::Error::msg)?,
        ExitCode::SUCCESS
    );

    // A candidate that deletes more: the diff shows the delete and the
    // apply it dropped.
    let pruner = plugin_path("good-pruner")?;
    assert_eq!(
        replay(&dir.0, &pruner, &[])
            .await?
            .map_err(anyhow::Error::msg)?,
        ExitCode::FAILURE
    );
    let report = wasmop_replay_json(&dir.0, &pruner).await?;
    let diffs = differences(&report);
    for w in ["w1", "w2"] {
        let ns_name = &ns.name;
        ensure!(
            diffs
                .iter()
                .any(|d| d.starts_with(&format!("delete ConfigMap {ns_name}/{w}-cm: (absent) → "))),
            "no delete of {w}-cm in {diffs:?}"
        );
        ensure!(
            diffs.iter().any(
                |d| d.starts_with(&format!("apply ConfigMap {ns_name}/{w}-cm: {{"))
                    && d.ends_with("→ (absent)")
            ),
            "no dropped apply of {w}-cm in {diffs:?}"
        );
    }
    // Recordings of another plugin only: a usage error, not a pass.
    let other = TempDir::new("wasmop-record-other");
    for (name, text) in files.iter().filter(|(f, _)| f.ends_with("-m.json")) {
        std::fs::write(other.0.join(name), text)?;
    }
    let err = replay(&other.0, &good, &[])
        .await?
        .expect_err("no recording of good");
    ensure!(err.contains("no recording of plugin good"), "{err}");
    Ok(())
}

/// The report of `wasmop replay` (what `-o json` prints).
async fn wasmop_replay_json(dir: &Path, plugin: &Path) -> Result<wasmop::cli::replay::Report> {
    let dir = dir.to_owned();
    let plugin = plugin.to_owned();
    // The compile cache every test and `wasmop replay` use: good's ports
    // to JavaScript and Python (12-18 MB) take a debug build minutes each
    // to compile, and each digest compiles once per machine.
    let load = wasmop::cli::PluginArgs {
        compile_cache: None,
        no_compile_cache: false,
        deadline_ms: 2000,
        memory_mib: 64,
    };
    tokio::task::spawn_blocking(move || wasmop::cli::replay::replay(&dir, &plugin, &[], &load))
        .await?
        .map_err(|e| anyhow::anyhow!("{e}"))
}

fn differences(report: &wasmop::cli::replay::Report) -> Vec<String> {
    report
        .replays
        .iter()
        .flat_map(|r| r.differences.iter().map(ToString::to_string))
        .collect()
}
