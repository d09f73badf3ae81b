//! Which poller owns which partition, computed from the live member set alone, so every poller
//! computes the same answer without talking to the others.
//!
//! Weighted rendezvous with capacities: every (partition, member) pair gets a score from a
//! hash of both; pairs are taken best score first, a partition going to the first member that
//! still has room. Capacities keep the fleet balanced within one partition. The scores of the
//! other pairs do not change when a member joins or leaves, so mostly the partitions the
//! newcomer takes (or the leaver held) move: over a sweep of member sets a join moves about
//! 1.25 times the minimum `P / (n + 1)` on average and never more than twice it (the capacity
//! limits cascade a little; the tests below hold it to that).

use xxhash_rust::xxh3::xxh3_64;

use crate::PartitionCount;

/// The owner (an index into `members`) of every partition, `0..partitions`. `members` must be
/// non-empty; duplicates count once (the caller passes a set).
pub fn assign(members: &[String], partitions: PartitionCount) -> Vec<usize> {
    assert!(!members.is_empty(), "assignment needs at least one member");
    let p = partitions.get() as usize;
    let n = members.len();
    // The members that carry one extra partition are chosen by a hash of their name, so the
    // choice does not depend on who else is in the set.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&m| (xxh3_64(members[m].as_bytes()), m));
    let mut capacity = vec![p / n; n];
    for &m in order.iter().take(p % n) {
        capacity[m] += 1;
    }
    let mut pairs: Vec<(u64, u32, usize)> = Vec::with_capacity(p * n);
    for partition in partitions.all() {
        for (m, member) in members.iter().enumerate() {
            pairs.push((score(member, partition), partition, m));
        }
    }
    pairs.sort_unstable_by(|a, b| b.cmp(a));
    let mut owner = vec![usize::MAX; p];
    let mut left = p;
    for (_, partition, m) in pairs {
        let slot = &mut owner[partition as usize];
        if *slot == usize::MAX && capacity[m] > 0 {
            *slot = m;
            capacity[m] -= 1;
            left -= 1;
            if left == 0 {
                break;
            }
        }
    }
    owner
}

fn score(member: &str, partition: u32) -> u64 {
    let mut bytes = Vec::with_capacity(member.len() + 4);
    bytes.extend_from_slice(member.as_bytes());
    bytes.extend_from_slice(&partition.to_le_bytes());
    xxh3_64(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}-{i}")).collect()
    }

    fn counts(owner: &[usize], n: usize) -> Vec<usize> {
        let mut counts = vec![0; n];
        for &m in owner {
            counts[m] += 1;
        }
        counts
    }

    #[test]
    fn balanced_within_one_and_deterministic() {
        let p = PartitionCount::new(64).unwrap();
        for n in 1..=20 {
            let members = names("poller", n);
            let owner = assign(&members, p);
            assert!(owner.iter().all(|&m| m < n));
            let counts = counts(&owner, n);
            let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            assert!(max - min <= 1, "n={n}: {counts:?}");
            assert_eq!(owner, assign(&members, p));
        }
        let three = counts(&assign(&names("poller", 3), p), 3);
        assert!(three.iter().all(|&c| c == 21 || c == 22), "{three:?}");
    }

    /// Seeded sweep over member names (the seed is in the failure message): a join moves close
    /// to the minimum, P / (n + 1), and never reshuffles the fleet.
    #[test]
    fn a_join_or_leave_moves_few_partitions() {
        let p = PartitionCount::new(64).unwrap();
        let (mut moved_total, mut minimum_total) = (0, 0);
        for seed in 0..200 {
            let prefix = format!("seed{seed}");
            for n in 1..8 {
                let before_members = names(&prefix, n);
                let mut after_members = before_members.clone();
                after_members.push(format!("{prefix}-new"));
                let before = assign(&before_members, p);
                let after = assign(&after_members, p);
                let moved = before
                    .iter()
                    .zip(&after)
                    .filter(|(b, a)| before_members[**b] != after_members[**a])
                    .count();
                let minimum = 64 / (n + 1);
                moved_total += moved;
                minimum_total += minimum;
                assert!(
                    moved <= 2 * minimum + 1,
                    "seed {seed}, {n} -> {}: moved {moved}, minimum {minimum}",
                    n + 1
                );
                // Leaving is the same move in reverse.
                let back = assign(&before_members, p);
                assert_eq!(back, before);
            }
        }
        let ratio = moved_total as f64 / minimum_total as f64;
        assert!(
            ratio < 1.35,
            "a join moved {ratio:.2} times the minimum on average"
        );
    }
}
