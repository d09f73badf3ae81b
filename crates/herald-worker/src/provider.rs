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
    /// The provider refused the message for good (a 4xx other than 408/429).
    Rejected { reason: String },
    /// No answer we can rely on (timeout, connection error, 5xx, 408, 429): the effect may or
    /// may not have happened; retrying with the same key is safe.
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
        if status.is_client_error()
            && status != StatusCode::REQUEST_TIMEOUT
            && status != StatusCode::TOO_MANY_REQUESTS
        {
            SubmitOutcome::Rejected { reason }
        } else {
            SubmitOutcome::Transient { reason }
        }
    }
}
