//! Who may call what, with the built binary: the API will not start without credentials
//! unless it is told it is a development run, secrets are refused on a command line and read
//! from the environment or files, forged receipts are refused and counted, and the runtime
//! database role can run the pipeline but cannot erase its history.
//!
//! Longer than 400 lines: one test per credential path of the built binary, sharing the process
//! helpers at the top.

use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt;
use herald_core::signature;
use herald_testkit::keys::{CLIENT, RUNTIME_ROLE};
use herald_testkit::{free_port, DeploymentKeys, LocalPostgres, RoleProcess};
use serde_json::{json, Value};

use crate::deployment::HERALD;

/// `herald args…` with only `env` (and PATH) in its environment.
fn herald_with(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    std::process::Command::new(HERALD)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// A migrated database of its own, as its owner.
async fn database() -> (LocalPostgres, String) {
    let pg = LocalPostgres::start().await.expect("postgres");
    let url = pg.create_database("herald").await.expect("database");
    let out = herald_with(
        &["migrate", "--database-url", &url, "--partitions", "4"],
        &[],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (pg, url)
}

/// `herald api` on a free port with `env` and `flags`; its base URL and process.
async fn start_api(
    database_url: &str,
    env: Vec<(String, String)>,
    flags: &[&str],
    logs: &std::path::Path,
    name: &str,
) -> (String, RoleProcess) {
    let base = format!("http://127.0.0.1:{}", free_port().unwrap());
    let mut args: Vec<String> = ["api", "--listen", &base["http://".len()..]]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    args.extend(flags.iter().map(|f| (*f).to_owned()));
    let mut env = env;
    env.push(("HERALD_DATABASE_URL".to_owned(), database_url.to_owned()));
    let api = RoleProcess::spawn(
        PathBuf::from(HERALD).as_path(),
        name,
        &args,
        &env,
        logs,
        format!("{base}/healthz"),
    )
    .await
    .unwrap_or_else(|err| panic!("{name} did not start: {err:#}"));
    (base, api)
}

#[test]
fn the_api_refuses_to_start_without_credentials_and_says_what_to_set() {
    let db = ["api", "--database-url", "postgres://127.0.0.1:1/herald"];
    let out = herald_with(&db, &[]);
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for needed in [
        "HERALD_API_CLIENT_KEYS",
        "HERALD_API_OPERATOR_KEYS",
        "--insecure-dev",
    ] {
        assert!(stderr.contains(needed), "{needed} missing from: {stderr}");
    }
    // Keys without receipt secrets: the message names the secrets.
    let out = herald_with(
        &db,
        &[("HERALD_API_CLIENT_KEYS", "shop=client-key-0123456789")],
    );
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("HERALD_RECEIPT_SECRETS"), "{stderr}");
    // The flat key list of earlier versions is named, so an upgrade knows what changed.
    let out = herald_with(&db, &[("HERALD_API_KEYS", "k1,k2")]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("HERALD_API_KEYS is no longer read"));
    // A key too short to be a secret.
    let out = herald_with(
        &db,
        &[
            ("HERALD_API_OPERATOR_KEYS", "ops=short"),
            ("HERALD_RECEIPT_SECRETS", "gw-a=receipt-secret-0123456"),
        ],
    );
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("shorter than 16"));
}

#[test]
fn secrets_are_refused_on_a_command_line() {
    let database = "postgres://127.0.0.1:1/herald";
    for (role, flag, variable) in [
        ("api", "--client-keys", "HERALD_API_CLIENT_KEYS"),
        ("api", "--operator-keys", "HERALD_API_OPERATOR_KEYS"),
        ("api", "--receipt-secrets", "HERALD_RECEIPT_SECRETS"),
        (
            "provider-sim",
            "--receipt-secrets",
            "HERALD_SIM_RECEIPT_SECRETS",
        ),
        (
            "migrate",
            "--runtime-role-password",
            "HERALD_RUNTIME_ROLE_PASSWORD",
        ),
    ] {
        let out = herald_with(
            &[role, flag, "name=secret-value-0123456789", "--print-config"],
            &[("HERALD_DATABASE_URL", database)],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{role} {flag}: {stderr}");
        assert!(
            stderr.contains(variable) && !stderr.contains("secret-value"),
            "{role} {flag}: {stderr}"
        );
    }
}

#[tokio::test]
async fn a_development_run_starts_open_and_keys_can_come_from_files() {
    let (_pg, url) = database().await;
    let logs = tempfile::tempdir().unwrap();
    let (open, _open_api) =
        start_api(&url, Vec::new(), &["--insecure-dev"], logs.path(), "open").await;
    let client = reqwest::Client::new();
    let message = json!({"recipient": "+15550100", "body": {"text": "hi"}});
    let response = client
        .post(format!("{open}/v1/messages"))
        .json(&message)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202, "a development run needs no key");

    let keys = DeploymentKeys::generate();
    let files = tempfile::tempdir().unwrap();
    let write = |name: &str, text: String| {
        let path = files.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let env = vec![
        (
            "HERALD_API_CLIENT_KEYS_FILE".to_owned(),
            write(
                "client-keys",
                format!("# one per line\n{CLIENT}={}\n", keys.client_key),
            ),
        ),
        (
            "HERALD_RECEIPT_SECRETS_FILE".to_owned(),
            write("receipt-secrets", keys.receipt_secrets_value()),
        ),
    ];
    let (guarded, _guarded_api) = start_api(&url, env, &[], logs.path(), "guarded").await;
    let post = |key: Option<&str>| {
        let request = client.post(format!("{guarded}/v1/messages")).json(&message);
        match key {
            Some(key) => request.bearer_auth(key),
            None => request,
        }
    };
    assert_eq!(post(None).send().await.unwrap().status(), 401);
    assert_eq!(
        post(Some(&keys.client_key)).send().await.unwrap().status(),
        202
    );
    // --print-config shows that keys are set, never what they are.
    let out = herald_with(
        &["api", "--database-url", &url, "--print-config"],
        &[(
            "HERALD_API_CLIENT_KEYS",
            &format!("{CLIENT}={}", keys.client_key),
        )],
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        !printed.contains(&keys.client_key) && printed.contains("hidden"),
        "{printed}"
    );
}

/// The value of `name{reason="…"}` on a /metrics page.
fn counter(metrics: &str, name: &str, reason: &str) -> f64 {
    let series = format!("{name}{{reason=\"{reason}\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{series} not on /metrics"))
}

#[tokio::test]
async fn forged_and_stale_receipts_are_refused_counted_and_change_nothing() {
    const FLOOD: usize = 300;
    const REJECTIONS: &str = "herald_receipt_signature_rejections_total";
    let (_pg, url) = database().await;
    let keys = DeploymentKeys::generate();
    let logs = tempfile::tempdir().unwrap();
    let (api, process) = start_api(&url, keys.api_env(), &[], logs.path(), "api").await;
    let client = reqwest::Client::new();
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    };
    let rows = || async {
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        let rows: (i64, i64) =
            sqlx::query_as("SELECT (SELECT count(*) FROM receipts), (SELECT count(*) FROM outbox)")
                .fetch_one(&pool)
                .await
                .unwrap();
        pool.close().await;
        rows
    };

    // A flood signed with a key the forger made up.
    let answers: Vec<u16> = futures::stream::iter(0..FLOOD)
        .map(|i| {
            let body =
                format!(r#"{{"provider_id":"{i}","status":"DELIVRD","timestamp":1700000000}}"#);
            let header = signature::sign(b"a-guessed-secret-0123456", now(), body.as_bytes());
            let request = client
                .post(format!("{api}/v1/providers/gw-a/receipts"))
                .header(signature::HEADER, header)
                .body(body);
            async move { request.send().await.unwrap().status().as_u16() }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    assert!(answers.iter().all(|status| *status == 401), "{answers:?}");
    // One stale post, signed right an hour ago, and one unsigned.
    let body = r#"{"provider_id":"1","status":"DELIVRD","timestamp":1700000000}"#;
    let secret = keys.receipt_secret("gw-a").unwrap().as_bytes();
    let stale = client
        .post(format!("{api}/v1/providers/gw-a/receipts"))
        .header(
            signature::HEADER,
            signature::sign(secret, now() - 3600, body.as_bytes()),
        )
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(stale.status(), 401);
    let unsigned = client
        .post(format!("{api}/v1/providers/gw-a/receipts"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(unsigned.status(), 401);
    assert_eq!(rows().await, (0, 0), "no receipt, no status job");

    let metrics = client
        .get(format!("{api}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(counter(&metrics, REJECTIONS, "mismatch"), FLOOD as f64);
    assert_eq!(counter(&metrics, REJECTIONS, "stale"), 1.0);
    assert_eq!(counter(&metrics, REJECTIONS, "missing"), 1.0);
    assert_eq!(counter(&metrics, REJECTIONS, "unknown_gateway"), 0.0);
    assert!(process.log_tail(20_000).contains("refused a receipt post"));

    // The gateway's own signature, made now, is stored.
    let signed = client
        .post(format!("{api}/v1/providers/gw-a/receipts"))
        .header(
            signature::HEADER,
            signature::sign(secret, now(), body.as_bytes()),
        )
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(signed.status(), 202);
    let answer: Value = signed.json().await.unwrap();
    assert!(answer["receipt_id"].is_i64());
    assert_eq!(rows().await, (1, 1));
}

#[tokio::test]
async fn the_runtime_role_runs_the_pipeline_but_cannot_erase_history() {
    let (_pg, url) = database().await;
    let keys = DeploymentKeys::generate();
    let migrate = |env: &[(&str, &str)]| {
        herald_with(
            &["migrate", "--database-url", &url, "--partitions", "4"],
            env,
        )
    };
    let password = keys.runtime_password.as_str();
    let out = migrate(&[
        ("HERALD_RUNTIME_ROLE", RUNTIME_ROLE),
        ("HERALD_RUNTIME_ROLE_PASSWORD", password),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Again, as every upgrade runs it: the existing role keeps its password and its grants.
    let out = migrate(&[("HERALD_RUNTIME_ROLE", RUNTIME_ROLE)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The owner itself is no runtime role.
    let out = migrate(&[("HERALD_RUNTIME_ROLE", "postgres")]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unprivileged"));

    let runtime = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&keys.runtime_url(&url).unwrap())
        .await
        .unwrap();
    // The pipeline's statements: an accept, a claim, a receipt and its status job.
    let partitions = herald_store::migrate::partition_count(&runtime)
        .await
        .unwrap();
    let body = json!({"text": "hi"});
    let message = herald_store::accept::NewMessage {
        id: uuid::Uuid::now_v7(),
        partition: 0,
        recipient: "+15550100".to_owned(),
        fingerprint: herald_store::accept::fingerprint("+15550100", None, &body),
        body,
        idempotency_key: Some("runtime-1".to_owned()),
        created_by: Some(CLIENT.to_owned()),
    };
    let accepted = herald_store::accept::accept_messages(&runtime, &[message])
        .await
        .unwrap();
    assert!(accepted[0].created);
    // A history row of the kind a worker writes (the accept writes none: QUEUED is derived).
    sqlx::query("INSERT INTO message_events (message_id, state) VALUES ($1, 'CLAIMED')")
        .bind(accepted[0].id)
        .execute(&runtime)
        .await
        .unwrap();
    let receipt = herald_store::receipts::NewReceipt {
        gateway: "gw-a".to_owned(),
        raw: br#"{"provider_id":"1","status":"DELIVRD","timestamp":1700000000}"#.to_vec(),
        content_type: Some("application/json".to_owned()),
        partition: 0,
    };
    herald_store::receipts::accept_receipts(&runtime, &[&receipt])
        .await
        .unwrap();
    let view = herald_store::messages::message_with_history(&runtime, accepted[0].id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(view.created_by.as_deref(), Some(CLIENT));
    assert_eq!(partitions.get(), 4);
    // The working tables are deleted from by design (each one this schema has).
    let mut deletable = 0;
    for table in herald_store::runtime_role::DELETED_BY_DESIGN {
        let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(table)
            .fetch_one(&runtime)
            .await
            .unwrap();
        if exists {
            sqlx::query(&format!("DELETE FROM {table}"))
                .execute(&runtime)
                .await
                .unwrap_or_else(|err| panic!("DELETE FROM {table}: {err}"));
            deletable += 1;
        }
    }
    assert!(deletable >= 2);

    // History cannot be erased, nor the schema changed.
    for statement in [
        "TRUNCATE message_events",
        "DELETE FROM message_events",
        "TRUNCATE messages CASCADE",
        "DELETE FROM messages",
        "DELETE FROM receipts",
        "DELETE FROM ledger",
        "DELETE FROM parking",
        "TRUNCATE outbox",
        "DELETE FROM outbox",
        "UPDATE ledger SET provider_id = 'forged'",
        "UPDATE herald_settings SET value = '8'",
        "DROP TABLE message_events",
        "CREATE TABLE shadow (id int)",
        "DELETE FROM _sqlx_migrations",
    ] {
        let err = sqlx::query(statement)
            .execute(&runtime)
            .await
            .expect_err(statement);
        let code = err
            .as_database_error()
            .and_then(|e| e.code())
            .map(|c| c.into_owned());
        // 42501: insufficient_privilege; 42P01 never (the table exists).
        assert_eq!(code.as_deref(), Some("42501"), "{statement}: {err}");
    }
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM message_events")
        .fetch_one(&runtime)
        .await
        .unwrap();
    assert_eq!(events, 1, "the CLAIMED event is still there");

    // Retention removes through the schema's own functions alone: the role finishes the
    // message (DONE, DELIVERED), and the functions, not the role, remove its send row and
    // fold its history. The setting that lets compaction delete gives the role nothing.
    sqlx::query(
        "WITH done AS (UPDATE outbox SET status = 'DONE', created_at = now() - interval '2 days'
                       WHERE message_id = $1)
         INSERT INTO message_events (message_id, state) VALUES ($1, 'DELIVERED')",
    )
    .bind(accepted[0].id)
    .execute(&runtime)
    .await
    .unwrap();
    let mut tx = runtime.begin().await.unwrap();
    sqlx::query("SET LOCAL herald.compacting = 'on'")
        .execute(&mut *tx)
        .await
        .unwrap();
    let refused = sqlx::query("DELETE FROM message_events")
        .execute(&mut *tx)
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("permission denied"),
        "{refused}"
    );
    drop(tx);
    let fence = herald_store::leases::take_over(&runtime, 0, "maintenance")
        .await
        .unwrap();
    let day = std::time::Duration::from_secs(86_400);
    let removed = herald_store::retention::remove_done_jobs(&runtime, fence, day, 100)
        .await
        .unwrap();
    assert_eq!(removed.removed, 1);
    let compacted =
        herald_store::retention::compact_histories(&runtime, fence, std::time::Duration::ZERO, 100)
            .await
            .unwrap();
    assert_eq!(
        (compacted.compacted, compacted.folded),
        (1, 2),
        "CLAIMED, DELIVERED"
    );
    let view = herald_store::messages::message_with_history(&runtime, accepted[0].id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(view.state, "DELIVERED");
    assert_eq!(view.events.len(), 3, "QUEUED (derived), CLAIMED, DELIVERED");
}

/// The runtime role may DELETE only from the working tables: every `DELETE FROM` the store
/// runs must name one of them, so a new one fails here instead of in production.
#[test]
fn the_store_deletes_only_from_the_tables_the_runtime_role_may_delete_from() {
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/../herald-store/src");
    // Every Rust file under src, submodules' directories included.
    let mut files = Vec::new();
    let mut dirs = vec![std::path::PathBuf::from(src)];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    let mut found = 0;
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        for (at, _) in text.match_indices("DELETE FROM ") {
            let table: String = text[at + "DELETE FROM ".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            assert!(
                herald_store::runtime_role::DELETED_BY_DESIGN.contains(&table.as_str()),
                "{} deletes from {table}, which the runtime role may not",
                path.display()
            );
            found += 1;
        }
    }
    assert!(found >= 2, "the search found the store's deletes");
}

/// The whole time a deployment of the test kit runs, its roles are connected as the runtime
/// role: every end-to-end test proves the grants suffice.
#[tokio::test]
async fn a_test_deployment_runs_as_the_runtime_role_with_keys() {
    let herald = crate::Deployment::start(crate::Options::default()).await;
    let users: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT usename::text FROM pg_stat_activity
         WHERE application_name = 'herald' AND datname = current_database()",
    )
    .fetch_all(&herald.pool)
    .await
    .unwrap();
    assert_eq!(users, [RUNTIME_ROLE]);
    let ids = herald.send(20, 10, 1).await;
    // A client key reads the messages it accepted, not the operator's.
    let client =
        herald_client::Client::from_http(&herald.api_url, herald.keys.client_client().unwrap());
    let mine = herald_client::wire::SendRequest {
        recipient: "+15550100".to_owned(),
        body: json!({"text": "mine"}),
        partition_key: None,
    };
    let own = client.send(&mine, None).await.unwrap().id;
    let message = client.message(own).await.unwrap().expect("its own message");
    assert_eq!(message.created_by.as_deref(), Some(CLIENT));
    let operators: uuid::Uuid = ids[0].parse().unwrap();
    assert!(client.message(operators).await.unwrap().is_none(), "404");
    herald.wait_delivered(21, Duration::from_secs(60)).await;
    // The simulator's signed receipts are taken: verify waits until every message settled.
    let (code, report) = herald.verify().await;
    assert_eq!(code, 0, "{report}");
}
