//! `herald-loadtest accept`: intake alone, against PostgreSQL's own ceiling in the same run.
//!
//! A fresh PostgreSQL and `herald api` (nothing else) are started. For each form — one message
//! per request, and batches — the API is loaded by `--connections` closed-loop clients for
//! `--duration`, and then pgbench runs the accept path's own statement
//! ([`herald_store::accept::INSERT_MESSAGES`], one message or one batch per transaction,
//! BEGIN … COMMIT as the API sends it) on the same database with the same number of
//! connections. The figure is the ratio: what the API commits per second over what the
//! database commits per second when nothing but the SQL is in the way. CPU seconds of the API
//! and of PostgreSQL per 1,000 messages come from `/proc`.
//!
//! Longer than 400 lines with its unit tests (the code is about 400).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use herald_client::wire::{BatchItem, SendRequest};
use herald_testkit::{LocalPostgres, PostgresOptions, RoleProcess};
use serde::Serialize;

#[derive(Debug, clap::Args)]
pub struct AcceptArgs {
    /// The herald binary whose `api` role is measured.
    #[arg(long, default_value = "target/release/herald")]
    pub herald_bin: PathBuf,
    /// fsync and synchronous commit on, as in production (off: a test server's settings).
    #[arg(long)]
    pub durable: bool,
    /// Concurrent clients of the API, and pgbench connections.
    #[arg(long, default_value_t = 32)]
    pub connections: usize,
    /// How long each form is measured, for the API and for pgbench each.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Messages per batch request (0: skip the batch form).
    #[arg(long, default_value_t = 100)]
    pub batch: usize,
    /// Bytes of text in each message body.
    #[arg(long, default_value_t = 200)]
    pub payload_bytes: usize,
    /// Partitions the database is installed with.
    #[arg(long, default_value_t = 64)]
    pub partitions: u32,
    /// Extra flags for `herald api` (repeatable), e.g. `--api-flag=--group-parallel=1`.
    #[arg(long = "api-flag", allow_hyphen_values = true)]
    pub api_flags: Vec<String>,
    /// Where the JSON report is written.
    #[arg(long, default_value = "loadtest/results/accept.json")]
    pub output: PathBuf,
}

/// One form measured both ways.
#[derive(Debug, Clone, Serialize)]
pub struct Form {
    pub name: String,
    pub messages_per_request: usize,
    /// Messages the API committed per second (2xx answers × messages per request).
    pub api_messages_per_s: f64,
    /// Requests answered with something other than 2xx, or not answered.
    pub api_errors: u64,
    /// Messages per accept transaction (group commit, or the batch size).
    pub mean_messages_per_transaction: f64,
    /// Mean time of one accept transaction in the API, in milliseconds.
    pub transaction_ms: f64,
    /// pgbench transactions per second × messages per transaction.
    pub pgbench_messages_per_s: f64,
    /// api / pgbench.
    pub ratio: f64,
    pub api_cpu_s_per_1000: f64,
    /// The load generator's own CPU (it shares the machine with the API and PostgreSQL).
    pub client_cpu_s_per_1000: f64,
    pub postgres_cpu_s_per_1000_api: f64,
    pub postgres_cpu_s_per_1000_pgbench: f64,
}

#[derive(Debug, Serialize)]
pub struct AcceptReport {
    pub durable: bool,
    pub connections: usize,
    pub duration_s: f64,
    pub api_flags: Vec<String>,
    pub load_average_before: String,
    pub forms: Vec<Form>,
}

pub async fn main(args: AcceptArgs) -> anyhow::Result<i32> {
    anyhow::ensure!(args.connections > 0, "--connections must be at least 1");
    herald_testkit::packages::ensure_installed().await?;
    let load_average_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let dir = tempfile::Builder::new()
        .prefix("herald-accept-")
        .tempdir()?;
    let pg = LocalPostgres::start_in(
        &dir.path().join("postgres"),
        &PostgresOptions {
            durable: args.durable,
            max_connections: 300,
            ..PostgresOptions::default()
        },
    )
    .await?;
    let database_url = pg.create_database("herald").await?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&database_url)
        .await?;
    herald_store::migrate::migrate(
        &pool,
        herald_core::PartitionCount::new(args.partitions)
            .context("--partitions must be 1 to 1024")?,
    )
    .await?;
    let api_url = format!("http://127.0.0.1:{}", herald_testkit::free_port()?);
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs)?;
    let mut api_args: Vec<String> = ["api", "--listen", &api_url["http://".len()..]]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    api_args.extend(["--database-max-connections".to_owned(), "32".to_owned()]);
    api_args.extend(args.api_flags.iter().cloned());
    let keys = herald_testkit::DeploymentKeys::generate();
    let mut env = vec![
        ("HERALD_DATABASE_URL".to_owned(), database_url.clone()),
        ("HERALD_LOG_FORMAT".to_owned(), "json".to_owned()),
    ];
    env.extend(keys.api_env());
    let api = RoleProcess::spawn(
        &args.herald_bin,
        "api",
        &api_args,
        &env,
        &logs,
        format!("{api_url}/healthz"),
    )
    .await?;
    let api_pid = api.pid().context("the api process has no pid")?;

    let mut forms = Vec::new();
    let mut sizes = vec![1];
    if args.batch > 1 {
        sizes.push(args.batch);
    }
    for size in sizes {
        let name = if size == 1 {
            "single".to_owned()
        } else {
            format!("batch of {size}")
        };
        eprintln!("accept: {name}: API for {:?}", args.duration);
        let pg_cpu = crate::cost::postgres_cpu_s(pg.data_dir());
        let api_cpu = crate::cost::cpu_s(api_pid, false);
        let client_cpu = crate::cost::cpu_s(std::process::id() as i32, false);
        let metrics_before = scrape(&api_url).await;
        let (sent, errors) = load_api(&api_url, &keys.client_key, size, &args).await?;
        let metrics_after = scrape(&api_url).await;
        let delta = |name: &str| sample(&metrics_after, name) - sample(&metrics_before, name);
        let groups = delta("herald_store_commit_groups_total{writer=\"accept\"}");
        let mean_group = if groups > 0.0 {
            delta("herald_store_commit_grouped_total{writer=\"accept\"}") / groups
        } else {
            size as f64
        };
        let transactions = delta("herald_accept_transaction_duration_seconds_count");
        let transaction_ms = if transactions > 0.0 {
            delta("herald_accept_transaction_duration_seconds_sum") * 1000.0 / transactions
        } else {
            0.0
        };
        let client_cpu = crate::cost::cpu_s(std::process::id() as i32, false) - client_cpu;
        let api_cpu = crate::cost::cpu_s(api_pid, false) - api_cpu;
        let pg_cpu_api = crate::cost::postgres_cpu_s(pg.data_dir()) - pg_cpu;
        eprintln!("accept: {name}: pgbench for {:?}", args.duration);
        let pg_cpu = crate::cost::postgres_cpu_s(pg.data_dir());
        let tps = pgbench(&database_url, dir.path(), size, &args).await?;
        let pg_cpu_bench = crate::cost::postgres_cpu_s(pg.data_dir()) - pg_cpu;
        let seconds = args.duration.as_secs_f64();
        let api_rate = sent as f64 / seconds;
        let bench_rate = tps * size as f64;
        let bench_messages = bench_rate * seconds;
        forms.push(Form {
            name,
            messages_per_request: size,
            api_messages_per_s: api_rate,
            api_errors: errors,
            mean_messages_per_transaction: mean_group,
            transaction_ms,
            pgbench_messages_per_s: bench_rate,
            ratio: api_rate / bench_rate.max(f64::MIN_POSITIVE),
            api_cpu_s_per_1000: per_1000(api_cpu, sent as f64),
            client_cpu_s_per_1000: per_1000(client_cpu, sent as f64),
            postgres_cpu_s_per_1000_api: per_1000(pg_cpu_api, sent as f64),
            postgres_cpu_s_per_1000_pgbench: per_1000(pg_cpu_bench, bench_messages),
        });
    }
    let report = AcceptReport {
        durable: args.durable,
        connections: args.connections,
        duration_s: args.duration.as_secs_f64(),
        api_flags: args.api_flags.clone(),
        load_average_before: load_average_before.trim().to_owned(),
        forms,
    };
    print!("{}", render(&report));
    if let Some(parent) = args.output.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&args.output, serde_json::to_vec_pretty(&report)?)?;
    eprintln!("accept: report written to {}", args.output.display());
    Ok(0)
}

fn per_1000(cpu_s: f64, messages: f64) -> f64 {
    if messages > 0.0 {
        cpu_s * 1000.0 / messages
    } else {
        0.0
    }
}

pub fn render(report: &AcceptReport) -> String {
    let mut out = format!(
        "accept alone: {} connections, {:.0} s per measurement, durable {}, load average before: {}\n",
        report.connections, report.duration_s, report.durable, report.load_average_before
    );
    out.push_str(&format!(
        "{:<14} {:>10} {:>10} {:>7} {:>7} {:>8} {:>6} | CPU s per 1,000 messages: {:>5} {:>6} {:>7} {:>11}\n",
        "form", "API msg/s", "pgbench", "ratio", "errors", "msg/tx", "tx ms", "API", "client", "PG(API)", "PG(pgbench)"
    ));
    for form in &report.forms {
        out.push_str(&format!(
            "{:<14} {:>10.0} {:>10.0} {:>6.2}x {:>7} {:>8.1} {:>6.2} | {:>31.3} {:>6.3} {:>7.3} {:>11.3}\n",
            form.name,
            form.api_messages_per_s,
            form.pgbench_messages_per_s,
            form.ratio,
            form.api_errors,
            form.mean_messages_per_transaction,
            form.transaction_ms,
            form.api_cpu_s_per_1000,
            form.client_cpu_s_per_1000,
            form.postgres_cpu_s_per_1000_api,
            form.postgres_cpu_s_per_1000_pgbench,
        ));
    }
    out
}

/// The API's `/metrics` text (empty when it cannot be read: the figures read 0).
async fn scrape(api_url: &str) -> String {
    match reqwest::get(format!("{api_url}/metrics")).await {
        Ok(response) => response.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// The value of the sample named exactly `name` (labels included, as exported).
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .filter_map(|line| line.strip_prefix(name))
        .filter_map(|rest| rest.strip_prefix(' '))
        .filter_map(|value| value.trim().parse::<f64>().ok())
        .sum()
}

/// Closed-loop clients posting for `args.duration`; answers (messages committed, failed
/// requests).
async fn load_api(
    api_url: &str,
    api_key: &str,
    size: usize,
    args: &AcceptArgs,
) -> anyhow::Result<(u64, u64)> {
    let http = herald_client::http_builder(Some(api_key))?
        .pool_max_idle_per_host(args.connections)
        .timeout(Duration::from_secs(30))
        .build()?;
    let client = herald_client::Client::from_http(api_url, http);
    let committed = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let text = "x".repeat(args.payload_bytes);
    let until = Instant::now() + args.duration;
    let mut clients = tokio::task::JoinSet::new();
    for connection in 0..args.connections {
        let (client, committed, errors, text) = (
            client.clone(),
            committed.clone(),
            errors.clone(),
            text.clone(),
        );
        clients.spawn(async move {
            let mut n = 0u64;
            while Instant::now() < until {
                n += 1;
                let message = |i: usize| BatchItem {
                    recipient: format!(
                        "+1555{connection:03}{:06}",
                        (n as usize * size + i) % 1_000_000
                    ),
                    body: serde_json::json!({ "text": text, "n": n }),
                    partition_key: None,
                    idempotency_key: None,
                };
                let answer = if size == 1 {
                    let BatchItem {
                        recipient, body, ..
                    } = message(0);
                    let single = SendRequest {
                        recipient,
                        body,
                        partition_key: None,
                    };
                    client.send(&single, None).await.map(drop)
                } else {
                    client
                        .send_batch((0..size).map(message).collect())
                        .await
                        .map(drop)
                };
                match answer {
                    Ok(()) => {
                        committed.fetch_add(size as u64, Ordering::Relaxed);
                    }
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
    }
    while clients.join_next().await.is_some() {}
    Ok((
        committed.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
    ))
}

/// The accept statement as a pgbench script: the arrays the API binds are built in SQL, one
/// message (or `size`) per transaction.
pub fn pgbench_script(size: usize, payload_bytes: usize, partitions: u32) -> String {
    let body = serde_json::json!({ "text": "x".repeat(payload_bytes), "n": 1 }).to_string();
    let array = |element: &str, kind: &str| {
        format!("ARRAY(SELECT {element} FROM generate_series(1, {size}) AS g)::{kind}[]")
    };
    let statement = herald_store::accept::INSERT_MESSAGES
        .replace("$1::uuid[]", &array("gen_random_uuid()", "uuid"))
        .replace(
            "$2::int[]",
            &array(&format!("(random() * {})::int", partitions - 1), "int"),
        )
        .replace("$3::text[]", &array("'+1555' || g", "text"))
        .replace("$4::jsonb[]", &array(&format!("'{body}'::jsonb"), "jsonb"))
        .replace("$5::text[]", &array("NULL::text", "text"))
        .replace(
            "$6::bytea[]",
            &array("'\\x000102030405060708090a0b0c0d0e0f'::bytea", "bytea"),
        )
        .replace("$7", "'send'")
        .replace("$8::text[]", &array("NULL::text", "text"));
    let statement = statement.trim().replace('\n', " ");
    format!("BEGIN;\n{statement};\nCOMMIT;\n")
}

/// Runs pgbench with the accept statement on `database_url`; answers transactions per second.
async fn pgbench(
    database_url: &str,
    dir: &Path,
    size: usize,
    args: &AcceptArgs,
) -> anyhow::Result<f64> {
    let script = dir.join(format!("accept-{size}.sql"));
    std::fs::write(
        &script,
        pgbench_script(size, args.payload_bytes, args.partitions),
    )?;
    let bin = herald_testkit::postgres::bin_dir()?.join("pgbench");
    let output = tokio::process::Command::new(&bin)
        .args(["-n", "-M", "prepared"])
        .args(["-j", &args.connections.min(2).to_string()])
        .args(["-c", &args.connections.to_string()])
        .args(["-T", &args.duration.as_secs().max(1).to_string()])
        .arg("-f")
        .arg(&script)
        .arg(database_url)
        .output()
        .await
        .with_context(|| format!("running {}", bin.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    anyhow::ensure!(
        output.status.success(),
        "pgbench failed: {}{}",
        stdout,
        String::from_utf8_lossy(&output.stderr)
    );
    parse_tps(&stdout).with_context(|| format!("no tps in pgbench's output:\n{stdout}"))
}

/// `tps = 1234.5 (without initial connection time)` → 1234.5.
pub fn parse_tps(output: &str) -> Option<f64> {
    output
        .lines()
        .filter(|line| line.starts_with("tps = "))
        .find(|line| line.contains("without initial connection time"))
        .or_else(|| output.lines().find(|line| line.starts_with("tps = ")))?
        .trim_start_matches("tps = ")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_one_sample_by_its_exact_name() {
        let text = "x_total{writer=\"accept\"} 12\nx_total{writer=\"receipts\"} 5\nx_count 3\n";
        assert_eq!(sample(text, "x_total{writer=\"accept\"}"), 12.0);
        assert_eq!(sample(text, "x_count"), 3.0);
        assert_eq!(sample(text, "x"), 0.0);
    }

    #[test]
    fn reads_pgbench_tps() {
        let output = "number of transactions actually processed: 100\n\
                      latency average = 3.2 ms\n\
                      initial connection time = 12.0 ms\n\
                      tps = 3123.456789 (without initial connection time)\n";
        assert_eq!(parse_tps(output), Some(3123.456789));
        assert_eq!(parse_tps("nothing"), None);
    }

    #[test]
    fn the_script_is_the_accept_statement_with_its_arrays_built_in_sql() {
        let script = pgbench_script(10, 5, 64);
        assert!(script.starts_with("BEGIN;\n") && script.ends_with("COMMIT;\n"));
        assert!(!script.contains('$'), "{script}");
        assert!(script.contains("generate_series(1, 10)"));
        assert!(script.contains("INSERT INTO messages"));
        assert!(script.contains("INSERT INTO outbox"));
    }
}
