//! The accept path (rule R1): one transaction writes the message and its outbox row (QUEUED is
//! derived from the message row, migration 0019). Nothing else is on this path: no Redis, no
//! network call.

use herald_core::{JobType, MessageState};
use serde_json::Value;
use sqlx::types::Json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::metrics::{measured, Operation};
use crate::StoreError;

/// The channel pollers listen on for the partition numbers with new rows, so an idle poller
/// wakes at once instead of at its next poll. The accept path does not notify inside its
/// transaction (see [`crate::wakeups`]); operator actions, which are rare, do.
pub const OUTBOX_CHANNEL: &str = "herald_outbox";

/// Wakes the pollers of `partitions` when the surrounding transaction commits (operator
/// actions only: a NOTIFY serialises commits).
pub(crate) async fn notify_partitions(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    partitions: &[i32],
) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_notify($1, p::text) FROM UNNEST($2::int[]) AS p")
        .bind(OUTBOX_CHANNEL)
        .bind(partitions)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A validated message, ready to be written. The caller computed its id and partition.
#[derive(Debug, Clone)]
pub struct NewMessage {
    pub id: Uuid,
    pub partition: u32,
    pub recipient: String,
    pub body: Value,
    pub idempotency_key: Option<String>,
    /// Identifies the request's content, to tell a retry from a conflicting reuse of a key.
    pub fingerprint: [u8; 16],
    /// The name of the API key that sent it (None: the API runs without keys). A key's retry
    /// is answered from the stored message only if that key stored it.
    pub created_by: Option<String>,
}

/// What the accept path did with one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    pub id: Uuid,
    /// False when the idempotency key was seen before with the same content.
    pub created: bool,
    pub state: MessageState,
}

#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    /// The key was used before for different content; nothing was written.
    #[error("idempotency key {key:?} was already used with a different request")]
    KeyConflict { index: usize, key: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for AcceptError {
    fn from(err: sqlx::Error) -> Self {
        AcceptError::Store(StoreError::Database(err))
    }
}

/// The content fingerprint of a request: xxh3-128 of the canonical JSON of what the message
/// would store (serde_json sorts object keys, so key order does not matter).
pub fn fingerprint(recipient: &str, partition_key: Option<&str>, body: &Value) -> [u8; 16] {
    let canonical = serde_json::json!({
        "recipient": recipient,
        "partition_key": partition_key,
        "body": body,
    });
    let bytes = serde_json::to_vec(&canonical).unwrap_or_default();
    xxhash_rust::xxh3::xxh3_128(&bytes).to_be_bytes()
}

/// The accept statement: messages and their outbox rows, from arrays (one element per
/// message). No event is written: a message is QUEUED from its `created_at` until its history
/// says more (migration 0019). Public so benchmarks run exactly this SQL.
pub const INSERT_MESSAGES: &str = r#"
WITH input AS (
    SELECT * FROM UNNEST($1::uuid[], $2::int[], $3::text[], $4::jsonb[], $5::text[], $6::bytea[],
                         $8::text[])
        AS t(id, partition, recipient, body, idempotency_key, request_fingerprint, created_by)
), inserted AS (
    INSERT INTO messages (id, partition, recipient, body, idempotency_key, request_fingerprint,
                          created_by)
    SELECT id, partition, recipient, body, idempotency_key, request_fingerprint, created_by
    FROM input
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id, partition
), queued_outbox AS (
    INSERT INTO outbox (partition, job_type, message_id)
    SELECT partition, $7, id FROM inserted
)
SELECT id, partition FROM inserted
"#;

/// Writes a batch of messages in one transaction and answers, in input order, the id each
/// request maps to. A key reused with other content rolls the whole batch back.
pub async fn accept_messages(
    pool: &PgPool,
    messages: &[NewMessage],
) -> Result<Vec<Accepted>, AcceptError> {
    measured(Operation::Accept, async {
        let mut tx = pool.begin().await?;
        // Nothing is committed before COMMIT: an error of either step wrote nothing.
        let written = write_messages(&mut tx, messages)
            .await
            .map_err(|(_, err)| err)?;
        let mut answers = Vec::with_capacity(written.len());
        for (index, result) in written.into_iter().enumerate() {
            match result {
                Ok(accepted) => answers.push(accepted),
                Err(KeyReused { key }) => {
                    tx.rollback().await?;
                    return Err(AcceptError::KeyConflict { index, key });
                }
            }
        }
        // Until COMMIT is sent, a broken connection rolls the transaction back.
        tx.commit().await.map_err(crate::after_sending)?;
        Ok(answers)
    })
    .await
}

/// A message whose idempotency key was used before for different content: nothing of it
/// was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyReused {
    pub key: String,
}

/// Writes independent messages (separate requests sharing one transaction, see
/// [`crate::group`]) and answers each on its own: a reused key fails only its own message.
/// The insert is one statement, committed on its own (one round trip, no BEGIN/COMMIT): no
/// message depends on another, so nothing needs rolling back. Messages whose key existed are
/// then answered from the stored rows, which are committed (the insert waited for them).
pub async fn accept_each(
    pool: &PgPool,
    messages: &[NewMessage],
) -> Result<Vec<Result<Accepted, KeyReused>>, StoreError> {
    measured(Operation::Accept, async {
        let mut conn = pool.acquire().await?;
        // The insert commits on its own: once it is sent, a broken connection may hide a
        // commit; once it committed, failing to read the existing keys leaves every answer
        // unknown (some messages of the group are stored).
        write_messages(&mut conn, messages)
            .await
            .map_err(|(step, err)| match step {
                Step::Insert => crate::after_sending(err),
                Step::Resolve => StoreError::OutcomeUnknown(err.to_string()),
            })
    })
    .await
}

/// Which step of [`write_messages`] failed.
enum Step {
    /// The insert of messages and their outbox rows.
    Insert,
    /// Reading the stored messages of keys that existed, after the insert.
    Resolve,
}

/// Inserts the messages with their outbox rows in one statement; a message
/// whose key exists is answered from the stored one (same content) or refused (other content).
/// Two messages of one call with the same key behave as if sent one after the other.
async fn write_messages(
    conn: &mut sqlx::PgConnection,
    messages: &[NewMessage],
) -> Result<Vec<Result<Accepted, KeyReused>>, (Step, sqlx::Error)> {
    let inserted = insert_messages(conn, messages)
        .await
        .map_err(|err| (Step::Insert, err))?;
    resolve_messages(conn, messages, inserted)
        .await
        .map_err(|err| (Step::Resolve, err))
}

async fn insert_messages(
    conn: &mut sqlx::PgConnection,
    messages: &[NewMessage],
) -> Result<Vec<(Uuid, i32)>, sqlx::Error> {
    sqlx::query_as(INSERT_MESSAGES)
        .bind(messages.iter().map(|m| m.id).collect::<Vec<_>>())
        .bind(
            messages
                .iter()
                .map(|m| m.partition as i32)
                .collect::<Vec<_>>(),
        )
        .bind(
            messages
                .iter()
                .map(|m| m.recipient.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(messages.iter().map(|m| Json(&m.body)).collect::<Vec<_>>())
        .bind(
            messages
                .iter()
                .map(|m| m.idempotency_key.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(
            messages
                .iter()
                .map(|m| m.fingerprint.to_vec())
                .collect::<Vec<_>>(),
        )
        .bind(JobType::Send.as_str())
        .bind(
            messages
                .iter()
                .map(|m| m.created_by.as_deref())
                .collect::<Vec<_>>(),
        )
        .fetch_all(&mut *conn)
        .await
}

/// A message whose idempotency key a request reused, as stored.
#[derive(sqlx::FromRow)]
struct StoredMessage {
    idempotency_key: String,
    id: Uuid,
    request_fingerprint: Vec<u8>,
    state: String,
    created_by: Option<String>,
}

async fn resolve_messages(
    conn: &mut sqlx::PgConnection,
    messages: &[NewMessage],
    inserted: Vec<(Uuid, i32)>,
) -> Result<Vec<Result<Accepted, KeyReused>>, sqlx::Error> {
    let created: std::collections::HashSet<Uuid> = inserted.iter().map(|(id, _)| *id).collect();
    // Not inserted: the idempotency key exists. Same content is a retry, else a conflict.
    let reused: Vec<&str> = messages
        .iter()
        .filter(|m| !created.contains(&m.id))
        .filter_map(|m| m.idempotency_key.as_deref())
        .collect();
    let existing: Vec<StoredMessage> = if reused.is_empty() {
        Vec::new()
    } else {
        sqlx::query_as(
            "SELECT m.idempotency_key, m.id, m.request_fingerprint, s.state, m.created_by
             FROM messages m JOIN message_current_state s ON s.message_id = m.id
             WHERE m.idempotency_key = ANY($1)",
        )
        .bind(&reused)
        .fetch_all(&mut *conn)
        .await?
    };
    let existing: std::collections::HashMap<&str, &StoredMessage> = existing
        .iter()
        .map(|stored| (stored.idempotency_key.as_str(), stored))
        .collect();
    let mut answers = Vec::with_capacity(messages.len());
    for message in messages {
        if created.contains(&message.id) {
            answers.push(Ok(Accepted {
                id: message.id,
                created: true,
                state: MessageState::Queued,
            }));
            continue;
        }
        let key = message.idempotency_key.clone().ok_or_else(|| {
            sqlx::Error::Protocol(format!("message {} was not inserted", message.id))
        })?;
        let Some(stored) = existing.get(key.as_str()) else {
            return Err(sqlx::Error::Protocol(format!(
                "message {} was not inserted and key {key:?} is not stored",
                message.id
            )));
        };
        // Another API key's message is never answered to this one, even with equal content.
        if stored.request_fingerprint != message.fingerprint
            || stored.created_by != message.created_by
        {
            answers.push(Err(KeyReused { key }));
            continue;
        }
        let state = stored
            .state
            .parse()
            .map_err(|err: herald_core::state::UnknownState| sqlx::Error::Decode(Box::new(err)))?;
        answers.push(Ok(Accepted {
            id: stored.id,
            created: false,
            state,
        }));
    }
    Ok(answers)
}
