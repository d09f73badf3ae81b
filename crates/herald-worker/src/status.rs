//! The status handler: applies a provider's delivery receipt to its message (rules R5, R6,
//! R7). The receipt is decoded, its status mapped and its timestamp parsed; any of these
//! failing parks the raw receipt with the reason. The message is found by (gateway, provider
//! id) and the provider's time: the effect whose first attempt started last before the
//! receipt was written. A receipt whose send is not recorded yet is held, uncharged, until it
//! is (then queued again), or parked after the hold window. A job carries one receipt or a
//! batch of them; every receipt's end is written and the job marked DONE in one statement, so
//! a crash at any point leaves the job to be handled again, never half-applied.
//!
//! Longer than 400 lines: the batch apply, the hold release loop and the reconciliation loop of
//! the status job type; the statements are in `herald-store/src/receipts`.

use std::collections::HashMap;
use std::time::Duration;

use herald_core::job::Job;
use herald_core::receipt::{decode, map_status, parse_timestamp};
use herald_core::JobType;
use herald_core::MessageState;
use herald_store::receipts::{
    count_held, finish_status_jobs, ledger_committed_up_to, load_receipts, mark_silent_unknown,
    messages_for_receipts, park_expired_held, reconcile_ledger, release_held_receipts,
    settled_sends, ReceiptLookup, ReceiptToApply, ReceiptToHold, ReceiptToPark, SettledCheck,
    StatusOutcomes, StoredReceipt,
};
use herald_store::wakeups::Wakeups;
use herald_store::StoreError;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::metrics as m;
use crate::{BatchAnswers, BatchJobs, Handled, Handler};

#[derive(Debug, Clone, Default)]
pub struct StatusSettings {
    /// Operator-configured status aliases, upper case: `ACKD` → `DELIVRD`.
    pub aliases: HashMap<String, String>,
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
    Held,
    StaleCopy,
}

/// A receipt decoded and mapped, waiting for its message to be looked up.
struct Mapped<'a> {
    receipt: &'a StoredReceipt,
    provider_id: String,
    /// The latest moment the provider can have written the receipt, by its own clock: the
    /// time it states plus that timestamp's resolution.
    written_by: chrono::DateTime<chrono::Utc>,
    /// The time the provider states, to tell a copy of a final receipt from a receipt for a
    /// newer send that reused the provider id.
    provider_time: chrono::DateTime<chrono::Utc>,
    state: MessageState,
    detail: serde_json::Value,
}

/// Where one receipt of a job stands before the batch's lookups.
enum Step<'a> {
    /// Cannot be applied: parked with its raw input and the reason.
    Park {
        receipt_id: Option<i64>,
        raw: Vec<u8>,
        reason: String,
    },
    Mapped(Mapped<'a>),
}

/// Counts one receipt's end (every end is recorded in PostgreSQL).
fn counted(job: &Job, applied: Applied) {
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
        Applied::Held => outcome("held"),
        Applied::StaleCopy => outcome("stale_copy"),
    }
}

impl Handler for StatusHandler {
    type Kind = JobType;
    const JOB_TYPE: JobType = JobType::Status;

    /// A batch of receipts: loaded in one query, decoded and mapped, their messages found in
    /// one query, and applied (states appended, jobs DONE) in one statement. Parking and
    /// holding, the rare ends, keep their own statements.
    async fn handle(&self, jobs: BatchJobs, cancel: CancellationToken) -> BatchAnswers {
        let mut answers = Vec::with_capacity(jobs.len());
        let just_jobs: Vec<&Job> = jobs.iter().map(|(_, job)| job).collect();
        // A batch shares its statements with other writers (the send worker's group commit
        // touches the same messages), so a deadlock or a dropped connection fails the whole
        // batch: try it again at once, a few times, before leaving it to be reclaimed. Jobs
        // already finished by an earlier try come back as stale copies.
        let mut result = self.apply_batch(&just_jobs).await;
        for _ in 0..3 {
            let Err(err) = &result else { break };
            tracing::warn!(error = %err, jobs = jobs.len(), "applying a batch of receipts failed; trying again");
            tokio::select! {
                // Shutting down: the entries stay unacknowledged and are reclaimed.
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
            }
            result = self.apply_batch(&just_jobs).await;
        }
        match result {
            Ok(ends) => {
                for ((entry_id, job), receipts) in jobs.iter().zip(ends) {
                    for applied in receipts {
                        counted(job, applied);
                    }
                    answers.push((entry_id.clone(), Handled::Done));
                }
            }
            Err(err) => {
                outcome("store_error");
                tracing::error!(error = %err, jobs = jobs.len(),
                    "could not record the receipts' outcome; leaving the entries to be reclaimed");
                answers.extend(jobs.into_iter().map(|(entry, _)| (entry, Handled::Keep)));
            }
        }
        answers
    }
}

impl StatusHandler {
    /// The end of every receipt of every job, in order: the batch's receipts loaded in one
    /// query, their messages found in one query, and every job finished (its receipts parked,
    /// held or applied, the job DONE) in one statement.
    async fn apply_batch(&self, jobs: &[&Job]) -> Result<Vec<Vec<Applied>>, StoreError> {
        // Two copies of one job in a batch (a re-drive published it again while the first
        // waited in the stream): the later ones are stale copies, so nothing is parked twice.
        let mut seen = std::collections::HashSet::new();
        let per_job_ids: Vec<Option<Vec<i64>>> = jobs
            .iter()
            .map(|job| {
                seen.insert((job.partition, job.outbox_id))
                    .then(|| receipt_ids(job))
            })
            .collect();
        let ids: Vec<i64> = per_job_ids.iter().flatten().flatten().copied().collect();
        let receipts = load_receipts(&self.pool, &ids).await?;
        // (job index, step) for every receipt of every job, in order.
        let mut steps: Vec<(usize, Step)> = Vec::with_capacity(ids.len().max(jobs.len()));
        for (at, (job, ids)) in jobs.iter().zip(per_job_ids.iter()).enumerate() {
            let Some(ids) = ids else { continue };
            if ids.is_empty() {
                steps.push((
                    at,
                    Step::Park {
                        receipt_id: None,
                        raw: job.payload.to_string().into_bytes(),
                        reason: "status job without a receipt_id or receipt_ids".to_owned(),
                    },
                ));
            }
            for id in ids {
                steps.push((at, self.map(*id, &receipts)));
            }
        }
        let mapped: Vec<(usize, &Mapped)> = steps
            .iter()
            .filter_map(|(at, step)| match step {
                Step::Mapped(m) => Some((*at, m)),
                Step::Park { .. } => None,
            })
            .collect();
        let lookups: Vec<ReceiptLookup> = mapped
            .iter()
            .map(|(_, m)| ReceiptLookup {
                gateway: m.receipt.gateway.clone(),
                provider_id: m.provider_id.clone(),
                written_from: m.provider_time,
                written_by: m.written_by,
                is_final: herald_core::receipt::is_final(m.state),
            })
            .collect();
        let matches = messages_for_receipts(&self.pool, &lookups).await?;
        // One line per batch, not per receipt: a gateway that reuses ids this fast does it
        // for a good share of its receipts (31,048 in a 500,000-message drain).
        let ambiguous: Vec<_> = mapped
            .iter()
            .zip(&matches)
            .filter(|(_, found)| found.ambiguous)
            .collect();
        if let Some(((_, r), _)) = ambiguous.first() {
            ::metrics::counter!(m::AMBIGUOUS).increment(ambiguous.len() as u64);
            tracing::warn!(receipts = ambiguous.len(), gateway = %r.receipt.gateway,
                provider_id = %r.provider_id, receipt_id = r.receipt.id,
                "a gateway reused provider ids within the receipt timestamps' resolution: each of these receipts went to the oldest such send without a final receipt, if any (one named here)");
        }
        let found: Vec<Option<uuid::Uuid>> = matches.iter().map(|f| f.message_id).collect();
        // A receipt whose matching send is already settled by another final receipt is most
        // likely for a newer send that reused the provider id and is not recorded yet: it is
        // held, unless it already waited that way for the whole window (`as_duplicate`).
        let checks: Vec<(usize, SettledCheck)> = mapped
            .iter()
            .zip(&found)
            .enumerate()
            .filter_map(|(i, ((at, m), message))| {
                let message = (*message)?;
                (!as_duplicate(jobs[*at])).then(|| {
                    let check = SettledCheck {
                        message_id: message,
                        provider_time: m.provider_time,
                        written_by: m.written_by,
                    };
                    (i, check)
                })
            })
            .collect();
        let settled = settled_sends(
            &self.pool,
            &checks.iter().map(|(_, c)| c.clone()).collect::<Vec<_>>(),
        )
        .await?;
        let mut superseding = vec![None; found.len()];
        for ((i, _), submitted) in checks.iter().zip(settled) {
            superseding[*i] = submitted;
        }
        let mut superseding = superseding.into_iter();
        let mut found = found.into_iter();
        let mut outcomes = StatusOutcomes::default();
        let mut ends: Vec<(usize, Applied)> = Vec::with_capacity(steps.len());
        for (at, step) in steps {
            let job = jobs[at];
            let mapped = match step {
                Step::Park {
                    receipt_id,
                    raw,
                    reason,
                } => {
                    outcomes.parks.push(ReceiptToPark {
                        partition: job.partition,
                        outbox_id: job.outbox_id,
                        receipt_id,
                        raw,
                        reason: reason.clone(),
                    });
                    ends.push((at, Applied::Parked(reason)));
                    continue;
                }
                Step::Mapped(mapped) => mapped,
            };
            let settled = superseding.next().flatten();
            match found.next().flatten() {
                Some(message_id) if settled.is_none() => {
                    ends.push((at, Applied::State(mapped.state.as_str())));
                    outcomes.applies.push(ReceiptToApply {
                        partition: job.partition,
                        outbox_id: job.outbox_id,
                        message_id,
                        state: mapped.state,
                        detail: mapped.detail,
                    });
                }
                // The send is not recorded yet (or only an older, settled send with this id
                // is): hold the receipt until it is.
                _ => {
                    outcomes.holds.push(ReceiptToHold {
                        partition: job.partition,
                        outbox_id: job.outbox_id,
                        receipt_id: mapped.receipt.id,
                        gateway: mapped.receipt.gateway.clone(),
                        provider_id: mapped.provider_id.clone(),
                        provider_time: mapped.written_by,
                        superseding: settled,
                    });
                    ends.push((at, Applied::Held));
                }
            }
        }
        let keys: Vec<(u32, i64)> = jobs.iter().map(|j| (j.partition, j.outbox_id)).collect();
        let finished: std::collections::HashSet<(u32, i64)> =
            finish_status_jobs(&self.pool, &keys, &outcomes)
                .await?
                .into_iter()
                .collect();
        if !outcomes.holds.is_empty() {
            tracing::info!(
                held = outcomes.holds.len(),
                "receipts whose send is not recorded yet are held until it is"
            );
        }
        let mut per_job: Vec<Vec<Applied>> = per_job_ids
            .iter()
            .map(|ids| match ids {
                Some(_) => Vec::new(),
                None => vec![Applied::StaleCopy],
            })
            .collect();
        for (at, end) in ends {
            let job = jobs[at];
            per_job[at].push(if finished.contains(&(job.partition, job.outbox_id)) {
                end
            } else {
                Applied::StaleCopy
            });
        }
        Ok(per_job)
    }

    /// Decodes one receipt, maps its status and parses its timestamp; anything that fails is
    /// to be parked with the raw body and the reason.
    fn map<'a>(&self, id: i64, receipts: &'a HashMap<i64, StoredReceipt>) -> Step<'a> {
        let Some(receipt) = receipts.get(&id) else {
            return Step::Park {
                receipt_id: None,
                raw: serde_json::json!({ "receipt_id": id })
                    .to_string()
                    .into_bytes(),
                reason: format!("receipt {id} does not exist"),
            };
        };
        let park = |reason: String| Step::Park {
            receipt_id: Some(receipt.id),
            raw: receipt.raw.clone(),
            reason,
        };
        let decoded = match decode(&receipt.raw) {
            Ok(decoded) => decoded,
            Err(err) => return park(err.to_string()),
        };
        let state = match map_status(&decoded.status, &self.settings.aliases) {
            Ok(state) => state,
            Err(err) => return park(err.to_string()),
        };
        let provider_time = match parse_timestamp(&decoded.timestamp) {
            Ok(time) => time,
            Err(err) => return park(err.to_string()),
        };
        let detail = serde_json::json!({
            "gateway": receipt.gateway,
            "provider_id": decoded.provider_id,
            "provider_status": decoded.status,
            "provider_time": provider_time,
            "receipt_id": receipt.id,
        });
        let resolution = herald_core::receipt::timestamp_resolution(&decoded.timestamp);
        let written_by = provider_time
            + chrono::Duration::from_std(resolution).unwrap_or_else(|_| chrono::Duration::zero());
        Step::Mapped(Mapped {
            receipt,
            provider_id: decoded.provider_id,
            written_by,
            provider_time,
            state,
            detail,
        })
    }
}

/// The receipts a status job names: `receipt_ids` (the API stores a batch of receipts as one
/// job), or one `receipt_id` (a released or replayed receipt, and jobs queued by earlier
/// versions). Empty when the payload names none, or names one that is not an id: such a
/// job is parked with its payload, never dropped.
fn receipt_ids(job: &Job) -> Vec<i64> {
    if let Some(ids) = job.payload.get("receipt_ids").and_then(|v| v.as_array()) {
        let valid: Vec<i64> = ids.iter().filter_map(|v| v.as_i64()).collect();
        return if valid.len() == ids.len() {
            valid
        } else {
            Vec::new()
        };
    }
    receipt_id(job).into_iter().collect()
}

fn receipt_id(job: &Job) -> Option<i64> {
    job.payload.get("receipt_id").and_then(|v| v.as_i64())
}

/// A held receipt released after waiting out [`herald_store::receipts::SUPERSEDED_HOLD`]
/// without a newer send: applied to the settled send it matches (a copy or a correction).
fn as_duplicate(job: &Job) -> bool {
    job.payload.get("as_duplicate").and_then(|v| v.as_bool()) == Some(true)
}

fn outcome(label: &'static str) {
    ::metrics::counter!(m::JOBS, "job_type" => "status", "outcome" => label).increment(1);
}

/// Rule R7: every `interval`, messages accepted longer than `window` ago without a final
/// receipt become UNKNOWN (counted on their own), until `cancel`. The ledger is read from
/// where the last pass stopped, up to the moment every ledger row before it is committed less
/// the window; messages of an earlier release still in `awaiting_receipt` are reconciled too.
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
        if let Err(err) = reconcile_once(&pool, window).await {
            tracing::warn!(error = %err, "reconciliation failed; retrying next interval");
        }
    }
}

/// One reconciliation pass: see [`reconcile_silent`].
pub async fn reconcile_once(pool: &PgPool, window: Duration) -> Result<(), StoreError> {
    let count = |marked: u64| {
        if marked > 0 {
            ::metrics::counter!(m::UNKNOWN).increment(marked);
            tracing::warn!(
                count = marked,
                "no final receipt within the window: marked UNKNOWN"
            );
        }
    };
    loop {
        let (marked, more) = mark_silent_unknown(pool, window, 1000).await?;
        count(marked);
        if !more {
            break;
        }
    }
    let Some(committed) = ledger_committed_up_to(pool, Duration::from_secs(5)).await? else {
        tracing::info!("ledger writes still open after 5 s; reconciling the ledger next pass");
        return Ok(());
    };
    let cutoff = committed - chrono::Duration::from_std(window).unwrap_or(chrono::Duration::MAX);
    loop {
        let (marked, more) = reconcile_ledger(pool, cutoff, 1000).await?;
        count(marked);
        if !more {
            return Ok(());
        }
    }
}

/// Held receipts (sends recorded late): every `interval`, those a ledger row now matches are
/// queued again and their partitions' pollers woken; every tenth interval, those held longer
/// than `hold_for` are parked with their raw bodies and the held count is exported as a gauge.
/// Until `cancel`.
pub async fn release_held(
    pool: PgPool,
    hold_for: Duration,
    interval: Duration,
    cancel: CancellationToken,
) {
    let wakeups = Wakeups::spawn(pool.clone(), Duration::from_millis(5));
    for tick in 0u64.. {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        loop {
            match release_held_receipts(&pool, 1000).await {
                Ok(partitions) if partitions.is_empty() => break,
                Ok(partitions) => {
                    ::metrics::counter!(m::RELEASED).increment(partitions.len() as u64);
                    tracing::info!(
                        receipts = partitions.len(),
                        "held receipts queued again: their sends are recorded"
                    );
                    wakeups.wake(partitions);
                }
                Err(err) => {
                    tracing::warn!(error = %err, "releasing held receipts failed; retrying next interval");
                    break;
                }
            }
        }
        // Expiry and the gauge are not urgent: every tenth pass.
        if tick % 10 != 0 {
            continue;
        }
        match park_expired_held(&pool, hold_for, 1000).await {
            Ok(0) => {}
            Ok(count) => {
                ::metrics::counter!(m::PARKED, "job_type" => "status").increment(count);
                tracing::warn!(count, hold_for = ?hold_for,
                    "receipts held past the hold window without a recorded send: parked with their raw bodies");
            }
            Err(err) => tracing::warn!(error = %err, "parking expired held receipts failed"),
        }
        match count_held(&pool).await {
            Ok(held) => ::metrics::gauge!(m::HELD).set(held as f64),
            // The gauge keeps its last value until a count works; the log says it is stale.
            Err(err) => {
                tracing::warn!(error = %err, "counting held receipts failed; herald_receipts_held is stale")
            }
        }
    }
}
