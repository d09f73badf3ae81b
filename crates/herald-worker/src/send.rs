//! The send handler (rules R4, R5): confirm ownership (outbox DONE + CLAIMED), call the
//! provider with the message's idempotency key, then record ACCEPTED with the ledger row — or
//! a retry, or a failure. No transaction is open during the provider call.

use std::time::Duration;

use herald_core::job::Job;
use herald_core::{send_effect_key, JobType};
use herald_queue::Delivery;
use herald_store::effects::{
    confirm_ownership, recipient_of, record_accepted, record_failed, reject_before_claim,
    schedule_retry, ProviderReceipt, RetryOutcome,
};
use herald_store::StoreError;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::metrics as m;
use crate::provider::{ProviderClient, SubmitOutcome};
use crate::{Handled, Handler};

#[derive(Debug, Clone)]
pub struct SendSettings {
    /// Claims a send may use before it becomes DEAD.
    pub max_attempts: u32,
    /// Back-off after the first failed attempt; doubles per attempt.
    pub retry_base: Duration,
    /// The longest back-off.
    pub retry_max: Duration,
    /// This worker's name in CLAIMED events.
    pub worker: String,
    /// Recipients an internal check refuses: their messages end FAILED before any claim.
    pub blocked_recipients: std::collections::HashSet<String>,
}

impl Default for SendSettings {
    fn default() -> Self {
        Self {
            max_attempts: 10,
            retry_base: Duration::from_millis(500),
            retry_max: Duration::from_secs(60),
            worker: "worker".to_owned(),
            blocked_recipients: Default::default(),
        }
    }
}

pub struct SendHandler {
    pub pool: PgPool,
    pub provider: ProviderClient,
    pub settings: SendSettings,
}

impl Handler for SendHandler {
    async fn handle(&self, delivery: Delivery, cancel: CancellationToken) -> Handled {
        let job = match delivery.job {
            Ok(job) if job.job_type == JobType::Send => job,
            Ok(job) => {
                outcome("wrong_job_type");
                tracing::error!(entry = %delivery.entry_id, job_type = %job.job_type,
                    outbox_id = job.outbox_id, "a non-send job is on the send stream; dropping this copy (its outbox row stays the proof)");
                return Handled::Done;
            }
            Err(raw) => {
                ::metrics::counter!(m::MALFORMED, "job_type" => "send").increment(1);
                tracing::error!(entry = %delivery.entry_id, raw = %raw,
                    "stream entry is not a valid job; dropping this copy (its outbox row stays the proof)");
                return Handled::Done;
            }
        };
        match self.send(&job, &cancel).await {
            Ok(()) => Handled::Done,
            Err(err) => {
                outcome("store_error");
                tracing::error!(outbox_id = job.outbox_id, error = %err,
                    "could not record the outcome; leaving the entry to be reclaimed");
                Handled::Keep
            }
        }
    }
}

impl SendHandler {
    #[tracing::instrument(skip_all, fields(outbox_id = job.outbox_id, partition = job.partition, message_id))]
    async fn send(&self, job: &Job, cancel: &CancellationToken) -> Result<(), StoreError> {
        if let Some(reason) = self.internal_check(job).await? {
            let rejected =
                reject_before_claim(&self.pool, job.partition, job.outbox_id, &reason).await?;
            outcome(if rejected {
                "rejected_internal"
            } else {
                "stale_copy"
            });
            return Ok(());
        }
        let Some(owned) = confirm_ownership(
            &self.pool,
            job.partition,
            job.outbox_id,
            &self.settings.worker,
        )
        .await?
        else {
            // Another copy of this job was confirmed, or the row was re-driven.
            outcome("stale_copy");
            return Ok(());
        };
        ::metrics::counter!(m::CONFIRMED, "job_type" => "send").increment(1);
        tracing::Span::current().record("message_id", tracing::field::display(owned.message_id));
        if owned.already_accepted {
            outcome("already_accepted");
            return Ok(());
        }
        let key = send_effect_key(owned.message_id);
        match self
            .provider
            .submit(&key, &owned.recipient, &owned.body)
            .await
        {
            SubmitOutcome::Accepted {
                gateway,
                provider_id,
            } => {
                let receipt = ProviderReceipt {
                    gateway,
                    provider_id,
                };
                let inserted = with_retries(cancel, || {
                    record_accepted(&self.pool, owned.message_id, &key, &receipt)
                })
                .await?;
                outcome(if inserted {
                    "accepted"
                } else {
                    "accepted_again"
                });
            }
            SubmitOutcome::Rejected { reason } => {
                tracing::warn!(%reason, "provider rejected the message for good");
                with_retries(cancel, || {
                    record_failed(&self.pool, owned.message_id, &reason)
                })
                .await?;
                outcome("rejected");
            }
            SubmitOutcome::Transient { reason } => {
                let backoff = self.backoff(job.attempt);
                let retried = with_retries(cancel, || {
                    schedule_retry(
                        &self.pool,
                        job.partition,
                        job.outbox_id,
                        &reason,
                        backoff,
                        self.settings.max_attempts,
                    )
                })
                .await?;
                match retried {
                    RetryOutcome::Scheduled => outcome("retry"),
                    RetryOutcome::Dead => {
                        tracing::error!(%reason, attempt = job.attempt, "send is DEAD after its last attempt");
                        ::metrics::counter!(herald_store::metrics::DEAD, "stage" => "retry")
                            .increment(1);
                        outcome("dead")
                    }
                    RetryOutcome::NotOwned => outcome("retry_not_owned"),
                }
            }
        }
        Ok(())
    }

    /// The checks a message must pass before it may be claimed; `Some(reason)` refuses it.
    async fn internal_check(&self, job: &Job) -> Result<Option<String>, StoreError> {
        if self.settings.blocked_recipients.is_empty() {
            return Ok(None);
        }
        let Some(message_id) = job.message_id else {
            return Ok(None);
        };
        let recipient = recipient_of(&self.pool, message_id).await?;
        Ok(recipient
            .filter(|r| self.settings.blocked_recipients.contains(r))
            .map(|r| format!("recipient {r} is blocked")))
    }

    fn backoff(&self, attempt: i32) -> Duration {
        let doublings = attempt.saturating_sub(1).clamp(0, 16) as u32;
        self.settings
            .retry_base
            .saturating_mul(1 << doublings)
            .min(self.settings.retry_max)
    }
}

fn outcome(label: &'static str) {
    ::metrics::counter!(m::JOBS, "job_type" => "send", "outcome" => label).increment(1);
}

/// Retries a write that must not be lost after a provider call (the call cannot be undone)
/// through short database outages: up to about 30 seconds, or until cancelled.
async fn with_retries<T, F, Fut>(cancel: &CancellationToken, mut write: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut delay = Duration::from_millis(100);
    let mut waited = Duration::ZERO;
    loop {
        match write().await {
            Ok(value) => return Ok(value),
            Err(err) if waited >= Duration::from_secs(30) || cancel.is_cancelled() => {
                return Err(err)
            }
            Err(err) => {
                tracing::warn!(error = %err, "write after the provider call failed; retrying");
                tokio::time::sleep(delay).await;
                waited += delay;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    }
}
