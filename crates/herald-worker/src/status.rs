//! The status handler: applies a provider's delivery receipt to its message (rules R5, R6,
//! R7). The receipt is decoded, its status mapped and its timestamp parsed; any of these
//! failing parks the raw receipt with the reason. The message is found by (gateway, provider
//! id). The state is appended and the job marked DONE in one statement, so a crash at any point
//! leaves the job to be handled again, never half-applied.

use std::collections::HashMap;
use std::time::Duration;

use herald_core::job::Job;
use herald_core::receipt::{decode, map_status, parse_timestamp};
use herald_core::JobType;
use herald_core::MessageState;
use herald_queue::Delivery;
use herald_store::outbox::defer_job;
use herald_store::receipts::{
    apply_receipts, load_receipts, mark_silent_unknown, messages_for_receipts, park,
    ReceiptToApply, StoredReceipt,
};
use herald_store::StoreError;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::metrics as m;
use crate::{Handled, Handler};

#[derive(Debug, Clone)]
pub struct StatusSettings {
    /// Operator-configured status aliases, upper case: `ACKD` → `DELIVRD`.
    pub aliases: HashMap<String, String>,
    /// Attempts to find the receipt's message (the send may not be recorded yet) before the
    /// receipt is parked.
    pub max_attempts: u32,
    /// Wait before looking for the message again.
    pub retry_after: Duration,
}

impl Default for StatusSettings {
    fn default() -> Self {
        Self {
            aliases: HashMap::new(),
            max_attempts: 10,
            retry_after: Duration::from_secs(2),
        }
    }
}

pub struct StatusHandler {
    pub pool: PgPool,
    pub settings: StatusSettings,
}

/// What became of one receipt.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Applied {
    State(&'static str),
    Parked(String),
    Deferred,
    StaleCopy,
}

/// A receipt decoded and mapped, waiting for its message to be looked up.
struct Mapped<'a> {
    receipt: &'a StoredReceipt,
    provider_id: String,
    state: MessageState,
    detail: serde_json::Value,
}

/// Where one job of a batch stands.
enum Step<'a> {
    Finished(Applied),
    Mapped(Mapped<'a>),
}

/// The status job in an entry, or `None` (counted and logged) for an entry that is not one:
/// its copy is dropped, its outbox row stays the proof.
fn status_job(delivery: Delivery) -> Option<Job> {
    match delivery.job {
        Ok(job) if job.job_type == JobType::Status => Some(job),
        Ok(job) => {
            outcome("wrong_job_type");
            tracing::error!(entry = %delivery.entry_id, job_type = %job.job_type, outbox_id = job.outbox_id,
                "a non-status job is on the status stream; dropping this copy (its outbox row stays the proof)");
            None
        }
        Err(raw) => {
            ::metrics::counter!(m::MALFORMED, "job_type" => "status").increment(1);
            tracing::error!(entry = %delivery.entry_id, raw = %raw,
                "stream entry is not a valid job; dropping this copy (its outbox row stays the proof)");
            None
        }
    }
}

/// Counts one receipt's end; every end is recorded in PostgreSQL, so the entry is done.
fn counted(job: &Job, applied: Applied) -> Handled {
    match applied {
        Applied::State(state) => {
            outcome("applied");
            ::metrics::counter!(m::RECEIPT_STATES, "state" => state).increment(1);
        }
        Applied::Parked(reason) => {
            outcome("parked");
            ::metrics::counter!(m::PARKED, "job_type" => "status").increment(1);
            tracing::warn!(outbox_id = job.outbox_id, %reason, "receipt parked with its raw body");
        }
        Applied::Deferred => outcome("deferred"),
        Applied::StaleCopy => outcome("stale_copy"),
    }
    Handled::Done
}

impl Handler for StatusHandler {
    async fn handle(&self, delivery: Delivery, cancel: CancellationToken) -> Handled {
        self.handle_batch(vec![delivery], cancel)
            .await
            .pop()
            .map(|(_, handled)| handled)
            .unwrap_or(Handled::Keep)
    }

    /// A batch of receipts: loaded in one query, decoded and mapped, their messages found in
    /// one query, and applied (states appended, jobs DONE) in one statement. Parking and
    /// deferring, the rare ends, keep their own statements.
    async fn handle_batch(
        &self,
        deliveries: Vec<Delivery>,
        _cancel: CancellationToken,
    ) -> Vec<(String, Handled)> {
        let (jobs, mut answers) = crate::decode_batch(deliveries, status_job);
        let just_jobs: Vec<&Job> = jobs.iter().map(|(_, job)| job).collect();
        // A batch shares its statements with other writers (the send worker's group commit
        // touches the same messages), so a deadlock or a dropped connection fails the whole
        // batch: try it again at once, a few times, before leaving it to be reclaimed. Jobs
        // already finished by an earlier try come back as stale copies.
        let mut result = self.apply_batch(&just_jobs).await;
        for _ in 0..3 {
            let Err(err) = &result else { break };
            tracing::warn!(error = %err, receipts = jobs.len(), "applying a batch of receipts failed; trying again");
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            result = self.apply_batch(&just_jobs).await;
        }
        match result {
            Ok(ends) => {
                for ((entry_id, job), applied) in jobs.iter().zip(ends) {
                    answers.push((entry_id.clone(), counted(job, applied)));
                }
            }
            Err(err) => {
                outcome("store_error");
                tracing::error!(error = %err, receipts = jobs.len(),
                    "could not record the receipts' outcome; leaving the entries to be reclaimed");
                answers.extend(jobs.into_iter().map(|(entry, _)| (entry, Handled::Keep)));
            }
        }
        answers
    }
}

impl StatusHandler {
    /// The end of every job, in order.
    async fn apply_batch(&self, jobs: &[&Job]) -> Result<Vec<Applied>, StoreError> {
        let ids: Vec<i64> = jobs.iter().filter_map(|job| receipt_id(job)).collect();
        let receipts = load_receipts(&self.pool, &ids).await?;
        let mut steps = Vec::with_capacity(jobs.len());
        for job in jobs {
            steps.push(self.map(job, &receipts).await?);
        }
        let lookups: Vec<_> = steps
            .iter()
            .filter_map(|step| match step {
                Step::Mapped(m) => Some((
                    m.receipt.gateway.clone(),
                    m.provider_id.clone(),
                    m.receipt.received_at,
                )),
                Step::Finished(_) => None,
            })
            .collect();
        let mut found = messages_for_receipts(&self.pool, &lookups)
            .await?
            .into_iter();
        let mut to_apply = Vec::new();
        let mut ends: Vec<Option<Applied>> = Vec::with_capacity(jobs.len());
        for (job, step) in jobs.iter().zip(steps) {
            let mapped = match step {
                Step::Finished(applied) => {
                    ends.push(Some(applied));
                    continue;
                }
                Step::Mapped(mapped) => mapped,
            };
            let Some(message_id) = found.next().flatten() else {
                ends.push(Some(self.unmatched(job, &mapped).await?));
                continue;
            };
            to_apply.push(ReceiptToApply {
                partition: job.partition,
                outbox_id: job.outbox_id,
                message_id,
                state: mapped.state,
                detail: mapped.detail,
            });
            ends.push(None);
        }
        let applied: std::collections::HashSet<(u32, i64)> = apply_receipts(&self.pool, &to_apply)
            .await?
            .into_iter()
            .collect();
        let mut applied_states = to_apply.iter().map(|r| {
            if applied.contains(&(r.partition, r.outbox_id)) {
                Applied::State(r.state.as_str())
            } else {
                Applied::StaleCopy
            }
        });
        Ok(ends
            .into_iter()
            .map(|end| {
                end.or_else(|| applied_states.next())
                    .unwrap_or(Applied::StaleCopy)
            })
            .collect())
    }

    /// Decodes one job's receipt, maps its status and parses its timestamp; anything that
    /// fails is parked with the raw body and the reason.
    async fn map<'a>(
        &self,
        job: &Job,
        receipts: &'a HashMap<i64, StoredReceipt>,
    ) -> Result<Step<'a>, StoreError> {
        let Some(id) = receipt_id(job) else {
            let raw = job.payload.to_string();
            let reason = "status job without a receipt_id".to_owned();
            return self.park(job, None, raw.as_bytes(), reason).await;
        };
        let Some(receipt) = receipts.get(&id) else {
            let reason = format!("receipt {id} does not exist");
            return self
                .park(job, None, job.payload.to_string().as_bytes(), reason)
                .await;
        };
        let decoded = match decode(&receipt.raw) {
            Ok(decoded) => decoded,
            Err(err) => {
                return self
                    .park(job, Some(receipt.id), &receipt.raw, err.to_string())
                    .await
            }
        };
        let state = match map_status(&decoded.status, &self.settings.aliases) {
            Ok(state) => state,
            Err(err) => {
                return self
                    .park(job, Some(receipt.id), &receipt.raw, err.to_string())
                    .await
            }
        };
        let provider_time = match parse_timestamp(&decoded.timestamp) {
            Ok(time) => time,
            Err(err) => {
                return self
                    .park(job, Some(receipt.id), &receipt.raw, err.to_string())
                    .await
            }
        };
        let detail = serde_json::json!({
            "gateway": receipt.gateway,
            "provider_id": decoded.provider_id,
            "provider_status": decoded.status,
            "provider_time": provider_time,
            "receipt_id": receipt.id,
        });
        Ok(Step::Mapped(Mapped {
            receipt,
            provider_id: decoded.provider_id,
            state,
            detail,
        }))
    }

    /// Parks a job's input (the job becomes DONE in the same statement).
    async fn park<'a>(
        &self,
        job: &Job,
        receipt_id: Option<i64>,
        raw: &[u8],
        reason: String,
    ) -> Result<Step<'a>, StoreError> {
        let parked = park(
            &self.pool,
            job.partition,
            job.outbox_id,
            JobType::Status,
            receipt_id,
            raw,
            &reason,
        )
        .await?;
        Ok(Step::Finished(match parked {
            Some(_) => Applied::Parked(reason),
            None => Applied::StaleCopy,
        }))
    }

    /// A receipt whose message is not recorded (yet): the send may not be recorded yet (the
    /// receipt outran the worker's ledger write), so it waits and tries again, and is parked
    /// after `max_attempts`.
    async fn unmatched(&self, job: &Job, mapped: &Mapped<'_>) -> Result<Applied, StoreError> {
        let reason = format!(
            "no message was sent through gateway {:?} with provider id {:?}",
            mapped.receipt.gateway, mapped.provider_id
        );
        if job.attempt >= self.settings.max_attempts as i32 {
            let reason = format!("{reason} (after {} attempts)", job.attempt);
            let step = self
                .park(job, Some(mapped.receipt.id), &mapped.receipt.raw, reason)
                .await?;
            return Ok(match step {
                Step::Finished(applied) => applied,
                Step::Mapped(_) => Applied::StaleCopy,
            });
        }
        Ok(
            if defer_job(
                &self.pool,
                job.partition,
                job.outbox_id,
                &reason,
                self.settings.retry_after,
            )
            .await?
            {
                Applied::Deferred
            } else {
                Applied::StaleCopy
            },
        )
    }
}

fn receipt_id(job: &Job) -> Option<i64> {
    job.payload.get("receipt_id").and_then(|v| v.as_i64())
}

fn outcome(label: &'static str) {
    ::metrics::counter!(m::JOBS, "job_type" => "status", "outcome" => label).increment(1);
}

/// Rule R7: every `interval`, messages accepted longer than `window` ago without a final
/// receipt become UNKNOWN (counted on their own), until `cancel`.
pub async fn reconcile_silent(
    pool: PgPool,
    window: Duration,
    interval: Duration,
    cancel: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        loop {
            match mark_silent_unknown(&pool, window, 1000).await {
                Ok(0) => break,
                Ok(count) => {
                    ::metrics::counter!(m::UNKNOWN).increment(count);
                    tracing::warn!(count, "no final receipt within the window: marked UNKNOWN");
                }
                Err(err) => {
                    tracing::warn!(error = %err, "reconciliation failed; retrying next interval");
                    break;
                }
            }
        }
    }
}
