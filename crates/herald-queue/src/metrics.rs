//! The queue store's metrics, declared in one place.

use std::future::Future;
use std::time::Instant;

/// Publishing a batch to a job type's stream (one pipelined round trip).
pub const PUBLISH_DURATION: &str = "herald_queue_publish_duration_seconds";
/// Every Redis operation, by operation.
pub const REDIS_DURATION: &str = "herald_redis_operation_duration_seconds";
/// Failed Redis operations, by operation.
pub const REDIS_ERRORS: &str = "herald_redis_errors_total";

#[derive(Debug, Clone, Copy)]
pub enum RedisOp {
    Publish,
    Ack,
}

impl RedisOp {
    fn label(self) -> &'static str {
        match self {
            RedisOp::Publish => "publish",
            RedisOp::Ack => "ack",
        }
    }
}

pub fn describe() {
    metrics::describe_histogram!(
        PUBLISH_DURATION,
        metrics::Unit::Seconds,
        "Publishing one claimed batch to the job type's stream."
    );
    metrics::describe_histogram!(
        REDIS_DURATION,
        metrics::Unit::Seconds,
        "Redis operations, by operation."
    );
    metrics::describe_counter!(REDIS_ERRORS, "Failed Redis operations, by operation.");
    for op in [RedisOp::Publish, RedisOp::Ack] {
        let _ = metrics::histogram!(REDIS_DURATION, "operation" => op.label());
        metrics::counter!(REDIS_ERRORS, "operation" => op.label()).increment(0);
    }
    for job_type in herald_core::JobType::ALL {
        let _ = metrics::histogram!(PUBLISH_DURATION, "job_type" => job_type.as_str());
    }
}

pub(crate) async fn measured<T, E, F>(op: RedisOp, fut: F) -> Result<T, E>
where
    F: Future<Output = Result<T, E>>,
{
    let started = Instant::now();
    let result = fut.await;
    metrics::histogram!(REDIS_DURATION, "operation" => op.label())
        .record(started.elapsed().as_secs_f64());
    if result.is_err() {
        metrics::counter!(REDIS_ERRORS, "operation" => op.label()).increment(1);
    }
    result
}
