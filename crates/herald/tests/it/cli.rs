//! The built binary's command line: subcommands, configuration files and flags, exit codes.
//! Longer than 400 lines: one test per command-line promise, each running the binary.

use std::process::Output;

use crate::deployment::HERALD;

fn herald(args: &[&str]) -> Output {
    std::process::Command::new(HERALD)
        .args(args)
        .env_remove("HERALD_DATABASE_URL")
        .output()
        .unwrap()
}

#[test]
fn help_names_every_role_and_its_environment_variables() {
    let out = herald(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for role in [
        "migrate",
        "api",
        "poller",
        "worker",
        "provider-sim",
        "dev",
        "verify",
        "archive",
    ] {
        assert!(text.contains(role), "{role} missing from --help:\n{text}");
    }
    for (role, env) in [
        ("migrate", "HERALD_PARTITIONS"),
        ("api", "HERALD_API_CLIENT_KEYS"),
        ("api", "HERALD_API_OPERATOR_KEYS"),
        ("api", "HERALD_RECEIPT_SECRETS"),
        ("api", "HERALD_INSECURE_DEV"),
        ("provider-sim", "HERALD_SIM_RECEIPT_SECRETS"),
        ("migrate", "HERALD_RUNTIME_ROLE_PASSWORD"),
        ("poller", "HERALD_REDIS_SEND_URL"),
        ("worker", "HERALD_WORKER_CONCURRENCY"),
        ("provider-sim", "HERALD_SIM_ERROR_RATE"),
        ("dev", "HERALD_DEV_MESSAGES"),
        ("verify", "HERALD_PROVIDER_SIM_URL"),
        ("plan", "HERALD_PLAN_CONFIG"),
    ] {
        let out = herald(&[role, "--help"]);
        assert!(out.status.success(), "{role} --help failed");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(env),
            "{env} missing from {role} --help:\n{text}"
        );
    }
}

/// `--help` shows which variable each flag reads, never the value it holds: URLs carry
/// passwords, and keys and secrets are nothing but.
#[test]
fn help_never_prints_a_secret_from_the_environment() {
    let secrets = [
        ("HERALD_DATABASE_URL", "postgres://herald:pw-db-1@db/herald"),
        ("HERALD_REDIS_URL", "redis://:pw-redis-2@redis:6379"),
        ("HERALD_REDIS_SEND_URL", "redis://:pw-redis-3@redis:6379"),
        ("HERALD_REDIS_STATUS_URL", "redis://:pw-redis-4@redis:6379"),
        ("HERALD_ETCD_ENDPOINTS", "http://root:pw-etcd-5@etcd:2379"),
        ("HERALD_PROVIDER_URL", "https://user:pw-gw-6@gateway"),
        ("HERALD_PROVIDER_SIM_URL", "http://user:pw-sim-7@sim"),
        ("HERALD_SIM_CALLBACK_URL", "http://user:pw-cb-8@api"),
        ("HERALD_API_CLIENT_KEYS", "shop=pw-client-key-10"),
        ("HERALD_API_OPERATOR_KEYS", "ops=pw-operator-key-11"),
        ("HERALD_RECEIPT_SECRETS", "gw-a=pw-receipt-secret-12"),
        ("HERALD_SIM_RECEIPT_SECRETS", "gw-a=pw-receipt-secret-13"),
        ("HERALD_RUNTIME_ROLE_PASSWORD", "pw-runtime-role-14"),
    ];
    for role in [
        "migrate",
        "api",
        "poller",
        "worker",
        "provider-sim",
        "dev",
        "verify",
        "plan",
    ] {
        let out = std::process::Command::new(HERALD)
            .args([role, "--help"])
            .envs(secrets)
            .output()
            .unwrap();
        assert!(out.status.success(), "{role} --help failed");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            !text.contains("pw-"),
            "{role} --help shows a secret:\n{text}"
        );
    }
}

#[test]
fn bad_configuration_exits_64_with_the_reason() {
    let out = herald(&["api"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--database-url"));

    let out = herald(&[
        "worker",
        "--job-type",
        "sms",
        "--database-url",
        "postgres://x/y",
    ]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("sms"));

    let out = herald(&[
        "migrate",
        "--database-url",
        "postgres://127.0.0.1:1/x",
        "--partitions",
        "0",
    ]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("partition count"));
}

/// TLS files that cannot work are refused before anything connects, naming the flag.
#[test]
fn unusable_tls_files_exit_64_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let not_pem = dir.path().join("ca.txt");
    std::fs::write(&not_pem, "not a certificate").unwrap();
    let not_pem = not_pem.to_str().unwrap();
    let base = [
        "worker",
        "--job-type",
        "send",
        "--database-url",
        "postgres://127.0.0.1:1/x",
        "--redis-url",
        "rediss://127.0.0.1:1/",
        "--provider-url",
        "https://127.0.0.1:1",
    ];
    for (extra, says) in [
        (
            vec!["--redis-ca-file", "/nonexistent/ca.pem"],
            "--redis-ca-file: cannot read",
        ),
        (vec!["--redis-ca-file", not_pem], "holds no PEM block"),
        (
            vec!["--redis-cert-file", not_pem],
            "--redis-cert-file and --redis-key-file go together",
        ),
        (vec!["--provider-ca-file", not_pem], "--provider-ca-file"),
    ] {
        let mut args = base.to_vec();
        args.extend(extra.iter().copied());
        let out = herald(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

/// Settings come from defaults, then a --config file, then HERALD_* variables, then flags;
/// --print-config shows the merged result, and a key no role knows is refused.
#[test]
fn a_config_file_sits_between_the_defaults_and_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("herald.toml");
    std::fs::write(
        &file,
        "database_url = \"postgres://herald@db/herald\"\nmax_batch = 5\n\
         [api]\nmax_batch = 7\ngroup-max = 64\nrequest_timeout = \"3s\"\n",
    )
    .unwrap();
    let config = |extra: &[&str], env: &[(&str, &str)]| {
        let mut command = std::process::Command::new(HERALD);
        command
            .args(["api", "--config", file.to_str().unwrap(), "--print-config"])
            .args(extra)
            .env_remove("HERALD_DATABASE_URL")
            .env("HERALD_API_CLIENT_KEYS", "shop=k1-client-key-0123456")
            .env("HERALD_RECEIPT_SECRETS", "gw-a=k2-receipt-secret-0123");
        for (k, v) in env {
            command.env(k, v);
        }
        let out = command.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let from_file = config(&[], &[]);
    assert_eq!(
        from_file["max_batch"], 7,
        "the [api] table wins over the top level"
    );
    assert_eq!(from_file["group_max"], 64);
    assert_eq!(from_file["request_timeout"], "3s");
    assert_eq!(
        from_file["max_body_bytes"], 262144,
        "the default where nothing says otherwise"
    );
    let env_wins = config(&[], &[("HERALD_API_MAX_BATCH", "8")]);
    assert_eq!(env_wins["max_batch"], 8);
    let flag_wins = config(&["--max-batch", "9"], &[("HERALD_API_MAX_BATCH", "8")]);
    assert_eq!(flag_wins["max_batch"], 9);

    std::fs::write(&file, "[api]\nmax_bacth = 7\n").unwrap();
    let out = herald(&["api", "--config", file.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("[api] max_bacth"), "{stderr}");
}

#[test]
fn print_config_masks_passwords() {
    let out = std::process::Command::new(HERALD)
        .args([
            "api",
            "--database-url",
            "postgres://herald:s3cret@db/herald",
            "--print-config",
        ])
        .env("HERALD_API_CLIENT_KEYS", "shop=k1-client-key-0123456")
        .env("HERALD_RECEIPT_SECRETS", "gw-a=k2-receipt-secret-0123")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !text.contains("s3cret") && !text.contains("k1-") && !text.contains("k2-"),
        "{text}"
    );
    assert!(text.contains("postgres://herald:***@db/herald"), "{text}");
    assert!(text.contains("(set, hidden)"), "{text}");
}

#[tokio::test]
async fn migrate_refuses_another_partition_count() {
    let db = herald_testkit::TestDatabase::empty().await.unwrap();
    let url = db.url();
    let run = |partitions: &str| {
        std::process::Command::new(HERALD)
            .args([
                "migrate",
                "--database-url",
                &url,
                "--partitions",
                partitions,
            ])
            .output()
            .unwrap()
    };
    assert!(run("8").status.success());
    assert!(run("8").status.success());
    let out = run("16");
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("8 partitions") && stderr.contains("16"),
        "{stderr}"
    );
}

#[test]
fn plan_checks_pool_and_memory_budgets() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/plan.toml");
    let out = herald(&["plan", "--config", example]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("postgres connections") && text.contains("every budget fits"),
        "{text}"
    );

    // Ten more send workers of 16 connections each do not fit in 200.
    let dir = tempfile::tempdir().unwrap();
    let crowded = dir.path().join("crowded.toml");
    let config = std::fs::read_to_string(example).unwrap().replace(
        "name = \"worker-send\"\nreplicas = 4",
        "name = \"worker-send\"\nreplicas = 14",
    );
    std::fs::write(&crowded, config).unwrap();
    let out = herald(&["plan", "--config", crowded.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("postgres connections") && text.contains("OVER"),
        "{text}"
    );
    assert!(text.contains("worker-send 14x16"), "{text}");

    // A backlog that does not fit below the pause threshold.
    let full = dir.path().join("full.toml");
    let config = std::fs::read_to_string(example).unwrap().replacen(
        "peak_backlog_jobs = 500000",
        "peak_backlog_jobs = 5000000",
        1,
    );
    std::fs::write(&full, config).unwrap();
    let out = herald(&["plan", "--config", full.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("redis send memory per shard"));

    // A typo is a configuration error, not a silent default.
    let typo = dir.path().join("typo.toml");
    std::fs::write(&typo, "[postgres]\nmax_conections = 10\n").unwrap();
    let out = herald(&["plan", "--config", typo.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_conections"));
}

#[test]
fn plan_checks_the_budgets_of_a_helm_release() {
    let chart = concat!(env!("CARGO_MANIFEST_DIR"), "/../../helm/herald");
    let defaults = format!("{chart}/values.yaml");
    let plan = |files: &[&str]| {
        let mut args = vec!["plan"];
        for file in files {
            args.extend(["--values", file]);
        }
        herald(&args)
    };

    // Every Deployment counts one surge pod: api 2+1, poller 2+1 (16 + 1 LISTEN), workers 2+1.
    let out = plan(&[&defaults]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(
            "api 3x16 + poller 3x17 + worker-send 3x16 + worker-status 3x16 + 3 reserved"
        ) && text.contains("every budget fits"),
        "{text}"
    );
    for example in ["small", "large"] {
        let file = format!("{chart}/examples/{example}.yaml");
        let out = plan(&[&defaults, &file]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{example}: {text}");
    }
    // large: KEDA's maximum (16) plus a surge pod; four send shards share the send backlog.
    let large = format!("{chart}/examples/large.yaml");
    let text = String::from_utf8_lossy(&plan(&[&defaults, &large]).stdout).into_owned();
    assert!(text.contains("poller 17x17"), "{text}");
    assert!(text.contains("5000000 jobs x 256 B"), "{text}");

    // Later files win; the autoscaler's maximum is capped at the partition count.
    let dir = tempfile::tempdir().unwrap();
    let crowded = dir.path().join("crowded.yaml");
    std::fs::write(
        &crowded,
        "partitions: 8\npoller:\n  autoscaling:\n    enabled: true\n    maxReplicas: 50\n\
         workers:\n  send:\n    replicas: 20\n",
    )
    .unwrap();
    let out = plan(&[&defaults, crowded.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("poller 9x17") && text.contains("worker-send 21x16") && text.contains("OVER"),
        "{text}"
    );

    // External shards are counted from their URLs; memory is checked per shard.
    let full = dir.path().join("full.yaml");
    std::fs::write(
        &full,
        "redis:\n  status:\n    maxmemoryMb: 64\n    peakBacklogJobs: 1000000\n    external:\n      \
         urls: [\"redis://a:6379/\", \"redis://b:6379/\"]\n",
    )
    .unwrap();
    let out = plan(&[&defaults, full.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("redis status memory per shard") && text.contains("500000 jobs x 256 B"),
        "{text}"
    );

    // Without the chart's defaults a value is missing: a configuration error, not a guess.
    let out = plan(&[crowded.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("values.yaml"));
    // --config and --values are one or the other.
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/plan.toml");
    let out = herald(&["plan", "--config", example, "--values", &defaults]);
    assert_eq!(out.status.code(), Some(64));
}

/// A worker's defaults depend on its job type; --print-config shows the values it runs with,
/// and a flag still wins over them.
#[test]
fn print_config_shows_the_job_types_own_defaults() {
    let config = |extra: &[&str]| {
        let out = std::process::Command::new(HERALD)
            .args(["worker", "--print-config"])
            .args(extra)
            .env("HERALD_DATABASE_URL", "postgres://herald@db/herald")
            .env("HERALD_REDIS_URL", "redis://queue:6379")
            .env("HERALD_PROVIDER_URL", "http://provider:8080")
            .env_remove("HERALD_WORKER_CONCURRENCY")
            .env_remove("HERALD_WORKER_BATCHES_IN_FLIGHT")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let send = config(&["--job-type", "send"]);
    assert_eq!(send["concurrency"], 512);
    assert_eq!(send["batches_in_flight"], 0);
    let status = config(&["--job-type", "status"]);
    assert_eq!(status["concurrency"], 64);
    assert_eq!(status["batches_in_flight"], 2);
    let chosen = config(&["--job-type", "send", "--concurrency", "7"]);
    assert_eq!(chosen["concurrency"], 7, "a flag wins over the default");
}

/// A back-off cap below the first back-off is a configuration error, named before anything
/// connects; the cap is shown with the other settings.
#[test]
fn a_retry_cap_below_the_first_back_off_exits_64() {
    let base = [
        "worker",
        "--job-type",
        "send",
        "--database-url",
        "postgres://127.0.0.1:1/x",
        "--redis-url",
        "redis://127.0.0.1:1/",
        "--provider-url",
        "http://127.0.0.1:1",
    ];
    let mut args = base.to_vec();
    args.extend(["--retry-base", "2s", "--retry-max", "1s"]);
    let out = herald(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("--retry-max (1s) must be at least --retry-base (2s)"),
        "{stderr}"
    );

    let mut args = base.to_vec();
    args.extend(["--retry-max", "5s", "--print-config"]);
    let out = herald(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(config["retry_max"], "5s");
    assert_eq!(config["retry_base"], "500ms");
}

/// `herald <role> --config FILE --print-config`, with nothing from this process's HERALD_*
/// variables.
fn printed_config(role: &str, file: &std::path::Path) -> serde_json::Value {
    let mut command = std::process::Command::new(HERALD);
    command.args([role, "--config", file.to_str().unwrap(), "--print-config"]);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("HERALD_") {
            command.env_remove(key);
        }
    }
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{role}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Each role's typed configuration, written as its `--config` file the way the test kit runs
/// every role, is exactly what the role runs with: every setting the struct holds (defaults,
/// changed values, lists, durations, a true and a false switch) reads back the same.
#[test]
fn a_typed_configuration_written_as_a_file_is_what_the_role_runs_with() {
    use herald_core::JobType;
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let url = "postgres://herald@db:5432/herald";
    let check = |role: &str, config: serde_json::Value, file_text: String| {
        let file = dir.path().join(format!("{role}.toml"));
        std::fs::write(&file, file_text).unwrap();
        let printed = printed_config(role, &file);
        let serde_json::Value::Object(fields) = config else {
            panic!("{role}: not a struct")
        };
        for (key, value) in fields {
            if value.is_null() {
                continue;
            }
            assert_eq!(printed[&key], value, "{role}: {key} read back differently");
        }
    };
    let mut api = herald_api::ApiConfig::new(url);
    api.auth.insecure_dev = true;
    api.max_batch = 17;
    api.request_timeout = Duration::from_millis(2500);
    api.redis_send_url = vec!["redis://a:6379/".into(), "redis://b:6379/".into()];
    api.pressure.queue_full_threshold = 0.65;
    check("api", serde_json::to_value(&api).unwrap(), toml(&api));

    let mut poller = herald_poller::config::PollerConfig::new(url, "redis://a/", "redis://b/");
    poller.etcd_endpoints = vec!["http://etcd-0:2379".into(), "http://etcd-1:2379".into()];
    poller.poll_interval = Duration::from_millis(150);
    poller.poller_id = Some("poller-7".into());
    check(
        "poller",
        serde_json::to_value(&poller).unwrap(),
        toml(&poller),
    );

    let mut worker = herald_worker::config::WorkerConfig::new(JobType::Status, url, "redis://s/");
    worker.concurrency = Some(9);
    worker.batches_in_flight = Some(3);
    worker.status_alias = vec![("ACKD".into(), "DELIVRD".into())];
    worker.blocked_recipients = vec!["+15550100".into()];
    worker.receipt_window = Duration::from_secs(90 * 60);
    check(
        "worker",
        serde_json::to_value(&worker).unwrap(),
        toml(&worker),
    );

    let mut sim = herald_provider_sim::config::SimConfig {
        error_rate: 0.25,
        refuse_status: Some(404),
        gateways: vec!["gw-x".into()],
        ..Default::default()
    };
    sim.receipt_delay = Duration::from_millis(5);
    check(
        "provider-sim",
        serde_json::to_value(&sim).unwrap(),
        toml(&sim),
    );
}

/// Writes a role's configuration the way the test kit does.
fn toml<T: serde::Serialize>(config: &T) -> String {
    herald_testkit::config::role_config_toml(config).unwrap()
}

/// A poller or worker whose admin address is taken does not run on without `/metrics` and
/// probes: it fails at start, naming the address, before it connects to anything.
#[test]
fn a_taken_admin_address_fails_the_start() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    for role in [
        &[
            "worker",
            "--job-type",
            "status",
            "--redis-url",
            "redis://127.0.0.1:1/",
        ][..],
        &[
            "poller",
            "--redis-send-url",
            "redis://127.0.0.1:1/",
            "--redis-status-url",
            "redis://127.0.0.1:1/",
        ][..],
    ] {
        let mut args = role.to_vec();
        args.extend([
            "--database-url",
            "postgres://herald@127.0.0.1:1/herald",
            "--admin-listen",
            &address,
        ]);
        let out = herald(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}: {stderr}", role[0]);
        assert!(
            stderr.contains(&format!("cannot listen on {address}")),
            "{}: {stderr}",
            role[0]
        );
    }
}

#[test]
fn archive_verify_checks_every_file_against_its_manifest_and_exits_1_on_a_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let archive = herald_store::archive::ArchiveDir::new(dir.path());
    let rows = [serde_json::json!({
        "message": {"id": "0190a1b2-0000-7000-8000-000000000001"},
        "events": [],
        "ledger": []
    })];
    let written = archive
        .write(herald_store::archive::Kind::Messages, &rows)
        .unwrap();
    let root = dir.path().to_str().unwrap();
    let out = herald(&["archive", "verify", root]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains(&format!("OK     {}", written.file)), "{text}");
    assert!(
        text.contains("1 file(s) verified, 1 row(s); 0 failed"),
        "{text}"
    );

    // One byte changed: the file no longer matches its manifest.
    let file = dir.path().join("messages").join(&written.file);
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&file, bytes).unwrap();
    let out = herald(&["archive", "verify", root]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("does not match its manifest"), "{text}");
    // A path without any archive is a failure too, not an empty success.
    let empty = tempfile::tempdir().unwrap();
    let out = herald(&["archive", "verify", empty.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
}
