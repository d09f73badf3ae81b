use herald_core::{MessageState, PartitionCount};
use herald_store::migrate::{migrate, partition_count};
use herald_store::StoreError;

use crate::{count, message, migrated};

#[tokio::test]
async fn migrate_records_the_partition_count_and_refuses_another() {
    let (_pg, pool) = migrated(16).await;
    assert_eq!(partition_count(&pool).await.unwrap().get(), 16);
    // One child per partition, each with its partial index on PENDING rows.
    let children = count(
        &pool,
        "SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox'::regclass",
    )
    .await;
    assert_eq!(children, 16);
    let pending_indexes = count(
        &pool,
        "SELECT count(*) FROM pg_indexes
         WHERE tablename LIKE 'outbox\\_p%' AND indexdef LIKE '%WHERE (status = ''PENDING''::text)%'",
    )
    .await;
    assert_eq!(pending_indexes, 16);

    // Running again with the same count is a no-op; another count is refused.
    migrate(&pool, PartitionCount::new(16).unwrap())
        .await
        .unwrap();
    let err = migrate(&pool, PartitionCount::new(32).unwrap())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::PartitionCountMismatch {
                recorded: 16,
                requested: 32
            }
        ),
        "{err}"
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox'::regclass"
        )
        .await,
        16
    );
}

#[tokio::test]
async fn state_rank_in_sql_matches_the_domain() {
    let (_pg, pool) = migrated(4).await;
    for state in MessageState::ALL {
        let rank: i32 = sqlx::query_scalar("SELECT herald_state_rank($1)")
            .bind(state.as_str())
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(rank, state.rank(), "{state}");
    }
}

#[tokio::test]
async fn history_is_append_only_and_messages_immutable() {
    let (_pg, pool) = migrated(4).await;
    let sent = message(1, None, "x");
    herald_store::accept::accept_messages(&pool, std::slice::from_ref(&sent))
        .await
        .unwrap();
    sqlx::query("INSERT INTO message_events (message_id, state) VALUES ($1, 'CLAIMED')")
        .bind(sent.id)
        .execute(&pool)
        .await
        .unwrap();
    for statement in [
        "UPDATE messages SET recipient = 'other'",
        "UPDATE message_events SET state = 'ACCEPTED'",
        "DELETE FROM message_events",
    ] {
        let err = sqlx::query(statement).execute(&pool).await.unwrap_err();
        assert!(
            err.to_string().contains("append-only"),
            "{statement}: {err}"
        );
    }
    assert_eq!(count(&pool, "SELECT count(*) FROM message_events").await, 1);
}

/// The history carries no foreign key to its message (migration 0011: each one took a row
/// lock on the message per insert); the proof's `history_without_message` finding stands for
/// it, and counts every kind of history row whose message is not there.
#[tokio::test]
async fn history_rows_without_their_message_are_a_finding_of_the_proof() {
    use herald_store::verify::database_findings;

    let (_pg, pool) = migrated(4).await;
    herald_store::accept::accept_messages(&pool, &[message(1, None, "kept")])
        .await
        .unwrap();
    assert_eq!(
        database_findings(&pool)
            .await
            .unwrap()
            .history_without_message,
        0
    );
    let foreign_keys = count(
        &pool,
        "SELECT count(*) FROM pg_constraint
         WHERE contype = 'f' AND confrelid = 'messages'::regclass",
    )
    .await;
    assert_eq!(foreign_keys, 0);
    // What a bug writing for a message that does not exist would leave behind.
    let nobody = uuid::Uuid::now_v7();
    for statement in [
        "INSERT INTO message_events (message_id, state) VALUES ($1, 'CLAIMED')",
        "INSERT INTO ledger (idempotency_key, message_id, gateway, provider_id)
         VALUES ('k-' || $1::text, $1, 'g', 'p')",
        "INSERT INTO in_flight_sends (message_id, partition, outbox_id) VALUES ($1, 1, 1)",
    ] {
        sqlx::query(statement)
            .bind(nobody)
            .execute(&pool)
            .await
            .unwrap();
    }
    assert_eq!(
        database_findings(&pool)
            .await
            .unwrap()
            .history_without_message,
        3
    );
}

/// Every migration newer than the rules follows them: no statement that would stop intake on a
/// live database (see `herald_store::migration_rules`).
#[test]
fn every_new_migration_can_run_while_herald_takes_traffic() {
    use herald_store::migration_rules::{check, CHECKED_FROM};
    // The rules came with migration 7; raising this would exempt new migrations from them.
    assert_eq!(CHECKED_FROM, 7);
    let mut checked = 0;
    for migration in herald_store::migrate::migrations() {
        if migration.version < CHECKED_FROM {
            continue;
        }
        let problems = check(&migration.sql);
        assert!(
            problems.is_empty(),
            "migration {} ({}) would stop intake on a live database:\n{}",
            migration.version,
            migration.description,
            problems.join("\n")
        );
        checked += 1;
    }
    let newest = herald_store::migrate::migrations()
        .iter()
        .map(|m| m.version)
        .max()
        .unwrap();
    assert_eq!(checked as i64, (newest - CHECKED_FROM + 1).max(0));
}

/// An upgrade's migration on a database that is taking accepts: a transaction that holds the
/// table a migration alters (a slow accept, a report) must not stop intake for as long as it
/// runs. The migration waits at most its lock timeout, is rolled back, and tries again; the
/// accepts queued behind it go on in between, and none fails. The same upgrade without a lock
/// timeout stops every accept until the long transaction ends, which is what this guards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_behind_a_long_transaction_does_not_stop_accepts() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use herald_store::migrate::{migrate_up_to, migrate_with_locks, LockPolicy};

    // The newest migration that alters a table every accept writes to.
    const ALTERS_MESSAGES: i64 = 6;
    let pg = herald_testkit::LocalPostgres::start()
        .await
        .expect("start postgres");
    let partitions = PartitionCount::new(4).unwrap();

    // Two upgrades of the same old schema: without a lock timeout (one wait as long as the
    // blocker), then with Herald's.
    for (policy, expect_progress) in [
        (
            LockPolicy {
                lock_timeout: Duration::from_secs(60),
                attempts: 1,
            },
            false,
        ),
        (
            LockPolicy {
                lock_timeout: Duration::from_millis(200),
                attempts: 200,
            },
            true,
        ),
    ] {
        let db = format!("upgrade_{}", policy.lock_timeout.as_millis());
        let url = pg.create_database(&db).await.expect("create database");
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            .connect(&url)
            .await
            .expect("connect");
        migrate_up_to(&pool, ALTERS_MESSAGES - 1, partitions)
            .await
            .expect("the older release's schema");
        // Rows already there, as on any live database.
        sqlx::query(
            "INSERT INTO messages (id, partition, recipient, body, request_fingerprint)
             SELECT gen_random_uuid(), n % 4, '+15550100', '{}'::jsonb, '\\x00'::bytea
             FROM generate_series(1, 20000) n",
        )
        .execute(&pool)
        .await
        .expect("rows");

        // The older release's accepts keep running through the upgrade.
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicU64::new(0));
        let mut accepts = Vec::new();
        for _ in 0..3 {
            let (pool, stop, accepted) = (pool.clone(), stop.clone(), accepted.clone());
            accepts.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let mut tx = pool.begin().await?;
                    let id: uuid::Uuid = sqlx::query_scalar(
                        "INSERT INTO messages (id, partition, recipient, body, request_fingerprint)
                         VALUES (gen_random_uuid(), 1, '+15550100', '{}'::jsonb, '\\x00'::bytea)
                         RETURNING id",
                    )
                    .fetch_one(&mut *tx)
                    .await?;
                    sqlx::query(
                        "INSERT INTO outbox (partition, job_type, message_id) VALUES (1, 'send', $1)",
                    )
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                    tx.commit().await?;
                    accepted.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<_, sqlx::Error>(())
            }));
        }

        // A long transaction that holds `messages` (ROW EXCLUSIVE, as an accept does).
        let mut blocker = pool.begin().await.expect("begin");
        sqlx::query(
            "INSERT INTO messages (id, partition, recipient, body, request_fingerprint)
             VALUES (gen_random_uuid(), 0, '+15550100', '{}'::jsonb, '\\x00'::bytea)",
        )
        .execute(&mut *blocker)
        .await
        .expect("the long transaction's write");
        let upgrade = tokio::spawn({
            let pool = pool.clone();
            async move { migrate_with_locks(&pool, partitions, policy).await }
        });
        // Let the migration reach its ALTER and wait behind the long transaction.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let before = accepted.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(3)).await;
        let during = accepted.load(Ordering::Relaxed) - before;
        blocker.commit().await.expect("the long transaction ends");

        upgrade
            .await
            .unwrap()
            .expect("the upgrade completes once the long transaction ended");
        stop.store(true, Ordering::Relaxed);
        for accept in accepts {
            accept
                .await
                .unwrap()
                .expect("no accept failed during the upgrade");
        }
        let column: Option<String> = sqlx::query_scalar(
            "SELECT column_name::text FROM information_schema.columns
             WHERE table_name = 'messages' AND column_name = 'created_by'",
        )
        .fetch_optional(&pool)
        .await
        .unwrap();
        assert!(column.is_some(), "migration {ALTERS_MESSAGES} applied");
        if expect_progress {
            assert!(
                during > 0,
                "with a lock timeout, accepts go on while the migration waits: {during}"
            );
        } else {
            assert_eq!(
                during, 0,
                "without a lock timeout every accept queues behind the waiting ALTER"
            );
        }
        pool.close().await;
    }
}

/// Every `herald migrate` (each upgrade, each Helm hook) makes sure the outbox partitions exist.
/// With nothing to create it must take no lock a writer holds: a transaction writing to an
/// outbox partition (an accept, a claim) neither holds the run up nor is held up by it.
#[tokio::test]
async fn a_migrate_with_nothing_to_do_waits_for_no_writer() {
    use herald_store::migrate::{migrate_with_locks, LockPolicy};

    let (_pg, pool) = migrated(4).await;
    let mut writer = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO outbox (partition, job_type, payload) VALUES (2, 'send', '{}')")
        .execute(&mut *writer)
        .await
        .unwrap();
    let policy = LockPolicy {
        lock_timeout: std::time::Duration::from_millis(500),
        attempts: 1,
    };
    migrate_with_locks(&pool, PartitionCount::new(4).unwrap(), policy)
        .await
        .expect("a run with nothing to do needs no lock an open write holds");
    writer.commit().await.unwrap();
}

/// The SQL names states as constants, not parameters: the outbox's partial indexes
/// (`WHERE status = 'PENDING'`, the in-flight and DEAD ones) serve a statement only when its
/// condition names the same constant, which a bound parameter under a generic plan does not.
/// So the constants are tied to `herald_core`'s enums here instead: every quoted upper-case
/// word in the store's statements and in the migrations must be a state of `MessageState` or
/// `OutboxStatus`, and every state must be named somewhere. A misspelt state would compile,
/// run, and match nothing.
#[test]
fn every_state_the_sql_names_is_one_of_the_enums() {
    use herald_core::OutboxStatus;
    use std::collections::BTreeSet;

    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let files =
        herald_testkit::source_files(&[root.join("src"), root.join("../../migrations")], &[]);
    assert!(files.len() > 20, "read {} files", files.len());
    let known: BTreeSet<&str> = MessageState::ALL
        .iter()
        .map(|s| s.as_str())
        .chain(OutboxStatus::ALL.iter().map(|s| s.as_str()))
        .collect();
    // Not states: the privilege a grant names.
    let other = ["DELETE"];
    let mut named = BTreeSet::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        // Each `'WORD'`: a quote, three or more upper-case letters or underscores, a quote.
        for (start, _) in text.match_indices('\'') {
            let rest = &text[start + 1..];
            let len = rest
                .find(|c: char| !(c.is_ascii_uppercase() || c == '_'))
                .unwrap_or(rest.len());
            let quoted = &rest[..len];
            if len < 3 || !rest[len..].starts_with('\'') || other.contains(&quoted) {
                continue;
            }
            assert!(
                known.contains(quoted),
                "{}: '{quoted}' is no state of MessageState or OutboxStatus",
                file.display()
            );
            named.insert(quoted.to_owned());
        }
    }
    let unnamed: Vec<&&str> = known.iter().filter(|s| !named.contains(**s)).collect();
    assert!(unnamed.is_empty(), "states no SQL names: {unnamed:?}");
}
