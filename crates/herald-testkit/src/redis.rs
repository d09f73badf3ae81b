//! A Redis server of our own, without persistence, with `maxmemory` and `noeviction`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use nix::sys::signal::Signal;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::process::{Launch, Managed};
use crate::{free_port, path_str, wait_until};

#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// `maxmemory` in bytes; writes past it are rejected (`noeviction`), never evicted.
    pub max_memory_bytes: u64,
    /// TLS only (no plaintext port); clients may present a certificate of the CA.
    pub tls: Option<crate::tls::ServerTls>,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            max_memory_bytes: 256 * 1024 * 1024,
            tls: None,
        }
    }
}

/// A running Redis server. It keeps nothing on disk, so a restart loses every stream.
pub struct LocalRedis {
    process: Managed,
    port: u16,
    tls: bool,
    _temp: Option<tempfile::TempDir>,
}

impl LocalRedis {
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with(&RedisOptions::default()).await
    }

    /// Starts a server in a fresh temporary directory with `options`.
    pub async fn start_with(options: &RedisOptions) -> anyhow::Result<Self> {
        let temp = tempfile::Builder::new().prefix("herald-redis-").tempdir()?;
        let mut redis = Self::start_in(temp.path(), options).await?;
        redis._temp = Some(temp);
        Ok(redis)
    }

    pub async fn start_in(root: &Path, options: &RedisOptions) -> anyhow::Result<Self> {
        std::fs::create_dir_all(root)?;
        let port = free_port()?;
        let program = which("redis-server")
            .context("redis-server is not installed: install the redis-server package")?;
        let mut args = match &options.tls {
            None => vec!["--port".to_owned(), port.to_string()],
            Some(tls) => vec![
                "--port".to_owned(),
                "0".to_owned(),
                "--tls-port".to_owned(),
                port.to_string(),
                "--tls-cert-file".to_owned(),
                path_str(&tls.cert)?.to_owned(),
                "--tls-key-file".to_owned(),
                path_str(&tls.key)?.to_owned(),
                "--tls-ca-cert-file".to_owned(),
                path_str(&tls.ca)?.to_owned(),
                "--tls-auth-clients".to_owned(),
                "optional".to_owned(),
            ],
        };
        args.extend([
            "--bind".to_owned(),
            "127.0.0.1".to_owned(),
            "--save".to_owned(),
            String::new(),
            "--appendonly".to_owned(),
            "no".to_owned(),
            "--dir".to_owned(),
            path_str(root)?.to_owned(),
            "--maxmemory".to_owned(),
            options.max_memory_bytes.to_string(),
            "--maxmemory-policy".to_owned(),
            "noeviction".to_owned(),
        ]);
        let process = Managed::spawn(Launch {
            program,
            args,
            env: Vec::new(),
            user: None,
            log: root.join("redis.log"),
        })?;
        let redis = Self {
            process,
            port,
            tls: options.tls.is_some(),
            _temp: None,
        };
        redis.wait_ready().await?;
        Ok(redis)
    }

    async fn wait_ready(&self) -> anyhow::Result<()> {
        let port = self.port;
        let tls = self.tls;
        wait_until("redis", Duration::from_secs(20), || async move {
            let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
            if tls {
                // Listening is ready enough; the clients under test do the handshake.
                return Ok(());
            }
            stream.write_all(b"PING\r\n").await?;
            let mut reply = [0u8; 7];
            stream.read_exact(&mut reply).await?;
            anyhow::ensure!(&reply == b"+PONG\r\n", "unexpected reply {reply:?}");
            Ok(())
        })
        .await
        .with_context(|| self.process.log_tail(2000))
    }

    pub fn pid(&self) -> Option<i32> {
        self.process.pid()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://…`, or `rediss://…` for a TLS server.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}/", self.port)
    }

    /// Stops the server (its streams are gone: no persistence).
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        self.process
            .stop_with(Signal::SIGTERM, Duration::from_secs(10))
            .await?;
        Ok(())
    }

    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.process.start()?;
        self.wait_ready().await
    }
}

/// The first `name` on PATH (or in /usr/sbin, /usr/bin).
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}
