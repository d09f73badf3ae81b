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
    // The variables cargo gives this test describe this package (CARGO_PKG_NAME and the
    // like); passed on, they made the nested build compile ring, sqlx and every Herald crate
    // again (1 min 22 s of the suite) although `cargo test` had just built them.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if [
            "CARGO_PKG_",
            "CARGO_MANIFEST_",
            "CARGO_CRATE_",
            "CARGO_BIN_",
        ]
        .iter()
        .any(|prefix| key.starts_with(prefix))
            || key == "CARGO_PRIMARY_PACKAGE"
            || key == "CARGO_TARGET_TMPDIR"
        {
            build.env_remove(key);
        }
    }
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
    // No "mark": the shared rounds claim rows as PUBLISHED.
    for stage in ["claim", "publish", "confirm", "provider call", "ledger"] {
        let row = stages.iter().find(|s| s["name"] == stage).unwrap();
        assert!(row["calls"].as_u64().unwrap() > 0, "{stage}: {row}");
    }
    assert!(out.path().read_dir().unwrap().any(|e| e
        .unwrap()
        .path()
        .extension()
        .is_some_and(|x| x == "svg")));

    // The cost of the run, read from the database's counters and /proc.
    let cost = &report["cost"];
    assert!(
        cost["row_writes_per_message"].as_f64().unwrap() >= 5.0,
        "{cost}"
    );
    assert!(
        cost["wal_bytes_per_message"].as_f64().unwrap() > 0.0,
        "{cost}"
    );
    assert!(
        cost["cpu_s_per_1000"]["postgres"].as_f64().unwrap() > 0.0,
        "{cost}"
    );
    assert!(
        cost["cpu_s_per_1000"]["api"].as_f64().unwrap() > 0.0,
        "{cost}"
    );
    for table in ["messages", "outbox", "message_events", "ledger"] {
        let writes = &cost["tables_per_message"][table];
        assert!(
            writes["inserts"].as_f64().unwrap() >= 0.99,
            "{table}: {cost}"
        );
    }
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

/// The benchmarks a new user runs first, each at a toy size: `capacity` finds a rate it
/// sustains and writes its steps with their cost, `drain` empties a backlog accepted with the
/// pollers stopped and proves it, `idle` measures a deployment with nothing to do.
#[test]
fn capacity_drain_and_idle_report_what_they_measured() {
    let herald = herald_binary();
    let out = tempfile::tempdir().unwrap();
    let json = |prefix: &str| -> Value {
        let path = std::fs::read_dir(out.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".json"))
            })
            .unwrap_or_else(|| panic!("no {prefix} report"));
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    };
    let run = |args: &[&str]| {
        let output = Command::new(LOADTEST)
            .args(args)
            .arg("--herald-bin")
            .arg(&herald)
            .args(["--partitions", "8", "--out"])
            .arg(out.path())
            .output()
            .expect("running herald-loadtest");
        println!(
            "{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        output.status.code()
    };

    let code = run(&[
        "capacity",
        "--local",
        "--from",
        "40",
        "--factor",
        "2",
        "--max-rate",
        "80",
        "--hold",
        "3s",
        "--refine",
        "0",
        "--no-half-step",
        "--seed",
        "5",
    ]);
    assert_eq!(code, Some(0), "capacity found no sustained rate");
    let capacity = json("capacity-2");
    let steps = capacity["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2, "{capacity}");
    assert_eq!(steps[0]["rate"], 40.0);
    assert_eq!(steps[1]["rate"], 80.0);
    assert!(steps.iter().all(|s| s["passed"] == true), "{capacity}");
    assert_eq!(capacity["capacity"], 80.0);
    assert_eq!(steps[1]["delivered"], 240, "{capacity}");
    assert!(steps[1]["cost"]["row_writes_per_message"].as_f64().unwrap() > 1.0);

    let code = run(&[
        "drain",
        "--messages",
        "400",
        "--batch",
        "20",
        "--fill-rate",
        "400",
        "--seed",
        "6",
    ]);
    assert_eq!(code, Some(0), "drain failed");
    let drain = json("drain-");
    assert_eq!(drain["backlog"], 400, "{drain}");
    assert_eq!(drain["proof"]["delivered"], 400, "{drain}");
    assert_eq!(drain["settled"], true, "{drain}");
    assert!(drain["delivered_per_s"].as_f64().unwrap() > 0.0, "{drain}");
    let per_5s: u64 = drain["delivered_per_5s"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(per_5s, 400, "{drain}");
    // The WAL of the window by table: all of it still on disk, partitions and indexes folded
    // into their tables, and the tables' figures adding up to the WAL per message.
    let cost = &drain["cost"];
    let wal = &cost["wal_by_table"];
    assert!(wal["covered"].as_f64().unwrap() > 0.99, "{wal}");
    let tables = wal["per_message"].as_object().unwrap();
    for table in ["outbox", "message_events", "ledger", "in_flight_sends"] {
        assert!(
            tables[table]["bytes"].as_f64().unwrap() > 0.0,
            "{table}: {wal}"
        );
    }
    assert!(
        !tables
            .keys()
            .any(|name| name.starts_with("outbox_p") || name.ends_with("_pkey")),
        "{wal}"
    );
    let sum: f64 = tables.values().map(|t| t["bytes"].as_f64().unwrap()).sum();
    let measured = cost["wal_bytes_per_message"].as_f64().unwrap();
    assert!(
        (sum - measured).abs() < measured * 0.01,
        "{sum} against {measured}"
    );

    let code = run(&["idle", "--duration", "3s", "--warmup", "1s"]);
    assert_eq!(code, Some(0), "idle failed");
    let idle = json("idle-");
    let share = idle["share_by_process"].as_object().unwrap();
    for process in ["api", "poller-0", "send-worker", "postgres", "etcd"] {
        assert!(
            share.contains_key(process),
            "{process} not measured: {idle}"
        );
    }
    assert!(idle["machine_share"].as_f64().unwrap() < 1.0, "{idle}");
}

/// PostgreSQL crashes under load (every process killed at once) and later restarts cleanly:
/// every message the API accepted is delivered once, and nothing ends in a wrong state.
#[test]
fn a_postgres_crash_and_restart_under_load_lose_and_double_nothing() {
    let herald = herald_binary();
    let out = tempfile::tempdir().unwrap();
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/postgres-crash.toml");
    let output = Command::new(LOADTEST)
        .args(["run", "--local", "--herald-bin"])
        .arg(&herald)
        .args(["--rate", "60", "--duration", "12s", "--partitions", "16"])
        // Durable: without fsync and synchronous commit, a crash loses commits the API
        // already acknowledged (the proof catches exactly that: `missing`).
        .args([
            "--durable",
            "--batch",
            "2",
            "--seed",
            "21",
            "--retries",
            "8",
        ])
        .args([
            "--drain-timeout",
            "150s",
            "--no-plot",
            "--name",
            "pg",
            "--out",
        ])
        .arg(out.path())
        .arg("--scenario")
        .arg(&scenario)
        .output()
        .expect("running herald-loadtest");
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!("{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(0), "herald-loadtest failed");
    let report = std::fs::read_dir(out.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "json"))
        .expect("a JSON report");
    let report: Value = serde_json::from_slice(&std::fs::read(report).unwrap()).unwrap();
    let chaos = report["chaos"].as_array().unwrap();
    assert_eq!(chaos.len(), 2, "{chaos:?}");
    assert!(chaos.iter().all(|c| c["ok"] == true), "{chaos:?}");
    let proof = &report["proof"];
    assert_eq!(proof["lost"], 0, "{proof}");
    assert_eq!(proof["verdict"]["fates"]["doubled"], 0, "{proof}");
    assert!(proof["accepted"].as_u64().unwrap() > 0, "{proof}");
    assert_eq!(proof["delivered"], proof["accepted"], "{proof}");
    assert_eq!(report["ok"], true);
}
