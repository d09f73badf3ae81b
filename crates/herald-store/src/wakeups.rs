//! Wake-ups for idle pollers, sent after commit and coalesced. PostgreSQL serialises the
//! commit of every transaction that called NOTIFY, so a NOTIFY inside each accept transaction
//! halves the rate at which single messages and receipts commit. The accept path commits
//! without one and hands the partitions it wrote to [`Wakeups`]; one task sends one NOTIFY
//! statement per short window for every partition written in it. A lost wake-up (the
//! statement failed) only delays rows by the poller's poll interval: polling is the fallback.

use std::collections::BTreeSet;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::mpsc;

use crate::accept::OUTBOX_CHANNEL;

/// The handle the accept path wakes partitions through; cloning is cheap.
#[derive(Clone)]
pub struct Wakeups {
    tx: mpsc::UnboundedSender<u32>,
}

impl Wakeups {
    /// Starts the sender: partitions woken within `window` of each other share one statement.
    /// It ends when every handle is dropped.
    pub fn spawn(pool: PgPool, window: Duration) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(send_coalesced(pool, rx, window));
        Self { tx }
    }

    /// Asks for a wake-up of each partition's poller (after the caller's commit).
    pub fn wake(&self, partitions: impl IntoIterator<Item = u32>) {
        for partition in partitions {
            // Only fails once the sender stopped (shutdown): polling covers it.
            let _ = self.tx.send(partition);
        }
    }
}

async fn send_coalesced(pool: PgPool, mut rx: mpsc::UnboundedReceiver<u32>, window: Duration) {
    while let Some(first) = rx.recv().await {
        let mut partitions = BTreeSet::from([first]);
        tokio::time::sleep(window).await;
        while let Ok(next) = rx.try_recv() {
            partitions.insert(next);
        }
        let partitions: Vec<i32> = partitions.into_iter().map(|p| p as i32).collect();
        let sent = sqlx::query("SELECT pg_notify($1, p::text) FROM UNNEST($2::int[]) AS p")
            .bind(OUTBOX_CHANNEL)
            .bind(&partitions)
            .execute(&pool)
            .await;
        if let Err(err) = sent {
            tracing::warn!(error = %err, partitions = partitions.len(),
                "waking the pollers failed; they find the rows at their next poll");
        }
    }
}
