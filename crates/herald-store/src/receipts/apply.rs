//! Applying receipts to their messages and finishing status jobs, a batch in one statement.

use super::*;

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
