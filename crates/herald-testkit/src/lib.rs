//! Real servers on demand. Each test (and `herald dev`) gets its own PostgreSQL, Redis and
//! etcd processes, on free ports, in their own directories, torn down when the handle drops
//! (also when a test panics). Any server can be stopped, killed and started again mid-test on
//! the same port and data, and Herald's roles run as separate processes of the built binary
//! so a test can kill -9, SIGTERM, SIGSTOP or restart them.

pub mod deployment;
pub mod etcd;
pub mod keys;
pub mod packages;
pub mod postgres;
pub mod process;
pub mod prometheus;
pub mod redis;
pub mod role;

pub use deployment::{DeploymentOptions, LocalDeployment};
pub use etcd::LocalEtcd;
pub use keys::DeploymentKeys;
pub use postgres::{LocalPostgres, PostgresOptions};
pub use process::children_of;
pub use prometheus::{LocalPrometheus, ScrapeJob};
pub use redis::{LocalRedis, RedisOptions};
pub use role::RoleProcess;

use std::net::TcpListener;
use std::time::{Duration, Instant};

/// A port nobody listens on right now.
pub fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// Polls `check` every 50 ms until it succeeds or `timeout` passes; returns the last error.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(()) => return Ok(()),
            Err(err) if Instant::now() >= deadline => {
                anyhow::bail!("{what} not ready after {timeout:?}: {err:#}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}
