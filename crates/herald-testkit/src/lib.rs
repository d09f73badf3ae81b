//! Real servers on demand. A test (and `herald dev`) can start its own PostgreSQL, Redis and
//! etcd processes, on free ports, in their own directories, torn down when the handle drops
//! (also when a test panics); a test that only needs a database takes one of its own on its
//! test binary's shared PostgreSQL server instead ([`TestDatabase`], cloned from a migrated
//! template in milliseconds). Any server can be stopped, killed and started again mid-test on
//! the same port and data, and Herald's roles run as separate processes of the built binary
//! so a test can kill -9, SIGTERM, SIGSTOP or restart them.

pub mod config;
pub mod deployment;
pub mod etcd;
pub mod keys;
pub mod packages;
pub mod postgres;
pub mod process;
pub mod prometheus;
pub mod redis;
pub mod role;
pub mod shared;
pub mod tls;

pub use deployment::{DeploymentOptions, LocalDeployment};
pub use etcd::LocalEtcd;
pub use keys::DeploymentKeys;
pub use postgres::{LocalPostgres, PostgresOptions};
pub use process::children_of;
pub use prometheus::{LocalPrometheus, ScrapeJob};
pub use redis::{LocalRedis, RedisOptions};
pub use role::RoleProcess;
pub use shared::TestDatabase;
pub use tls::{ServerTls, TestCerts};

use std::net::TcpListener;
use std::time::{Duration, Instant};

/// Where [`free_port`] looks: below Linux's default ephemeral range (32768-60999), from which
/// the kernel picks the local port of every outgoing connection and of `bind(0)`. A port handed
/// out here is bound a moment later by a child process; taken from the ephemeral range, a test's
/// client connection could take it in between (the server then fails with "Address already in
/// use"), and `bind(0)` could hand it to two tests at once (one test's requests then reach
/// another test's server).
const PORTS: std::ops::Range<u16> = 20_000..32_000;

/// A port nobody listens on right now, and that no other caller was given, in this process
/// or another: tests run in parallel threads of one process, and `scripts/test` runs several
/// test processes at once, each starting servers on ports from here. Across processes a port
/// is held by an advisory lock on a file named after it (in the temporary directory), kept
/// until the process ends; the kernel drops the lock of a process that died.
pub fn free_port() -> anyhow::Result<u16> {
    use rand::Rng;
    static GIVEN: std::sync::Mutex<std::collections::BTreeMap<u16, std::fs::File>> =
        std::sync::Mutex::new(std::collections::BTreeMap::new());
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    // One folder per user: another user's lock files could not be opened for writing.
    let user = std::env::var("USER").unwrap_or_else(|_| "anyone".to_owned());
    let locks = std::env::temp_dir().join(format!("herald-test-ports-{user}"));
    std::fs::create_dir_all(&locks)?;
    let mut rng = rand::rng();
    for _ in 0..1_000 {
        let port = rng.random_range(PORTS);
        if given.contains_key(&port) {
            continue;
        }
        let Ok(lock) = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(locks.join(port.to_string()))
        else {
            continue;
        };
        if lock.try_lock().is_err() {
            continue; // another test process holds it
        }
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.insert(port, lock);
            return Ok(port);
        }
    }
    anyhow::bail!("no free port in {PORTS:?} after 1,000 tries")
}

/// Every `.rs` and `.sql` file below `roots`, for tests that read the code as text; folders
/// named in `skip` (e.g. `tests`, `target`) are not entered.
pub fn source_files(roots: &[std::path::PathBuf], skip: &[&str]) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut folders = roots.to_vec();
    while let Some(folder) = folders.pop() {
        let entries = std::fs::read_dir(&folder)
            .unwrap_or_else(|err| panic!("reading {}: {err}", folder.display()));
        for entry in entries {
            let path = entry.expect("a folder entry").path();
            if path.is_dir() {
                if !skip.iter().any(|s| path.ends_with(s)) {
                    folders.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs" || e == "sql") {
                files.push(path);
            }
        }
    }
    files
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

/// The sum of the series of `name` in a Prometheus text rendering whose labels contain
/// `labels` (`""`: every series, labelled or not); `None` when no series matches.
pub fn metric_value(text: &str, name: &str, labels: &str) -> Option<f64> {
    text.lines()
        .filter(|line| {
            line.strip_prefix(name).is_some_and(|rest| {
                if labels.is_empty() {
                    rest.starts_with(' ') || rest.starts_with('{')
                } else {
                    rest.strip_prefix('{')
                        .and_then(|rest| rest.split_once('}'))
                        .is_some_and(|(found, _)| found.contains(labels))
                }
            })
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(None, |sum, value| Some(sum.unwrap_or(0.0) + value))
}

/// A path as the `&str` a server's command line takes.
pub(crate) fn path_str(path: &std::path::Path) -> anyhow::Result<&str> {
    anyhow::Context::context(path.to_str(), "non-UTF-8 path")
}

#[cfg(test)]
mod metric_tests {
    use super::metric_value;

    #[test]
    fn sums_the_matching_series_and_tells_none_from_zero() {
        let text = "# TYPE a counter\n\
                    a{job_type=\"send\"} 2\n\
                    a{job_type=\"status\"} 3\n\
                    ab{job_type=\"send\"} 100\n\
                    b 0\n";
        assert_eq!(metric_value(text, "a", ""), Some(5.0));
        assert_eq!(metric_value(text, "a", "job_type=\"send\""), Some(2.0));
        assert_eq!(metric_value(text, "b", ""), Some(0.0));
        assert_eq!(metric_value(text, "b", "job_type=\"send\""), None);
        assert_eq!(metric_value(text, "c", ""), None);
    }
}
