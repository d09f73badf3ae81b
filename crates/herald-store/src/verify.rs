//! The database side of the proof: what PostgreSQL knows of each accepted message, and the
//! findings no single message shows (parked input, unfinished receipts, outbox rows that went
//! missing). [`gather`] and [`conclude`] join them with the provider's record into a
//! [`herald_core::verdict::Verdict`]; the verdict itself is decided in herald-core.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use herald_core::verdict::{
    classify, message_of_effect_key, Evidence, Expectations, FailureCause, Finding, ProviderView,
    Verdict,
};
use herald_core::{send_effect_key, MessageState};
use sqlx::PgPool;
use uuid::Uuid;

use crate::StoreError;

/// What PostgreSQL knows about one message.
#[derive(Debug, Clone, Default)]
pub struct MessageFacts {
    /// `messages.created_at`: the accept transaction.
    pub created_at: Option<DateTime<Utc>>,
    /// Idempotency keys of its ledger rows (its effects).
    pub ledger_keys: Vec<String>,
    /// Its current state: the highest-ranked event; `None` while it has no event (QUEUED).
    pub state: Option<MessageState>,
    /// Its send outbox row is DEAD.
    pub dead: bool,
    /// It has a FAILED event, with this cause.
    pub failure: Option<FailureCause>,
    /// The first ACCEPTED event.
    pub accepted_at: Option<DateTime<Utc>>,
}

impl MessageFacts {
    /// The evidence for the verdict, with what the provider knows of the message's key.
    pub fn evidence(&self, provider: ProviderView) -> Evidence {
        Evidence {
            in_database: self.created_at.is_some(),
            ledger_keys: self.ledger_keys.clone(),
            state: self.state,
            dead: self.dead,
            failure: self.failure,
            provider_submits: provider.submits,
            provider_final: provider.final_receipt,
        }
    }
}

#[derive(sqlx::FromRow)]
struct FactRow {
    id: Uuid,
    created_at: DateTime<Utc>,
    keys: Vec<String>,
    state: Option<String>,
    dead: bool,
    failure: Option<String>,
    accepted_at: Option<DateTime<Utc>>,
}

const FACTS: &str = "
SELECT m.id, m.created_at,
       ARRAY(SELECT l.idempotency_key FROM ledger l WHERE l.message_id = m.id) AS keys,
       (SELECT e.state FROM message_events e WHERE e.message_id = m.id
        ORDER BY herald_state_rank(e.state) DESC,
                 (e.detail->>'provider_time')::timestamptz DESC NULLS LAST, e.seq DESC
        LIMIT 1) AS state,
       -- Through the partial index on DEAD rows: the outbox has no index on message_id.
       m.id IN (SELECT o.message_id FROM outbox o
                WHERE o.status = 'DEAD' AND o.job_type = 'send') AS dead,
       (SELECT coalesce(e.detail->>'cause', 'other') FROM message_events e
        WHERE e.message_id = m.id AND e.state = 'FAILED' ORDER BY e.seq DESC LIMIT 1) AS failure,
       (SELECT min(e.at) FROM message_events e
        WHERE e.message_id = m.id AND e.state = 'ACCEPTED') AS accepted_at
FROM messages m WHERE m.id = ANY($1)";

/// Looks up `ids` in PostgreSQL, 5,000 at a time. An id the database does not have is absent
/// from the answer.
pub async fn message_facts(
    pool: &PgPool,
    ids: &[Uuid],
) -> Result<HashMap<Uuid, MessageFacts>, StoreError> {
    let mut out: HashMap<Uuid, MessageFacts> = HashMap::with_capacity(ids.len());
    for chunk in ids.chunks(5000) {
        let rows: Vec<FactRow> = sqlx::query_as(FACTS).bind(chunk).fetch_all(pool).await?;
        for row in rows {
            let state = match row.state {
                Some(state) => Some(state.parse().map_err(
                    |err: herald_core::state::UnknownState| StoreError::Corrupt(err.to_string()),
                )?),
                None => None,
            };
            out.insert(
                row.id,
                MessageFacts {
                    created_at: Some(row.created_at),
                    ledger_keys: row.keys,
                    state,
                    dead: row.dead,
                    failure: row.failure.map(|cause| match cause.as_str() {
                        "content" => FailureCause::Content,
                        _ => FailureCause::Other,
                    }),
                    accepted_at: row.accepted_at,
                },
            );
        }
    }
    Ok(out)
}

/// Every message id in the database.
pub async fn all_message_ids(pool: &PgPool) -> Result<Vec<Uuid>, StoreError> {
    Ok(sqlx::query_scalar("SELECT id FROM messages")
        .fetch_all(pool)
        .await?)
}

/// The ids among `ids` that the database has.
async fn existing(pool: &PgPool, ids: &[Uuid]) -> Result<HashSet<Uuid>, StoreError> {
    let mut out = HashSet::with_capacity(ids.len());
    for chunk in ids.chunks(5000) {
        let found: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM messages WHERE id = ANY($1)")
            .bind(chunk)
            .fetch_all(pool)
            .await?;
        out.extend(found);
    }
    Ok(out)
}

/// Counts of what no single message shows, over the whole database.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DatabaseFindings {
    /// Parked items not replayed.
    pub parked: u64,
    /// Status outbox rows not DONE.
    pub receipts_unfinished: u64,
    /// Messages without their send outbox row plus receipts no status outbox row names.
    pub outbox_rows_missing: u64,
    /// Events, ledger rows and in-flight claims whose message is not in `messages`.
    pub history_without_message: u64,
}

/// Reads the findings. The outbox check is behavioural proof of rule R3: every message has
/// its send row and every receipt its status row for as long as the database holds them.
pub async fn database_findings(pool: &PgPool) -> Result<DatabaseFindings, StoreError> {
    let (parked, unfinished, messages_without, receipts_without, history_without): (
        i64,
        i64,
        i64,
        i64,
        i64,
    ) = sqlx::query_as(
        "SELECT
                 (SELECT count(*) FROM parking WHERE replayed_at IS NULL),
                 (SELECT count(*) FROM outbox WHERE job_type = 'status' AND status <> 'DONE'),
                 -- A send row may be gone once DONE (retention, crate::retention): then
                 -- a worker took it, and the history shows more than QUEUED.
                 (SELECT count(*) FROM messages m
                  WHERE NOT EXISTS (SELECT 1 FROM outbox o
                                    WHERE o.message_id = m.id AND o.job_type = 'send')
                    AND NOT EXISTS (SELECT 1 FROM message_events e
                                    WHERE e.message_id = m.id AND e.state <> 'QUEUED')),
                 (WITH named AS (
                      SELECT (o.payload->>'receipt_id')::bigint AS id FROM outbox o
                      WHERE o.job_type = 'status' AND o.payload ? 'receipt_id'
                      UNION ALL
                      SELECT jsonb_array_elements_text(o.payload->'receipt_ids')::bigint
                      FROM outbox o
                      WHERE o.job_type = 'status' AND o.payload ? 'receipt_ids'
                  )
                  -- NOT EXISTS, not NOT IN: one job naming a null id would make NOT IN
                  -- unknown for every receipt, and the check could never fail.
                  -- A DONE status row may be gone (retention): a receipt received until some
                  -- partition's outbox retention passed its time is not counted (its status
                  -- row, written with the receipt, is in a partition the proof cannot tell).
                  SELECT count(*) FROM receipts r
                  WHERE NOT EXISTS (SELECT 1 FROM named n WHERE n.id = r.id)
                    AND r.received_at > coalesce(
                        (SELECT max(c.passed_at) FROM retention_cursors c
                         WHERE c.name LIKE 'outbox:%'), '-infinity')),
                 -- The history's rows carry no foreign key to their message (migration
                 -- 0011): this is the check that stands for one.
                 (SELECT count(*) FROM (
                      SELECT message_id FROM message_events
                      UNION ALL SELECT message_id FROM ledger
                      UNION ALL SELECT message_id FROM in_flight_sends
                      UNION ALL SELECT message_id FROM awaiting_receipt
                  ) h
                  WHERE NOT EXISTS (SELECT 1 FROM messages m WHERE m.id = h.message_id))",
    )
    .fetch_one(pool)
    .await?;
    Ok(DatabaseFindings {
        parked: parked as u64,
        receipts_unfinished: unfinished as u64,
        outbox_rows_missing: (messages_without + receipts_without) as u64,
        history_without_message: history_without as u64,
    })
}

/// Classifies every id (once) from its facts and the provider's view of its effect key.
pub fn tally(
    ids: &[Uuid],
    facts: &HashMap<Uuid, MessageFacts>,
    provider: &HashMap<String, ProviderView>,
    expected: Expectations,
) -> Verdict {
    let mut verdict = Verdict::new(expected);
    let absent = MessageFacts::default();
    let mut seen = HashSet::with_capacity(ids.len());
    for id in ids.iter().filter(|id| seen.insert(**id)) {
        let fact = facts.get(id).unwrap_or(&absent);
        let view = provider
            .get(&send_effect_key(*id))
            .copied()
            .unwrap_or_default();
        let fate = classify(*id, &fact.evidence(view));
        verdict.add(*id, fate, fact.state);
    }
    verdict
}

/// What [`gather`] read of the messages a proof covers.
#[derive(Debug, Clone, Default)]
pub struct Gathered {
    /// Every id once.
    pub ids: Vec<Uuid>,
    pub facts: HashMap<Uuid, MessageFacts>,
}

/// Reads the facts of `ids` (every message in the database when `None`). A proof reads the
/// database *before* the provider's record: that record only grows, and every ledger row was
/// written after its submit, so no effect read here can be missing from a later snapshot of
/// the provider (read the other way round, a row written in between looks unsubmitted).
pub async fn gather(pool: &PgPool, ids: Option<&[Uuid]>) -> Result<Gathered, StoreError> {
    let ids: Vec<Uuid> = match ids {
        Some(ids) => {
            let mut seen = HashSet::with_capacity(ids.len());
            ids.iter().copied().filter(|id| seen.insert(*id)).collect()
        }
        None => all_message_ids(pool).await?,
    };
    let facts = message_facts(pool, &ids).await?;
    Ok(Gathered { ids, facts })
}

/// The verdict over what [`gather`] read and the provider's record per effect key (read
/// after it), with the findings over the whole database.
pub async fn conclude(
    pool: &PgPool,
    gathered: &Gathered,
    provider: &HashMap<String, ProviderView>,
    expected: Expectations,
) -> Result<Verdict, StoreError> {
    let mut verdict = tally(&gathered.ids, &gathered.facts, provider, expected);
    // The other direction: every effect the provider took belongs to a message.
    let mut named = Vec::with_capacity(provider.len());
    let mut unnamed = 0u64;
    for key in provider.keys() {
        match message_of_effect_key(key) {
            Some(id) => named.push(id),
            None => unnamed += 1,
        }
    }
    let known = existing(pool, &named).await?;
    // A message the retention removed (crate::retention) is gone with its ledger row; its
    // effect is not an orphan. The message cursor has passed every id it removed.
    let removed_up_to: Option<String> =
        sqlx::query_scalar("SELECT after FROM retention_cursors WHERE name = 'messages'")
            .fetch_optional(pool)
            .await?;
    let removed_up_to = removed_up_to.and_then(|id| id.parse::<Uuid>().ok());
    let orphans = unnamed
        + named
            .iter()
            .filter(|id| !known.contains(id) && removed_up_to.is_none_or(|upto| **id > upto))
            .count() as u64;
    let findings = database_findings(pool).await?;
    verdict.set_finding(Finding::OrphanEffects, orphans);
    verdict.set_finding(Finding::Parked, findings.parked);
    verdict.set_finding(Finding::ReceiptsUnfinished, findings.receipts_unfinished);
    verdict.set_finding(Finding::OutboxRowsMissing, findings.outbox_rows_missing);
    verdict.set_finding(
        Finding::HistoryWithoutMessage,
        findings.history_without_message,
    );
    Ok(verdict)
}
