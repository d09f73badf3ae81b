//! The right to write a partition's outbox rows.

/// A partition and the fencing epoch its owner holds. The epoch of a partition only grows;
/// every claim, mark and re-drive checks it in the same statement, so a holder of an older
/// epoch changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fence {
    pub partition: u32,
    pub epoch: i64,
}
