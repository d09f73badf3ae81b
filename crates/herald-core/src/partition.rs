//! Routing a message to an outbox partition.

use xxhash_rust::xxh3::xxh3_64;

/// The number of outbox partitions, fixed when the schema is installed.
///
/// Invariant: at least 1 and at most [`PartitionCount::MAX`]; the value never changes after
/// `herald migrate` recorded it, because every stored row's partition was computed from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PartitionCount(u32);

impl PartitionCount {
    /// The upper bound: one child table per partition, so the count stays small.
    pub const MAX: u32 = 4096;
    /// The default for a new installation.
    pub const DEFAULT: PartitionCount = PartitionCount(64);

    /// Accepts `1..=MAX`.
    pub fn new(count: u32) -> Result<Self, InvalidPartitionCount> {
        if (1..=Self::MAX).contains(&count) {
            Ok(Self(count))
        } else {
            Err(InvalidPartitionCount(count))
        }
    }

    pub fn get(self) -> u32 {
        self.0
    }

    /// Every partition number, `0..count`.
    pub fn all(self) -> impl Iterator<Item = u32> {
        0..self.0
    }
}

impl std::fmt::Display for PartitionCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("partition count must be between 1 and {max}, got {0}", max = PartitionCount::MAX)]
pub struct InvalidPartitionCount(pub u32);

/// `xxh3_64(partition_key) mod P`: the same key always lands in the same partition, so
/// messages for one recipient keep their order within one poller.
pub fn partition_of(partition_key: &str, count: PartitionCount) -> u32 {
    (xxh3_64(partition_key.as_bytes()) % u64::from(count.get())) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_is_stable_and_in_range() {
        let count = PartitionCount::new(64).unwrap();
        let first = partition_of("+15550100", count);
        assert_eq!(first, partition_of("+15550100", count));
        for i in 0..10_000 {
            assert!(partition_of(&format!("user-{i}"), count) < 64);
        }
    }

    #[test]
    fn keys_spread_over_every_partition() {
        let count = PartitionCount::new(16).unwrap();
        let mut seen = [0u32; 16];
        for i in 0..16_000 {
            seen[partition_of(&format!("user-{i}"), count) as usize] += 1;
        }
        // A uniform hash puts ~1000 in each; a broken one leaves some empty.
        assert!(seen.iter().all(|&n| n > 800 && n < 1200), "{seen:?}");
    }

    #[test]
    fn partition_count_bounds() {
        assert!(PartitionCount::new(0).is_err());
        assert!(PartitionCount::new(PartitionCount::MAX + 1).is_err());
        assert_eq!(PartitionCount::new(1).unwrap().all().count(), 1);
    }
}
