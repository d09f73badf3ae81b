//! The worker's statements (rules R4, R5): confirm ownership before the provider call (a claim
//! lease on the outbox row), record the provider's answer after it, and schedule a retry or
//! record a failure otherwise, each under the claim's lease. Each is one statement, so each
//! is its own transaction and none spans a network call.
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

/// Takes the outbox row's claim lease and appends CLAIMED to its message, in one statement.
/// Returns `None` when the row is not PROCESSING/PUBLISHED any more (another worker finished
/// it, or a re-drive returned it to PENDING and a newer copy of the job is on its way) or
/// another attempt holds a live lease on it: the caller drops its copy. A message that is
/// already ACCEPTED gets no CLAIMED and its row is DONE at once. The batch statement
/// ([`confirm_ownership_batch`]) for one job.
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
/// PROCESSING/PUBLISHED and held by no live lease is charged an attempt (this is where
/// attempts are counted: a confirm is followed by a provider call) and takes a fresh lease
/// token, valid for `lease`, on the row itself; its message gets CLAIMED. The status stays:
/// the update touches no indexed column, so it is HOT. A row whose message is already
/// ACCEPTED becomes DONE instead. Rows another copy finished or holds are left out of the
/// answer. Rows are locked in (partition, id) order, so two workers confirming overlapping
/// batches queue behind each other instead of deadlocking.
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
        sqlx::query_as(
            "WITH input AS (
                 SELECT * FROM UNNEST($1::int[], $2::bigint[]) AS t(partition, id)
             ), locked AS (
                 SELECT x.partition, x.id, x.message_id
                 FROM (SELECT * FROM input ORDER BY partition, id) k
                 CROSS JOIN LATERAL (
                     SELECT o.partition, o.id, o.status, o.message_id, o.lease_until
                     FROM outbox o
                     WHERE o.partition = k.partition AND o.id = k.id
                     OFFSET 0
                     FOR UPDATE OF o) x
                 WHERE x.status IN ('PROCESSING', 'PUBLISHED')
                   -- Another attempt holds the row: this copy is stale. An expired lease
                   -- is taken over (its worker's later writes present a lease that is gone).
                   AND (x.lease_until IS NULL OR x.lease_until < now())
             ), checked AS (
                 -- A count per job, not EXISTS (nor LIMIT 1): a generic plan made while the
                 -- ledger was small hashed the whole ledger for EXISTS at every call, and
                 -- with a LIMIT it read the ledger sequentially until the first match.
                 SELECT l.partition, l.id, a.accepted
                 FROM locked l CROSS JOIN LATERAL (
                     SELECT count(*) > 0 AS accepted FROM ledger g
                     WHERE g.message_id = l.message_id) a
             ), owned AS (
                 UPDATE outbox o
                 SET attempts = o.attempts + 1,
                     status = CASE WHEN c.accepted THEN 'DONE' ELSE o.status END,
                     lease = CASE WHEN c.accepted THEN NULL ELSE gen_random_uuid() END,
                     lease_until = CASE WHEN c.accepted THEN NULL
                                        ELSE now() + make_interval(secs => $4) END
                 FROM checked c WHERE o.partition = c.partition AND o.id = c.id
                 RETURNING o.partition, o.id, o.message_id, o.attempts, c.accepted, o.lease
             ), claimed AS (
                 INSERT INTO message_events (message_id, state, detail)
                 SELECT message_id, 'CLAIMED',
                        jsonb_build_object('worker', $3::text, 'outbox_id', id,
                                           'attempt', attempts)
                 FROM owned WHERE NOT accepted
             )
             SELECT owned.partition, owned.id, m.id, m.recipient, m.body, owned.accepted,
                    owned.attempts, owned.lease
             FROM owned CROSS JOIN LATERAL (
                 SELECT m.id, m.recipient, m.body FROM messages m
                 WHERE m.id = owned.message_id OFFSET 0) m",
        )
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
    /// The claim the call was made under: its outbox row becomes DONE if the lease still
    /// holds. `None` records the effect alone.
    pub claim: Option<Claim>,
}

/// An attempt's claim: its outbox row and the lease token its confirm took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Claim {
    pub partition: u32,
    pub outbox_id: i64,
    pub lease: Uuid,
}

/// [`record_accepted`] for many effects in one statement (group commit): ledger rows (ON
/// CONFLICT DO NOTHING), ACCEPTED events, and each claim whose lease still holds settled (its
/// outbox row DONE, the lease gone). The ledger row and the event are written whatever the
/// lease: the provider took the effect. A ledger row records when the effect's first attempt
/// started (its message's first CLAIMED): receipts are matched to it by that time. Answers,
/// per effect in input order, whether its ledger row is new.
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
    let claims: Vec<&Claim> = effects.iter().filter_map(|e| e.claim.as_ref()).collect();
    let claim_partitions: Vec<i32> = claims.iter().map(|c| c.partition as i32).collect();
    let claim_ids: Vec<i64> = claims.iter().map(|c| c.outbox_id).collect();
    let claim_leases: Vec<Uuid> = claims.iter().map(|c| c.lease).collect();
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
             ), held AS (
                 -- Locked in (partition, id) order, as the confirm and renew_leases lock
                 -- them: the same rows taken in different orders deadlock.
                 SELECT x.partition, x.id
                 FROM (SELECT * FROM UNNEST($5::int[], $6::bigint[], $7::uuid[])
                           AS c(partition, id, lease)
                       ORDER BY partition, id) k
                 CROSS JOIN LATERAL (
                     SELECT o.partition, o.id FROM outbox o
                     WHERE o.partition = k.partition AND o.id = k.id AND o.lease = k.lease
                     OFFSET 0
                     FOR UPDATE OF o) x
             ), settled AS (
                 UPDATE outbox o SET status = 'DONE', lease = NULL, lease_until = NULL
                 FROM held h WHERE o.partition = h.partition AND o.id = h.id
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
        .bind(&claim_partitions)
        .bind(&claim_ids)
        .bind(&claim_leases)
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

/// Inserts the ledger row for the effect and appends ACCEPTED, in one statement, and settles
/// `claim` (its outbox row DONE) if its lease still holds; the send now awaits its receipt. A
/// second write of the same effect (same idempotency key) adds no ledger row and returns
/// false. The batch statement ([`record_accepted_batch`]) for one effect.
pub async fn record_accepted(
    pool: &PgPool,
    message_id: Uuid,
    idempotency_key: &str,
    receipt: &ProviderReceipt,
    claim: Option<Claim>,
) -> Result<bool, StoreError> {
    let effect = AcceptedEffect {
        message_id,
        idempotency_key: idempotency_key.to_owned(),
        receipt: receipt.clone(),
        claim,
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
    /// The row is not held under this attempt's lease any more (someone else moved it, or the
    /// lease ran out and the claim was re-driven or taken over); nothing changed.
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

/// Returns a claimed send row to PENDING, due after `backoff`, and appends RETRYING with the
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
            "WITH moved AS (
                 UPDATE outbox o
                 SET status = CASE WHEN o.attempts >= $5 AND NOT $7 THEN 'DEAD' ELSE 'PENDING' END,
                     available_at = now() + make_interval(secs => $4),
                     claimed_at = NULL, lease = NULL, lease_until = NULL,
                     last_error = $3
                 WHERE o.partition = $1 AND o.id = $2 AND o.lease = $6
                   AND o.status IN ('PROCESSING', 'PUBLISHED')
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

/// Extends the leases of claims whose provider calls (or outcome writes) are still running to
/// `lease` from now, in one statement. Answers how many are still held: a claim the poller
/// already re-drove, or another attempt took over, is not renewed.
pub async fn renew_leases(
    pool: &PgPool,
    held: &[Claim],
    lease: Duration,
) -> Result<u64, StoreError> {
    if held.is_empty() {
        return Ok(0);
    }
    let partitions: Vec<i32> = held.iter().map(|c| c.partition as i32).collect();
    let ids: Vec<i64> = held.iter().map(|c| c.outbox_id).collect();
    let leases: Vec<Uuid> = held.iter().map(|c| c.lease).collect();
    let done = measured(
        Operation::Renew,
        sqlx::query(
            // Rows are locked in (partition, id) order, as the confirm and
            // record_accepted_batch lock them: taking them in the plan's order deadlocked
            // with the outcome writes under load.
            "WITH held AS (
                 SELECT x.partition, x.id
                 FROM (SELECT * FROM UNNEST($1::int[], $2::bigint[], $3::uuid[])
                           AS h(partition, id, lease)
                       ORDER BY partition, id) k
                 CROSS JOIN LATERAL (
                     SELECT o.partition, o.id FROM outbox o
                     WHERE o.partition = k.partition AND o.id = k.id AND o.lease = k.lease
                     OFFSET 0
                     FOR UPDATE OF o) x
             )
             UPDATE outbox o SET lease_until = now() + make_interval(secs => $4)
             FROM held h WHERE o.partition = h.partition AND o.id = h.id",
        )
        .bind(&partitions)
        .bind(&ids)
        .bind(&leases)
        .bind(lease.as_secs_f64())
        .execute(pool),
    )
    .await?;
    Ok(done.rows_affected())
}

/// Appends FAILED with the reason: the message will not be sent, because the provider refused
/// its content for good. The event says so (`cause: content`), which is how a proof tells a
/// rejection the caller caused from a failure of Herald's. `claim`, if its lease still
/// holds, is settled (its outbox row DONE).
pub async fn record_failed(
    pool: &PgPool,
    message_id: Uuid,
    claim: Option<Claim>,
    reason: &str,
) -> Result<(), StoreError> {
    measured(
        Operation::Fail,
        sqlx::query(
            "WITH settled AS (
                 UPDATE outbox SET status = 'DONE', lease = NULL, lease_until = NULL
                 WHERE partition = $3 AND id = $4 AND lease = $5
             )
             INSERT INTO message_events (message_id, state, detail)
             VALUES ($1, 'FAILED', jsonb_build_object('reason', $2::text, 'cause', 'content'))",
        )
        .bind(message_id)
        .bind(reason)
        .bind(claim.map(|c| c.partition as i32))
        .bind(claim.map(|c| c.outbox_id))
        .bind(claim.map(|c| c.lease))
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
