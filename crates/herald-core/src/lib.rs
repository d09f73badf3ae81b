//! Herald's domain, with no network I/O and no async runtime: how a message is routed to a
//! partition, the states of a message and of an outbox row, the job types, the one function that
//! derives the idempotency key of each effect, the signature a provider puts on its receipts, and
//! what every role's configuration shares (`config`, which reads secret and certificate files).
//! Every other crate takes these from here so that the rules they encode exist once.

pub mod assignment;
pub mod config;
pub mod fence;
pub mod idempotency;
pub mod job;
pub mod partition;
pub mod receipt;
pub mod signature;
pub mod state;
pub mod tls;
pub mod verdict;

pub use config::ConfigError;
pub use fence::Fence;
pub use idempotency::send_effect_key;
pub use job::{JobKind, JobType};
pub use partition::{partition_of, PartitionCount};
pub use state::{MessageState, OutboxStatus};
pub use tls::{ClientIdentity, ClientTls};
