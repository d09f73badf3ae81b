//! The API's contract as an OpenAPI 3.1 document, generated from the wire types and the
//! handlers' annotations, served at `GET /v1/openapi.json` and committed as `docs/openapi.json`
//! (a test fails when the two differ: regenerate with `HERALD_WRITE_OPENAPI=1 cargo test -p
//! herald-api openapi`).

use axum::http::header;
use axum::response::{IntoResponse, Response};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::problem::Problem;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Herald",
        description = "A message pipeline that never drops a message: once Herald answers 202, the message reaches the provider at least once, its effect happens exactly once, and its whole history is recorded. Every error is application/problem+json.",
        license(name = "Apache-2.0")
    ),
    paths(
        crate::handlers::accept_one,
        crate::handlers::accept_batch,
        crate::handlers::get_message,
        crate::handlers::list_partitions,
        crate::operations::list_dead,
        crate::operations::redrive_dead,
        crate::operations::list_parked,
        crate::operations::replay_parked,
        crate::operations::accept_receipt,
        crate::operations::accept_receipt_batch,
    ),
    components(schemas(crate::problem::Problem)),
    modifiers(&Credentials),
    tags(
        (name = "messages", description = "Clients: accept messages, read their history (a client or operator key)"),
        (name = "operators", description = "Operators: partitions, DEAD rows, parked input (an operator key)"),
        (name = "providers", description = "Gateways: delivery receipts, signed with the gateway's secret"),
    )
)]
struct ApiDoc;

/// The problems every client route may answer, documented once.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // a description of answers, never built
pub(crate) enum ClientProblems {
    #[response(
        status = 401,
        description = "No or an unknown API key",
        content_type = "application/problem+json"
    )]
    Unauthorized(Problem),
    #[response(
        status = 429,
        description = "The key is past its rate limit (Retry-After)",
        content_type = "application/problem+json"
    )]
    RateLimited(Problem),
    #[response(
        status = 503,
        description = "unavailable (nothing written), outcome-unknown (it may be stored: retry with the same Idempotency-Key) or timeout (Retry-After)",
        content_type = "application/problem+json"
    )]
    Unavailable(Problem),
}

/// The problems every operator route may answer.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // a description of answers, never built
pub(crate) enum OperatorProblems {
    #[response(
        status = 401,
        description = "No or an unknown API key",
        content_type = "application/problem+json"
    )]
    Unauthorized(Problem),
    #[response(
        status = 403,
        description = "A client key: operator routes need an operator key",
        content_type = "application/problem+json"
    )]
    Forbidden(Problem),
    #[response(
        status = 429,
        description = "The key is past its rate limit (Retry-After)",
        content_type = "application/problem+json"
    )]
    RateLimited(Problem),
    #[response(
        status = 503,
        description = "PostgreSQL does not answer, or the request passed --request-timeout: outcome-unknown for a POST (Retry-After)",
        content_type = "application/problem+json"
    )]
    Unavailable(Problem),
}

/// The problems both receipt routes may answer.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // a description of answers, never built
pub(crate) enum ReceiptProblems {
    #[response(
        status = 401,
        description = "The Herald-Signature does not hold for the gateway's secret",
        content_type = "application/problem+json"
    )]
    Unsigned(Problem),
    #[response(
        status = 503,
        description = "unavailable or outcome-unknown (Retry-After): post it again",
        content_type = "application/problem+json"
    )]
    Unavailable(Problem),
}

/// The two kinds of credential: bearer keys, and receipt signatures.
struct Credentials;

impl Modify for Credentials {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        components.add_security_scheme(
            "receipt_signature",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "Herald-Signature",
                "t=<unix seconds>,v1=<hex HMAC-SHA256 of \"<t>.<body>\" with the gateway's secret>",
            ))),
        );
    }
}

/// The document.
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// The document as the committed file holds it (pretty JSON and a final newline).
pub fn pretty_json() -> String {
    let mut text = document()
        .to_pretty_json()
        .expect("the OpenAPI document serialises");
    text.push('\n');
    text
}

/// `GET /v1/openapi.json` (no credential: the contract is not a secret).
pub(crate) async fn serve() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], pretty_json()).into_response()
}
