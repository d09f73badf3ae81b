//! The provider client: one submit, with the effect's idempotency key.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde::{Deserialize, Serialize};

use crate::metrics as m;

/// What a submit ended in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmitOutcome {
    /// The provider took the message and named it.
    Accepted {
        gateway: String,
        provider_id: String,
    },
    /// The provider refused the message's content for good (400, 422).
    Rejected { reason: String },
    /// No answer we can rely on (timeout, connection error, 5xx, 408, 429), or a refusal of
    /// Herald itself (401, 403, 404, …): retrying with the same key is safe.
    Transient { reason: String },
}

#[derive(Serialize)]
struct SubmitBody<'a> {
    recipient: &'a str,
    body: &'a serde_json::Value,
}

#[derive(Deserialize)]
struct SubmitAnswer {
    provider_id: String,
    gateway: String,
}

/// A provider's submit endpoint.
#[derive(Clone)]
pub struct ProviderClient {
    client: reqwest::Client,
    submit_url: String,
}

impl ProviderClient {
    pub fn new(base_url: &str, timeout: Duration) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(Duration::from_secs(2))
            .pool_max_idle_per_host(256)
            .build()?;
        Ok(Self {
            client,
            submit_url: format!("{}/v1/submit", base_url.trim_end_matches('/')),
        })
    }

    /// Submits one message under `idempotency_key`.
    pub async fn submit(
        &self,
        idempotency_key: &str,
        recipient: &str,
        body: &serde_json::Value,
    ) -> SubmitOutcome {
        let started = Instant::now();
        let outcome = self.submit_inner(idempotency_key, recipient, body).await;
        metrics::histogram!(m::PROVIDER_CALL_DURATION).record(started.elapsed().as_secs_f64());
        let label = match &outcome {
            SubmitOutcome::Accepted { .. } => "accepted",
            SubmitOutcome::Rejected { .. } => "rejected",
            SubmitOutcome::Transient { .. } => "transient",
        };
        metrics::counter!(m::PROVIDER_CALLS, "outcome" => label).increment(1);
        outcome
    }

    async fn submit_inner(
        &self,
        idempotency_key: &str,
        recipient: &str,
        body: &serde_json::Value,
    ) -> SubmitOutcome {
        let response = self
            .client
            .post(&self.submit_url)
            .header("Idempotency-Key", idempotency_key)
            .json(&SubmitBody { recipient, body })
            .send()
            .await;
        let response = match response {
            Ok(response) => response,
            Err(err) if err.is_timeout() => {
                return SubmitOutcome::Transient {
                    reason: "provider timed out (outcome unknown)".to_owned(),
                }
            }
            Err(err) => {
                return SubmitOutcome::Transient {
                    reason: format!("provider unreachable: {err}"),
                }
            }
        };
        let status = response.status();
        if status.is_success() {
            return match response.json::<SubmitAnswer>().await {
                Ok(answer) => SubmitOutcome::Accepted {
                    gateway: answer.gateway,
                    provider_id: answer.provider_id,
                },
                // A 2xx we cannot read: the effect happened, its id is unknown. Retrying with
                // the same key returns the first answer.
                Err(err) => SubmitOutcome::Transient {
                    reason: format!("provider answered {status} with an unreadable body: {err}"),
                },
            };
        }
        let text = response.text().await.unwrap_or_default();
        let reason = format!(
            "provider answered {status}: {}",
            text.chars().take(200).collect::<String>()
        );
        classify_refusal(status, reason)
    }
}

/// Sorts a provider's non-2xx answer. Only a refusal of the message's own content (400, 422)
/// is final: the caller caused it. A 401, 403, 404 or any other 4xx says Herald is pointed at
/// the wrong place or holds the wrong credentials — no fault of the message — so it is retried
/// like a 5xx, loudly, and ends DEAD (visible, re-drivable) if it persists, never FAILED.
fn classify_refusal(status: StatusCode, reason: String) -> SubmitOutcome {
    match status {
        StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY => {
            SubmitOutcome::Rejected { reason }
        }
        s if s.is_client_error()
            && s != StatusCode::REQUEST_TIMEOUT
            && s != StatusCode::TOO_MANY_REQUESTS =>
        {
            tracing::error!(%status, %reason, "the provider refuses Herald itself (URL or credentials?); retrying, not failing the message");
            SubmitOutcome::Transient {
                reason: format!("provider configuration error: {reason}"),
            }
        }
        _ => SubmitOutcome::Transient { reason },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_refusal_of_the_content_is_final() {
        let sort = |code: u16| classify_refusal(StatusCode::from_u16(code).unwrap(), "r".into());
        for code in [400, 422] {
            assert!(
                matches!(sort(code), SubmitOutcome::Rejected { .. }),
                "{code}"
            );
        }
        for code in [401, 403, 404, 405, 408, 429, 500, 502, 503] {
            assert!(
                matches!(sort(code), SubmitOutcome::Transient { .. }),
                "{code}"
            );
        }
    }
}
