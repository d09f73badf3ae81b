//! Job types: each has its own Redis stream(s) and its own worker fleet.

use std::fmt;
use std::str::FromStr;

/// The kind of work an outbox row asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobType {
    /// Submit a message to the provider.
    Send,
    /// Apply a provider's delivery receipt to a message.
    Status,
}

impl JobType {
    pub const ALL: [JobType; 2] = [JobType::Send, JobType::Status];

    pub fn as_str(self) -> &'static str {
        match self {
            JobType::Send => "send",
            JobType::Status => "status",
        }
    }
}

/// What the queue and the worker runtime need of a job type: its name, used in stream and
/// consumer-group names and as the `job_type` label; on the wire (the job's `job_type`) it is
/// the type's serde form, which must be the same string (a unit test holds `JobType` to it). Herald's
/// job types are the variants of [`JobType`]; the trait lets the queue and the runtime be
/// written once for any of them, and lets the worker's tests run a job type of their own.
pub trait JobKind:
    Copy + Eq + fmt::Debug + Send + Sync + serde::Serialize + serde::de::DeserializeOwned + 'static
{
    /// The job type's name.
    fn name(self) -> &'static str;
}

impl JobKind for JobType {
    fn name(self) -> &'static str {
        self.as_str()
    }
}

impl fmt::Display for JobType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown job type {0:?} (known: send, status)")]
pub struct UnknownJobType(pub String);

impl FromStr for JobType {
    type Err = UnknownJobType;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "send" => Ok(JobType::Send),
            "status" => Ok(JobType::Status),
            other => Err(UnknownJobType(other.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_unknown() {
        for job in JobType::ALL {
            assert_eq!(job.as_str().parse::<JobType>(), Ok(job));
        }
        assert!("sms".parse::<JobType>().is_err());
    }

    #[test]
    fn the_wire_form_is_the_name() {
        for job in JobType::ALL {
            assert_eq!(serde_json::to_value(job).unwrap(), job.name());
        }
    }
}

/// One unit of work as it travels from the outbox through a queue store to a worker. The
/// outbox row `(partition, outbox_id)` is the proof the work is owed; the job is a copy.
/// `K` is the kind of job type: Herald's own [`JobType`] everywhere but in tests of the
/// runtime ([`JobKind`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(bound = "K: JobKind")]
pub struct Job<K = JobType> {
    pub outbox_id: i64,
    pub partition: u32,
    pub job_type: K,
    pub message_id: Option<uuid::Uuid>,
    /// Provider attempts the outbox row had used when this copy was published (0 for a
    /// fresh send). The worker's confirm charges the next one and answers its number.
    pub attempt: i32,
    /// Job-type specific data; empty for sends, which read the message itself.
    pub payload: serde_json::Value,
}
