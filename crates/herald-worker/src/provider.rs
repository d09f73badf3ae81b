//! The provider client: one submit with the effect's idempotency key, and the lookup of what
//! became of a key (`GET {base}/v1/submits/{key}`), which settles a submit whose answer was
//! lost.

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
    /// The provider surely did nothing: no connection was made, it answered 429, a refusal
    /// of Herald itself (401, 403, 404, …), or a lookup found no submit under the key.
    /// Retrying with the same key is safe.
    Transient { reason: String },
    /// Nobody knows whether the provider took it: a timeout, a connection lost after the
    /// request went out, a 5xx, a 408, a 409 (a submit with this key is still in progress), a
    /// 2xx without a readable answer. Retrying with the same key is safe; once attempts are
    /// used up, the provider is asked by key instead of the message going DEAD.
    Unknown { reason: String },
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
    /// `{base}/v1/submits/`, the key is appended as one path segment.
    lookup_url: reqwest::Url,
}

/// A provider client that cannot be built from its settings.
#[derive(Debug, thiserror::Error)]
pub enum ProviderSetupError {
    #[error("TLS material or HTTP client: {0}")]
    Client(#[from] reqwest::Error),
    #[error("not a URL: {0}")]
    Url(String),
    #[error("the provider URL {0:?} cannot have paths below it")]
    NotABase(String),
}

impl ProviderClient {
    pub fn new(base_url: &str, timeout: Duration) -> Result<Self, ProviderSetupError> {
        Self::with_tls(base_url, timeout, &herald_core::ClientTls::default())
    }

    /// A client of an `https://` provider that trusts `tls.ca` besides the public roots and
    /// presents `tls.identity` when given (mutual TLS).
    pub fn with_tls(
        base_url: &str,
        timeout: Duration,
        tls: &herald_core::ClientTls,
    ) -> Result<Self, ProviderSetupError> {
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(Duration::from_secs(2))
            .pool_max_idle_per_host(256);
        if let Some(ca) = &tls.ca {
            for certificate in reqwest::Certificate::from_pem_bundle(ca)? {
                builder = builder.add_root_certificate(certificate);
            }
        }
        if let Some(identity) = &tls.identity {
            let mut pem = identity.cert.clone();
            pem.push(b'\n');
            pem.extend_from_slice(&identity.key);
            builder = builder.identity(reqwest::Identity::from_pem(&pem)?);
        }
        let client = builder.build()?;
        let base = base_url.trim_end_matches('/');
        let lookup_url = reqwest::Url::parse(&format!("{base}/v1/submits"))
            .map_err(|err| ProviderSetupError::Url(format!("{base_url:?}: {err}")))?;
        if lookup_url.cannot_be_a_base() {
            return Err(ProviderSetupError::NotABase(base_url.to_owned()));
        }
        Ok(Self {
            client,
            submit_url: format!("{base}/v1/submit"),
            lookup_url,
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
        count_call("submit", &outcome);
        outcome
    }

    /// Asks the provider what became of `idempotency_key` (no effect of its own): `Accepted`
    /// with the first answer when a submit under it took effect, `Transient` when the provider
    /// has none (404), `Unknown` when it could not answer.
    pub async fn lookup(&self, idempotency_key: &str) -> SubmitOutcome {
        let started = Instant::now();
        let outcome = self.lookup_inner(idempotency_key).await;
        metrics::histogram!(m::PROVIDER_CALL_DURATION).record(started.elapsed().as_secs_f64());
        count_call("lookup", &outcome);
        outcome
    }

    async fn lookup_inner(&self, idempotency_key: &str) -> SubmitOutcome {
        let mut url = self.lookup_url.clone();
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.push(idempotency_key);
        }
        let response = match self.client.get(url).send().await {
            Ok(response) => response,
            Err(err) => {
                return SubmitOutcome::Unknown {
                    reason: format!("looking the key up failed: {err}"),
                }
            }
        };
        let status = response.status();
        if status == StatusCode::NOT_FOUND {
            return SubmitOutcome::Transient {
                reason: "the provider has no submit under this key".to_owned(),
            };
        }
        if !status.is_success() {
            return SubmitOutcome::Unknown {
                reason: format!("looking the key up: provider answered {status}"),
            };
        }
        match response.json::<SubmitAnswer>().await {
            Ok(answer) => SubmitOutcome::Accepted {
                gateway: answer.gateway,
                provider_id: answer.provider_id,
            },
            Err(err) => SubmitOutcome::Unknown {
                reason: format!("looking the key up: unreadable answer: {err}"),
            },
        }
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
                return SubmitOutcome::Unknown {
                    reason: "provider timed out (outcome unknown)".to_owned(),
                }
            }
            // No connection was made: the request never left.
            Err(err) if err.is_connect() => {
                return SubmitOutcome::Transient {
                    reason: format!("provider unreachable: {err}"),
                }
            }
            Err(err) => {
                return SubmitOutcome::Unknown {
                    reason: format!("provider call broke off (outcome unknown): {err}"),
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
                Err(err) => SubmitOutcome::Unknown {
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

fn count_call(call: &'static str, outcome: &SubmitOutcome) {
    let label = match outcome {
        SubmitOutcome::Accepted { .. } => "accepted",
        SubmitOutcome::Rejected { .. } => "rejected",
        SubmitOutcome::Transient { .. } => "transient",
        SubmitOutcome::Unknown { .. } => "unknown",
    };
    metrics::counter!(m::PROVIDER_CALLS, "call" => call, "outcome" => label).increment(1);
}

/// Sorts a provider's non-2xx answer. Only a refusal of the message's own content (400, 422)
/// is final: the caller caused it. A 5xx, a 408 or a 409 (the same key is being submitted by
/// another attempt right now) leave the outcome unknown. A 429 surely did nothing. A 401, 403,
/// 404 or any other 4xx says Herald is pointed at the wrong place or holds the wrong
/// credentials — no fault of the message — so it is retried, loudly, and ends DEAD (visible,
/// re-drivable) if it persists, never FAILED.
fn classify_refusal(status: StatusCode, reason: String) -> SubmitOutcome {
    match status {
        StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY => {
            SubmitOutcome::Rejected { reason }
        }
        StatusCode::REQUEST_TIMEOUT | StatusCode::CONFLICT => SubmitOutcome::Unknown { reason },
        s if s.is_server_error() => SubmitOutcome::Unknown { reason },
        s if s.is_client_error() && s != StatusCode::TOO_MANY_REQUESTS => {
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
        for code in [401, 403, 404, 405, 429] {
            assert!(
                matches!(sort(code), SubmitOutcome::Transient { .. }),
                "{code}"
            );
        }
        // The provider may have taken these: never a reason for DEAD.
        for code in [408, 409, 500, 502, 503, 504] {
            assert!(
                matches!(sort(code), SubmitOutcome::Unknown { .. }),
                "{code}"
            );
        }
    }
}
