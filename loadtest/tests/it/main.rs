//! The load tester against a real local deployment: a short open-loop load with one chaos
//! step (kill -9 the send worker, start it again), and the proof must say lost 0, doubled 0.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const LOADTEST: &str = env!("CARGO_BIN_EXE_herald-loadtest");

/// The `herald` binary of the same profile, next to the load tester; built when missing or
/// stale (cargo answers at once when it is up to date).
fn herald_binary() -> PathBuf {
    let dir = Path::new(LOADTEST).parent().expect("target directory");
    let release = dir.file_name().is_some_and(|n| n == "release");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut build = Command::new(cargo);
    build
        .args(["build", "-p", "herald", "--bin", "herald"])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if release {
        build.arg("--release");
    }
    let status = build.status().expect("running cargo build -p herald");
    assert!(status.success(), "cargo build -p herald failed");
    let herald = dir.join("herald");
    assert!(herald.is_file(), "no {}", herald.display());
    herald
}

/// A provider that answers 404 to everything (Herald pointed at the wrong URL) takes no
/// message: the run must fail, naming the DEAD ones, and pass only when it declares them.
#[test]
fn a_provider_answering_404_to_everything_fails_the_run() {
    let herald = herald_binary();
    let out = tempfile::tempdir().unwrap();
    let run = |expect: &str| {
        let output = Command::new(LOADTEST)
            .args(["run", "--local", "--herald-bin"])
            .arg(&herald)
            .args(["--rate", "20", "--duration", "2s", "--partitions", "16"])
            .args(["--seed", "11", "--drain-timeout", "120s", "--no-plot"])
            .args(["--sim-flag=--refuse-status=404"])
            .args(["--send-worker-flag=--max-attempts=2"])
            .args(["--send-worker-flag=--retry-base=50ms"])
            .args(["--expect", expect, "--name", "refused", "--out"])
            .arg(out.path())
            .output()
            .expect("running herald-loadtest");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        println!("{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
        (output.status.code(), stdout)
    };
    let (code, stdout) = run("");
    assert_eq!(code, Some(1), "a run that delivered nothing must fail");
    assert!(stdout.contains("WRONG dead: 40 (expected 0)"), "{stdout}");
    let (code, stdout) = run("dead=40");
    assert_eq!(code, Some(0), "the outage was declared: {stdout}");
}

#[test]
fn a_short_load_with_the_send_worker_killed_loses_and_doubles_nothing() {
    let herald = herald_binary();
    let out = tempfile::tempdir().unwrap();
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/kill-send-worker.toml");
    let output = Command::new(LOADTEST)
        .args(["run", "--local", "--herald-bin"])
        .arg(&herald)
        .args(["--rate", "100", "--duration", "5s", "--partitions", "16"])
        .args(["--batch", "1", "--replay-rate", "0.05", "--seed", "7"])
        .args(["--drain-timeout", "120s", "--name", "it", "--out"])
        .arg(out.path())
        .arg("--scenario")
        .arg(&scenario)
        .output()
        .expect("running herald-loadtest");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}\n{stderr}");
    assert_eq!(output.status.code(), Some(0), "herald-loadtest failed");

    let report = std::fs::read_dir(out.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "json"))
        .expect("a JSON report");
    let report: Value = serde_json::from_slice(&std::fs::read(report).unwrap()).unwrap();
    let proof = &report["proof"];
    assert_eq!(proof["lost"], 0, "{proof}");
    assert_eq!(proof["verdict"]["fates"]["doubled"], 0, "{proof}");
    assert_eq!(proof["replay_mismatches"], 0, "{proof}");
    // Every id the API accepted is proven delivered, one by one: how many were accepted in
    // the 5 s is the machine's throughput, a benchmark's figure.
    assert_eq!(proof["accepted"], report["load"]["accepted"]);
    assert!(proof["accepted"].as_u64().unwrap() > 0, "{proof}");
    assert_eq!(proof["delivered"], proof["accepted"], "{proof}");
    assert_eq!(report["drain"]["complete"], true, "{}", report["drain"]);
    assert_eq!(report["ok"], true, "{proof}");
    assert!(report["load"]["replays"].as_u64().unwrap() > 0);

    let chaos = report["chaos"].as_array().unwrap();
    assert_eq!(chaos.len(), 1, "{chaos:?}");
    assert_eq!(chaos[0]["ok"], true, "{chaos:?}");
    assert!(chaos[0]["pid"].as_i64().is_some(), "{chaos:?}");
    assert!(report["restarted_roles"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r == "send-worker"));

    let stages = report["breakdown"].as_array().unwrap();
    for stage in [
        "claim",
        "publish",
        "mark",
        "confirm",
        "provider call",
        "ledger",
    ] {
        let row = stages.iter().find(|s| s["name"] == stage).unwrap();
        assert!(row["calls"].as_u64().unwrap() > 0, "{stage}: {row}");
    }
    assert!(out.path().read_dir().unwrap().any(|e| e
        .unwrap()
        .path()
        .extension()
        .is_some_and(|x| x == "svg")));
}

#[test]
fn chaos_steps_against_a_deployment_it_did_not_start_are_refused() {
    let output = Command::new(LOADTEST)
        .args(["run", "--api-url", "http://127.0.0.1:9", "--database-url"])
        .args([
            "postgres://nobody@127.0.0.1:9/none",
            "--sim-url",
            "http://127.0.0.1:9",
        ])
        .arg("--scenario")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/kill-send-worker.toml"))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("chaos steps need a local deployment"),
        "{stderr}"
    );
}

#[test]
fn compare_prints_ratios() {
    let dir = tempfile::tempdir().unwrap();
    let report = |name: &str, delivered: f64| {
        let path = dir.path().join(format!("{name}.json"));
        let mut value: Value = serde_json::from_str(include_str!("report.json")).unwrap();
        value["name"] = name.into();
        value["throughput"]["delivered_per_s"] = delivered.into();
        std::fs::write(&path, value.to_string()).unwrap();
        path
    };
    let (a, b) = (report("a", 100.0), report("b", 250.0));
    let output = Command::new(LOADTEST)
        .arg("compare")
        .args([&a, &b])
        .output()
        .unwrap();
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout);
    let row = text
        .lines()
        .find(|l| l.contains("delivered end to end"))
        .unwrap();
    assert!(row.contains("2.50x"), "{row}");
}
