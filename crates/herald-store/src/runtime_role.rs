//! The runtime role: the PostgreSQL role the API, pollers and workers connect as, created or
//! updated by `herald migrate --runtime-role`, so that the roles never hold the owner's powers.
//! It may read and write what the roles write and nothing more: no DDL, no TRUNCATE anywhere,
//! no UPDATE of immutable rows, and DELETE only on the working tables the pipeline deletes
//! from by design ([`DELETED_BY_DESIGN`]), never on history ([`HISTORY`]). Every run resets
//! its privileges to exactly these, so tables a later migration adds are covered.

use base64::Engine;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::{Digest, Sha256};
use sqlx::PgPool;

/// The tables the pipeline deletes rows from by design: in-flight sends once they have an
/// outcome, messages awaiting a receipt once it came, and receipts held for their send once it
/// is recorded (`held_receipts`, from migration 0005; a table a schema does not have yet is
/// skipped). Nothing else is ever deleted.
pub const DELETED_BY_DESIGN: [&str; 3] = ["in_flight_sends", "awaiting_receipt", "held_receipts"];

/// History: never deleted from, never truncated.
pub const HISTORY: [&str; 5] = [
    "messages",
    "message_events",
    "receipts",
    "ledger",
    "parking",
];

/// History whose rows never change after insert (parking rows get `replayed_at`).
const INSERT_ONLY: [&str; 4] = ["messages", "message_events", "receipts", "ledger"];

/// Read by every role, written by `herald migrate` alone.
const READ_ONLY: [&str; 2] = ["herald_settings", "message_current_state"];

/// Iterations of the SCRAM-SHA-256 verifier (PostgreSQL's default).
const SCRAM_ITERATIONS: u32 = 4096;

/// Serialises concurrent runs (two Helm hooks): a role created twice at once fails.
const ROLE_LOCK: i64 = 0x6865_7261_6c65;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeRoleError {
    #[error("runtime role name {0:?}: use 1 to 63 lower-case letters, digits or '_', starting with a letter or '_'")]
    BadName(String),
    #[error(
        "the runtime role's password must be at least 16 printable ASCII characters without spaces"
    )]
    BadPassword,
    #[error("role {0:?} does not exist and no password was given to create it with")]
    NoPassword(String),
    #[error("role {0:?} is the role running this migration, a superuser, or owns Herald's tables; the runtime role must be another, unprivileged role")]
    Privileged(String),
    #[error("role {role:?} can still {privilege} on {table} (through a role it is a member of?); choose a role that belongs to no other")]
    StillAllowed {
        role: String,
        privilege: &'static str,
        table: &'static str,
    },
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

/// Creates `name` (with `password`) or updates it (a new password when one is given), then
/// gives it exactly the runtime privileges on the current schema, and checks the result.
pub async fn ensure_runtime_role(
    pool: &PgPool,
    name: &str,
    password: Option<&str>,
) -> Result<(), RuntimeRoleError> {
    let valid_name = name.len() < 64
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !valid_name {
        return Err(RuntimeRoleError::BadName(name.to_owned()));
    }
    if let Some(password) = password {
        let printable = password.bytes().all(|b| b.is_ascii_graphic());
        if password.len() < 16 || !printable {
            return Err(RuntimeRoleError::BadPassword);
        }
    }
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(ROLE_LOCK)
        .execute(&mut *tx)
        .await?;
    let existing: Option<(bool, bool, i64)> = sqlx::query_as(
        "SELECT r.rolsuper, r.rolname = current_user,
                (SELECT count(*) FROM pg_class c
                 WHERE c.relowner = r.oid AND c.relnamespace = current_schema()::text::regnamespace)
         FROM pg_roles r WHERE r.rolname = $1",
    )
    .bind(name)
    .fetch_optional(&mut *tx)
    .await?;
    // The password goes to the server as a SCRAM verifier, never as clear text, so it is in
    // no statement log.
    let verifier = password.map(scram_verifier);
    let statement = match existing {
        Some((superuser, is_me, owned)) if superuser || is_me || owned > 0 => {
            return Err(RuntimeRoleError::Privileged(name.to_owned()));
        }
        Some(_) => match &verifier {
            Some(verifier) => Some(
                format_sql(
                    &mut tx,
                    "ALTER ROLE %I LOGIN PASSWORD %L",
                    &[name, verifier],
                )
                .await?,
            ),
            None => None,
        },
        None => {
            let verifier = verifier
                .as_ref()
                .ok_or_else(|| RuntimeRoleError::NoPassword(name.to_owned()))?;
            Some(
                format_sql(
                    &mut tx,
                    "CREATE ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD %L",
                    &[name, verifier],
                )
                .await?,
            )
        }
    };
    if let Some(statement) = statement {
        sqlx::raw_sql(&statement).execute(&mut *tx).await?;
    }
    let deletable: Vec<String> = sqlx::query_scalar(
        "SELECT t FROM unnest($1::text[]) AS t WHERE to_regclass(quote_ident(t)) IS NOT NULL",
    )
    .bind(DELETED_BY_DESIGN)
    .fetch_all(&mut *tx)
    .await?;
    let grants = format_sql(&mut tx, &grant_template(&deletable), &[name]).await?;
    sqlx::raw_sql(&grants).execute(&mut *tx).await?;
    check_history_is_safe(&mut tx, name).await?;
    tx.commit().await?;
    Ok(())
}

/// The privileges, for [`format_sql`] with the role as its one argument: `%1$I` the role,
/// `%2$I` the database, `%3$I` the schema.
fn grant_template(deletable: &[String]) -> String {
    let list = |tables: &[&str]| tables.join(", ");
    [
        "GRANT CONNECT ON DATABASE %2$I TO %1$I".to_owned(),
        "GRANT USAGE ON SCHEMA %3$I TO %1$I".to_owned(),
        // Start from nothing, so a re-run takes back whatever an earlier version granted.
        "REVOKE ALL ON ALL TABLES IN SCHEMA %3$I FROM %1$I".to_owned(),
        "REVOKE ALL ON ALL SEQUENCES IN SCHEMA %3$I FROM %1$I".to_owned(),
        "GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA %3$I TO %1$I".to_owned(),
        format!("REVOKE INSERT, UPDATE ON {} FROM %1$I", list(&READ_ONLY)),
        format!("REVOKE UPDATE ON {} FROM %1$I", list(&INSERT_ONLY)),
        "REVOKE ALL ON _sqlx_migrations FROM %1$I".to_owned(),
        "GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA %3$I TO %1$I".to_owned(),
        "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA %3$I TO %1$I".to_owned(),
    ]
    .into_iter()
    .chain(
        deletable
            .iter()
            .map(|table| format!("GRANT DELETE ON {table} TO %1$I")),
    )
    .collect::<Vec<_>>()
    .join(";\n")
}

/// Asks PostgreSQL whether the role can, through any path (a membership included), still
/// delete from or truncate a history table, or truncate any table.
async fn check_history_is_safe(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    role: &str,
) -> Result<(), RuntimeRoleError> {
    for table in HISTORY.iter().chain(&DELETED_BY_DESIGN) {
        let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(table)
            .fetch_one(&mut **tx)
            .await?;
        for privilege in ["DELETE", "TRUNCATE"] {
            if !exists || (privilege == "DELETE" && DELETED_BY_DESIGN.contains(table)) {
                continue;
            }
            let allowed: bool = sqlx::query_scalar("SELECT has_table_privilege($1, $2, $3)")
                .bind(role)
                .bind(table)
                .bind(privilege)
                .fetch_one(&mut **tx)
                .await?;
            if allowed {
                return Err(RuntimeRoleError::StillAllowed {
                    role: role.to_owned(),
                    privilege,
                    table,
                });
            }
        }
    }
    Ok(())
}

/// `format(template, args…, current_database(), current_schema())` on the server, which
/// quotes identifiers (`%I`) and literals (`%L`) exactly as PostgreSQL reads them; unused
/// arguments are ignored.
async fn format_sql(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    template: &str,
    args: &[&str],
) -> Result<String, sqlx::Error> {
    let placeholders: String = (2..=args.len() + 1)
        .map(|i| format!(", ${i}::text"))
        .collect();
    let query =
        format!("SELECT format($1::text{placeholders}, current_database(), current_schema())");
    let mut statement = sqlx::query_scalar(&query).bind(template);
    for arg in args {
        statement = statement.bind(*arg);
    }
    statement.fetch_one(&mut **tx).await
}

/// PostgreSQL's SCRAM-SHA-256 password verifier (RFC 5802, RFC 7677) for an ASCII password:
/// `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`.
fn scram_verifier(password: &str) -> String {
    let mut salt = [0u8; 16];
    rand::rng().fill_bytes(&mut salt);
    scram_verifier_with(password, &salt, SCRAM_ITERATIONS)
}

fn scram_verifier_with(password: &str, salt: &[u8], iterations: u32) -> String {
    let hmac = |key: &[u8], data: &[u8]| -> [u8; 32] {
        let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC accepts any key length");
        mac.update(data);
        mac.finalize().into_bytes().into()
    };
    // Hi(): PBKDF2 with HMAC-SHA-256, one block.
    let mut block = salt.to_vec();
    block.extend_from_slice(&1u32.to_be_bytes());
    let mut u = hmac(password.as_bytes(), &block);
    let mut salted = u;
    for _ in 1..iterations {
        u = hmac(password.as_bytes(), &u);
        for (s, b) in salted.iter_mut().zip(u) {
            *s ^= b;
        }
    }
    let client_key = hmac(&salted, b"Client Key");
    let stored_key = Sha256::digest(client_key);
    let server_key = hmac(&salted, b"Server Key");
    let b64 = base64::engine::general_purpose::STANDARD;
    format!(
        "SCRAM-SHA-256${iterations}:{}${}:{}",
        b64.encode(salt),
        b64.encode(stored_key),
        b64.encode(server_key)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scram_verifier_is_postgresql_s() {
        // The RFC 7677 example (user "user", password "pencil"), as PostgreSQL stores it.
        let salt = base64::engine::general_purpose::STANDARD
            .decode("W22ZaJ0SNY7soEsUEjb6gQ==")
            .unwrap();
        assert_eq!(
            scram_verifier_with("pencil", &salt, 4096),
            "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$\
             WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:\
             wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU="
        );
    }

    #[test]
    fn history_is_never_deleted_from_by_design() {
        for table in DELETED_BY_DESIGN {
            assert!(!HISTORY.contains(&table));
        }
        let template = grant_template(&["in_flight_sends".to_owned()]);
        assert!(template.contains("GRANT DELETE ON in_flight_sends TO"));
        assert!(!template.contains("GRANT DELETE ON message"));
        assert!(!template.contains("TRUNCATE"));
    }
}
