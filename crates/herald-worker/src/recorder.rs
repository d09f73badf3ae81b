//! Group commit of the send worker's outcomes. Provider calls finish one by one; each caller
//! hands its effect to the recorder and waits. The recorder writes everything that is waiting
//! in one statement (one transaction), then answers each caller — so every ACCEPTED is still
//! committed after its own provider call, and no caller is answered before the commit that
//! holds its effect. While one write runs, the next group gathers; a group that starts alone
//! waits up to its linger (`--batch-linger`) for company.
//! The grouping is [`herald_store::group`]'s, shared with the API's accept paths.

use std::sync::Arc;
use std::time::Duration;

use herald_store::effects::{record_accepted_batch, AcceptedEffect};
use herald_store::group::{GroupCommit, GroupSettings};
use herald_store::StoreError;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// The handle callers record through; the writer ends when every handle is dropped.
#[derive(Clone)]
pub struct AcceptedRecorder {
    group: GroupCommit<AcceptedEffect, bool>,
}

impl AcceptedRecorder {
    /// Starts the writer: at most `settings.max_group` effects per statement, `parallel`
    /// statements at a time; a failed write is retried (a database outage) for up to
    /// `retry_for`, or until `cancel`.
    pub fn spawn(
        pool: PgPool,
        settings: GroupSettings,
        retry_for: Duration,
        cancel: CancellationToken,
    ) -> Self {
        let group = GroupCommit::spawn(
            "ledger",
            settings,
            move |effects: Arc<Vec<AcceptedEffect>>| {
                let pool = pool.clone();
                let cancel = cancel.clone();
                async move {
                    crate::send::with_retries_for(&cancel, retry_for, || {
                        record_accepted_batch(&pool, &effects)
                    })
                    .await
                }
            },
        );
        Self { group }
    }

    /// Records one effect and answers once it is committed: true when its ledger row is new.
    pub async fn record(&self, effect: AcceptedEffect) -> Result<bool, StoreError> {
        self.group.write(effect).await
    }
}
