//! Waiting for a state, never for a time: each wait polls what it waits for, allows far more
//! time than the state should take on a busy machine, and on timeout says what it last saw.
//! How long things took is for benchmarks; a test prints it at most.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::Deployment;

/// The deadline for a state that normally comes within seconds: long enough that only a
/// state that never comes reaches it.
pub const PATIENCE: Duration = Duration::from_secs(90);

/// How long a role sent SIGTERM may take to exit by itself. Each role bounds its own drain
/// (`--drain-timeout`); this only keeps a hung process from hanging the test.
pub const EXIT_GRACE: Duration = Duration::from_secs(60);

/// Polls `probe` every 100 ms until it answers `Ok`, and returns that value. After `timeout`
/// panics with `what` and the last `Err`: what was seen instead.
pub async fn until<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    // Only the deadline reads the clock; no assertion is made on how long the wait took.
    let deadline = Instant::now() + timeout;
    loop {
        match probe().await {
            Ok(value) => return value,
            Err(seen) if Instant::now() >= deadline => {
                panic!("waited {timeout:?} for {what}; last seen: {seen}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The value of a `SELECT count(*)`.
pub async fn count(herald: &Deployment, count_sql: &str) -> i64 {
    sqlx::query_scalar(count_sql)
        .fetch_one(&herald.pool)
        .await
        .unwrap_or_else(|err| panic!("{count_sql}: {err}"))
}

/// Waits until `count_sql` has grown by `by` from its value now; returns the new value. Lets
/// a scenario run on until something happened (`by` more messages accepted, delivered)
/// rather than for a while.
pub async fn grown(herald: &Deployment, count_sql: &str, by: i64) -> i64 {
    let from = count(herald, count_sql).await;
    until(
        &format!("{count_sql} grows by {by} from {from}"),
        PATIENCE,
        || async {
            let now = count(herald, count_sql).await;
            if now >= from + by {
                Ok(now)
            } else {
                Err(now.to_string())
            }
        },
    )
    .await
}

/// Waits until the API has accepted `by` more messages than now: load that keeps running is
/// seen to run.
pub async fn accepted_more(herald: &Deployment, by: i64) -> i64 {
    grown(herald, "SELECT count(*) FROM messages", by).await
}

/// Waits until the metric `name` (summed over its series) on the role at `admin` is above
/// `floor`; returns its value.
pub async fn metric_above(herald: &Deployment, admin: &str, name: &str, floor: f64) -> f64 {
    until(
        &format!("{name} on {admin} above {floor}"),
        PATIENCE,
        || async {
            let now = herald.metric(admin, name).await;
            if now > floor {
                Ok(now)
            } else {
                Err(now.to_string())
            }
        },
    )
    .await
}
