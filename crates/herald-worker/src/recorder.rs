//! Group commit of the send worker's outcomes. Provider calls finish one by one; each caller
//! hands its effect to the recorder and waits. The recorder writes everything that is waiting
//! in one statement (one transaction), then answers each caller — so every ACCEPTED is still
//! committed after its own provider call, and no caller is answered before the commit that
//! holds its effect. While one write runs, the next group gathers; there is no timer to wait.

use std::time::Duration;

use herald_store::effects::{record_accepted_batch, AcceptedEffect};
use herald_store::StoreError;
use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

type Waiting = (AcceptedEffect, oneshot::Sender<Result<bool, StoreError>>);

/// The handle callers record through; the writer task ends when every handle is dropped.
#[derive(Clone)]
pub struct AcceptedRecorder {
    tx: mpsc::Sender<Waiting>,
}

impl AcceptedRecorder {
    /// Starts the writer: at most `max_group` effects per statement; a failed write is retried
    /// (a database outage) for up to `retry_for`, or until `cancel`.
    pub fn spawn(
        pool: PgPool,
        max_group: usize,
        retry_for: Duration,
        cancel: CancellationToken,
    ) -> Self {
        let (tx, rx) = mpsc::channel(max_group.max(1) * 4);
        tokio::spawn(write_groups(pool, rx, max_group.max(1), retry_for, cancel));
        Self { tx }
    }

    /// Records one effect and answers once it is committed: true when its ledger row is new.
    pub async fn record(&self, effect: AcceptedEffect) -> Result<bool, StoreError> {
        let (answer, answered) = oneshot::channel();
        self.tx
            .send((effect, answer))
            .await
            .map_err(|_| StoreError::GroupWrite("the outcome recorder stopped".to_owned()))?;
        answered
            .await
            .map_err(|_| StoreError::GroupWrite("the outcome recorder stopped".to_owned()))?
    }
}

async fn write_groups(
    pool: PgPool,
    mut rx: mpsc::Receiver<Waiting>,
    max_group: usize,
    retry_for: Duration,
    cancel: CancellationToken,
) {
    while let Some(first) = rx.recv().await {
        let mut group = vec![first];
        while group.len() < max_group {
            match rx.try_recv() {
                Ok(next) => group.push(next),
                Err(_) => break,
            }
        }
        ::metrics::counter!(crate::metrics::COMMIT_GROUPS).increment(1);
        let effects: Vec<AcceptedEffect> = group.iter().map(|(e, _)| e.clone()).collect();
        let written = crate::send::with_retries_for(&cancel, retry_for, || {
            record_accepted_batch(&pool, &effects)
        })
        .await;
        match written {
            Ok(inserted) => {
                for ((_, answer), new) in group.into_iter().zip(inserted) {
                    let _ = answer.send(Ok(new));
                }
            }
            Err(err) => {
                let text = err.to_string();
                for (_, answer) in group {
                    let _ = answer.send(Err(StoreError::GroupWrite(text.clone())));
                }
            }
        }
    }
}
