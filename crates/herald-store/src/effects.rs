//! The worker's statements (rules R4, R5): confirm ownership before the provider call, record
//! the provider's answer after it, and schedule a retry or record a failure otherwise. Each is
//! one statement, so each is its own transaction and none spans a network call.

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
) -> Result<Option<OwnedSend>, StoreError> {
    let owned = confirm_ownership_batch(pool, &[(partition, outbox_id)], worker).await?;
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
/// PROCESSING/PUBLISHED becomes DONE and its message gets CLAIMED (unless already ACCEPTED) and
/// an `in_flight_sends` row. Rows another copy finished are left out of the answer. Rows are
/// locked in (partition, id) order, so two workers confirming overlapping batches queue
/// behind each other instead of deadlocking.
pub async fn confirm_ownership_batch(
    pool: &PgPool,
    jobs: &[(u32, i64)],
    worker: &str,
) -> Result<Vec<OwnedFromBatch>, StoreError> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let mut sorted = jobs.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let partitions: Vec<i32> = sorted.iter().map(|(p, _)| *p as i32).collect();
    let ids: Vec<i64> = sorted.iter().map(|(_, id)| *id).collect();
    let rows: Vec<(i32, i64, Uuid, String, Json<Value>, bool)> = measured(
        Operation::Confirm,
        sqlx::query_as(
            "WITH input AS (
                 SELECT * FROM UNNEST($1::int[], $2::bigint[]) AS t(partition, id)
             ), locked AS (
                 SELECT o.partition, o.id FROM outbox o JOIN input i
                     ON o.partition = i.partition AND o.id = i.id
                 WHERE o.status IN ('PROCESSING', 'PUBLISHED')
                 ORDER BY o.partition, o.id
                 FOR UPDATE OF o
             ), done AS (
                 UPDATE outbox o SET status = 'DONE'
                 FROM locked l
                 WHERE o.partition = l.partition AND o.id = l.id
                   AND o.status IN ('PROCESSING', 'PUBLISHED')
                 RETURNING o.partition, o.id, o.message_id, o.attempts
             ), owned AS (
                 SELECT done.partition, done.id, done.message_id, done.attempts,
                        EXISTS (SELECT 1 FROM ledger l WHERE l.message_id = done.message_id)
                            AS accepted
                 FROM done
             ), claimed AS (
                 INSERT INTO message_events (message_id, state, detail)
                 SELECT message_id, 'CLAIMED',
                        jsonb_build_object('worker', $3::text, 'outbox_id', id,
                                           'attempt', attempts)
                 FROM owned WHERE NOT accepted
             ), in_flight AS (
                 INSERT INTO in_flight_sends (message_id, partition, outbox_id)
                 SELECT message_id, partition, id FROM owned WHERE NOT accepted
                 ON CONFLICT (message_id) DO UPDATE
                     SET partition = EXCLUDED.partition, outbox_id = EXCLUDED.outbox_id,
                         claimed_at = now()
             )
             SELECT owned.partition, owned.id, m.id, m.recipient, m.body, owned.accepted
             FROM owned JOIN messages m ON m.id = owned.message_id",
        )
        .bind(&partitions)
        .bind(&ids)
        .bind(worker)
        .fetch_all(pool),
    )
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(partition, outbox_id, message_id, recipient, Json(body), already_accepted)| {
                OwnedFromBatch {
                    partition: partition as u32,
                    outbox_id,
                    send: OwnedSend {
                        message_id,
                        recipient,
                        body,
                        already_accepted,
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
/// receipts. Answers, per effect in input order, whether its ledger row is new.
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
                 INSERT INTO ledger (idempotency_key, message_id, gateway, provider_id)
                 SELECT idempotency_key, message_id, gateway, provider_id FROM input
                 ORDER BY idempotency_key
                 ON CONFLICT (idempotency_key) DO NOTHING
                 RETURNING idempotency_key, message_id, gateway, provider_id
             ), settled AS (
                 DELETE FROM in_flight_sends WHERE message_id IN (SELECT message_id FROM input)
             ), awaiting AS (
                 INSERT INTO awaiting_receipt (message_id)
                 SELECT message_id FROM effect
                 ON CONFLICT (message_id) DO NOTHING
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
    /// The row used its last attempt and is DEAD.
    Dead,
    /// The row was not DONE (someone else moved it); nothing changed.
    NotOwned,
}

/// Returns a DONE send row to PENDING, due after `backoff`, and appends RETRYING with the
/// reason; past `max_attempts` the row becomes DEAD and the message gets a DEAD event.
pub async fn schedule_retry(
    pool: &PgPool,
    partition: u32,
    outbox_id: i64,
    reason: &str,
    backoff: Duration,
    max_attempts: u32,
) -> Result<RetryOutcome, StoreError> {
    let status: Option<String> = measured(
        Operation::Retry,
        sqlx::query_scalar(
            "WITH moved AS (
                 UPDATE outbox
                 SET status = CASE WHEN attempts >= $5 THEN 'DEAD' ELSE 'PENDING' END,
                     available_at = now() + make_interval(secs => $4),
                     claimed_at = NULL,
                     last_error = $3
                 WHERE partition = $1 AND id = $2 AND status = 'DONE'
                 RETURNING id, message_id, attempts, status
             ), settled AS (
                 DELETE FROM in_flight_sends s USING moved WHERE s.message_id = moved.message_id
             ), event AS (
                 INSERT INTO message_events (message_id, state, detail)
                 SELECT message_id,
                        CASE WHEN status = 'DEAD' THEN 'DEAD' ELSE 'RETRYING' END,
                        jsonb_build_object('reason', $3::text, 'attempt', attempts,
                                           'outbox_id', id)
                 FROM moved
             )
             SELECT status FROM moved",
        )
        .bind(partition as i32)
        .bind(outbox_id)
        .bind(reason)
        .bind(backoff.as_secs_f64())
        .bind(max_attempts as i32)
        .fetch_optional(pool),
    )
    .await?;
    Ok(match status.as_deref() {
        Some("PENDING") => RetryOutcome::Scheduled,
        Some(_) => RetryOutcome::Dead,
        None => RetryOutcome::NotOwned,
    })
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
