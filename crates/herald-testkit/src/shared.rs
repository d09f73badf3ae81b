//! One PostgreSQL server per test binary, and a database per test cloned from a migrated
//! template.
//!
//! Starting a server (initdb, then the postmaster) and migrating 64 outbox partitions cost a
//! test about two seconds; `CREATE DATABASE … TEMPLATE` costs a few milliseconds. So the first
//! test of a binary that asks for a database starts the binary's server, the first that asks for
//! a partition count migrates a template database with it, and every test gets a fresh copy of
//! that template: its own tables, its own statistics, nothing another test wrote.
//!
//! A test that stops, kills or crashes PostgreSQL, changes server settings or creates roles
//! (which belong to the whole server) keeps a [`crate::LocalPostgres`] of its own.
//!
//! The server outlives every test of the binary and stops with it: a shell runs it and sends it
//! SIGINT (PostgreSQL's fast shutdown) when its standard input, a pipe from the test binary,
//! ends, which happens when the binary exits, however it exits. Its directory is removed by the
//! next binary that starts one, once its process is gone.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::Context;
use herald_core::PartitionCount;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};

use crate::postgres::{PostgresOptions, Prepared};

/// A database of its own on the binary's shared server.
#[derive(Debug, Clone)]
pub struct TestDatabase {
    name: String,
    port: u16,
}

impl TestDatabase {
    /// A fresh database with Herald's schema for `partitions` outbox partitions (as `herald
    /// migrate --partitions` leaves it), cloned from the binary's template for that count.
    pub async fn migrated(partitions: u32) -> anyhow::Result<Self> {
        let server = server()?;
        let template = template(server, partitions).await?;
        Self::create(server, Some(&template)).await
    }

    /// A fresh, empty database (no schema).
    pub async fn empty() -> anyhow::Result<Self> {
        Self::create(server()?, None).await
    }

    async fn create(server: &Server, template: Option<&str>) -> anyhow::Result<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let name = format!("test_{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let sql = match template {
            Some(template) => format!("CREATE DATABASE \"{name}\" TEMPLATE \"{template}\""),
            None => format!("CREATE DATABASE \"{name}\""),
        };
        server.execute(&sql).await?;
        Ok(Self {
            name,
            port: server.port,
        })
    }

    /// Its URL (superuser `postgres`, no password).
    pub fn url(&self) -> String {
        url(self.port, &self.name)
    }

    /// The shared server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A pool of up to `max_connections` connections to it.
    pub async fn pool(&self, max_connections: u32) -> anyhow::Result<PgPool> {
        Ok(PgPoolOptions::new()
            .max_connections(max_connections)
            .connect(&self.url())
            .await?)
    }
}

/// A valid message for `partition` with body `{"text": text}`, to `+15550100`, as the API would
/// store it (its fingerprint computed the API's way).
pub fn message(partition: u32, key: Option<&str>, text: &str) -> herald_store::accept::NewMessage {
    let body = serde_json::json!({ "text": text });
    herald_store::accept::NewMessage {
        id: uuid::Uuid::now_v7(),
        partition,
        recipient: "+15550100".to_owned(),
        fingerprint: herald_store::accept::fingerprint("+15550100", None, &body),
        body,
        idempotency_key: key.map(str::to_owned),
        created_by: None,
    }
}

fn url(port: u16, database: &str) -> String {
    format!("postgres://postgres@127.0.0.1:{port}/{database}")
}

struct Server {
    port: u16,
    /// The shell's standard input: never closed while the process lives (see [`start`]).
    _until_exit: std::process::ChildStdin,
}

impl Server {
    /// Runs one statement on a connection of its own (made in the caller's runtime: each test
    /// has its own, so nothing here keeps a pool across tests).
    async fn execute(&self, sql: &str) -> anyhow::Result<()> {
        let mut conn = PgConnection::connect(&url(self.port, "postgres")).await?;
        sqlx::query(sql)
            .execute(&mut conn)
            .await
            .with_context(|| sql.to_owned())?;
        conn.close().await?;
        Ok(())
    }
}

/// The binary's server, started by the first caller.
fn server() -> anyhow::Result<&'static Server> {
    static SERVER: OnceLock<Result<Server, String>> = OnceLock::new();
    SERVER
        .get_or_init(|| start().map_err(|err| format!("{err:#}")))
        .as_ref()
        .map_err(|err| anyhow::anyhow!("the shared PostgreSQL server did not start: {err}"))
}

/// The template database for `partitions`, migrated by the first caller that needs it.
async fn template(server: &Server, partitions: u32) -> anyhow::Result<String> {
    static MIGRATED: tokio::sync::Mutex<BTreeSet<u32>> =
        tokio::sync::Mutex::const_new(BTreeSet::new());
    let name = format!("template_p{partitions}");
    let mut migrated = MIGRATED.lock().await;
    if !migrated.contains(&partitions) {
        server
            .execute(&format!("CREATE DATABASE \"{name}\""))
            .await?;
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect(&url(server.port, &name))
            .await?;
        let count = PartitionCount::new(partitions).context("partition count")?;
        herald_store::migrate::migrate(&pool, count)
            .await
            .context("migrating the template")?;
        // A template must have no sessions when it is copied.
        pool.close().await;
        migrated.insert(partitions);
    }
    Ok(name)
}

const DIR_PREFIX: &str = "herald-pg-shared-";

/// Runs the postmaster (`$0 "$@"`) in the background and stops it with a fast shutdown
/// (SIGINT) once standard input ends: the write end is held by the test binary, so it ends
/// when the binary exits, however it exits (a panic, a signal, kill -9).
const UNTIL_STDIN_ENDS: &str =
    r#""$0" "$@" & server=$!; read -r _; kill -INT "$server"; wait "$server""#;

/// initdb and the postmaster, under a shell that stops it when this process ends.
fn start() -> anyhow::Result<Server> {
    use std::os::unix::process::CommandExt;
    remove_dead_directories();
    let root = std::env::temp_dir().join(format!("{DIR_PREFIX}{}", std::process::id()));
    let prepared = Prepared::new(&root, &PostgresOptions::default())?;
    let log = std::fs::OpenOptions::new()
        .append(true)
        .open(&prepared.log)?;
    let mut command = std::process::Command::new("sh");
    command
        .arg("-c")
        .arg(UNTIL_STDIN_ENDS)
        .arg(prepared.bin.join("postgres"))
        .args(&prepared.args)
        .stdin(std::process::Stdio::piped())
        .stdout(log.try_clone()?)
        .stderr(log);
    if let Some((uid, gid)) = prepared.user {
        command.uid(uid).gid(gid);
    }
    let mut child = command.spawn().context("starting the shared postgres")?;
    let stdin = child.stdin.take().context("the shell's standard input")?;
    let port = prepared.port;
    let deadline = Instant::now() + Duration::from_secs(30);
    let ready = prepared.bin.join("pg_isready");
    loop {
        let status = std::process::Command::new(&ready)
            .args(["-q", "-h", "127.0.0.1", "-p", &port.to_string()])
            .status()?;
        if status.success() {
            return Ok(Server {
                port,
                _until_exit: stdin,
            });
        }
        if let Some(exit) = child.try_wait()? {
            anyhow::bail!(
                "the shared PostgreSQL server exited ({exit}): {}",
                std::fs::read_to_string(&prepared.log).unwrap_or_default()
            );
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the shared PostgreSQL server was not ready after 30 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Directories of earlier binaries' servers whose process is gone.
fn remove_dead_directories() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(DIR_PREFIX))
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let path: PathBuf = entry.path();
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}
