//! A PostgreSQL server of our own: initdb into a fresh directory (as the `postgres` user when
//! running as root), listening on 127.0.0.1 on a free port.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use nix::sys::signal::Signal;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use crate::path_str;
use crate::process::{Launch, Managed};
use crate::{free_port, wait_until};

/// How the server trades durability for speed.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// fsync and synchronous commit on (for `herald dev` and benchmarks); off for tests.
    pub durable: bool,
    pub max_connections: u32,
    /// TLS on the server (clients may still connect without it: `pg_hba` trusts both).
    pub tls: Option<crate::tls::ServerTls>,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            durable: false,
            max_connections: 200,
            tls: None,
        }
    }
}

/// A running PostgreSQL server. Dropped: killed, and its directory removed (if temporary).
pub struct LocalPostgres {
    process: Managed,
    port: u16,
    data_dir: PathBuf,
    _temp: Option<tempfile::TempDir>,
}

impl LocalPostgres {
    /// Starts a server in a fresh temporary directory.
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with(&PostgresOptions::default()).await
    }

    /// Starts a server with `options` in a fresh temporary directory.
    pub async fn start_with(options: &PostgresOptions) -> anyhow::Result<Self> {
        let temp = tempfile::Builder::new().prefix("herald-pg-").tempdir()?;
        let root = temp.path().to_path_buf();
        let mut pg = Self::start_in(&root, options).await?;
        pg._temp = Some(temp);
        Ok(pg)
    }

    /// Starts a server whose files live under `root` (created, must be empty or absent).
    pub async fn start_in(root: &Path, options: &PostgresOptions) -> anyhow::Result<Self> {
        let prepared = {
            let (root, options) = (root.to_path_buf(), options.clone());
            tokio::task::spawn_blocking(move || Prepared::new(&root, &options)).await??
        };
        let process = Managed::spawn(Launch {
            program: prepared.bin.join("postgres"),
            args: prepared.args,
            env: Vec::new(),
            user: prepared.user,
            log: prepared.log,
        })?;
        let pg = Self {
            process,
            port: prepared.port,
            data_dir: prepared.data_dir,
            _temp: None,
        };
        pg.wait_ready().await?;
        Ok(pg)
    }

    async fn wait_ready(&self) -> anyhow::Result<()> {
        let url = self.url("postgres");
        wait_until("postgres", Duration::from_secs(30), || {
            let url = url.clone();
            async move {
                let pool = PgPoolOptions::new()
                    .max_connections(1)
                    .connect(&url)
                    .await?;
                sqlx::query("SELECT 1").execute(&pool).await?;
                pool.close().await;
                Ok(())
            }
        })
        .await
        .with_context(|| self.process.log_tail(2000))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The URL of `database` on this server.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// Creates a database and returns its URL.
    pub async fn create_database(&self, name: &str) -> anyhow::Result<String> {
        let pool = self.admin_pool().await?;
        sqlx::query(&format!("CREATE DATABASE \"{name}\""))
            .execute(&pool)
            .await?;
        pool.close().await;
        Ok(self.url(name))
    }

    async fn admin_pool(&self) -> anyhow::Result<PgPool> {
        Ok(PgPoolOptions::new()
            .max_connections(1)
            .connect(&self.url("postgres"))
            .await?)
    }

    /// Fast shutdown (SIGINT), waiting for it to finish.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        self.process
            .stop_with(Signal::SIGINT, Duration::from_secs(30))
            .await?;
        Ok(())
    }

    /// kill -9 the postmaster.
    pub async fn kill9(&mut self) -> anyhow::Result<()> {
        self.process.kill9().await
    }

    /// A crash: kill -9 every process of the server at once (its backends, WAL writer,
    /// checkpointer… and the postmaster), as a power loss or an OOM kill of the whole pod
    /// would. Committed transactions survive (WAL); the next start recovers.
    pub async fn crash(&mut self) -> anyhow::Result<()> {
        let postmaster = self.process.pid().context("postgres is not running")?;
        let children = crate::process::children_of(postmaster);
        for child in &children {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*child),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        self.process.kill9().await?;
        // Every child gone (they are the postmaster's, reaped by init now) before a restart,
        // or the new postmaster finds the old shared memory still attached.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while children.iter().any(|pid| alive(*pid)) {
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "postgres backends still alive 10 s after SIGKILL"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Starts the server again on the same port and data.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.process.start()?;
        self.wait_ready().await
    }
}

/// A data directory made by initdb and the command line that serves it: everything up to
/// starting the postmaster (shared by [`LocalPostgres`] and the per-binary server of
/// [`crate::shared`]).
pub(crate) struct Prepared {
    pub bin: PathBuf,
    pub data_dir: PathBuf,
    pub port: u16,
    pub args: Vec<String>,
    pub user: Option<(u32, u32)>,
    pub log: PathBuf,
}

impl Prepared {
    /// Runs initdb under `root` (created, must be empty or absent) and builds the server's
    /// arguments. Blocks for initdb (about a second).
    pub fn new(root: &Path, options: &PostgresOptions) -> anyhow::Result<Self> {
        let bin = bin_dir()?;
        std::fs::create_dir_all(root)?;
        let user = postgres_user()?;
        let data_dir = root.join("data");
        let socket_dir = root.join("socket");
        std::fs::create_dir_all(&socket_dir)?;
        if let Some((uid, gid)) = user {
            for dir in [root, &socket_dir] {
                std::os::unix::fs::chown(dir, Some(uid), Some(gid))?;
            }
        }
        let log = root.join("postgres.log");
        std::fs::write(&log, b"")?;
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(&log, Some(uid), Some(gid))?;
        }

        let mut initdb = std::process::Command::new(bin.join("initdb"));
        initdb
            .args([
                "-D",
                path_str(&data_dir)?,
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
            ])
            .args(["--no-sync", "--locale=C.UTF-8"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        if let Some((uid, gid)) = user {
            std::os::unix::process::CommandExt::uid(&mut initdb, uid);
            std::os::unix::process::CommandExt::gid(&mut initdb, gid);
        }
        let out = initdb.output().context("running initdb")?;
        if !out.status.success() {
            bail!(
                "initdb failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }

        let port = free_port()?;
        let mut args = vec![
            "-D".to_owned(),
            path_str(&data_dir)?.to_owned(),
            "-p".to_owned(),
            port.to_string(),
            "-k".to_owned(),
            path_str(&socket_dir)?.to_owned(),
            "-c".to_owned(),
            "listen_addresses=127.0.0.1".to_owned(),
            "-c".to_owned(),
            format!("max_connections={}", options.max_connections),
        ];
        if let Some(tls) = &options.tls {
            // The server reads its key only when the server's user owns it, mode 0600.
            let dir = root.join("tls");
            std::fs::create_dir_all(&dir)?;
            for (from, name) in [
                (&tls.cert, "server.pem"),
                (&tls.key, "server.key"),
                (&tls.ca, "ca.pem"),
            ] {
                let to = dir.join(name);
                std::fs::copy(from, &to).with_context(|| format!("copying {}", from.display()))?;
                std::fs::set_permissions(&to, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
                if let Some((uid, gid)) = user {
                    std::os::unix::fs::chown(&to, Some(uid), Some(gid))?;
                }
            }
            for setting in [
                "ssl=on".to_owned(),
                format!("ssl_cert_file={}", path_str(&dir.join("server.pem"))?),
                format!("ssl_key_file={}", path_str(&dir.join("server.key"))?),
                format!("ssl_ca_file={}", path_str(&dir.join("ca.pem"))?),
            ] {
                args.push("-c".to_owned());
                args.push(setting);
            }
        }
        // Extra server settings for a profiling run, space-separated `name=value`
        // (`loadtest/README.md`: `shared_preload_libraries=pg_stat_statements`).
        if let Ok(extra) = std::env::var("HERALD_PG_SETTINGS") {
            for setting in extra.split_whitespace() {
                args.push("-c".to_owned());
                args.push(setting.to_owned());
            }
        }
        if !options.durable {
            for setting in [
                "fsync=off",
                "synchronous_commit=off",
                "full_page_writes=off",
            ] {
                args.push("-c".to_owned());
                args.push(setting.to_owned());
            }
        }
        Ok(Self {
            bin,
            data_dir,
            port,
            args,
            user,
            log,
        })
    }
}

/// The newest installed PostgreSQL's binaries.
pub fn bin_dir() -> anyhow::Result<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .context("PostgreSQL is not installed (no /usr/lib/postgresql): install postgresql-15")?
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("postgres").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).context(
        "no PostgreSQL server binaries under /usr/lib/postgresql/*/bin: install postgresql-15",
    )
}

/// The uid/gid to run PostgreSQL as: `postgres` when we are root, else ourselves.
fn postgres_user() -> anyhow::Result<Option<(u32, u32)>> {
    if !nix::unistd::Uid::effective().is_root() {
        return Ok(None);
    }
    let user = nix::unistd::User::from_name("postgres")?
        .context("running as root needs a `postgres` user for initdb (install postgresql-15)")?;
    Ok(Some((user.uid.as_raw(), user.gid.as_raw())))
}

/// Whether `pid` still runs (a zombie waiting for its parent to reap it does not).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .next()?
                .to_owned();
            Some(state != "Z")
        })
        .unwrap_or(false)
}
