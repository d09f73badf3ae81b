//! The proof that nothing was lost or doubled, message by message: every id the API answered
//! 2xx for is looked up in PostgreSQL and in the provider simulator's own record of submits.
//!
//! A message is delivered when it has a ledger row *and* the provider recorded a submit with
//! its effect key; DEAD and FAILED are visible outcomes, not losses; anything else is lost.
//! A message with more than one ledger row is a duplicate effect. Both must be 0.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

/// What PostgreSQL knows about one message (herald-store runs the statements).
pub use herald_store::verify::MessageFacts as Facts;

/// Looks up `ids` in PostgreSQL, 5,000 at a time.
pub async fn facts(pool: &PgPool, ids: &[Uuid]) -> anyhow::Result<HashMap<Uuid, Facts>> {
    Ok(herald_store::verify::message_facts(pool, ids).await?)
}

/// The counts of the proof. `lost` and `duplicate_effects` must be 0.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proof {
    /// Distinct ids the API answered 2xx for.
    pub accepted: u64,
    /// A ledger row and a provider submit for its effect key.
    pub delivered: u64,
    pub lost: u64,
    /// Of the lost: the API answered 2xx but PostgreSQL has no such message.
    pub lost_missing_in_database: u64,
    /// Of the lost: the provider has no submit with the message's effect key.
    pub lost_missing_at_provider: u64,
    /// Of the lost: the provider has it but no ledger row, DEAD or FAILED was recorded.
    pub lost_without_outcome: u64,
    /// Messages with more than one ledger row.
    pub duplicate_effects: u64,
    /// Submits of a key the provider had seen before (allowed: a retry carries the same key).
    pub duplicate_provider_submits: u64,
    pub dead: u64,
    pub failed: u64,
    pub unknown: u64,
    /// Idempotent replays whose answer named a different id than the first (a retry became a
    /// second message): counted as doubled.
    pub replay_mismatches: u64,
    /// Up to 20 lost ids, to start an investigation.
    pub lost_sample: Vec<Uuid>,
}

impl Proof {
    /// Builds the proof from the facts of each id and the provider's submit count per key.
    pub fn build(
        ids: &[Uuid],
        facts: &HashMap<Uuid, Facts>,
        provider: &HashMap<String, u64>,
        replay_mismatches: u64,
    ) -> Self {
        let mut proof = Proof {
            replay_mismatches,
            ..Proof::default()
        };
        let mut seen = HashSet::new();
        for id in ids.iter().filter(|id| seen.insert(**id)) {
            proof.accepted += 1;
            let key = herald_core::idempotency::send_effect_key(*id);
            let submits = provider.get(&key).copied().unwrap_or(0);
            proof.duplicate_provider_submits += submits.saturating_sub(1);
            let Some(fact) = facts.get(id).filter(|f| f.created_at.is_some()) else {
                proof.lost += 1;
                proof.lost_missing_in_database += 1;
                proof.sample(*id);
                continue;
            };
            if fact.effects > 1 {
                proof.duplicate_effects += 1;
            }
            proof.unknown += u64::from(fact.unknown);
            if fact.effects > 0 && submits > 0 {
                proof.delivered += 1;
            } else if fact.dead {
                proof.dead += 1;
            } else if fact.failed {
                proof.failed += 1;
            } else {
                proof.lost += 1;
                if submits == 0 {
                    proof.lost_missing_at_provider += 1;
                } else {
                    proof.lost_without_outcome += 1;
                }
                proof.sample(*id);
            }
        }
        proof
    }

    fn sample(&mut self, id: Uuid) {
        if self.lost_sample.len() < 20 {
            self.lost_sample.push(id);
        }
    }

    /// Messages that had an effect twice, or a replay that became a second message.
    pub fn doubled(&self) -> u64 {
        self.duplicate_effects + self.replay_mismatches
    }

    /// Nothing lost, nothing doubled.
    pub fn ok(&self) -> bool {
        self.lost == 0 && self.doubled() == 0
    }

    /// The process exit status the proof asks for: 1 when anything was lost or doubled.
    pub fn exit_code(&self) -> i32 {
        if self.ok() {
            0
        } else {
            1
        }
    }
}

/// The provider simulator's submit count per idempotency key (`GET /v1/submits`, the same
/// record `herald verify` reads).
pub async fn provider_submits(sim_url: &str) -> anyhow::Result<HashMap<String, u64>> {
    herald_provider_sim::fetch_submit_counts(sim_url, Duration::from_secs(120)).await
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

    fn delivered() -> Facts {
        Facts {
            created_at: Some(Utc::now()),
            effects: 1,
            accepted_at: Some(Utc::now()),
            ..Facts::default()
        }
    }

    fn setup(n: usize) -> (Vec<Uuid>, HashMap<Uuid, Facts>, HashMap<String, u64>) {
        let ids: Vec<Uuid> = (0..n).map(|_| Uuid::now_v7()).collect();
        let facts = ids.iter().map(|id| (*id, delivered())).collect();
        let provider = ids
            .iter()
            .map(|id| (herald_core::idempotency::send_effect_key(*id), 1))
            .collect();
        (ids, facts, provider)
    }

    #[test]
    fn everything_delivered_once_is_ok() {
        let (ids, facts, mut provider) = setup(10);
        // A retried submit with the same key is allowed and counted.
        provider.insert(herald_core::idempotency::send_effect_key(ids[3]), 2);
        let proof = Proof::build(&ids, &facts, &provider, 0);
        assert_eq!((proof.accepted, proof.delivered, proof.lost), (10, 10, 0));
        assert_eq!(proof.duplicate_provider_submits, 1);
        assert_eq!(proof.exit_code(), 0);
    }

    #[test]
    fn an_id_missing_from_the_provider_record_is_lost_and_fails_the_run() {
        let (ids, facts, mut provider) = setup(10);
        provider.remove(&herald_core::idempotency::send_effect_key(ids[7]));
        let proof = Proof::build(&ids, &facts, &provider, 0);
        assert_eq!(proof.lost, 1);
        assert_eq!(proof.lost_missing_at_provider, 1);
        assert_eq!(proof.lost_sample, vec![ids[7]]);
        assert_eq!(proof.delivered, 9);
        assert_eq!(proof.exit_code(), 1);
    }

    #[test]
    fn an_id_the_database_never_saw_is_lost() {
        let (ids, mut facts, provider) = setup(3);
        facts.remove(&ids[0]);
        let proof = Proof::build(&ids, &facts, &provider, 0);
        assert_eq!((proof.lost, proof.lost_missing_in_database), (1, 1));
        assert!(!proof.ok());
    }

    #[test]
    fn two_ledger_rows_or_a_replay_with_a_new_id_are_doubled() {
        let (ids, mut facts, provider) = setup(3);
        facts.get_mut(&ids[1]).unwrap().effects = 2;
        let proof = Proof::build(&ids, &facts, &provider, 0);
        assert_eq!((proof.duplicate_effects, proof.lost), (1, 0));
        assert_eq!(proof.exit_code(), 1);
        let (ids, facts, provider) = setup(3);
        assert_eq!(Proof::build(&ids, &facts, &provider, 1).exit_code(), 1);
    }

    #[test]
    fn dead_and_failed_are_outcomes_not_losses() {
        let (ids, mut facts, mut provider) = setup(3);
        for (i, set) in [(0usize, true), (1, false)] {
            let fact = facts.get_mut(&ids[i]).unwrap();
            fact.effects = 0;
            if set {
                fact.dead = true;
            } else {
                fact.failed = true;
            }
            provider.remove(&herald_core::idempotency::send_effect_key(ids[i]));
        }
        let proof = Proof::build(&ids, &facts, &provider, 0);
        assert_eq!((proof.dead, proof.failed, proof.lost), (1, 1, 0));
        assert!(proof.ok());
    }
}
