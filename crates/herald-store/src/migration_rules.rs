//! The rules a migration follows so that it can run while Herald takes traffic.
//!
//! A migration runs against a live database: the API accepting, pollers claiming, workers
//! writing. A statement that takes a strong lock for long, or rewrites a large table, stops
//! intake for as long as it runs. [`check`] reads a migration's SQL and names each statement
//! that would; a test runs it over every migration newer than [`CHECKED_FROM`].
//!
//! What is refused, and what to write instead:
//!
//! - `CREATE INDEX` on a table the migration does not create, without `CONCURRENTLY` (a plain
//!   build blocks every write to the table for the whole build). A concurrent build cannot run
//!   in a transaction: the file starts with `-- no-transaction`.
//! - Any index on `outbox`: it is partitioned, and PostgreSQL cannot build an index on a
//!   partitioned table concurrently. Build it `ON ONLY outbox`, then concurrently on each child
//!   and `ALTER INDEX … ATTACH PARTITION` each; `herald_create_outbox_partitions` is where
//!   per-child indexes live today.
//! - `ADD CONSTRAINT … CHECK / FOREIGN KEY` (or a column with `REFERENCES` / `CHECK`) without
//!   `NOT VALID`: validating scans the table under a lock that blocks writes. Add it
//!   `NOT VALID` and `VALIDATE CONSTRAINT` it in a later statement (a weaker lock).
//! - `ADD COLUMN … NOT NULL` without a `DEFAULT` (fails on a table with rows), and a `DEFAULT`
//!   that is volatile (`now()`, `clock_timestamp()`, `random()`, `gen_random_uuid()`), which
//!   rewrites every row.
//! - `ALTER COLUMN … TYPE` and `SET NOT NULL` (a rewrite or a full scan under an exclusive
//!   lock), `VACUUM FULL`, `CLUSTER`, `LOCK TABLE`, `REINDEX` without `CONCURRENTLY`.
//!
//! Every statement also runs under `herald migrate`'s `lock_timeout` (see
//! [`crate::migrate::LockPolicy`]), so even an allowed `ALTER TABLE` never queues accepts
//! behind it for longer than that.

/// Migrations up to this version were written before these rules and have run on every
/// deployment; a migration cannot be changed once applied (its checksum is recorded), so they
/// are not checked. Every later one is.
pub const CHECKED_FROM: i64 = 7;

/// Why each statement of `sql` could stop intake on a live database (empty: none).
pub fn check(sql: &str) -> Vec<String> {
    let no_transaction = sql.trim_start().starts_with("-- no-transaction");
    let statements = statements(sql);
    let created: Vec<String> = statements
        .iter()
        .filter_map(|s| table_after(s, &["create table if not exists ", "create table "]))
        .collect();
    let mut problems = Vec::new();
    for statement in &statements {
        let s = statement.as_str();
        let mut refuse = |why: &str| problems.push(format!("{why}: `{}`", shorten(s)));
        if s.starts_with("create index") || s.starts_with("create unique index") {
            let table = index_table(s);
            if table.as_deref() == Some("outbox") {
                refuse(
                    "an index on the partitioned outbox cannot be built concurrently; build it \
                     ON ONLY outbox, then concurrently per child partition, and attach each",
                );
            } else if !s.contains(" concurrently ") && !table.is_some_and(|t| created.contains(&t))
            {
                refuse("an index on an existing table is built CONCURRENTLY (in a migration that starts with `-- no-transaction`)");
            } else if s.contains(" concurrently ") && !no_transaction {
                refuse("CREATE INDEX CONCURRENTLY cannot run in a transaction: start the file with `-- no-transaction`");
            }
        }
        if s.starts_with("alter table") {
            let table = table_after(
                s,
                &[
                    "alter table only ",
                    "alter table if exists ",
                    "alter table ",
                ],
            );
            let new_table = table.is_some_and(|t| created.contains(&t));
            if !new_table {
                let validates = s.contains(" check ")
                    || s.contains(" check(")
                    || s.contains(" foreign key")
                    || s.contains(" references ");
                if validates
                    && (s.contains(" add ") || s.contains(" add constraint "))
                    && !s.contains(" not valid")
                {
                    refuse("a constraint on an existing table is added NOT VALID and validated in a later statement");
                }
                if s.contains(" add column")
                    || (s.contains(" add ") && !s.contains(" add constraint "))
                {
                    let volatile = [
                        "now()",
                        "clock_timestamp()",
                        "random()",
                        "gen_random_uuid()",
                        "current_timestamp",
                    ];
                    if s.contains(" not null") && !s.contains(" default ") {
                        refuse("a NOT NULL column needs a DEFAULT on a table with rows");
                    }
                    if s.contains(" default ") && volatile.iter().any(|v| s.contains(v)) {
                        refuse("a volatile DEFAULT rewrites every row under an exclusive lock; add the column without it and fill it in batches");
                    }
                }
                if s.contains(" type ") && s.contains(" alter column ") {
                    refuse("changing a column's type rewrites the table under an exclusive lock");
                }
                if s.contains(" set not null") {
                    refuse("SET NOT NULL scans the table under an exclusive lock; use a validated CHECK (… IS NOT NULL) instead");
                }
            }
        }
        if s.starts_with("vacuum full") || s.starts_with("cluster") || s.starts_with("lock ") {
            refuse("takes an exclusive lock for as long as it runs");
        }
        if s.starts_with("reindex") && !s.contains(" concurrently") {
            refuse("REINDEX blocks writes; use REINDEX … CONCURRENTLY");
        }
    }
    problems
}

/// The statements of `sql`, comments removed, whitespace collapsed, lowercased, with a space
/// appended so that `" word "` matches a last word too. Semicolons inside dollar-quoted
/// bodies and string literals do not split.
fn statements(sql: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut chars = sql.chars().peekable();
    let mut dollar: Option<String> = None;
    let mut quoted = false;
    while let Some(c) = chars.next() {
        if let Some(tag) = &dollar {
            current.push(c);
            if current.ends_with(tag.as_str()) && current.len() > tag.len() {
                dollar = None;
            }
            continue;
        }
        if quoted {
            current.push(c);
            if c == '\'' {
                quoted = false;
            }
            continue;
        }
        match c {
            '-' if chars.peek() == Some(&'-') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
                current.push(' ');
            }
            '\'' => {
                quoted = true;
                current.push(c);
            }
            '$' => {
                let mut tag = String::from("$");
                while let Some(&n) = chars.peek() {
                    chars.next();
                    tag.push(n);
                    if n == '$' {
                        break;
                    }
                    if !(n.is_alphanumeric() || n == '_') {
                        break;
                    }
                }
                current.push_str(&tag);
                if tag.len() >= 2 && tag.ends_with('$') {
                    dollar = Some(tag);
                }
            }
            ';' => {
                push_statement(&mut out, &current);
                current.clear();
            }
            c => current.push(c),
        }
    }
    push_statement(&mut out, &current);
    out
}

fn push_statement(out: &mut Vec<String>, text: &str) {
    let normal = text
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase();
    if !normal.is_empty() {
        out.push(format!("{normal} "));
    }
}

/// The (unqualified, unquoted) table name right after the first of `prefixes` that starts `s`.
fn table_after(s: &str, prefixes: &[&str]) -> Option<String> {
    let rest = prefixes.iter().find_map(|p| s.strip_prefix(p))?;
    name(rest)
}

fn name(rest: &str) -> Option<String> {
    let word = rest.split([' ', '(']).next()?;
    let word = word.rsplit('.').next()?.trim_matches('"');
    (!word.is_empty()).then(|| word.to_owned())
}

/// The table a `CREATE INDEX` statement builds on.
fn index_table(s: &str) -> Option<String> {
    let (_, rest) = s.split_once(" on ")?;
    let rest = rest.strip_prefix("only ").unwrap_or(rest);
    name(rest)
}

fn shorten(s: &str) -> String {
    let s = s.trim();
    match s.char_indices().nth(100) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn what_a_live_database_can_take_passes() {
        let sql = "-- A new table and its index, a nullable column, a constraint added NOT VALID.
            CREATE TABLE held (id bigint PRIMARY KEY, at timestamptz NOT NULL DEFAULT now());
            CREATE INDEX held_at ON held (at);
            ALTER TABLE messages ADD COLUMN created_by text;
            ALTER TABLE ledger ADD COLUMN n integer NOT NULL DEFAULT 0;
            ALTER TABLE ledger ADD CONSTRAINT ledger_n CHECK (n >= 0) NOT VALID;
            ALTER TABLE ledger VALIDATE CONSTRAINT ledger_n;
            CREATE FUNCTION f() RETURNS void LANGUAGE plpgsql AS $$
            BEGIN
                LOCK TABLE messages; -- inside a body: not a statement of the migration
            END
            $$;";
        assert_eq!(check(sql), Vec::<String>::new());
        let concurrent =
            "-- no-transaction\nCREATE INDEX CONCURRENTLY ledger_gw ON ledger (gateway);";
        assert_eq!(check(concurrent), Vec::<String>::new());
    }

    #[test]
    fn each_statement_that_would_stop_intake_is_named() {
        for (sql, why) in [
            ("CREATE INDEX ledger_gw ON ledger (gateway);", "CONCURRENTLY"),
            ("CREATE INDEX CONCURRENTLY ledger_gw ON ledger (gateway);", "no-transaction"),
            // The one migration that ran before these rules and would not pass them today.
            (
                "CREATE INDEX IF NOT EXISTS outbox_dead ON outbox (id) WHERE status = 'DEAD';",
                "partitioned outbox",
            ),
            ("ALTER TABLE ledger ADD CONSTRAINT c CHECK (length(gateway) > 0);", "NOT VALID"),
            (
                "ALTER TABLE held_receipts ADD CONSTRAINT f FOREIGN KEY (receipt_id) REFERENCES receipts (id);",
                "NOT VALID",
            ),
            ("ALTER TABLE messages ADD COLUMN tenant text NOT NULL;", "DEFAULT"),
            ("ALTER TABLE messages ADD COLUMN seen_at timestamptz DEFAULT now();", "volatile"),
            ("ALTER TABLE ledger ALTER COLUMN provider_id TYPE varchar(64);", "type"),
            ("ALTER TABLE ledger ALTER COLUMN submitted_at SET NOT NULL;", "SET NOT NULL"),
            ("VACUUM FULL outbox;", "exclusive lock"),
            ("LOCK TABLE messages IN ACCESS EXCLUSIVE MODE;", "exclusive lock"),
            ("REINDEX TABLE ledger;", "CONCURRENTLY"),
        ] {
            let problems = check(sql);
            assert_eq!(problems.len(), 1, "{sql}: {problems:?}");
            assert!(problems[0].contains(why), "{sql}: {problems:?}");
        }
    }
}
