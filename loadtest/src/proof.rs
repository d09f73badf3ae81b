//! The proof, message by message: every id the API answered 2xx for is classified against
//! PostgreSQL and the provider simulator's own record (its submits and the receipts it sent)
//! by `herald_core::verdict`, the same decision `herald verify` makes. A message is right
//! when it was delivered (its one effect at the provider and in the ledger, the final state
//! the provider sent) or rejected for its own content; every other end — DEAD, UNKNOWN, a
//! parked receipt, FAILED for a provider-side reason, still on its way, missing, doubled —
//! fails the run unless the run declared it (`--expect dead=5`), and some ends (doubled, DEAD
//! or UNKNOWN with a provider effect, a wrong final state) fail it whatever is declared.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use herald_core::verdict::{Expectations, Fate, ProviderView, Verdict};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

/// What PostgreSQL knows about one message (herald-store runs the statements).
pub use herald_store::verify::MessageFacts as Facts;

/// Looks up `ids` in PostgreSQL, 5,000 at a time.
pub async fn facts(pool: &PgPool, ids: &[Uuid]) -> anyhow::Result<HashMap<Uuid, Facts>> {
    Ok(herald_store::verify::message_facts(pool, ids).await?)
}

/// The proof of one run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proof {
    /// Distinct ids the API answered 2xx for.
    pub accepted: u64,
    /// Delivered: the effect once, at the provider and in the ledger, with the provider's
    /// final state.
    pub delivered: u64,
    /// Answered 2xx and not delivered, rejected or in a declared class: missing in the
    /// database, missing at the provider, or never settled.
    pub lost: u64,
    /// Submits of a key the provider had seen before (allowed: a retry carries the same key).
    pub duplicate_provider_submits: u64,
    /// Idempotent replays whose answer named a different id than the first (a retry became a
    /// second message): counted as doubled.
    pub replay_mismatches: u64,
    /// Every message's fate and the findings, with what the run expected (empty in reports
    /// written before the verdict existed).
    #[serde(default)]
    pub verdict: Verdict,
}

impl Proof {
    /// The proof from the verdict over the run's ids.
    pub fn new(
        verdict: Verdict,
        provider: &HashMap<String, ProviderView>,
        replay_mismatches: u64,
    ) -> Self {
        Proof {
            accepted: verdict.messages,
            delivered: verdict.count(Fate::Delivered),
            lost: verdict.lost(),
            duplicate_provider_submits: provider
                .values()
                .map(|v| v.submits.saturating_sub(1))
                .sum(),
            replay_mismatches,
            verdict,
        }
    }

    /// Messages that had an effect twice, or a replay that became a second message.
    pub fn doubled(&self) -> u64 {
        self.verdict.doubled() + self.replay_mismatches
    }

    /// Every message where it should be, nothing doubled.
    pub fn ok(&self) -> bool {
        self.verdict.ok() && self.replay_mismatches == 0
    }

    /// The process exit status the proof asks for: 1 when anything is wrong.
    pub fn exit_code(&self) -> i32 {
        if self.ok() {
            0
        } else {
            1
        }
    }
}

/// Builds the proof over `ids`: PostgreSQL's facts, the simulator's record, the findings.
pub async fn prove(
    pool: &PgPool,
    ids: &[Uuid],
    sim_url: &str,
    expected: Expectations,
    replay_mismatches: u64,
) -> anyhow::Result<(Proof, HashMap<Uuid, Facts>)> {
    // The database first, then the provider: see `herald_store::verify::gather`.
    let gathered = herald_store::verify::gather(pool, Some(ids)).await?;
    let provider = provider_views(sim_url).await?;
    let verdict = herald_store::verify::conclude(pool, &gathered, &provider, expected).await?;
    Ok((
        Proof::new(verdict, &provider, replay_mismatches),
        gathered.facts,
    ))
}

/// The provider simulator's record per effect key (`GET /v1/effects`, the same record
/// `herald verify` reads).
pub async fn provider_views(sim_url: &str) -> anyhow::Result<HashMap<String, ProviderView>> {
    Ok(herald_provider_sim::fetch_provider_views(sim_url, Duration::from_secs(120)).await?)
}

/// The first submit time of every key in the simulator's submit log (JSON lines), for the
/// accept → provider submit latency.
pub fn first_submits(log: &std::path::Path) -> anyhow::Result<HashMap<String, DateTime<Utc>>> {
    #[derive(Deserialize)]
    struct Line {
        key: String,
        at: DateTime<Utc>,
        n: u64,
    }
    let text = std::fs::read_to_string(log)?;
    let mut first = HashMap::new();
    for line in text.lines() {
        // A torn last line (the simulator killed mid-write) is skipped, as the simulator does.
        let Ok(line) = serde_json::from_str::<Line>(line) else {
            continue;
        };
        if line.n == 1 {
            first.entry(line.key).or_insert(line.at);
        }
    }
    Ok(first)
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::verdict::ProviderFinal;
    use herald_core::{send_effect_key, MessageState};
    use herald_store::verify::tally;

    /// `n` messages delivered with receipts, as the database and the provider would show them.
    fn setup(
        n: usize,
    ) -> (
        Vec<Uuid>,
        HashMap<Uuid, Facts>,
        HashMap<String, ProviderView>,
    ) {
        let ids: Vec<Uuid> = (0..n).map(|_| Uuid::now_v7()).collect();
        let facts = ids
            .iter()
            .map(|id| {
                let fact = Facts {
                    created_at: Some(Utc::now()),
                    ledger_keys: vec![send_effect_key(*id)],
                    state: Some(MessageState::Delivered),
                    accepted_at: Some(Utc::now()),
                    ..Facts::default()
                };
                (*id, fact)
            })
            .collect();
        let provider = ids
            .iter()
            .map(|id| {
                let view = ProviderView {
                    submits: 1,
                    final_receipt: ProviderFinal::Final(MessageState::Delivered),
                };
                (send_effect_key(*id), view)
            })
            .collect();
        (ids, facts, provider)
    }

    fn proof(
        ids: &[Uuid],
        facts: &HashMap<Uuid, Facts>,
        provider: &HashMap<String, ProviderView>,
        expected: &str,
    ) -> Proof {
        let verdict = tally(ids, facts, provider, expected.parse().unwrap());
        Proof::new(verdict, provider, 0)
    }

    #[test]
    fn everything_delivered_once_is_ok() {
        let (ids, facts, mut provider) = setup(10);
        // A retried submit with the same key is allowed and counted.
        provider.get_mut(&send_effect_key(ids[3])).unwrap().submits = 2;
        let proof = proof(&ids, &facts, &provider, "");
        assert_eq!((proof.accepted, proof.delivered, proof.lost), (10, 10, 0));
        assert_eq!(proof.duplicate_provider_submits, 1);
        assert_eq!(proof.exit_code(), 0);
    }

    #[test]
    fn an_id_missing_from_the_provider_record_is_lost_and_fails_the_run() {
        let (ids, facts, mut provider) = setup(10);
        provider.remove(&send_effect_key(ids[7]));
        let proof = proof(&ids, &facts, &provider, "");
        assert_eq!(proof.lost, 1);
        assert_eq!(proof.verdict.count(Fate::MissingAtProvider), 1);
        assert_eq!(proof.verdict.examples["missing_at_provider"], vec![ids[7]]);
        assert_eq!(proof.delivered, 9);
        assert_eq!(proof.exit_code(), 1);
    }

    #[test]
    fn an_id_the_database_never_saw_is_lost() {
        let (ids, mut facts, provider) = setup(3);
        facts.remove(&ids[0]);
        let proof = proof(&ids, &facts, &provider, "");
        assert_eq!((proof.lost, proof.verdict.count(Fate::Missing)), (1, 1));
        assert!(!proof.ok());
    }

    #[test]
    fn two_ledger_rows_or_a_replay_with_a_new_id_are_doubled() {
        let (ids, mut facts, provider) = setup(3);
        facts
            .get_mut(&ids[1])
            .unwrap()
            .ledger_keys
            .push("again".to_owned());
        let doubled = proof(&ids, &facts, &provider, "");
        assert_eq!((doubled.doubled(), doubled.lost), (1, 0));
        assert_eq!(doubled.exit_code(), 1);
        let (ids, facts, provider) = setup(3);
        let verdict = tally(&ids, &facts, &provider, Expectations::default());
        assert_eq!(Proof::new(verdict, &provider, 1).exit_code(), 1);
    }

    #[test]
    fn dead_without_a_provider_call_fails_the_run_unless_declared() {
        let (ids, mut facts, mut provider) = setup(3);
        let fact = facts.get_mut(&ids[0]).unwrap();
        fact.ledger_keys.clear();
        fact.dead = true;
        fact.state = Some(MessageState::Dead);
        provider.remove(&send_effect_key(ids[0]));
        let undeclared = proof(&ids, &facts, &provider, "");
        assert_eq!(undeclared.verdict.count(Fate::Dead), 1);
        assert_eq!(
            undeclared.exit_code(),
            1,
            "DEAD is not an outcome a user accepts"
        );
        assert_eq!(proof(&ids, &facts, &provider, "dead=1").exit_code(), 0);
        assert_eq!(proof(&ids, &facts, &provider, "dead=2").exit_code(), 1);
    }

    #[test]
    fn dead_with_a_provider_effect_fails_even_when_dead_is_declared() {
        let (ids, mut facts, provider) = setup(3);
        let fact = facts.get_mut(&ids[2]).unwrap();
        fact.ledger_keys.clear();
        fact.dead = true;
        let proof = proof(&ids, &facts, &provider, "dead=1");
        assert_eq!(proof.verdict.count(Fate::DeadWithEffect), 1);
        assert_eq!(proof.exit_code(), 1);
    }

    #[test]
    fn a_final_state_other_than_the_provider_s_fails_the_run() {
        let (ids, facts, mut provider) = setup(2);
        provider
            .get_mut(&send_effect_key(ids[0]))
            .unwrap()
            .final_receipt = ProviderFinal::Final(MessageState::Undelivered);
        let proof = proof(&ids, &facts, &provider, "");
        assert_eq!(proof.verdict.count(Fate::WrongFinalState), 1);
        assert_eq!(proof.exit_code(), 1);
    }
}
