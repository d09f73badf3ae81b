//! The worker's statements (rules R4, R5): confirm ownership before the provider call, record
//! the provider's answer after it, and schedule a retry or record a failure otherwise. Each is
//! one statement, so each is its own transaction and none spans a network call.
//!
//! Longer than 400 lines: each worker statement is written out beside its function, and most of
//! the length is SQL and the comments on why each statement is shaped as it is (docs/DESIGN.md,
//! "Keyed statements").

use std::time::Duration;

use serde_json::Value;
use sqlx::types::Json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::metrics::{measured, Operation};
use crate::StoreError;

/// A send the worker now owns: the message to submit.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnedSend {
    pub message_id: Uuid,
    pub recipient: String,
    pub body: Value,
    /// The ledger already holds this message's effect (an earlier attempt got through): the
    /// worker must not call the provider again.
    pub already_accepted: bool,
    /// Which attempt this is: confirms charged to the row, this one included. Past the
    /// worker's `max_attempts`, the attempt only asks the provider what became of the key.
    pub attempt: i32,
    /// The claim's lease token (`None` when already accepted: nothing is in flight). Every
    /// later write of this attempt presents it, and the worker renews it
    /// ([`renew_leases`]) until its outcome is written.
    pub lease: Option<Uuid>,
}

/// Marks the outbox row DONE and appends CLAIMED to its message, in one statement. Returns
/// `None` when the row is not PROCESSING/PUBLISHED any more (another worker finished it, or a
/// re-drive returned it to PENDING and a newer copy of the job is on its way): the caller
/// drops its copy. No CLAIMED is appended for a message that is already ACCEPTED. The batch
/// statement ([`confirm_ownership_batch`]) for one job.
pub async fn confirm_ownership(
    pool: &PgPool,
    partition: u32,
    outbox_id: i64,
    worker: &str,
    lease: Duration,
) -> Result<Option<OwnedSend>, StoreError> {
    let owned = confirm_ownership_batch(pool, &[(partition, outbox_id)], worker, lease).await?;
    Ok(owned.into_iter().next().map(|o| o.send))
}

/// A send the worker now owns, from a batch: which outbox row it came from, and the message.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnedFromBatch {
    pub partition: u32,
    pub outbox_id: i64,
    pub send: OwnedSend,
}

/// [`confirm_ownership`] for many jobs in one statement (one transaction): every row still
/// PROCESSING/PUBLISHED becomes DONE and is charged an attempt (this is where attempts are
/// counted: a confirm is followed by a provider call), and its message gets CLAIMED (unless
/// already ACCEPTED) and an `in_flight_sends` row holding a fresh lease token, valid for
/// `lease`. Rows another copy finished are left out of the answer. Rows are locked in
/// (partition, id) order, so two workers confirming overlapping batches queue behind each
/// other instead of deadlocking.
pub async fn confirm_ownership_batch(
    pool: &PgPool,
    jobs: &[(u32, i64)],
    worker: &str,
    lease: Duration,
) -> Result<Vec<OwnedFromBatch>, StoreError> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let mut sorted = jobs.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let partitions: Vec<i32> = sorted.iter().map(|(p, _)| *p as i32).collect();
    let ids: Vec<i64> = sorted.iter().map(|(_, id)| *id).collect();
    #[allow(clippy::type_complexity)]
    let rows: Vec<(i32, i64, Uuid, String, Json<Value>, bool, i32, Option<Uuid>)> = measured(
        Operation::Confirm,
        sqlx::query_as(concat!(
            "WITH input AS (
                 SELECT * FROM UNNEST($1::int[], $2::bigint[]) AS t(partition, id)
             ), ",
            lock_outbox_rows!("input"),
            ", done AS (
                 UPDATE outbox o SET status = 'DONE', attempts = o.attempts + 1
                 ",
            the_locked_rows!(),
            "
                 RETURNING o.partition, o.id, o.message_id, o.attempts
             ), owned AS (
                 -- A count per job, not EXISTS (nor LIMIT 1): a generic plan made while the
                 -- ledger was small hashed the whole ledger for EXISTS at every call, and
                 -- with a LIMIT it read the ledger sequentially until the first match.
                 SELECT done.partition, done.id, done.message_id, done.attempts,
                        a.accepted, gen_random_uuid() AS lease
                 FROM done CROSS JOIN LATERAL (
                     SELECT count(*) > 0 AS accepted FROM ledger l
                     WHERE l.message_id = done.message_id) a
             ), claimed AS (
                 INSERT INTO message_events (message_id, state, detail)
                 SELECT message_id, 'CLAIMED',
                        jsonb_build_object('worker', $3::text, 'outbox_id', id,
                                           'attempt', attempts)
                 FROM owned WHERE NOT accepted
             ), in_flight AS (
                 INSERT INTO in_flight_sends (message_id, partition, outbox_id, lease, lease_until)
                 SELECT message_id, partition, id, lease, now() + make_interval(secs => $4)
                 FROM owned WHERE NOT accepted
                 ON CONFLICT (message_id) DO UPDATE
                     SET partition = EXCLUDED.partition, outbox_id = EXCLUDED.outbox_id,
                         claimed_at = now(), lease = EXCLUDED.lease,
                         lease_until = EXCLUDED.lease_until
             )
             SELECT owned.partition, owned.id, m.id, m.recipient, m.body, owned.accepted,
                    owned.attempts, CASE WHEN owned.accepted THEN NULL ELSE owned.lease END
             FROM owned CROSS JOIN LATERAL (
                 SELECT m.id, m.recipient, m.body FROM messages m
                 WHERE m.id = owned.message_id OFFSET 0) m"
        ))
        .bind(&partitions)
        .bind(&ids)
        .bind(worker)
        .bind(lease.as_secs_f64())
        .fetch_all(pool),
    )
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(
                partition,
                outbox_id,
                message_id,
                recipient,
                Json(body),
                already_accepted,
                attempt,
                lease,
            )| {
                OwnedFromBatch {
                    partition: partition as u32,
                    outbox_id,
                    send: OwnedSend {
                        message_id,
                        recipient,
                        body,
                        already_accepted,
                        attempt,
                        lease,
                    },
                }
            },
        )
        .collect())
}

/// One effect to record: the provider took `message_id` under `idempotency_key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptedEffect {
    pub message_id: Uuid,
    pub idempotency_key: String,
    pub receipt: ProviderReceipt,
}

/// [`record_accepted`] for many effects in one statement (group commit): ledger rows (ON
/// CONFLICT DO NOTHING), ACCEPTED events, the sends no longer in flight and now awaiting their
/// receipts. A ledger row records when the effect's first attempt started (its message's
/// first CLAIMED): receipts are matched to it by that time. Answers, per effect in input
/// order, whether its ledger row is new.
pub async fn record_accepted_batch(
    pool: &PgPool,
    effects: &[AcceptedEffect],
) -> Result<Vec<bool>, StoreError> {
    if effects.is_empty() {
        return Ok(Vec::new());
    }
    let keys: Vec<&str> = effects.iter().map(|e| e.idempotency_key.as_str()).collect();
    let ids: Vec<Uuid> = effects.iter().map(|e| e.message_id).collect();
    let gateways: Vec<&str> = effects.iter().map(|e| e.receipt.gateway.as_str()).collect();
    let provider_ids: Vec<&str> = effects
        .iter()
        .map(|e| e.receipt.provider_id.as_str())
        .collect();
    let inserted: Vec<String> = measured(
        Operation::LedgerWrite,
        sqlx::query_scalar(
            "WITH input AS (
                 SELECT * FROM UNNEST($1::text[], $2::uuid[], $3::text[], $4::text[])
                     AS t(idempotency_key, message_id, gateway, provider_id)
             ), effect AS (
                 -- created_at is the clock while this statement holds its lock on the
                 -- ledger, not the transaction's start: the reconciliation relies on it
                 -- (receipts::ledger_committed_up_to).
                 INSERT INTO ledger (idempotency_key, message_id, gateway, provider_id,
                                     created_at, submitted_at)
                 SELECT idempotency_key, message_id, gateway, provider_id, clock_timestamp(),
                        coalesce((SELECT min(e.at) FROM message_events e
                                  WHERE e.message_id = input.message_id
                                    AND e.state = 'CLAIMED'), now())
                 FROM input
                 ORDER BY idempotency_key
                 ON CONFLICT (idempotency_key) DO NOTHING
                 RETURNING idempotency_key, message_id, gateway, provider_id
             ), settled AS (
                 -- Locked in message order, as renew_leases locks them: a renewal and this
                 -- delete taking the same rows in different orders deadlocked.
                 DELETE FROM in_flight_sends s
                 USING (SELECT message_id FROM in_flight_sends WHERE message_id = ANY($2)
                        ORDER BY message_id FOR UPDATE) l
                 WHERE s.message_id = l.message_id
             ), accepted AS (
                 INSERT INTO message_events (message_id, state, detail)
                 SELECT message_id, 'ACCEPTED',
                        jsonb_build_object('gateway', gateway, 'provider_id', provider_id)
                 FROM effect
             )
             SELECT idempotency_key FROM effect",
        )
        .bind(&keys)
        .bind(&ids)
        .bind(&gateways)
        .bind(&provider_ids)
        .fetch_all(pool),
    )
    .await?;
    let inserted: std::collections::HashSet<String> = inserted.into_iter().collect();
    Ok(effects
        .iter()
        .map(|e| inserted.contains(&e.idempotency_key))
        .collect())
}

/// The recipients of `message_ids` (for the worker's internal checks), in one query.
pub async fn recipients_of(
    pool: &PgPool,
    message_ids: &[Uuid],
) -> Result<std::collections::HashMap<Uuid, String>, StoreError> {
    let rows: Vec<(Uuid, String)> =
        sqlx::query_as("SELECT id, recipient FROM messages WHERE id = ANY($1)")
            .bind(message_ids)
            .fetch_all(pool)
            .await?;
    Ok(rows.into_iter().collect())
}

/// The provider's answer to a submit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderReceipt {
    pub gateway: String,
    pub provider_id: String,
}

/// Inserts the ledger row for the effect and appends ACCEPTED, in one statement; the send is
/// no longer in flight and now awaits its receipt. A second write of the same effect (same
/// idempotency key) changes nothing and returns false. The batch statement
/// ([`record_accepted_batch`]) for one effect.
pub async fn record_accepted(
    pool: &PgPool,
    message_id: Uuid,
    idempotency_key: &str,
    receipt: &ProviderReceipt,
) -> Result<bool, StoreError> {
    let effect = AcceptedEffect {
        message_id,
        idempotency_key: idempotency_key.to_owned(),
        receipt: receipt.clone(),
    };
    let inserted = record_accepted_batch(pool, &[effect]).await?;
    Ok(inserted.first().copied().unwrap_or(false))
}

/// What became of a send that failed in a way worth retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryOutcome {
    /// The outbox row is PENDING again, due after the back-off.
    Scheduled,
    /// The row used its last attempt, the provider surely has no effect, and it is DEAD.
    Dead,
    /// The row was not DONE under this attempt's lease (someone else moved it, or the lease
    /// ran out and the claim was re-driven); nothing changed.
    NotOwned,
}

/// Whether the provider surely did nothing with an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptEnd {
    /// A definite answer without effect (a 503 it promised had no effect, a 429, no
    /// connection at all, or a lookup that found no submit under the key).
    NoEffect,
    /// Nobody knows (a timeout, a connection lost mid-request, a 5xx, a 409 "in progress"):
    /// the row is never DEAD for it, however many attempts it used; once they are used up, the
    /// next attempt asks the provider by key instead of submitting.
    Unknown,
}

/// The attempt being given up on, by its lease.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryOf<'a> {
    pub partition: u32,
    pub outbox_id: i64,
    /// The claim's lease token: a worker whose lease ran out writes nothing.
    pub lease: Uuid,
    pub reason: &'a str,
    pub end: AttemptEnd,
}

/// Returns a DONE send row to PENDING, due after `backoff`, and appends RETRYING with the
/// reason. A row that used `max_attempts` and whose last attempt surely had no effect becomes
/// DEAD with a DEAD event; one whose outcome is unknown stays PENDING (its next attempt
/// settles it by asking the provider). Fenced by the attempt's lease.
pub async fn schedule_retry(
    pool: &PgPool,
    attempt: &RetryOf<'_>,
    backoff: Duration,
    max_attempts: u32,
) -> Result<RetryOutcome, StoreError> {
    let unknown = attempt.end == AttemptEnd::Unknown;
    let status: Option<String> = measured(
        Operation::Retry,
        sqlx::query_scalar(
            "WITH leased AS (
                 DELETE FROM in_flight_sends s
                 WHERE s.outbox_id = $2 AND s.partition = $1 AND s.lease = $6
                 RETURNING s.message_id
             ), moved AS (
                 UPDATE outbox o
                 SET status = CASE WHEN o.attempts >= $5 AND NOT $7 THEN 'DEAD' ELSE 'PENDING' END,
                     available_at = now() + make_interval(secs => $4),
                     claimed_at = NULL,
                     last_error = $3
                 FROM leased
                 WHERE o.partition = $1 AND o.id = $2 AND o.status = 'DONE'
                   AND o.message_id = leased.message_id
                 RETURNING o.id, o.message_id, o.attempts, o.status
             ), event AS (
                 INSERT INTO message_events (message_id, state, detail)
                 SELECT message_id,
                        CASE WHEN status = 'DEAD' THEN 'DEAD' ELSE 'RETRYING' END,
                        jsonb_build_object('reason', $3::text, 'attempt', attempts,
                                           'outbox_id', id,
                                           'outcome', CASE WHEN $7 THEN 'unknown'
                                                           ELSE 'no effect' END)
                        || CASE WHEN $7 AND attempts >= $5
                                THEN jsonb_build_object('next', 'ask the provider by key')
                                ELSE '{}'::jsonb END
                 FROM moved
             )
             SELECT status FROM moved",
        )
        .bind(attempt.partition as i32)
        .bind(attempt.outbox_id)
        .bind(attempt.reason)
        .bind(backoff.as_secs_f64())
        .bind(max_attempts as i32)
        .bind(attempt.lease)
        .bind(unknown)
        .fetch_optional(pool),
    )
    .await?;
    Ok(match status.as_deref() {
        Some("PENDING") => RetryOutcome::Scheduled,
        Some(_) => RetryOutcome::Dead,
        None => RetryOutcome::NotOwned,
    })
}

/// Extends the leases of claims whose provider calls (or outcome writes) are still running,
/// `(message id, lease token)` each, to `lease` from now, in one statement. Answers how many
/// are still held: a claim the poller already re-drove is not renewed.
pub async fn renew_leases(
    pool: &PgPool,
    held: &[(Uuid, Uuid)],
    lease: Duration,
) -> Result<u64, StoreError> {
    if held.is_empty() {
        return Ok(0);
    }
    let messages: Vec<Uuid> = held.iter().map(|(m, _)| *m).collect();
    let leases: Vec<Uuid> = held.iter().map(|(_, l)| *l).collect();
    let done = measured(
        Operation::Renew,
        sqlx::query(
            // Rows are locked in message order, as record_accepted_batch locks the ones it
            // deletes: taking them in the plan's order deadlocked with it under load.
            "WITH held AS (
                 SELECT s.message_id FROM in_flight_sends s
                 JOIN UNNEST($1::uuid[], $2::uuid[]) AS h(message_id, lease)
                   ON s.message_id = h.message_id AND s.lease = h.lease
                 ORDER BY s.message_id
                 FOR UPDATE OF s
             )
             UPDATE in_flight_sends s SET lease_until = now() + make_interval(secs => $3)
             FROM held WHERE s.message_id = held.message_id",
        )
        .bind(&messages)
        .bind(&leases)
        .bind(lease.as_secs_f64())
        .execute(pool),
    )
    .await?;
    Ok(done.rows_affected())
}

/// Appends FAILED with the reason: the message will not be sent, because the provider refused
/// its content for good. The event says so (`cause: content`), which is how a proof tells a
/// rejection the caller caused from a failure of Herald's.
pub async fn record_failed(
    pool: &PgPool,
    message_id: Uuid,
    reason: &str,
) -> Result<(), StoreError> {
    measured(
        Operation::Fail,
        sqlx::query(
            "WITH settled AS (DELETE FROM in_flight_sends WHERE message_id = $1)
             INSERT INTO message_events (message_id, state, detail)
             VALUES ($1, 'FAILED', jsonb_build_object('reason', $2::text, 'cause', 'content'))",
        )
        .bind(message_id)
        .bind(reason)
        .execute(pool),
    )
    .await?;
    Ok(())
}

/// Refuses a send before any claim (an internal check failed): the outbox row becomes DONE
/// and FAILED is appended with the reason, in one statement; no CLAIMED is ever written.
/// Returns false when the row is not PROCESSING/PUBLISHED (another copy handled it).
pub async fn reject_before_claim(
    pool: &PgPool,
    partition: u32,
    outbox_id: i64,
    reason: &str,
) -> Result<bool, StoreError> {
    let done = measured(
        Operation::Fail,
        sqlx::query(
            "WITH done AS (
                 UPDATE outbox SET status = 'DONE', last_error = $3
                 WHERE partition = $1 AND id = $2 AND status IN ('PROCESSING', 'PUBLISHED')
                 RETURNING message_id
             )
             INSERT INTO message_events (message_id, state, detail)
             SELECT message_id, 'FAILED', jsonb_build_object('reason', $3::text, 'stage', 'internal check',
                                                      'cause', 'content')
             FROM done",
        )
        .bind(partition as i32)
        .bind(outbox_id)
        .bind(reason)
        .execute(pool),
    )
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The recipient of a message (for the worker's internal checks).
pub async fn recipient_of(pool: &PgPool, message_id: Uuid) -> Result<Option<String>, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT recipient FROM messages WHERE id = $1")
            .bind(message_id)
            .fetch_optional(pool)
            .await?,
    )
}
