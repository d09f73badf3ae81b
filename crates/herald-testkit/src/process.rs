//! A child process that can be signalled, stopped and started again with the same command.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// How to (re)start a process: program, arguments, environment, user, log file.
#[derive(Debug, Clone)]
pub struct Launch {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Run as this uid/gid (PostgreSQL refuses to run as root).
    pub user: Option<(u32, u32)>,
    /// stdout and stderr are appended here.
    pub log: PathBuf,
}

/// A running (or stopped) server or role. Dropping it kills the process.
#[derive(Debug)]
pub struct Managed {
    launch: Launch,
    child: Option<Child>,
}

impl Managed {
    pub fn spawn(launch: Launch) -> anyhow::Result<Self> {
        let mut managed = Self {
            launch,
            child: None,
        };
        managed.start()?;
        Ok(managed)
    }

    /// Starts the process again after a stop or kill (no-op when it runs).
    pub fn start(&mut self) -> anyhow::Result<()> {
        if self.child.is_some() {
            return Ok(());
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.launch.log)
            .with_context(|| format!("opening {}", self.launch.log.display()))?;
        let mut command = Command::new(&self.launch.program);
        // A HERALD_* variable of the caller's environment would win over a role's --config
        // file: every setting of a process comes from its launch alone.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("HERALD_") {
                command.env_remove(key);
            }
        }
        command
            .args(&self.launch.args)
            .envs(self.launch.env.iter().cloned())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        if let Some((uid, gid)) = self.launch.user {
            command.uid(uid).gid(gid);
        }
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", self.launch.program.display()))?;
        self.child = Some(child);
        Ok(())
    }

    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().and_then(|c| c.id()).map(|id| id as i32)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: Signal) -> anyhow::Result<()> {
        let pid = self.pid().context("process is not running")?;
        kill(Pid::from_raw(pid), signal).with_context(|| format!("sending {signal} to {pid}"))
    }

    /// Sends `signal` and waits up to `timeout` for the exit; kills it after that. Returns
    /// whether it exited on its own.
    pub async fn stop_with(&mut self, signal: Signal, timeout: Duration) -> anyhow::Result<bool> {
        let Some(mut child) = self.child.take() else {
            return Ok(true);
        };
        if let Some(pid) = child.id() {
            let _ = kill(Pid::from_raw(pid as i32), signal);
        }
        match tokio::time::timeout(timeout, child.wait()).await {
            Ok(status) => {
                status?;
                Ok(true)
            }
            Err(_) => {
                child.kill().await?;
                Ok(false)
            }
        }
    }

    /// kill -9, and reap.
    pub async fn kill9(&mut self) -> anyhow::Result<()> {
        self.stop_with(Signal::SIGKILL, Duration::from_secs(10))
            .await?;
        Ok(())
    }

    /// Waits for the process to exit by itself; returns its exit code (None if signalled).
    pub async fn wait(&mut self, timeout: Duration) -> anyhow::Result<Option<i32>> {
        let child = self.child.as_mut().context("process is not running")?;
        let status = tokio::time::timeout(timeout, child.wait())
            .await
            .context("process did not exit in time")??;
        self.child = None;
        Ok(status.code())
    }

    pub fn log_path(&self) -> &std::path::Path {
        &self.launch.log
    }

    /// The process's log so far (for failure messages).
    pub fn log_tail(&self, max_bytes: usize) -> String {
        let text = std::fs::read_to_string(&self.launch.log).unwrap_or_default();
        let start = text.len().saturating_sub(max_bytes);
        let start = (start..text.len())
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(0);
        text[start..].to_owned()
    }
}

/// Every running process whose parent is `pid`, from `/proc` (a PostgreSQL server's
/// backends, WAL writer, checkpointer… are the postmaster's children).
pub fn children_of(pid: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|child| parent_of(*child) == Some(pid))
        .collect()
}

/// The parent pid of `pid`, from `/proc/<pid>/stat` (fields after the command name, which may
/// hold spaces, start after the last ')').
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(1)?.parse().ok()
}
