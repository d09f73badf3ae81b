//! Archival before removal. With an archive directory, every row retention removes from the
//! history (a closed message with its events and ledger rows, a receipt with its replayed
//! parking rows) is first written out as gzip-compressed JSON Lines, one file per removal
//! statement, which covers one id range (for messages, UUIDv7: an accept-time range), with a
//! manifest beside it: the row count, the id range, the size and the SHA-256 of the file. Both
//! are on disk (fsync) before the removal commits, so a crash in between leaves a file whose
//! rows are still in the database too, never a removal without its file. `herald archive
//! verify` reads a file back and checks it against its manifest; docs/DESIGN.md ("Retention")
//! says how to restore.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use flate2::read::MultiGzDecoder;
use flate2::write::GzEncoder;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The archive's format version, in every manifest.
pub const FORMAT: u32 = 1;

/// What a file holds: one line per removed message, or per removed receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `{"message": {...}, "events": [...], "ledger": [...]}` per line.
    Messages,
    /// `{"receipt": {...}, "parking": [...]}` per line.
    Receipts,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Messages => "messages",
            Kind::Receipts => "receipts",
        }
    }

    /// The key of each line's main row, and that row's id.
    fn row_key(self) -> &'static str {
        match self {
            Kind::Messages => "message",
            Kind::Receipts => "receipt",
        }
    }
}

/// Written beside each archive file as `<file>.manifest.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub kind: String,
    /// The archive file's name, in the manifest's directory.
    pub file: String,
    pub rows: u64,
    /// The first and last main row's id, as the database prints it.
    pub first_id: String,
    pub last_id: String,
    /// Size and SHA-256 (hex) of the compressed file.
    pub bytes: u64,
    pub sha256: String,
    pub written_at: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}: the manifest is not valid: {1}")]
    BadManifest(PathBuf, String),
    #[error("{0}: does not match its manifest: {1}")]
    Mismatch(PathBuf, String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ArchiveError + '_ {
    move |source| ArchiveError::Io {
        path: path.to_owned(),
        source,
    }
}

/// A directory that archive files are written to, one subdirectory per kind.
#[derive(Debug, Clone)]
pub struct ArchiveDir {
    root: PathBuf,
}

impl ArchiveDir {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Writes `rows` (one JSON value per line, in id order) as a new file with its manifest;
    /// both are synced to disk before this returns. Answers the manifest.
    pub fn write(&self, kind: Kind, rows: &[Value]) -> Result<Manifest, ArchiveError> {
        let id_of = |row: &Value| -> String {
            match &row[kind.row_key()]["id"] {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            }
        };
        let first_id = rows.first().map(id_of).unwrap_or_default();
        let last_id = rows.last().map(id_of).unwrap_or_default();
        let dir = self.root.join(kind.as_str());
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let written_at = chrono::Utc::now();
        let name = format!(
            "{}-{}-{}-{}.jsonl.gz",
            kind.as_str(),
            written_at.format("%Y%m%dT%H%M%S%.6fZ"),
            sortable(&first_id),
            sortable(&last_id)
        );
        let path = dir.join(&name);
        let partial = dir.join(format!("{name}.partial"));
        let file = File::create(&partial).map_err(io(&partial))?;
        let mut gz = GzEncoder::new(file, flate2::Compression::default());
        for row in rows {
            serde_json::to_writer(&mut gz, row)
                .map_err(|err| io(&partial)(std::io::Error::other(err)))?;
            gz.write_all(b"\n").map_err(io(&partial))?;
        }
        let file = gz.finish().map_err(io(&partial))?;
        file.sync_all().map_err(io(&partial))?;
        drop(file);
        let (bytes, sha256) = digest(&partial)?;
        let manifest = Manifest {
            format: FORMAT,
            kind: kind.as_str().to_owned(),
            file: name.clone(),
            rows: rows.len() as u64,
            first_id,
            last_id,
            bytes,
            sha256,
            written_at: written_at.to_rfc3339(),
        };
        let manifest_path = dir.join(format!("{name}.manifest.json"));
        let mut out = File::create(&manifest_path).map_err(io(&manifest_path))?;
        out.write_all(&serde_json::to_vec_pretty(&manifest).expect("a manifest serializes"))
            .map_err(io(&manifest_path))?;
        out.sync_all().map_err(io(&manifest_path))?;
        std::fs::rename(&partial, &path).map_err(io(&path))?;
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(io(&dir))?;
        Ok(manifest)
    }
}

/// An id as part of a file name that sorts like the id: numbers zero-padded.
fn sortable(id: &str) -> String {
    match id.parse::<i64>() {
        Ok(n) => format!("{n:020}"),
        Err(_) => id.to_owned(),
    }
}

/// Size and SHA-256 (hex) of a file.
fn digest(path: &Path) -> Result<(u64, String), ArchiveError> {
    let mut file = File::open(path).map_err(io(path))?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 64 * 1024];
    let mut bytes = 0u64;
    loop {
        let n = file.read(&mut buffer).map_err(io(path))?;
        if n == 0 {
            break;
        }
        bytes += n as u64;
        hasher.update(&buffer[..n]);
    }
    Ok((bytes, hex::encode(hasher.finalize())))
}

/// Reads an archive file back and checks it against its manifest (`path` is either): the
/// size and SHA-256 of the file, that every line is a JSON object with the kind's main row,
/// the row count, and the first and last id. Answers the manifest.
pub fn verify(path: &Path) -> Result<Manifest, ArchiveError> {
    let manifest_path = match path.to_str() {
        Some(p) if p.ends_with(".manifest.json") => path.to_owned(),
        _ => PathBuf::from(format!("{}.manifest.json", path.display())),
    };
    let text = std::fs::read(&manifest_path).map_err(io(&manifest_path))?;
    let manifest: Manifest = serde_json::from_slice(&text)
        .map_err(|err| ArchiveError::BadManifest(manifest_path.clone(), err.to_string()))?;
    if manifest.format != FORMAT {
        return Err(ArchiveError::BadManifest(
            manifest_path,
            format!("format {} (this Herald reads {FORMAT})", manifest.format),
        ));
    }
    let kind = match manifest.kind.as_str() {
        "messages" => Kind::Messages,
        "receipts" => Kind::Receipts,
        other => {
            return Err(ArchiveError::BadManifest(
                manifest_path,
                format!("unknown kind {other:?}"),
            ))
        }
    };
    let file = manifest_path
        .parent()
        .unwrap_or(Path::new("."))
        .join(&manifest.file);
    let mismatch = |what: String| ArchiveError::Mismatch(file.clone(), what);
    let (bytes, sha256) = digest(&file)?;
    if bytes != manifest.bytes || sha256 != manifest.sha256 {
        return Err(mismatch(format!(
            "{bytes} bytes with SHA-256 {sha256}, the manifest says {} bytes with {}",
            manifest.bytes, manifest.sha256
        )));
    }
    let reader = BufReader::new(MultiGzDecoder::new(File::open(&file).map_err(io(&file))?));
    let (mut rows, mut first, mut last) = (0u64, None, None);
    for (n, line) in reader.lines().enumerate() {
        let line = line.map_err(io(&file))?;
        let row: Value = serde_json::from_str(&line)
            .map_err(|err| mismatch(format!("line {}: not JSON: {err}", n + 1)))?;
        let id = match &row[kind.row_key()]["id"] {
            Value::String(s) => s.clone(),
            Value::Null => {
                return Err(mismatch(format!(
                    "line {}: no {} with an id",
                    n + 1,
                    kind.row_key()
                )))
            }
            other => other.to_string(),
        };
        first.get_or_insert_with(|| id.clone());
        last = Some(id);
        rows += 1;
    }
    if rows != manifest.rows {
        return Err(mismatch(format!(
            "{rows} rows, the manifest says {}",
            manifest.rows
        )));
    }
    if first.unwrap_or_default() != manifest.first_id
        || last.unwrap_or_default() != manifest.last_id
    {
        return Err(mismatch("the first or last id differs".to_owned()));
    }
    Ok(manifest)
}

/// Puts the rows of a verified archive file back (`path`: the file or its manifest), in one
/// transaction; a row the database still has (a file written by a removal that did not
/// commit) is left as it is. Answers the lines restored. Messages come back with their
/// events and ledger rows, receipts with their parking rows.
pub async fn restore(pool: &sqlx::PgPool, path: &Path) -> Result<u64, crate::StoreError> {
    let manifest = verify(path)?;
    let file = match path.to_str() {
        Some(p) if p.ends_with(".manifest.json") => path.with_file_name(&manifest.file),
        _ => path.to_owned(),
    };
    let lines: Vec<Value> = {
        let reader = BufReader::new(MultiGzDecoder::new(File::open(&file).map_err(io(&file))?));
        let mut lines = Vec::new();
        for line in reader.lines() {
            let line = line.map_err(io(&file))?;
            lines.push(
                serde_json::from_str(&line)
                    .map_err(|err| ArchiveError::Mismatch(file.clone(), err.to_string()))?,
            );
        }
        lines
    };
    // Each table's own record type reads its row back from the JSON PostgreSQL wrote.
    let statements: &[&str] = if manifest.kind == "messages" {
        &[
            "INSERT INTO messages SELECT * FROM jsonb_populate_record(NULL::messages, $1->'message')
             ON CONFLICT DO NOTHING",
            "INSERT INTO message_events OVERRIDING SYSTEM VALUE
             SELECT * FROM jsonb_populate_recordset(NULL::message_events, $1->'events')
             ON CONFLICT DO NOTHING",
            "INSERT INTO ledger SELECT * FROM jsonb_populate_recordset(NULL::ledger, $1->'ledger')
             ON CONFLICT DO NOTHING",
        ]
    } else {
        &[
            "INSERT INTO receipts OVERRIDING SYSTEM VALUE
             SELECT * FROM jsonb_populate_record(NULL::receipts, $1->'receipt')
             ON CONFLICT DO NOTHING",
            "INSERT INTO parking OVERRIDING SYSTEM VALUE
             SELECT * FROM jsonb_populate_recordset(NULL::parking, $1->'parking')
             ON CONFLICT DO NOTHING",
        ]
    };
    let mut tx = pool.begin().await?;
    for line in &lines {
        for statement in statements {
            sqlx::query(statement)
                .bind(sqlx::types::Json(line))
                .execute(&mut *tx)
                .await?;
        }
    }
    tx.commit().await?;
    Ok(lines.len() as u64)
}

/// Every manifest under `path` (a directory, searched recursively), or `path` itself.
pub fn manifests(path: &Path) -> Result<Vec<PathBuf>, ArchiveError> {
    if !path.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let mut found = Vec::new();
    let mut dirs = vec![path.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).map_err(io(&dir))? {
            let entry = entry.map_err(io(&dir))?.path();
            if entry.is_dir() {
                dirs.push(entry);
            } else if entry
                .to_str()
                .is_some_and(|p| p.ends_with(".manifest.json"))
            {
                found.push(entry);
            }
        }
    }
    found.sort();
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_written_file_verifies_and_any_change_to_it_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let archive = ArchiveDir::new(dir.path());
        let rows = vec![
            json!({"receipt": {"id": 7, "raw": "\\x7b7d"}, "parking": []}),
            json!({"receipt": {"id": 9, "raw": "\\x7b7d"}, "parking": [{"id": 1}]}),
        ];
        let manifest = archive.write(Kind::Receipts, &rows).unwrap();
        assert_eq!((manifest.rows, manifest.first_id.as_str()), (2, "7"));
        let file = dir.path().join("receipts").join(&manifest.file);
        assert_eq!(verify(&file).unwrap(), manifest);
        let found = manifests(dir.path()).unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(verify(&found[0]).unwrap(), manifest);

        let mut bytes = std::fs::read(&file).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0xff;
        std::fs::write(&file, bytes).unwrap();
        assert!(matches!(verify(&file), Err(ArchiveError::Mismatch(..))));
        std::fs::remove_file(&file).unwrap();
        assert!(matches!(verify(&found[0]), Err(ArchiveError::Io { .. })));
    }
}
