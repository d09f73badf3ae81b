//! Waking partitions: one signal per partition, fired by the accept path's NOTIFY through one
//! LISTEN session per poller (polling stays the fallback).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use herald_store::accept::OUTBOX_CHANNEL;
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// One wake-up signal per partition, fired by the accept path's NOTIFY.
#[derive(Clone)]
pub struct Wakers(Arc<HashMap<u32, Arc<Notify>>>);

impl Wakers {
    pub fn new(partitions: impl IntoIterator<Item = u32>) -> Self {
        Self(Arc::new(
            partitions
                .into_iter()
                .map(|p| (p, Arc::new(Notify::new())))
                .collect(),
        ))
    }

    /// The partition's signal (a fresh one for a partition outside the set).
    pub fn get(&self, partition: u32) -> Arc<Notify> {
        self.0.get(&partition).cloned().unwrap_or_default()
    }

    /// Listens until `cancel`; see [`listen_for_new_rows`].
    pub async fn listen(self, pool: PgPool, cancel: CancellationToken) {
        listen_for_new_rows(pool, self.0, cancel).await
    }
}

/// Wakes a partition's drain task when the accept path commits a row in it. Polling stays
/// the fallback: a lost notification only delays a row by the poll interval.
async fn listen_for_new_rows(
    pool: PgPool,
    wakers: Arc<HashMap<u32, Arc<Notify>>>,
    cancel: CancellationToken,
) {
    // A failed LISTEN waits before the next try, longer each time up to LISTEN_RETRY_MAX,
    // so an unreachable or refusing database is not asked in a tight loop.
    let mut retry = LISTEN_RETRY_MIN;
    while !cancel.is_cancelled() {
        match listen_once(&pool, &wakers, &cancel).await {
            Listened::Cancelled => return,
            Listened::Lost(err) => {
                tracing::warn!(error = %err, retry_in = ?LISTEN_RETRY_MIN, "LISTEN connection lost; relying on polling until it is back");
                retry = LISTEN_RETRY_MIN;
            }
            Listened::Refused(err) => {
                tracing::warn!(error = %err, retry_in = ?retry, "cannot LISTEN; relying on polling for now");
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(retry) => {}
        }
        retry = (retry * 2).min(LISTEN_RETRY_MAX);
    }
}

const LISTEN_RETRY_MIN: Duration = Duration::from_millis(500);
const LISTEN_RETRY_MAX: Duration = Duration::from_secs(30);

/// How one LISTEN session ended.
enum Listened {
    Cancelled,
    /// The connection or the LISTEN failed before any notification could arrive.
    Refused(sqlx::Error),
    /// A working session lost its connection.
    Lost(sqlx::Error),
}

async fn listen_once(
    pool: &PgPool,
    wakers: &HashMap<u32, Arc<Notify>>,
    cancel: &CancellationToken,
) -> Listened {
    let mut listener = match sqlx::postgres::PgListener::connect_with(pool).await {
        Ok(listener) => listener,
        Err(err) => return Listened::Refused(err),
    };
    if let Err(err) = listener.listen(OUTBOX_CHANNEL).await {
        return Listened::Refused(err);
    }
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return Listened::Cancelled,
            received = listener.recv() => match received {
                Ok(notification) => {
                    if let Some(waker) = notification
                        .payload()
                        .parse::<u32>()
                        .ok()
                        .and_then(|p| wakers.get(&p))
                    {
                        waker.notify_one();
                    }
                }
                Err(err) => return Listened::Lost(err),
            }
        }
    }
}
