//! Archival before removal. With an archive directory, every row retention removes from the
//! history (a closed message with its events and ledger rows, a receipt with its replayed
//! parking rows) is first written out as gzip-compressed JSON Lines, one file per removal
//! statement, which covers one id range (for messages, UUIDv7: an accept-time range), with a
//! manifest beside it: the row count, the id range, the size and the SHA-256 of the file. Both
//! are on disk (fsync) before the removal commits, so a crash in between leaves a file whose
//! rows are still in the database too, never a removal without its file. Once an hour is
//! over, its files are rolled up into files of up to 64 MB ([`ArchiveDir::roll_up`]). `herald archive
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
    /// For a file rolled up from the files of one hour ([`ArchiveDir::roll_up`]): their
    /// names, in order. Empty for a file written by one removal statement.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<String>,
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
            parts: Vec::new(),
        };
        write_manifest(&dir, &manifest)?;
        std::fs::rename(&partial, &path).map_err(io(&path))?;
        sync_dir(&dir)?;
        Ok(manifest)
    }

    /// Merges the files removal statements wrote in each hour before `now`'s (one per
    /// statement, a few a second under load) into files of up to [`ROLLED_FILE_BYTES`]: their
    /// compressed bytes one after the other (a gzip file may hold many members), with one
    /// manifest listing the parts. Each part is verified first; a group with a part that fails
    /// is left as it is (and logged). The merged file and its manifest are on disk before any
    /// part is removed, and a part a manifest of its hour already lists (a roll-up that stopped
    /// before removing its parts) is removed without being merged again. Files are chosen by
    /// name: a pass with no part of a past hour reads no manifest.
    pub fn roll_up(&self, kind: Kind, now: std::time::SystemTime) -> Result<RollUp, ArchiveError> {
        let now = chrono::DateTime::<chrono::Utc>::from(now);
        let dir = self.root.join(kind.as_str());
        let mut done = RollUp::default();
        if !dir.is_dir() {
            return Ok(done);
        }
        let prefix = format!("{}-", kind.as_str());
        let current = now.format("%Y%m%dT%H").to_string();
        // `<kind>-YYYYMMDDTHH`, then `MMSS.ffffffZ-…` for a statement's file or `h-…` for a
        // rolled one.
        let hour_of = |name: &str| {
            name.strip_prefix(prefix.as_str())
                .and_then(|rest| rest.get(..11))
                .map(str::to_owned)
        };
        let is_rolled = |name: &str| {
            name.strip_prefix(prefix.as_str())
                .and_then(|rest| rest.as_bytes().get(11))
                == Some(&b'h')
        };
        // Names first: only manifests of hours that are over and still have parts are read,
        // so a pass with nothing to roll up reads no file.
        let (mut part_manifests, mut rolled_manifests) = (Vec::new(), Vec::new());
        for entry in std::fs::read_dir(&dir).map_err(io(&dir))? {
            let entry = entry.map_err(io(&dir))?;
            let name = entry.file_name();
            let Some(file) = name.to_str().and_then(|n| n.strip_suffix(".manifest.json")) else {
                continue;
            };
            let Some(hour) = hour_of(file).filter(|hour| *hour < current) else {
                continue;
            };
            if is_rolled(file) {
                rolled_manifests.push((hour, entry.path()));
            } else {
                part_manifests.push((hour, entry.path()));
            }
        }
        if part_manifests.is_empty() {
            return Ok(done);
        }
        let hours: std::collections::HashSet<&String> =
            part_manifests.iter().map(|(hour, _)| hour).collect();
        let read = |path: &Path| -> Result<Option<Manifest>, ArchiveError> {
            let text = std::fs::read(path).map_err(io(path))?;
            Ok(serde_json::from_slice::<Manifest>(&text)
                .map_err(|err| {
                    tracing::warn!(manifest = %path.display(), error = %err,
                    "an archive manifest that is not valid is left out of the roll-up")
                })
                .ok())
        };
        // Parts a rolled file of the same hour already holds (a roll-up that stopped before
        // removing them).
        let mut merged = std::collections::HashSet::new();
        for (_, path) in rolled_manifests
            .iter()
            .filter(|(hour, _)| hours.contains(hour))
        {
            merged.extend(read(path)?.map(|m| m.parts).unwrap_or_default());
        }
        let mut due: Vec<Manifest> = Vec::new();
        for (_, path) in &part_manifests {
            let Some(part) = read(path)? else { continue };
            if merged.contains(&part.file) {
                remove_part(&dir, &part.file)?;
                done.leftovers_removed += 1;
            } else if !dir.join(&part.file).exists() {
                // A statement that stopped between its manifest and its file's rename: it did
                // not commit, so its rows are still in the database and go into a later file.
                tracing::warn!(manifest = %part.file, "an archive manifest without its file (a removal that did not commit) is removed");
                remove_part(&dir, &format!("{}.partial", part.file))?;
                remove_part(&dir, &part.file)?;
                done.leftovers_removed += 1;
            } else {
                due.push(part);
            }
        }
        due.sort_by(|a, b| a.file.cmp(&b.file));
        // Consecutive parts of one hour, up to ROLLED_FILE_BYTES each; a lone part is rolled
        // too, so no hour that is over keeps parts to be read again at every pass.
        let mut chunks: Vec<(String, u64, Vec<Manifest>)> = Vec::new();
        for part in due {
            let hour = hour_of(&part.file).expect("a due part is named by its hour");
            match chunks.last_mut() {
                Some((h, bytes, chunk))
                    if *h == hour && *bytes + part.bytes <= ROLLED_FILE_BYTES =>
                {
                    *bytes += part.bytes;
                    chunk.push(part);
                }
                _ => chunks.push((hour, part.bytes, vec![part])),
            }
        }
        for (hour, _, chunk) in chunks {
            if let Err(err) = chunk
                .iter()
                .try_for_each(|part| verify(&dir.join(&part.file)).map(drop))
            {
                tracing::warn!(error = %err, "an archive file does not match its manifest; its group of files is not rolled up");
                done.groups_skipped += 1;
                continue;
            }
            let (first, last) = (&chunk[0], &chunk[chunk.len() - 1]);
            let name = format!(
                "{prefix}{hour}h-{}-{}.jsonl.gz",
                sortable(&first.first_id),
                sortable(&last.last_id)
            );
            let partial = dir.join(format!("{name}.partial"));
            let mut out = File::create(&partial).map_err(io(&partial))?;
            for part in &chunk {
                let path = dir.join(&part.file);
                let mut input = File::open(&path).map_err(io(&path))?;
                std::io::copy(&mut input, &mut out).map_err(io(&partial))?;
            }
            out.sync_all().map_err(io(&partial))?;
            drop(out);
            let (bytes, sha256) = digest(&partial)?;
            let manifest = Manifest {
                format: FORMAT,
                kind: kind.as_str().to_owned(),
                file: name.clone(),
                rows: chunk.iter().map(|p| p.rows).sum(),
                first_id: first.first_id.clone(),
                last_id: last.last_id.clone(),
                bytes,
                sha256,
                written_at: chrono::Utc::now().to_rfc3339(),
                parts: chunk.iter().map(|p| p.file.clone()).collect(),
            };
            std::fs::rename(&partial, dir.join(&name)).map_err(io(&partial))?;
            write_manifest(&dir, &manifest)?;
            sync_dir(&dir)?;
            for part in &chunk {
                remove_part(&dir, &part.file)?;
            }
            sync_dir(&dir)?;
            done.files += 1;
            done.parts += chunk.len() as u64;
        }
        Ok(done)
    }
}

/// Most compressed bytes of a file [`ArchiveDir::roll_up`] writes: an hour's parts are merged
/// in order into files of up to this size, so restoring one message reads at most this much.
pub const ROLLED_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// What one [`ArchiveDir::roll_up`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RollUp {
    /// Files written, and the parts merged into them.
    pub files: u64,
    pub parts: u64,
    /// Parts an earlier roll-up had merged but not yet removed.
    pub leftovers_removed: u64,
    /// Groups of parts left as they are because one did not match its manifest.
    pub groups_skipped: u64,
}

/// Writes `<file>.manifest.json` beside the file, synced, through a temporary name, so a
/// manifest on disk is always whole.
fn write_manifest(dir: &Path, manifest: &Manifest) -> Result<(), ArchiveError> {
    let path = dir.join(format!("{}.manifest.json", manifest.file));
    let partial = dir.join(format!("{}.manifest.json.partial", manifest.file));
    let mut out = File::create(&partial).map_err(io(&partial))?;
    out.write_all(&serde_json::to_vec_pretty(manifest).expect("a manifest serializes"))
        .map_err(io(&partial))?;
    out.sync_all().map_err(io(&partial))?;
    std::fs::rename(&partial, &path).map_err(io(&path))
}

fn sync_dir(dir: &Path) -> Result<(), ArchiveError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

/// Removes a part file and its manifest, the file first: a file left without its manifest
/// would be found by nobody, while a manifest left without its file is found by the next
/// roll-up (a merged file's manifest lists it) and removed then.
fn remove_part(dir: &Path, file: &str) -> Result<(), ArchiveError> {
    for path in [dir.join(file), dir.join(format!("{file}.manifest.json"))] {
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(io(&path)(err)),
        }
    }
    Ok(())
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

/// Lines restored per transaction: a rolled-up file holds up to an hour of removals.
const RESTORE_CHUNK: usize = 1_000;

/// Puts the rows of a verified archive file back (`path`: the file or its manifest), reading
/// it as a stream and committing every [`RESTORE_CHUNK`] lines; a row the database still has
/// (a file written by a removal that did not commit, or a restore run twice) is left as it
/// is, so a restore that stopped half-way is finished by running it again. Answers the lines
/// restored. Messages come back with their events and ledger rows, receipts with their
/// parking rows.
pub async fn restore(pool: &sqlx::PgPool, path: &Path) -> Result<u64, crate::StoreError> {
    let manifest = verify(path)?;
    let file = match path.to_str() {
        Some(p) if p.ends_with(".manifest.json") => path.with_file_name(&manifest.file),
        _ => path.to_owned(),
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
    let reader = BufReader::new(MultiGzDecoder::new(File::open(&file).map_err(io(&file))?));
    let mut lines = reader.lines();
    let mut restored = 0u64;
    loop {
        let mut chunk: Vec<Value> = Vec::with_capacity(RESTORE_CHUNK);
        for line in lines.by_ref().take(RESTORE_CHUNK) {
            let line = line.map_err(io(&file))?;
            chunk.push(
                serde_json::from_str(&line)
                    .map_err(|err| ArchiveError::Mismatch(file.clone(), err.to_string()))?,
            );
        }
        if chunk.is_empty() {
            return Ok(restored);
        }
        let mut tx = pool.begin().await?;
        for line in &chunk {
            for statement in statements {
                sqlx::query(statement)
                    .bind(sqlx::types::Json(line))
                    .execute(&mut *tx)
                    .await?;
            }
        }
        tx.commit().await?;
        restored += chunk.len() as u64;
    }
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

    fn receipts(ids: std::ops::RangeInclusive<i64>) -> Vec<Value> {
        ids.map(|id| json!({"receipt": {"id": id}, "parking": []}))
            .collect()
    }

    fn ids_in(path: &Path) -> Vec<i64> {
        BufReader::new(MultiGzDecoder::new(File::open(path).unwrap()))
            .lines()
            .map(|line| {
                let row: Value = serde_json::from_str(&line.unwrap()).unwrap();
                row["receipt"]["id"].as_i64().unwrap()
            })
            .collect()
    }

    #[test]
    fn an_hours_files_roll_up_into_one_that_verifies_and_leftovers_go() {
        let dir = tempfile::tempdir().unwrap();
        let archive = ArchiveDir::new(dir.path());
        let kind_dir = dir.path().join("receipts");
        for ids in [1..=2, 3..=4, 5..=5] {
            archive.write(Kind::Receipts, &receipts(ids)).unwrap();
        }
        // Within the hour nothing is merged: a statement may still be writing.
        assert_eq!(
            archive
                .roll_up(Kind::Receipts, std::time::SystemTime::now())
                .unwrap(),
            RollUp::default()
        );
        assert_eq!(manifests(dir.path()).unwrap().len(), 3);

        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(2 * 3600);
        let done = archive.roll_up(Kind::Receipts, later).unwrap();
        assert_eq!((done.files, done.parts), (1, 3));
        let found = manifests(dir.path()).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        let rolled = verify(&found[0]).unwrap();
        assert_eq!(
            (
                rolled.rows,
                rolled.first_id.as_str(),
                rolled.last_id.as_str()
            ),
            (5, "1", "5")
        );
        assert_eq!(rolled.parts.len(), 3);
        assert_eq!(ids_in(&kind_dir.join(&rolled.file)), vec![1, 2, 3, 4, 5]);
        let names: Vec<_> = std::fs::read_dir(&kind_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 2, "the file and its manifest: {names:?}");

        // A roll-up that stopped before removing its parts: the next removes them, unmerged.
        let part = &rolled.parts[0];
        let leftover = Manifest {
            file: part.clone(),
            parts: Vec::new(),
            ..rolled.clone()
        };
        write_manifest(&kind_dir, &leftover).unwrap();
        std::fs::write(kind_dir.join(part), b"stale").unwrap();
        let again = archive.roll_up(Kind::Receipts, later).unwrap();
        assert_eq!((again.files, again.leftovers_removed), (0, 1));
        assert!(!kind_dir.join(part).exists());
        assert_eq!(manifests(dir.path()).unwrap().len(), 1);
        assert_eq!(verify(&found[0]).unwrap(), rolled);
    }

    #[test]
    fn a_part_that_fails_its_manifest_keeps_its_group_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let archive = ArchiveDir::new(dir.path());
        let first = archive.write(Kind::Receipts, &receipts(1..=3)).unwrap();
        archive.write(Kind::Receipts, &receipts(4..=6)).unwrap();
        let path = dir.path().join("receipts").join(&first.file);
        let mut bytes = std::fs::read(&path).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0xff;
        std::fs::write(&path, bytes).unwrap();
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(2 * 3600);
        let done = archive.roll_up(Kind::Receipts, later).unwrap();
        assert_eq!((done.files, done.groups_skipped), (0, 1));
        assert_eq!(manifests(dir.path()).unwrap().len(), 2);

        // A manifest whose file never arrived (its statement did not commit) is removed.
        std::fs::remove_file(&path).unwrap();
        let done = archive.roll_up(Kind::Receipts, later).unwrap();
        assert_eq!(done.leftovers_removed, 1);
        assert_eq!(manifests(dir.path()).unwrap().len(), 1);
        // The part left alone in its hour is rolled up too, so no pass reads it again.
        assert_eq!((done.files, done.parts), (1, 1));
        let found = manifests(dir.path()).unwrap();
        assert_eq!(verify(&found[0]).unwrap().parts.len(), 1);
    }
}
