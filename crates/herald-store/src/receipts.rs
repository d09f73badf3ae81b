//! Delivery receipts (the `status` job type) and the parking table (rules R6, R7).

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

/// How long a receipt for a settled send (see [`settled_sends`]) waits for a newer send with
/// its provider id before it is applied to the settled one after all (a duplicate with another
/// time, or the provider correcting itself). Longer than a send takes from its provider call to
/// its ledger row, through a worker that died after the call and the claim lease that re-drives
/// it.
pub const SUPERSEDED_HOLD: Duration = Duration::from_secs(300);

/// How far the provider's clock may run behind PostgreSQL's: a receipt stamped up to this long
/// (plus its timestamp's resolution) before its effect's first attempt started still belongs
/// to it. A gateway must not reuse a provider id within this long plus its timestamps'
/// resolution (a minute for `YYMMDDhhmm`); one issuing 65,535 ids wraps after about a minute
/// at 1,000 messages a second.
pub const RECEIPT_CLOCK_SKEW: Duration = Duration::from_secs(10);

/// A receipt whose send is not recorded yet, to hold.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceiptToHold {
    pub partition: u32,
    pub outbox_id: i64,
    pub receipt_id: i64,
    pub gateway: String,
    pub provider_id: String,
    /// The latest moment the provider can have written it (stated time plus resolution).
    pub provider_time: DateTime<Utc>,
    /// Held although a recorded send matches: that send (submitted at this time) is settled by
    /// another final receipt. `None`: no recorded send matches.
    pub superseding: Option<DateTime<Utc>>,
}

/// Holds receipts no recorded send matches yet: each status job becomes DONE and its receipt
/// waits in `held_receipts`, in one statement, charged nothing. [`release_held_receipts`]
/// queues it again once a ledger row matches. Returns the (partition, outbox id) of the jobs
/// held; the others were another copy's. [`finish_status_jobs`] with holds only.
pub async fn hold_receipts(
    pool: &PgPool,
    receipts: &[ReceiptToHold],
) -> Result<Vec<(u32, i64)>, StoreError> {
    let outcomes = StatusOutcomes {
        holds: receipts.to_vec(),
        ..StatusOutcomes::default()
    };
    finish_status_jobs(pool, &outcomes.jobs(), &outcomes).await
}

/// Queues a new status job for every held receipt a ledger row now matches (at most `limit`),
/// and stops holding it, in one statement; rows another worker is releasing are skipped. A
/// receipt held against a settled send is released when a newer send with its provider id is
/// recorded, or, after [`SUPERSEDED_HOLD`], marked `as_duplicate` to be applied to the settled
/// send. Answers the partition of each job queued, to wake their pollers.
pub async fn release_held_receipts(pool: &PgPool, limit: i64) -> Result<Vec<u32>, StoreError> {
    let partitions: Vec<i32> = measured(
        Operation::Hold,
        sqlx::query_scalar(
            "WITH candidates AS (
                 SELECT h.receipt_id,
                        EXISTS (
                            SELECT 1 FROM ledger l
                            WHERE l.gateway = h.gateway AND l.provider_id = h.provider_id
                              AND coalesce(l.submitted_at, l.created_at)
                                  > coalesce(h.superseding, '-infinity')
                              AND coalesce(l.submitted_at, l.created_at)
                                  <= h.provider_time + make_interval(secs => $2)) AS recorded,
                        h.superseding IS NOT NULL
                            AND h.held_at < now() - make_interval(secs => $4) AS waited_out,
                        h.held_at
                 FROM held_receipts h
             ), matched AS (
                 SELECT h.receipt_id, NOT c.recorded AS as_duplicate
                 FROM held_receipts h JOIN candidates c USING (receipt_id)
                 WHERE c.recorded OR c.waited_out
                 ORDER BY c.held_at
                 LIMIT $1
                 FOR UPDATE OF h SKIP LOCKED
             ), released AS (
                 DELETE FROM held_receipts h USING matched m
                 WHERE h.receipt_id = m.receipt_id
                 RETURNING h.receipt_id, h.partition, h.held_at, m.as_duplicate
             ), queued AS (
                 INSERT INTO outbox (partition, job_type, payload)
                 SELECT partition, $3,
                        jsonb_build_object('receipt_id', receipt_id, 'held_since', held_at)
                        || CASE WHEN as_duplicate THEN '{\"as_duplicate\": true}'::jsonb
                                ELSE '{}'::jsonb END
                 FROM released ORDER BY receipt_id
                 RETURNING partition
             )
             SELECT partition FROM queued",
        )
        .bind(limit)
        .bind(RECEIPT_CLOCK_SKEW.as_secs_f64())
        .bind(JobType::Status.as_str())
        .bind(SUPERSEDED_HOLD.as_secs_f64())
        .fetch_all(pool),
    )
    .await?;
    Ok(partitions.into_iter().map(|p| p as u32).collect())
}

/// Parks receipts held longer than `hold_for` (no send with their provider id was ever
/// recorded: a gateway misconfigured, or a receipt for another system), with their raw bodies
/// and the reason, at most `limit`. Answers how many were parked.
pub async fn park_expired_held(
    pool: &PgPool,
    hold_for: Duration,
    limit: i64,
) -> Result<u64, StoreError> {
    let done = measured(
        Operation::Hold,
        sqlx::query(
            "WITH expired AS (
                 DELETE FROM held_receipts
                 WHERE receipt_id IN (SELECT receipt_id FROM held_receipts
                                      WHERE held_at < now() - make_interval(secs => $1)
                                      ORDER BY held_at LIMIT $2
                                      FOR UPDATE SKIP LOCKED)
                 RETURNING receipt_id, gateway, provider_id, held_at
             )
             INSERT INTO parking (job_type, receipt_id, raw, reason)
             SELECT $3, e.receipt_id, r.raw,
                    format('no send through gateway %s with provider id %s was recorded \
                            while the receipt was held (since %s)',
                           e.gateway, e.provider_id, e.held_at)
             FROM expired e JOIN receipts r ON r.id = e.receipt_id",
        )
        .bind(hold_for.as_secs_f64())
        .bind(limit)
        .bind(JobType::Status.as_str())
        .execute(pool),
    )
    .await?;
    Ok(done.rows_affected())
}

/// Receipts held now (a gauge: a growing number means sends are recorded late, or receipts
/// come for provider ids Herald never sent).
pub async fn count_held(pool: &PgPool) -> Result<i64, StoreError> {
    Ok(sqlx::query_scalar("SELECT count(*) FROM held_receipts")
        .fetch_one(pool)
        .await?)
}

/// One mapped receipt to apply: its status job's outbox row, its message, the state.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceiptToApply {
    pub partition: u32,
    pub outbox_id: i64,
    pub message_id: Uuid,
    pub state: MessageState,
    pub detail: serde_json::Value,
}

/// [`apply_receipt`] for many receipts in one statement: every status job still
/// PROCESSING/PUBLISHED becomes DONE with its state appended, final states end their wait. A
/// duplicate receipt (same state, provider status and provider time as one the message already
/// has) finishes its job and appends nothing: a provider that posts a receipt twice does not
/// write the history twice.
/// Returns the (partition, outbox id) of the jobs applied; the others were another copy's.
/// [`finish_status_jobs`] with applies only.
pub async fn apply_receipts(
    pool: &PgPool,
    receipts: &[ReceiptToApply],
) -> Result<Vec<(u32, i64)>, StoreError> {
    let outcomes = StatusOutcomes {
        applies: receipts.to_vec(),
        ..StatusOutcomes::default()
    };
    finish_status_jobs(pool, &outcomes.jobs(), &outcomes).await
}

/// A status job's input to park with the reason: a receipt that cannot be applied (its raw
/// bytes), or a job that names no receipt (its payload).
#[derive(Debug, Clone, PartialEq)]
pub struct ReceiptToPark {
    pub partition: u32,
    pub outbox_id: i64,
    pub receipt_id: Option<i64>,
    pub raw: Vec<u8>,
    pub reason: String,
}

/// What the receipts of a batch of status jobs came to: each names its job.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StatusOutcomes {
    pub parks: Vec<ReceiptToPark>,
    pub holds: Vec<ReceiptToHold>,
    pub applies: Vec<ReceiptToApply>,
}

impl StatusOutcomes {
    /// Every job named, once.
    pub fn jobs(&self) -> Vec<(u32, i64)> {
        let mut jobs: Vec<(u32, i64)> = self
            .parks
            .iter()
            .map(|p| (p.partition, p.outbox_id))
            .chain(self.holds.iter().map(|h| (h.partition, h.outbox_id)))
            .chain(self.applies.iter().map(|a| (a.partition, a.outbox_id)))
            .collect();
        jobs.sort_unstable();
        jobs.dedup();
        jobs
    }
}

/// Finishes a batch of status jobs in one statement: every job still PROCESSING/PUBLISHED
/// becomes DONE, and with it, for every receipt of those jobs, what it came to — parked with
/// its raw body and reason, held until its send is recorded, or its state appended (final
/// states end the wait for a receipt). A job holds one receipt or many (a batch the API stored
/// together); its receipts are finished all together or not at all, so a worker that dies
/// half-way leaves nothing half-applied, and a second copy of a finished job writes nothing.
/// A receipt the message already has (same state, provider status and provider time, in its
/// history or earlier in this batch) appends nothing. Returns the (partition, outbox id) of
/// the jobs finished here; the others were another copy's.
pub async fn finish_status_jobs(
    pool: &PgPool,
    jobs: &[(u32, i64)],
    outcomes: &StatusOutcomes,
) -> Result<Vec<(u32, i64)>, StoreError> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let StatusOutcomes {
        parks,
        holds,
        applies,
    } = outcomes;
    let done: Vec<(i32, i64)> = measured(
        Operation::ReceiptApply,
        sqlx::query_as(concat!(
            "WITH jobs AS (
                 SELECT DISTINCT * FROM UNNEST($1::int[], $2::bigint[]) AS t(partition, id)
             ), ",
            lock_outbox_rows!("jobs"),
            ", done AS (
                 UPDATE outbox o SET status = 'DONE'
                 ",
            the_locked_rows!(),
            "
                 RETURNING o.partition, o.id
             ), parked AS (
                 INSERT INTO parking (job_type, receipt_id, raw, reason)
                 SELECT 'status', p.receipt_id, p.raw, p.reason
                 FROM UNNEST($3::int[], $4::bigint[], $5::bigint[], $6::bytea[], $7::text[])
                      WITH ORDINALITY AS p(partition, id, receipt_id, raw, reason, ord)
                 JOIN done d ON d.partition = p.partition AND d.id = p.id
                 ORDER BY p.ord
             ), held AS (
                 INSERT INTO held_receipts (receipt_id, gateway, provider_id, provider_time,
                                            partition, superseding)
                 SELECT h.receipt_id, h.gateway, h.provider_id, h.provider_time, h.partition,
                        h.superseding
                 FROM UNNEST($8::int[], $9::bigint[], $10::bigint[], $11::text[], $12::text[],
                             $13::timestamptz[], $14::timestamptz[])
                      AS h(partition, id, receipt_id, gateway, provider_id, provider_time,
                           superseding)
                 JOIN done d ON d.partition = h.partition AND d.id = h.id
                 ON CONFLICT (receipt_id) DO NOTHING
             ), applied AS (
                 SELECT a.* FROM UNNEST($15::int[], $16::bigint[], $17::uuid[], $18::text[],
                                        $19::jsonb[]) WITH ORDINALITY
                     AS a(partition, id, message_id, state, detail, ord)
                 JOIN done d ON d.partition = a.partition AND d.id = a.id
             ), fresh AS (
                 -- A receipt the message already has (same state, provider status and
                 -- provider time), in its history or earlier in this batch, adds nothing.
                 -- (A count per receipt, not NOT EXISTS: the planner turns that into an
                 -- anti-join over every event; this probes each message's own events.)
                 SELECT DISTINCT ON (a.message_id, a.state, a.detail->>'provider_status',
                                     a.detail->>'provider_time')
                        a.message_id, a.state, a.detail, a.ord
                 FROM applied a CROSS JOIN LATERAL (
                     SELECT count(*) AS copies FROM message_events e
                     WHERE e.message_id = a.message_id AND e.state = a.state
                       AND e.detail->>'provider_status'
                           IS NOT DISTINCT FROM a.detail->>'provider_status'
                       AND e.detail->>'provider_time'
                           IS NOT DISTINCT FROM a.detail->>'provider_time') seen
                 WHERE seen.copies = 0
                 ORDER BY a.message_id, a.state, a.detail->>'provider_status',
                          a.detail->>'provider_time', a.ord
             ), events AS (
                 INSERT INTO message_events (message_id, state, detail)
                 SELECT message_id, state, detail FROM fresh ORDER BY ord
             )
             SELECT partition, id FROM done"
        ))
        .bind(jobs.iter().map(|j| j.0 as i32).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| j.1).collect::<Vec<_>>())
        .bind(parks.iter().map(|p| p.partition as i32).collect::<Vec<_>>())
        .bind(parks.iter().map(|p| p.outbox_id).collect::<Vec<_>>())
        .bind(parks.iter().map(|p| p.receipt_id).collect::<Vec<_>>())
        .bind(parks.iter().map(|p| p.raw.as_slice()).collect::<Vec<_>>())
        .bind(parks.iter().map(|p| p.reason.as_str()).collect::<Vec<_>>())
        .bind(holds.iter().map(|h| h.partition as i32).collect::<Vec<_>>())
        .bind(holds.iter().map(|h| h.outbox_id).collect::<Vec<_>>())
        .bind(holds.iter().map(|h| h.receipt_id).collect::<Vec<_>>())
        .bind(holds.iter().map(|h| h.gateway.as_str()).collect::<Vec<_>>())
        .bind(
            holds
                .iter()
                .map(|h| h.provider_id.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(holds.iter().map(|h| h.provider_time).collect::<Vec<_>>())
        .bind(holds.iter().map(|h| h.superseding).collect::<Vec<_>>())
        .bind(
            applies
                .iter()
                .map(|r| r.partition as i32)
                .collect::<Vec<_>>(),
        )
        .bind(applies.iter().map(|r| r.outbox_id).collect::<Vec<_>>())
        .bind(applies.iter().map(|r| r.message_id).collect::<Vec<_>>())
        .bind(applies.iter().map(|r| r.state.as_str()).collect::<Vec<_>>())
        .bind(applies.iter().map(|r| Json(&r.detail)).collect::<Vec<_>>())
        .fetch_all(pool),
    )
    .await?;
    Ok(done
        .into_iter()
        .map(|(partition, id)| (partition as u32, id))
        .collect())
}

/// Applies a mapped receipt: the status job's outbox row becomes DONE and the state is appended
/// to the message's history, in one statement; a final state ends the wait for a receipt.
/// Returns false when another copy of the job got there first. [`apply_receipts`] for one.
pub async fn apply_receipt(
    pool: &PgPool,
    partition: u32,
    outbox_id: i64,
    message_id: Uuid,
    state: MessageState,
    detail: serde_json::Value,
) -> Result<bool, StoreError> {
    let receipt = ReceiptToApply {
        partition,
        outbox_id,
        message_id,
        state,
        detail,
    };
    Ok(!apply_receipts(pool, &[receipt]).await?.is_empty())
}

/// A parked item, for operators.
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct Parked {
    pub id: i64,
    pub job_type: String,
    pub receipt_id: Option<i64>,
    pub gateway: Option<String>,
    /// The raw body as text (lossy for non-UTF-8 bytes; the bytes are kept as they came).
    pub raw: String,
    pub reason: String,
    pub parked_at: DateTime<Utc>,
}

/// Parked items not replayed yet with an id above `after` (0: from the first), oldest first,
/// at most `limit`.
pub async fn list_parked(pool: &PgPool, after: i64, limit: i64) -> Result<Vec<Parked>, StoreError> {
    let rows: Vec<ParkedRow> = sqlx::query_as(
        "SELECT p.id, p.job_type, p.receipt_id, r.gateway, p.raw, p.reason, p.parked_at
         FROM parking p LEFT JOIN receipts r ON r.id = p.receipt_id
         WHERE p.replayed_at IS NULL AND p.id > $2 ORDER BY p.id LIMIT $1",
    )
    .bind(limit)
    .bind(after)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| Parked {
            id: row.id,
            job_type: row.job_type,
            receipt_id: row.receipt_id,
            gateway: row.gateway,
            raw: String::from_utf8_lossy(&row.raw).into_owned(),
            reason: row.reason,
            parked_at: row.parked_at,
        })
        .collect())
}

#[derive(sqlx::FromRow)]
struct ParkedRow {
    id: i64,
    job_type: String,
    receipt_id: Option<i64>,
    gateway: Option<String>,
    raw: Vec<u8>,
    reason: String,
    parked_at: DateTime<Utc>,
}

/// What an operator's replay did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// A new job was queued for the parked input.
    Queued {
        outbox_id: i64,
    },
    NotFound,
    AlreadyReplayed,
    /// Only parked receipts can be replayed.
    NotReplayable,
}

/// Queues the parked receipt again (after its mapping was fixed) and marks the item replayed,
/// in one transaction. `partition_of` routes the receipt like the receipts endpoint does.
pub async fn replay_parked(
    pool: &PgPool,
    id: i64,
    partition_of: impl Fn(&str, &[u8]) -> u32,
) -> Result<Replay, StoreError> {
    let mut tx = pool.begin().await?;
    let row: Option<(Option<i64>, bool)> = sqlx::query_as(
        "SELECT receipt_id, replayed_at IS NOT NULL FROM parking WHERE id = $1 FOR UPDATE",
    )
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
    let receipt_id = match row {
        None => return Ok(Replay::NotFound),
        Some((_, true)) => return Ok(Replay::AlreadyReplayed),
        Some((None, false)) => return Ok(Replay::NotReplayable),
        Some((Some(receipt_id), false)) => receipt_id,
    };
    let (gateway, raw): (String, Vec<u8>) =
        sqlx::query_as("SELECT gateway, raw FROM receipts WHERE id = $1")
            .bind(receipt_id)
            .fetch_one(&mut *tx)
            .await?;
    let partition = partition_of(&gateway, &raw);
    sqlx::query("UPDATE parking SET replayed_at = now() WHERE id = $1")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    let outbox_id: i64 = sqlx::query_scalar(
        "INSERT INTO outbox (partition, job_type, payload)
         VALUES ($1, $2, jsonb_build_object('receipt_id', $3::bigint, 'replay_of', $4::bigint))
         RETURNING id",
    )
    .bind(partition as i32)
    .bind(JobType::Status.as_str())
    .bind(receipt_id)
    .bind(id)
    .fetch_one(&mut *tx)
    .await?;
    crate::accept::notify_partitions(&mut tx, &[partition as i32]).await?;
    tx.commit().await?;
    Ok(Replay::Queued { outbox_id })
}

/// Reconciliation of silent gateways (rule R7) for messages accepted by an earlier release,
/// which kept them in `awaiting_receipt`: those accepted longer than `window` ago get
/// UNKNOWN unless a final receipt (or UNKNOWN) came since, at most `limit` per call; their
/// rows are deleted either way. Never FAILED, never UNDELIVERED: nobody knows. Returns how
/// many became UNKNOWN, and whether rows are left. [`reconcile_ledger`] reconciles the rest.
pub async fn mark_silent_unknown(
    pool: &PgPool,
    window: Duration,
    limit: i64,
) -> Result<(u64, bool), StoreError> {
    let (marked, taken): (i64, i64) = measured(
        Operation::Reconcile,
        sqlx::query_as(concat!(
            "WITH silent AS (
                 DELETE FROM awaiting_receipt
                 WHERE message_id = ANY(ARRAY(
                     SELECT message_id FROM awaiting_receipt
                     WHERE accepted_at < now() - make_interval(secs => $1)
                     ORDER BY accepted_at LIMIT $2
                     FOR UPDATE SKIP LOCKED))
                 RETURNING message_id, accepted_at
             ), marked AS (",
            mark_unknown!("silent", "accepted_at"),
            ")
             SELECT (SELECT count(*) FROM marked), (SELECT count(*) FROM silent)"
        ))
        .bind(window.as_secs_f64())
        .bind(limit)
        .fetch_one(pool),
    )
    .await?;
    Ok((marked as u64, taken >= limit))
}

/// The moment up to which every ledger row is committed: the clock, read before the
/// transactions writing the ledger at that moment (found in `pg_locks`, which every role may
/// read) have ended. A ledger row's `created_at` is the clock when its statement, holding its
/// lock on the ledger, wrote it; so a row created before that moment whose transaction had
/// not ended is among those waited for. `None` when they did not end within `wait`.
pub async fn ledger_committed_up_to(
    pool: &PgPool,
    wait: Duration,
) -> Result<Option<DateTime<Utc>>, StoreError> {
    let moment: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(pool)
        .await?;
    let writers: Vec<String> = sqlx::query_scalar(
        "SELECT virtualtransaction FROM pg_locks
         WHERE locktype = 'relation' AND relation = 'ledger'::regclass
           AND mode = 'RowExclusiveLock' AND granted AND pid <> pg_backend_pid()",
    )
    .fetch_all(pool)
    .await?;
    let deadline = tokio::time::Instant::now() + wait;
    let mut writers = writers;
    while !writers.is_empty() {
        writers = sqlx::query_scalar(
            "SELECT virtualxid FROM pg_locks
             WHERE locktype = 'virtualxid' AND virtualxid = ANY($1) AND granted",
        )
        .bind(&writers)
        .fetch_all(pool)
        .await?;
        if writers.is_empty() {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(Some(moment))
}

/// Reconciliation of silent gateways (rule R7): looks at the ledger rows created since the
/// last pass (`reconcile_watermark`) up to `cutoff` — at most about `limit` of them, oldest
/// first — and appends UNKNOWN to each whose message has neither a final receipt nor UNKNOWN,
/// then moves the watermark past them; in one statement, under the watermark's row lock (a
/// worker that finds it locked does nothing). `cutoff` must be no later than
/// [`ledger_committed_up_to`] minus the window, so no row below it can still appear. Returns
/// how many became UNKNOWN, and whether rows up to `cutoff` are left.
pub async fn reconcile_ledger(
    pool: &PgPool,
    cutoff: DateTime<Utc>,
    limit: i64,
) -> Result<(u64, bool), StoreError> {
    let (marked, looked, locked): (i64, i64, bool) = measured(
        Operation::Reconcile,
        sqlx::query_as(concat!(
            "WITH mark AS (
                 SELECT reconciled_to FROM reconcile_watermark LIMIT 1 FOR UPDATE SKIP LOCKED
             ), bound AS (
                 SELECT coalesce(
                     (SELECT l.created_at FROM ledger l
                      WHERE l.created_at > mark.reconciled_to AND l.created_at <= $1
                      ORDER BY l.created_at OFFSET $2 - 1 LIMIT 1),
                     $1) AS upto,
                     mark.reconciled_to AS since
                 FROM mark
             ), candidates AS (
                 SELECT l.message_id, l.created_at FROM ledger l, bound
                 WHERE l.created_at > bound.since AND l.created_at <= bound.upto
             ), marked AS (",
            mark_unknown!("candidates", "created_at"),
            "), moved AS (
                 UPDATE reconcile_watermark w SET reconciled_to = bound.upto
                 FROM bound WHERE bound.upto > w.reconciled_to
             )
             SELECT (SELECT count(*) FROM marked), (SELECT count(*) FROM candidates),
                    EXISTS (SELECT 1 FROM mark)"
        ))
        .bind(cutoff)
        .bind(limit)
        .fetch_one(pool),
    )
    .await?;
    Ok((marked as u64, locked && looked >= limit))
}
