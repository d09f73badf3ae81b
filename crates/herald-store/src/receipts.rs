//! Delivery receipts (the `status` job type) and the parking table (rules R6, R7). Taking
//! receipts in and finding each one's send are here; applying them and finishing status jobs
//! are in `apply.rs`, receipts held until their send is recorded in `held.rs`, the
//! operator's parking views in `parking.rs`, and the reconciliation of silent gateways in
//! `reconcile.rs`.

mod apply;
mod held;
mod parking;
mod reconcile;

pub use apply::*;
pub use held::*;
pub use parking::*;
pub use reconcile::*;

use std::borrow::Borrow;
use std::time::Duration;

use chrono::{DateTime, Utc};
use herald_core::{JobType, MessageState};
use sqlx::types::Json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::metrics::{measured, Operation};
use crate::StoreError;

/// A provider's receipt as it came, with the partition its status job goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewReceipt {
    pub gateway: String,
    pub raw: Vec<u8>,
    pub content_type: Option<String>,
    pub partition: u32,
}

/// Stores a provider's receipt byte for byte together with a `status` outbox row for it, in
/// one transaction. Nothing is interpreted here: a receipt that cannot be applied is parked later
/// by the status worker. Returns the receipt id. The caller wakes the partition's poller
/// after the commit ([`crate::wakeups::Wakeups`]). [`accept_receipts`] for one.
pub async fn accept_receipt(
    pool: &PgPool,
    gateway: &str,
    raw: &[u8],
    content_type: Option<&str>,
    partition: u32,
) -> Result<i64, StoreError> {
    let receipt = NewReceipt {
        gateway: gateway.to_owned(),
        raw: raw.to_vec(),
        content_type: content_type.map(str::to_owned),
        partition,
    };
    accept_receipts(pool, &[receipt])
        .await?
        .pop()
        .ok_or_else(|| StoreError::Corrupt("storing a receipt returned no id".to_owned()))
}

/// The most receipts one status job carries.
pub const RECEIPTS_PER_JOB: usize = 100;

/// Stores many receipts in one statement (one transaction), with one `status` outbox row per
/// [`RECEIPTS_PER_JOB`] of them (payload `{"receipt_ids": [...]}`, in input order, on the
/// partition of the first); answers their ids in input order. A job's receipts are applied
/// in the order they came; two jobs may be applied in either order (a message's state is
/// ranked, not last-written, see `docs/DESIGN.md`).
pub async fn accept_receipts<R: std::borrow::Borrow<NewReceipt>>(
    pool: &PgPool,
    receipts: &[R],
) -> Result<Vec<i64>, StoreError> {
    if receipts.is_empty() {
        return Ok(Vec::new());
    }
    let receipts: Vec<&NewReceipt> = receipts.iter().map(Borrow::borrow).collect();
    measured(Operation::Accept, async {
        let mut conn = pool.acquire().await?;
        let ids: Vec<i64> = sqlx::query_scalar(
            "WITH input AS MATERIALIZED (
                 SELECT nextval(pg_get_serial_sequence('receipts', 'id')) AS id,
                        gateway, raw, content_type, partition, ord
                 FROM UNNEST($1::text[], $2::bytea[], $3::text[], $4::int[]) WITH ORDINALITY
                     AS t(gateway, raw, content_type, partition, ord)
             ), receipt AS (
                 INSERT INTO receipts (id, gateway, raw, content_type) OVERRIDING SYSTEM VALUE
                 SELECT id, gateway, raw, content_type FROM input
             ), queued AS (
                 INSERT INTO outbox (partition, job_type, payload)
                 SELECT (array_agg(partition ORDER BY ord))[1], $5,
                        jsonb_build_object('receipt_ids', jsonb_agg(id ORDER BY ord))
                 FROM input GROUP BY (ord - 1) / $6 ORDER BY min(ord)
             )
             SELECT id FROM input ORDER BY ord",
        )
        .bind(
            receipts
                .iter()
                .map(|r| r.gateway.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            receipts
                .iter()
                .map(|r| r.raw.as_slice())
                .collect::<Vec<_>>(),
        )
        .bind(
            receipts
                .iter()
                .map(|r| r.content_type.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(
            receipts
                .iter()
                .map(|r| r.partition as i32)
                .collect::<Vec<_>>(),
        )
        .bind(JobType::Status.as_str())
        .bind(RECEIPTS_PER_JOB as i64)
        .fetch_all(&mut *conn)
        .await
        // One statement, committed on its own: once sent, a broken connection may hide a commit.
        .map_err(crate::after_sending)?;
        Ok(ids)
    })
    .await
}

/// A stored receipt.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct StoredReceipt {
    pub id: i64,
    pub gateway: String,
    pub raw: Vec<u8>,
    pub received_at: DateTime<Utc>,
}

pub async fn load_receipt(pool: &PgPool, id: i64) -> Result<Option<StoredReceipt>, StoreError> {
    Ok(
        sqlx::query_as("SELECT id, gateway, raw, received_at FROM receipts WHERE id = $1")
            .bind(id)
            .fetch_optional(pool)
            .await?,
    )
}

/// Stored receipts by id, in one query; ids that do not exist are absent.
pub async fn load_receipts(
    pool: &PgPool,
    ids: &[i64],
) -> Result<std::collections::HashMap<i64, StoredReceipt>, StoreError> {
    let rows: Vec<StoredReceipt> =
        sqlx::query_as("SELECT id, gateway, raw, received_at FROM receipts WHERE id = ANY($1)")
            .bind(ids)
            .fetch_all(pool)
            .await?;
    Ok(rows.into_iter().map(|r| (r.id, r)).collect())
}

/// A receipt to find the send of: its gateway and provider id, the interval its timestamp
/// names (the provider wrote it between `written_from` and `written_by`, by its own clock), and
/// whether it is final (a final receipt settles the send it is applied to).
#[derive(Debug, Clone, PartialEq)]
pub struct ReceiptLookup {
    pub gateway: String,
    pub provider_id: String,
    pub written_from: DateTime<Utc>,
    pub written_by: DateTime<Utc>,
    pub is_final: bool,
}

/// The send a receipt was matched to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReceiptMatch {
    /// `None`: no recorded send can be its.
    pub message_id: Option<Uuid>,
    /// More than one recorded send with its `(gateway, provider id)` started within the
    /// interval the receipt's timestamp names (widened by the clock skew): the gateway reused
    /// the id sooner than Herald can tell its receipts apart.
    pub ambiguous: bool,
}

/// Most recorded sends with one `(gateway, provider id)` one lookup weighs.
const MATCH_CANDIDATES: i64 = 8;

/// The send each receipt is about, in one query, answered in input order. Provider ids are
/// unique per gateway only and wrap.
///
/// Each receipt belongs to the newest send with its `(gateway, provider id)` whose first
/// attempt started no later than `written_by` plus [`RECEIPT_CLOCK_SKEW`]. When several such
/// sends started within the interval the receipt names (a gateway that reused the id within a
/// `YYMMDDhhmm` minute), the newest is not necessarily its: receipts come in the order the
/// provider wrote them, so it goes to the oldest of those sends that no final receipt has
/// settled yet — counting the final receipts earlier in `receipts`, which are applied with it
/// — and to the newest when all are settled.
pub async fn messages_for_receipts(
    pool: &PgPool,
    receipts: &[ReceiptLookup],
) -> Result<Vec<ReceiptMatch>, StoreError> {
    if receipts.is_empty() {
        return Ok(Vec::new());
    }
    let gateways: Vec<&str> = receipts.iter().map(|r| r.gateway.as_str()).collect();
    let provider_ids: Vec<&str> = receipts.iter().map(|r| r.provider_id.as_str()).collect();
    let from: Vec<DateTime<Utc>> = receipts.iter().map(|r| r.written_from).collect();
    let by: Vec<DateTime<Utc>> = receipts.iter().map(|r| r.written_by).collect();
    // Newest first per receipt. Whether a candidate is settled is read only when the receipt
    // has more than one candidate inside its interval (the rare, ambiguous case).
    let rows: Vec<(i64, Uuid, bool, Option<bool>)> = sqlx::query_as(
        "SELECT i.ord, c.message_id, c.inside, f.settled
         FROM UNNEST($1::text[], $2::text[], $3::timestamptz[], $4::timestamptz[])
              WITH ORDINALITY AS i(gateway, provider_id, written_from, written_by, ord)
         CROSS JOIN LATERAL (
             SELECT n.*, count(*) FILTER (WHERE n.inside) OVER () AS inside_count
             FROM (SELECT l.message_id, coalesce(l.submitted_at, l.created_at) AS submitted,
                          coalesce(l.submitted_at, l.created_at)
                              >= i.written_from - make_interval(secs => $5) AS inside
                   FROM ledger l
                   WHERE l.gateway = i.gateway AND l.provider_id = i.provider_id
                     AND coalesce(l.submitted_at, l.created_at)
                         <= i.written_by + make_interval(secs => $5)
                   ORDER BY coalesce(l.submitted_at, l.created_at) DESC
                   LIMIT $6) n) c
         LEFT JOIN LATERAL (
             -- Aggregates per message, not EXISTS: see settled_sends.
             SELECT bool_or(e.detail ? 'receipt_id') AS settled
             FROM message_events e
             WHERE c.inside AND c.inside_count > 1
               AND e.message_id = c.message_id AND herald_state_rank(e.state) = 5) f ON true
         ORDER BY i.ord, c.submitted DESC",
    )
    .bind(&gateways)
    .bind(&provider_ids)
    .bind(&from)
    .bind(&by)
    .bind(RECEIPT_CLOCK_SKEW.as_secs_f64())
    .bind(MATCH_CANDIDATES)
    .fetch_all(pool)
    .await?;
    let mut candidates: Vec<Vec<Candidate>> = vec![Vec::new(); receipts.len()];
    for (ord, message_id, inside, settled) in rows {
        if let Some(slot) = candidates.get_mut((ord - 1) as usize) {
            slot.push(Candidate {
                message_id,
                inside,
                settled: settled.unwrap_or(false),
            });
        }
    }
    Ok(choose_sends(receipts, &candidates))
}

/// A recorded send a receipt may be for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Candidate {
    message_id: Uuid,
    /// It started within the interval the receipt's timestamp names.
    inside: bool,
    /// A final receipt settled it already.
    settled: bool,
}

/// Picks each receipt's send from its candidates (newest first), in order: see
/// [`messages_for_receipts`].
fn choose_sends(receipts: &[ReceiptLookup], candidates: &[Vec<Candidate>]) -> Vec<ReceiptMatch> {
    let mut settled_here = std::collections::HashSet::new();
    receipts
        .iter()
        .zip(candidates)
        .map(|(receipt, candidates)| {
            let inside: Vec<&Candidate> = candidates.iter().filter(|c| c.inside).collect();
            let ambiguous = inside.len() > 1;
            let chosen = if ambiguous {
                inside
                    .iter()
                    .rev()
                    .find(|c| !c.settled && !settled_here.contains(&c.message_id))
                    .map(|c| c.message_id)
                    .or_else(|| candidates.first().map(|c| c.message_id))
            } else {
                candidates.first().map(|c| c.message_id)
            };
            if let (Some(message_id), true) = (chosen, receipt.is_final) {
                settled_here.insert(message_id);
            }
            ReceiptMatch {
                message_id: chosen,
                ambiguous,
            }
        })
        .collect()
}

/// A receipt matched to a send, to check against the send's final receipts.
#[derive(Debug, Clone, PartialEq)]
pub struct SettledCheck {
    pub message_id: Uuid,
    /// The time the receipt states (the time decides, not the status).
    pub provider_time: DateTime<Utc>,
    /// The end of the interval its timestamp names (the stated time plus its resolution:
    /// a minute for `YYMMDDhhmm`).
    pub written_by: DateTime<Utc>,
}

/// Of each receipt matched to a send: the submit time of that send when a final receipt
/// already settled it and this receipt is stamped later than every final receipt of it, else
/// `None`. Such a receipt is most likely for a newer send that reused the provider id and is
/// not recorded yet; it is held (see [`ReceiptToHold::superseding`]) instead of being applied
/// to the settled send. A copy of a final receipt, or an intermediate one that arrived after
/// the final, carries a time no later than the final's and is applied at once — except that
/// a timestamp coarser than a second names an interval, and a final stamped inside it tells
/// nothing: a newer send that reused the id within that minute stamps its receipts with the
/// same minute. Such a receipt is older than the final only when the final is stamped at or
/// after the interval's end; otherwise it is held too (a true copy is applied as one once
/// [`SUPERSEDED_HOLD`] passes without a newer send).
pub async fn settled_sends(
    pool: &PgPool,
    matched: &[SettledCheck],
) -> Result<Vec<Option<DateTime<Utc>>>, StoreError> {
    if matched.is_empty() {
        return Ok(Vec::new());
    }
    let messages: Vec<Uuid> = matched.iter().map(|m| m.message_id).collect();
    let times: Vec<DateTime<Utc>> = matched.iter().map(|m| m.provider_time).collect();
    let written_by: Vec<DateTime<Utc>> = matched.iter().map(|m| m.written_by).collect();
    let rows: Vec<(i64, Option<DateTime<Utc>>)> = sqlx::query_as(
        "SELECT i.ord,
                (SELECT max(coalesce(l.submitted_at, l.created_at)) FROM ledger l
                 WHERE l.message_id = i.message_id)
         FROM UNNEST($1::uuid[], $2::timestamptz[], $3::timestamptz[])
              WITH ORDINALITY AS i(message_id, provider_time, written_by, ord)
         -- Aggregates per message, not EXISTS: the planner turns EXISTS into a join over
         -- every event; this probes each message's own events.
         CROSS JOIN LATERAL (
             SELECT bool_or(e.detail ? 'receipt_id') AS settled,
                    bool_or((e.detail->>'provider_time')::timestamptz
                            >= CASE WHEN i.written_by - i.provider_time > interval '1 second'
                                    THEN i.written_by ELSE i.provider_time END) AS stamped_later
             FROM message_events e
             WHERE e.message_id = i.message_id AND herald_state_rank(e.state) = 5) f
         WHERE f.settled AND NOT coalesce(f.stamped_later, false)",
    )
    .bind(&messages)
    .bind(&times)
    .bind(&written_by)
    .fetch_all(pool)
    .await?;
    let mut out = vec![None; matched.len()];
    for (ord, submitted) in rows {
        if let Some(slot) = out.get_mut((ord - 1) as usize) {
            *slot = submitted;
        }
    }
    Ok(out)
}
