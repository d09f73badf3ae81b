//! Which tables the WAL of a stretch of work came from: every record between two WAL positions
//! (PostgreSQL's `pg_walinspect`), summed by the relation of its first block, with indexes,
//! TOAST and partitions folded into their table, and the full-page images apart. The row
//! counts of [`crate::cost`] say how many writes each table took; this says what they cost in
//! WAL, and how much of it was pages written whole after a checkpoint.
//!
//! It reads WAL back from disk after the measured window, so it never slows the window. The
//! server keeps only the last `max_wal_size` or so: what it already recycled is left out, the
//! answer says which share of the window it read, and the tables' shares of that part are
//! applied to the window's whole WAL (so the figures add up to the measured WAL per message).
//! The extension is created only in a deployment the tester started; in anyone else's
//! database it is used if installed, and otherwise the answer is a note instead of figures.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One table's WAL, per message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TableWal {
    pub bytes: f64,
    /// Of `bytes`, the full-page images.
    pub full_page_bytes: f64,
}

/// The WAL of a window by table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WalByTable {
    /// Share of the window's WAL still on disk and read (1.0: all of it).
    pub covered: f64,
    /// Per message of the window, by table: each table's share of the part read, times the
    /// window's whole WAL (from its positions), divided by the messages. With `covered` below
    /// 1, that assumes the part read is like the rest.
    pub per_message: BTreeMap<String, TableWal>,
    /// Why there are no figures, when there are none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The records between two positions (bytes since 0/0, as [`crate::cost::Sample`] keeps
/// them), from the oldest segment the server still holds on. `(name, bytes, full-page bytes,
/// covered share)` per table.
const BY_TABLE: &str = r"
WITH kept AS (
    SELECT min(name) AS name FROM pg_ls_waldir() WHERE name ~ '^[0-9A-F]{24}$'
), bounds AS (
    SELECT greatest('0/0'::pg_lsn + $1::numeric,
                    '0/0'::pg_lsn + (('x' || substr(k.name, 9, 8))::bit(32)::bigint * 4294967296
                        + ('x' || substr(k.name, 17, 8))::bit(32)::bigint
                          * (SELECT s.setting::bigint FROM pg_settings s
                             WHERE s.name = 'wal_segment_size'))::numeric) AS lo,
           least('0/0'::pg_lsn + $2::numeric, pg_current_wal_flush_lsn()) AS hi
    FROM kept k
), records AS (
    SELECT x.m[1]::oid AS db, x.m[2]::oid AS node,
           r.record_length + r.fpi_length AS bytes, r.fpi_length AS fpi
    FROM bounds b, pg_get_wal_records_info(b.lo, b.hi) r,
         LATERAL (SELECT regexp_match(r.block_ref, 'rel \d+/(\d+)/(\d+)') AS m) x
    WHERE b.lo < b.hi
), named AS (
    SELECT CASE WHEN r.node IS NULL THEN '(no relation)'
                WHEN c.oid IS NULL THEN '(other databases, shared or mapped catalogs)'
                WHEN c.relnamespace = 'pg_catalog'::regnamespace THEN '(catalogs)'
                ELSE coalesce(parent.relname, owner.relname, tab.relname) END AS name,
           r.bytes, r.fpi
    FROM records r
    LEFT JOIN pg_class c ON c.relfilenode = r.node AND r.node <> 0
                        AND r.db = (SELECT d.oid FROM pg_database d
                                    WHERE d.datname = current_database())
    LEFT JOIN pg_index i ON i.indexrelid = c.oid
    LEFT JOIN pg_class tab ON tab.oid = coalesce(i.indrelid, c.oid)
    LEFT JOIN pg_class owner ON owner.reltoastrelid = tab.oid
    LEFT JOIN pg_inherits h ON h.inhrelid = coalesce(owner.oid, tab.oid)
    LEFT JOIN pg_class parent ON parent.oid = h.inhparent
)
SELECT n.name::text, sum(n.bytes)::bigint, sum(n.fpi)::bigint,
       (SELECT coalesce(((b.hi - b.lo) / nullif($2::numeric - $1::numeric, 0))::float8, 0)
        FROM bounds b)
FROM named n GROUP BY n.name";

/// The WAL written between `from` and `to` (bytes since 0/0) by table, divided by `messages`.
/// `create`: the extension may be created (a server the tester started); otherwise it must
/// be installed already. Never fails: what it cannot read becomes the answer's note.
pub async fn by_table(
    pool: &sqlx::PgPool,
    from: i64,
    to: i64,
    messages: u64,
    create: bool,
) -> WalByTable {
    match read(pool, from, to, messages, create).await {
        Ok(answer) => answer,
        Err(err) => WalByTable {
            note: Some(format!("WAL by table not read: {err:#}")),
            ..WalByTable::default()
        },
    }
}

async fn read(
    pool: &sqlx::PgPool,
    from: i64,
    to: i64,
    messages: u64,
    create: bool,
) -> anyhow::Result<WalByTable> {
    if create {
        sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            .execute(pool)
            .await?;
    } else {
        let installed: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_walinspect')",
        )
        .fetch_one(pool)
        .await?;
        anyhow::ensure!(
            installed,
            "pg_walinspect is not installed in this database (the load tester creates it only \
             in a deployment it started)"
        );
    }
    let rows: Vec<(String, i64, i64, f64)> = sqlx::query_as(BY_TABLE)
        .bind(from)
        .bind(to)
        .fetch_all(pool)
        .await?;
    Ok(per_message(rows, (to - from) as f64, messages))
}

/// `rows` as the statement answers them; `window` is the window's WAL in bytes.
fn per_message(rows: Vec<(String, i64, i64, f64)>, window: f64, messages: u64) -> WalByTable {
    let n = (messages as f64).max(1.0);
    let covered = rows.first().map(|r| r.3).unwrap_or(0.0);
    let read: f64 = rows.iter().map(|r| r.1 as f64).sum();
    let scale = if read > 0.0 { window / read } else { 0.0 };
    WalByTable {
        covered,
        per_message: rows
            .into_iter()
            .map(|(name, bytes, fpi, _)| {
                (
                    name,
                    TableWal {
                        bytes: bytes as f64 * scale / n,
                        full_page_bytes: fpi as f64 * scale / n,
                    },
                )
            })
            .collect(),
        note: None,
    }
}

impl WalByTable {
    /// The lines of the cost report: the largest first, in kB per message.
    pub fn render(&self) -> String {
        if let Some(note) = &self.note {
            return format!("  {note}\n");
        }
        let mut tables: Vec<_> = self.per_message.iter().collect();
        tables.sort_by(|a, b| b.1.bytes.total_cmp(&a.1.bytes));
        let total: f64 = tables.iter().map(|(_, w)| w.bytes).sum();
        let mut out = format!(
            "  WAL per message by table, kB (of it full-page images), {}:",
            if self.covered >= 0.995 {
                "the whole window read back".to_owned()
            } else {
                format!(
                    "shares of the {:.0} % of the window still on disk",
                    self.covered * 100.0
                )
            }
        );
        for (name, wal) in tables {
            if wal.bytes < total * 0.005 {
                continue;
            }
            out.push_str(&format!(
                "\n    {name:<22} {:.3}  ({:.3})",
                wal.bytes / 1000.0,
                wal.full_page_bytes / 1000.0
            ));
        }
        out.push('\n');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_per_message_and_small_tables_are_not_printed() {
        // Half the window still on disk: each table's share of the half read, applied to the
        // whole window's 6,000,000 bytes.
        let wal = per_message(
            vec![
                ("outbox".to_owned(), 2_000_000, 1_000_000, 0.5),
                ("messages".to_owned(), 999_900, 0, 0.5),
                ("(catalogs)".to_owned(), 100, 0, 0.5),
            ],
            6_000_000.0,
            1_000,
        );
        assert_eq!(wal.covered, 0.5);
        assert_eq!(
            wal.per_message["outbox"],
            TableWal {
                bytes: 4_000.0,
                full_page_bytes: 2_000.0
            }
        );
        let total: f64 = wal.per_message.values().map(|t| t.bytes).sum();
        assert!((total - 6_000.0).abs() < 1e-6, "{total}");
        let text = wal.render();
        assert!(text.contains("of the 50 % of the window"), "{text}");
        assert!(text.contains("4.000  (2.000)"), "{text}");
        assert!(!text.contains("catalogs"), "{text}");
        assert!(text.find("outbox") < text.find("messages"), "{text}");
    }

    #[test]
    fn a_failure_is_a_note() {
        let wal = WalByTable {
            note: Some("WAL by table not read: permission denied".to_owned()),
            ..WalByTable::default()
        };
        assert_eq!(wal.render(), "  WAL by table not read: permission denied\n");
    }
}
