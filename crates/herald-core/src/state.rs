//! The states of a message (appended to its history) and of an outbox row.

use std::fmt;
use std::str::FromStr;

/// A message's state, as appended to `message_events`. The current state is derived from the
/// history, never stored: see [`MessageState::rank`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum MessageState {
    /// Committed with its outbox row; the client got 202.
    Queued,
    /// A worker confirmed ownership and is about to call the provider. A claim, not proof.
    Claimed,
    /// The provider call failed in a way that may be retried; the outbox row is PENDING again.
    Retrying,
    /// The provider returned an id: a fact that can be billed.
    Accepted,
    /// An internal check rejected the message before any provider call.
    Failed,
    /// Its outbox row passed the attempt limit; an operator can re-drive it.
    Dead,
    /// The provider reported an intermediate state: accepted by the network, not final.
    Enroute,
    /// No final receipt came within the reconciliation window: the outcome is unknown. Never
    /// turned into a failure by Herald; a late final receipt still settles it.
    Unknown,
    /// Final receipt: delivered to the recipient.
    Delivered,
    /// Final receipt: the provider gave up or the recipient rejected it.
    Undelivered,
    /// Final receipt: the message's validity ran out before delivery.
    Expired,
}

impl MessageState {
    pub const ALL: [MessageState; 11] = [
        MessageState::Queued,
        MessageState::Claimed,
        MessageState::Retrying,
        MessageState::Accepted,
        MessageState::Failed,
        MessageState::Dead,
        MessageState::Enroute,
        MessageState::Unknown,
        MessageState::Delivered,
        MessageState::Undelivered,
        MessageState::Expired,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            MessageState::Queued => "QUEUED",
            MessageState::Claimed => "CLAIMED",
            MessageState::Retrying => "RETRYING",
            MessageState::Accepted => "ACCEPTED",
            MessageState::Failed => "FAILED",
            MessageState::Dead => "DEAD",
            MessageState::Enroute => "ENROUTE",
            MessageState::Unknown => "UNKNOWN",
            MessageState::Delivered => "DELIVERED",
            MessageState::Undelivered => "UNDELIVERED",
            MessageState::Expired => "EXPIRED",
        }
    }

    /// How far along the lifecycle a state is. The current state of a message is its event
    /// with the highest rank, the latest among equals, so a late duplicate (a CLAIMED written
    /// by a re-driven job after ACCEPTED) never moves a message backwards. The same ranking is
    /// in the `herald_state_rank` SQL function; a store test checks that the two agree.
    pub fn rank(self) -> i32 {
        match self {
            MessageState::Queued => 0,
            MessageState::Claimed | MessageState::Retrying | MessageState::Dead => 1,
            MessageState::Accepted | MessageState::Failed => 2,
            MessageState::Enroute => 3,
            MessageState::Unknown => 4,
            MessageState::Delivered | MessageState::Undelivered | MessageState::Expired => 5,
        }
    }
}

impl fmt::Display for MessageState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown message state {0:?}")]
pub struct UnknownState(pub String);

impl FromStr for MessageState {
    type Err = UnknownState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        MessageState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| UnknownState(s.to_owned()))
    }
}

/// The life of an outbox row: PENDING → PROCESSING → PUBLISHED → DONE, or DEAD past the
/// attempt limit. The row is the only proof that work is owed, so nothing deletes it before
/// DONE; a re-drive returns stale PROCESSING/PUBLISHED rows to PENDING.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutboxStatus {
    Pending,
    Processing,
    Published,
    Done,
    Dead,
}

impl OutboxStatus {
    pub const ALL: [OutboxStatus; 5] = [
        OutboxStatus::Pending,
        OutboxStatus::Processing,
        OutboxStatus::Published,
        OutboxStatus::Done,
        OutboxStatus::Dead,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OutboxStatus::Pending => "PENDING",
            OutboxStatus::Processing => "PROCESSING",
            OutboxStatus::Published => "PUBLISHED",
            OutboxStatus::Done => "DONE",
            OutboxStatus::Dead => "DEAD",
        }
    }
}

impl fmt::Display for OutboxStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip() {
        for state in MessageState::ALL {
            assert_eq!(state.as_str().parse::<MessageState>(), Ok(state));
        }
        assert!("DELIVERED?".parse::<MessageState>().is_err());
    }

    #[test]
    fn accepted_outranks_a_late_claim() {
        assert!(MessageState::Accepted.rank() > MessageState::Claimed.rank());
        assert!(MessageState::Claimed.rank() > MessageState::Queued.rank());
    }
}
