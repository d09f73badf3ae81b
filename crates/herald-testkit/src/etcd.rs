//! An etcd server of our own: one member, client and peer ports free on 127.0.0.1.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use nix::sys::signal::Signal;

use crate::process::{Launch, Managed};
use crate::redis::which;
use crate::{free_port, path_str, wait_until};

pub struct LocalEtcd {
    process: Managed,
    client_port: u16,
    tls: Option<crate::tls::ServerTls>,
    data_dir: std::path::PathBuf,
    _temp: Option<tempfile::TempDir>,
}

impl LocalEtcd {
    pub async fn start() -> anyhow::Result<Self> {
        let temp = tempfile::Builder::new().prefix("herald-etcd-").tempdir()?;
        let mut etcd = Self::start_in(temp.path()).await?;
        etcd._temp = Some(temp);
        Ok(etcd)
    }

    pub async fn start_in(root: &Path) -> anyhow::Result<Self> {
        Self::start_with(root, None).await
    }

    /// A server whose clients must speak TLS and present a certificate of `tls.ca`.
    pub async fn start_tls(tls: &crate::tls::ServerTls) -> anyhow::Result<Self> {
        let temp = tempfile::Builder::new().prefix("herald-etcd-").tempdir()?;
        let mut etcd = Self::start_with(temp.path(), Some(tls.clone())).await?;
        etcd._temp = Some(temp);
        Ok(etcd)
    }

    /// [`start_tls`](Self::start_tls) with its data under `root`.
    pub async fn start_tls_in(root: &Path, tls: &crate::tls::ServerTls) -> anyhow::Result<Self> {
        Self::start_with(root, Some(tls.clone())).await
    }

    async fn start_with(root: &Path, tls: Option<crate::tls::ServerTls>) -> anyhow::Result<Self> {
        std::fs::create_dir_all(root)?;
        let program =
            which("etcd").context("etcd is not installed: install the etcd-server package")?;
        let client_port = free_port()?;
        let peer_port = free_port()?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let args = vec![
            "--name".to_owned(),
            "herald".to_owned(),
            "--data-dir".to_owned(),
            root.join("data")
                .to_str()
                .context("non-UTF-8 path")?
                .to_owned(),
            "--listen-client-urls".to_owned(),
            client.clone(),
            "--advertise-client-urls".to_owned(),
            client,
            "--listen-peer-urls".to_owned(),
            peer.clone(),
            "--initial-advertise-peer-urls".to_owned(),
            peer.clone(),
            "--initial-cluster".to_owned(),
            format!("herald={peer}"),
            "--log-level".to_owned(),
            "warn".to_owned(),
        ];
        let mut args = args;
        if let Some(tls) = &tls {
            let path = |p: &Path| path_str(p).map(str::to_owned);
            args.extend([
                "--cert-file".to_owned(),
                path(&tls.cert)?,
                "--key-file".to_owned(),
                path(&tls.key)?,
                "--trusted-ca-file".to_owned(),
                path(&tls.ca)?,
                "--client-cert-auth".to_owned(),
            ]);
        }
        let process = Managed::spawn(Launch {
            program,
            args,
            env: Vec::new(),
            user: None,
            log: root.join("etcd.log"),
        })?;
        let etcd = Self {
            process,
            client_port,
            tls,
            data_dir: root.join("data"),
            _temp: None,
        };
        etcd.wait_ready().await?;
        Ok(etcd)
    }

    async fn wait_ready(&self) -> anyhow::Result<()> {
        let url = format!("{}/health", self.endpoint());
        let client = match &self.tls {
            None => reqwest::Client::new(),
            Some(tls) => {
                // The server asks for a client certificate; present the server's own (same CA,
                // and etcd's server certificates serve as clients too when allowed).
                let ca = reqwest::Certificate::from_pem(&std::fs::read(&tls.ca)?)?;
                let mut pem = std::fs::read(&tls.cert)?;
                pem.extend(std::fs::read(&tls.key)?);
                reqwest::Client::builder()
                    .add_root_certificate(ca)
                    .identity(reqwest::Identity::from_pem(&pem)?)
                    .build()?
            }
        };
        wait_until("etcd", Duration::from_secs(30), || {
            let request = client.get(&url).timeout(Duration::from_secs(1));
            async move {
                let body = request.send().await?.text().await?;
                anyhow::ensure!(body.contains("\"health\":\"true\""), "not healthy: {body}");
                Ok(())
            }
        })
        .await
        .with_context(|| self.process.log_tail(2000))
    }

    pub fn pid(&self) -> Option<i32> {
        self.process.pid()
    }

    /// `http://127.0.0.1:<port>`, or `https://…` for a TLS server.
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    pub async fn stop(&mut self) -> anyhow::Result<()> {
        self.process
            .stop_with(Signal::SIGTERM, Duration::from_secs(10))
            .await?;
        Ok(())
    }

    /// Freezes the server (SIGSTOP): clients time out as if it were partitioned away.
    pub fn pause(&self) -> anyhow::Result<()> {
        self.process.signal(Signal::SIGSTOP)
    }

    pub fn resume(&self) -> anyhow::Result<()> {
        self.process.signal(Signal::SIGCONT)
    }

    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.process.start()?;
        self.wait_ready().await
    }

    /// Stops the server, deletes its data (every key, lease and revision) and starts it again
    /// empty on the same port: revisions start again from 1.
    pub async fn wipe_and_restart(&mut self) -> anyhow::Result<()> {
        self.stop().await?;
        std::fs::remove_dir_all(&self.data_dir)
            .with_context(|| format!("removing {}", self.data_dir.display()))?;
        self.restart().await
    }
}
