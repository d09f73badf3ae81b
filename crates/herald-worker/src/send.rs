//! The send handler (rules R4, R5): confirm ownership (outbox DONE + CLAIMED + an attempt
//! charged + a lease), call the provider with the message's idempotency key, then record
//! ACCEPTED with the ledger row — or a retry, or a failure. No transaction is open during the
//! provider call. The claim's lease is renewed in the background until the outcome is written;
//! a worker that dies or freezes stops renewing, and only then is its claim re-driven.
//!
//! Longer than 400 lines with its unit tests (the code is under 480): the send path from confirm
//! to outcome is kept in one file because every branch of it must keep rules R4 and R5.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald_core::job::Job;
use herald_core::{send_effect_key, JobType};
use herald_store::effects::{
    confirm_ownership_batch, recipients_of, record_failed, reject_before_claim, renew_leases,
    schedule_retry, AcceptedEffect, AttemptEnd, OwnedSend, ProviderReceipt, RetryOf, RetryOutcome,
};
use herald_store::group::{GroupCommit, GroupSettings};
use herald_store::StoreError;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::metrics as m;
use crate::provider::{ProviderClient, SubmitOutcome};
use crate::recorder::AcceptedRecorder;
use crate::{BatchAnswers, BatchJobs, Handled, Handler};

#[derive(Debug, Clone)]
pub struct SendSettings {
    /// Provider attempts a send may use. Past them, a send whose provider surely did nothing
    /// becomes DEAD; one whose last outcome is unknown is settled by asking the provider by key.
    pub max_attempts: u32,
    /// Back-off after the first failed attempt; doubles per attempt.
    pub retry_base: Duration,
    /// The longest back-off.
    pub retry_max: Duration,
    /// Most ACCEPTED sends one group-commit statement writes (1: one per transaction).
    pub max_group: usize,
    /// This worker's name in CLAIMED events.
    pub worker: String,
    /// Recipients an internal check refuses: their messages end FAILED before any claim.
    pub blocked_recipients: std::collections::HashSet<String>,
    /// How long a claim stays this worker's without a renewal; renewed every third of it
    /// while the provider call and the outcome's write run.
    pub claim_lease: Duration,
    /// How long a confirm or ledger write that starts alone waits for others to share its
    /// statement (see `herald_store::group::GroupSettings::linger`).
    pub linger: Duration,
}

/// The shortest claim lease: renewals every second at most.
pub const MIN_CLAIM_LEASE: Duration = Duration::from_secs(3);

impl SendSettings {
    /// Checks the settings that must relate. A claim is renewed while its call and writes run,
    /// so the lease need not outlast the provider timeout; it must leave room for renewals.
    pub fn validate(&self) -> Result<(), String> {
        if self.claim_lease < MIN_CLAIM_LEASE {
            return Err(format!(
                "the claim lease ({:?}) must be at least {:?}: it is renewed every third of it",
                self.claim_lease, MIN_CLAIM_LEASE
            ));
        }
        if self.max_attempts == 0 {
            return Err("max attempts must be at least 1".to_owned());
        }
        Ok(())
    }
}

impl Default for SendSettings {
    /// The settings of `herald worker --job-type send`'s defaults.
    fn default() -> Self {
        crate::config::WorkerConfig::default().send_settings("worker")
    }
}

pub struct SendHandler {
    pool: PgPool,
    provider: ProviderClient,
    settings: SendSettings,
    recorder: AcceptedRecorder,
    confirms: Confirms,
    leases: Leases,
}

/// Group commit of ownership confirmations: every batch read hands its jobs here, and the
/// confirmations waiting are written in one statement (one transaction, one WAL flush)
/// while the previous one runs. Each job's CLAIMED is still committed before its provider
/// call, since a caller is answered only after the commit that holds its job. Under a steady
/// load the reads return a few entries each; confirmed one batch at a time they made many
/// small transactions at once, which waited for the worker's connections.
type Confirms = GroupCommit<(u32, i64), Option<OwnedSend>>;

/// Confirm statements running at once: while one commits, the next group gathers and runs.
const CONFIRM_GROUPS_IN_FLIGHT: usize = 2;

fn spawn_confirms(pool: PgPool, settings: &SendSettings) -> Confirms {
    let worker = settings.worker.clone();
    let lease = settings.claim_lease;
    let group = GroupSettings {
        max_group: settings.max_group,
        parallel: CONFIRM_GROUPS_IN_FLIGHT,
        linger: settings.linger,
    };
    GroupCommit::spawn("confirm", group, move |keys: Arc<Vec<(u32, i64)>>| {
        let pool = pool.clone();
        let worker = worker.clone();
        async move {
            let owned = confirm_ownership_batch(&pool, &keys, &worker, lease).await?;
            let mut owned: HashMap<(u32, i64), OwnedSend> = owned
                .into_iter()
                .map(|o| ((o.partition, o.outbox_id), o.send))
                .collect();
            // Two copies of one job in a group: the first is confirmed, the other is stale.
            Ok(keys.iter().map(|key| owned.remove(key)).collect())
        }
    })
}

/// The leases of this worker's claims whose outcome is not written yet, by message.
#[derive(Clone, Default)]
struct Leases(Arc<Mutex<HashMap<Uuid, Uuid>>>);

/// Holds a claim's lease for renewal until dropped.
struct HeldLease {
    leases: Leases,
    message_id: Uuid,
}

impl Leases {
    fn hold(&self, message_id: Uuid, lease: Uuid) -> HeldLease {
        if let Ok(mut held) = self.0.lock() {
            held.insert(message_id, lease);
        }
        HeldLease {
            leases: self.clone(),
            message_id,
        }
    }

    fn snapshot(&self) -> Vec<(Uuid, Uuid)> {
        self.0
            .lock()
            .map(|held| held.iter().map(|(m, l)| (*m, *l)).collect())
            .unwrap_or_default()
    }

    /// Renews every held lease every third of `lease`, until `cancel`.
    async fn renew(self, pool: PgPool, lease: Duration, cancel: CancellationToken) {
        let every = lease / 3;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            let held = self.snapshot();
            if held.is_empty() {
                continue;
            }
            match renew_leases(&pool, &held, lease).await {
                Ok(renewed) if renewed < held.len() as u64 => {
                    // Written meanwhile (the lease is gone with its in-flight row), or re-driven.
                    tracing::debug!(held = held.len(), renewed, "some claims were not renewed");
                }
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!(error = %err, held = held.len(), "renewing claim leases failed; retrying")
                }
            }
        }
    }
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        if let Ok(mut held) = self.leases.0.lock() {
            held.remove(&self.message_id);
        }
    }
}

/// Longest a write after the provider call is retried through a database outage.
const WRITE_RETRY_FOR: Duration = Duration::from_secs(30);

impl SendHandler {
    /// The handler and its group-commit writer (which stops retrying writes on `cancel`).
    pub fn new(
        pool: PgPool,
        provider: ProviderClient,
        settings: SendSettings,
        cancel: CancellationToken,
    ) -> Self {
        let recorder = AcceptedRecorder::spawn(
            pool.clone(),
            GroupSettings {
                max_group: settings.max_group,
                parallel: 1,
                linger: settings.linger,
            },
            WRITE_RETRY_FOR,
            cancel.clone(),
        );
        let leases = Leases::default();
        tokio::spawn(
            leases
                .clone()
                .renew(pool.clone(), settings.claim_lease, cancel),
        );
        let confirms = spawn_confirms(pool.clone(), &settings);
        Self {
            pool,
            provider,
            settings,
            recorder,
            confirms,
            leases,
        }
    }
}

fn handled(job: &Job, result: Result<(), StoreError>) -> Handled {
    match result {
        Ok(()) => Handled::Done,
        Err(err) => {
            outcome("store_error");
            tracing::error!(outbox_id = job.outbox_id, error = %err,
                "could not record the outcome; leaving the entry to be reclaimed");
            Handled::Keep
        }
    }
}

impl Handler for SendHandler {
    type Kind = JobType;
    const JOB_TYPE: JobType = JobType::Send;

    /// The batched path: internal checks for the whole batch, ownership of the whole batch
    /// confirmed through the confirm group commit (in one statement, or two when the group
    /// was full; every CLAIMED committed before any call), the provider called
    /// for every job at once, and each ACCEPTED group-committed after its own call.
    async fn handle(&self, jobs: BatchJobs, cancel: CancellationToken) -> BatchAnswers {
        let mut answers = Vec::with_capacity(jobs.len());
        let jobs = match self.refuse_blocked(jobs).await {
            Ok(jobs) => jobs,
            Err((err, jobs)) => {
                tracing::error!(error = %err, "internal checks failed; leaving the batch to be reclaimed");
                outcome("store_error");
                answers.extend(jobs.into_iter().map(|(entry, _)| (entry, Handled::Keep)));
                return answers;
            }
        };
        let confirmed = futures::future::join_all(
            jobs.iter()
                .map(|(_, j)| self.confirms.write((j.partition, j.outbox_id))),
        )
        .await;
        let mut calls = Vec::with_capacity(jobs.len());
        let mut failed = 0;
        for ((entry_id, job), confirmed) in jobs.into_iter().zip(confirmed) {
            match confirmed {
                Err(err) => {
                    outcome("store_error");
                    if failed == 0 {
                        tracing::error!(error = %err, "could not confirm ownership; leaving the entry to be reclaimed");
                    }
                    failed += 1;
                    answers.push((entry_id, Handled::Keep));
                }
                // Another copy of this job was confirmed, or the row was re-driven.
                Ok(None) => {
                    outcome("stale_copy");
                    answers.push((entry_id, Handled::Done));
                }
                Ok(Some(send)) => {
                    ::metrics::counter!(m::CONFIRMED, "job_type" => "send").increment(1);
                    if send.already_accepted {
                        outcome("already_accepted");
                        answers.push((entry_id, Handled::Done));
                        continue;
                    }
                    let cancel = cancel.clone();
                    calls.push(async move {
                        let result = self.call_and_record(&job, &send, &cancel).await;
                        (entry_id, handled(&job, result))
                    });
                }
            }
        }
        answers.extend(futures::future::join_all(calls).await);
        answers
    }
}

impl SendHandler {
    /// Calls the provider for a send this worker owns (CLAIMED is committed, the attempt
    /// charged) and records the outcome: ACCEPTED with its ledger row through the group
    /// commit, FAILED, or a retry. An attempt past `max_attempts` (the last one's outcome was
    /// unknown) submits nothing: it asks the provider what became of the key. The claim's
    /// lease is renewed until the outcome is written.
    #[tracing::instrument(skip_all, fields(outbox_id = job.outbox_id, partition = job.partition, message_id = %owned.message_id, attempt = owned.attempt))]
    async fn call_and_record(
        &self,
        job: &Job,
        owned: &OwnedSend,
        cancel: &CancellationToken,
    ) -> Result<(), StoreError> {
        let Some(lease) = owned.lease else {
            outcome("already_accepted");
            return Ok(());
        };
        let _renewed = self.leases.hold(owned.message_id, lease);
        let key = send_effect_key(owned.message_id);
        let settling = owned.attempt > self.settings.max_attempts as i32;
        let answer = if settling {
            self.provider.lookup(&key).await
        } else {
            self.provider
                .submit(&key, &owned.recipient, &owned.body)
                .await
        };
        let (reason, end) = match answer {
            SubmitOutcome::Accepted {
                gateway,
                provider_id,
            } => {
                let effect = AcceptedEffect {
                    message_id: owned.message_id,
                    idempotency_key: key,
                    receipt: ProviderReceipt {
                        gateway,
                        provider_id,
                    },
                };
                let inserted = self.recorder.record(effect).await?;
                outcome(if inserted {
                    "accepted"
                } else {
                    "accepted_again"
                });
                return Ok(());
            }
            SubmitOutcome::Rejected { reason } => {
                tracing::warn!(%reason, "provider rejected the message for good");
                with_retries(cancel, || {
                    record_failed(&self.pool, owned.message_id, &reason)
                })
                .await?;
                outcome("rejected");
                return Ok(());
            }
            SubmitOutcome::Transient { reason } => (reason, AttemptEnd::NoEffect),
            SubmitOutcome::Unknown { reason } => (reason, AttemptEnd::Unknown),
        };
        let backoff = self.backoff(owned.attempt);
        let retry = RetryOf {
            partition: job.partition,
            outbox_id: job.outbox_id,
            lease,
            reason: &reason,
            end,
        };
        let retried = with_retries(cancel, || {
            schedule_retry(&self.pool, &retry, backoff, self.settings.max_attempts)
        })
        .await?;
        match retried {
            RetryOutcome::Scheduled if end == AttemptEnd::Unknown => {
                if owned.attempt == self.settings.max_attempts as i32 {
                    tracing::warn!(%reason, attempt = owned.attempt,
                        "last attempt's outcome is unknown; the provider will be asked by key");
                    ::metrics::counter!(m::SETTLING).increment(1);
                }
                outcome("retry_unknown")
            }
            RetryOutcome::Scheduled => outcome("retry"),
            RetryOutcome::Dead => {
                tracing::error!(%reason, attempt = owned.attempt, "send is DEAD: its attempts are used up and the provider has no effect");
                let stage = if settling { "settled" } else { "retry" };
                ::metrics::counter!(herald_store::metrics::DEAD, "stage" => stage).increment(1);
                outcome("dead")
            }
            RetryOutcome::NotOwned => outcome("retry_not_owned"),
        }
        Ok(())
    }

    /// Refuses, before any claim, the jobs whose recipient an internal check blocks (one
    /// query for the batch); answers the others. On a database error, every job comes back.
    #[allow(clippy::type_complexity)]
    async fn refuse_blocked(
        &self,
        jobs: Vec<(String, Job)>,
    ) -> Result<Vec<(String, Job)>, (StoreError, Vec<(String, Job)>)> {
        if self.settings.blocked_recipients.is_empty() {
            return Ok(jobs);
        }
        let ids: Vec<uuid::Uuid> = jobs.iter().filter_map(|(_, j)| j.message_id).collect();
        let recipients = match recipients_of(&self.pool, &ids).await {
            Ok(recipients) => recipients,
            Err(err) => return Err((err, jobs)),
        };
        let mut allowed = Vec::with_capacity(jobs.len());
        for (entry_id, job) in jobs {
            let blocked = job
                .message_id
                .and_then(|id| recipients.get(&id))
                .filter(|r| self.settings.blocked_recipients.contains(*r));
            let Some(recipient) = blocked else {
                allowed.push((entry_id, job));
                continue;
            };
            let reason = format!("recipient {recipient} is blocked");
            match reject_before_claim(&self.pool, job.partition, job.outbox_id, &reason).await {
                Ok(rejected) => outcome(if rejected {
                    "rejected_internal"
                } else {
                    "stale_copy"
                }),
                Err(err) => {
                    allowed.push((entry_id, job));
                    return Err((err, allowed));
                }
            }
        }
        Ok(allowed)
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
async fn with_retries<T, F, Fut>(cancel: &CancellationToken, write: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    with_retries_for(cancel, WRITE_RETRY_FOR, write).await
}

/// [`with_retries`] for up to `retry_for`.
pub(crate) async fn with_retries_for<T, F, Fut>(
    cancel: &CancellationToken,
    retry_for: Duration,
    mut write: F,
) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut delay = Duration::from_millis(100);
    let mut waited = Duration::ZERO;
    loop {
        match write().await {
            Ok(value) => return Ok(value),
            Err(err) if waited >= retry_for || cancel.is_cancelled() => return Err(err),
            Err(err) => {
                tracing::warn!(error = %err, "write after the provider call failed; retrying");
                tokio::select! {
                    // Shutting down: the entry stays unacknowledged and is reclaimed.
                    _ = cancel.cancelled() => return Err(err),
                    _ = tokio::time::sleep(delay) => {}
                }
                waited += delay;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Paused time: the clock moves only while every task waits, so the instants are exact.
    #[tokio::test(start_paused = true)]
    async fn a_retrying_write_gives_up_when_cancelled_not_after_its_pause() {
        let cancel = CancellationToken::new();
        let started = tokio::time::Instant::now();
        let stop = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1000)).await;
            stop.cancel();
        });
        let mut tries = 0;
        let result: Result<(), StoreError> =
            with_retries_for(&cancel, Duration::from_secs(60), || {
                tries += 1;
                async { Err(StoreError::GroupWrite("database down".to_owned())) }
            })
            .await;
        assert!(result.is_err());
        // Pauses of 100, 200 and 400 ms, then the cancel arrives 300 ms into the 800 ms one.
        assert_eq!(tries, 4);
        assert_eq!(started.elapsed(), Duration::from_millis(1000));
    }
}
