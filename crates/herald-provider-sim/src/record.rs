//! The simulator's memory: answers by key, counters per gateway, and the append-only log.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::receipts::PlannedReceipt;
use crate::{SimError, Stats};

/// The answer to a submit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubmitAnswer {
    pub provider_id: String,
    pub gateway: String,
    /// True when the key was submitted before (this is the first answer again).
    #[serde(default)]
    pub duplicate: bool,
}

/// One line of the submit log.
#[derive(Debug, Serialize, Deserialize)]
struct LogLine {
    key: String,
    provider_id: String,
    gateway: String,
    at: String,
    /// 1 for the first submit of the key, then 2, 3… for duplicates.
    n: u64,
}

/// A log line naming the receipts planned for a key's first submit.
#[derive(Debug, Serialize, Deserialize)]
struct ReceiptLine {
    key: String,
    receipts: Vec<PlannedReceipt>,
}

/// What the provider did with one idempotency key: `GET /v1/effects`, one JSON line each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Effect {
    pub key: String,
    /// Submits that took effect or were deduped.
    pub submits: u64,
    pub gateway: String,
    pub provider_id: String,
    /// The receipts planned for it, in order (None: the simulator posts no receipts).
    pub receipts: Option<Vec<PlannedReceipt>>,
}

pub struct Record {
    gateways: Vec<String>,
    id_wrap: u32,
    next_id: Vec<u32>,
    answers: HashMap<String, (SubmitAnswer, u64)>,
    receipts: HashMap<String, Vec<PlannedReceipt>>,
    stats: Stats,
    /// Appended to with one `write(2)` per line, in place: see [`Record::append`].
    log: File,
    /// Where `log` is, for errors.
    path: PathBuf,
}

impl Record {
    /// Opens (or creates) the log and replays it.
    pub fn open(path: &Path, gateways: &[String], id_wrap: u32) -> Result<Self, SimError> {
        let log_error = |source| SimError::Log {
            path: path.to_path_buf(),
            source,
        };
        let mut record = Self {
            gateways: gateways.to_vec(),
            id_wrap,
            next_id: vec![0; gateways.len()],
            answers: HashMap::new(),
            receipts: HashMap::new(),
            stats: Stats::default(),
            log: OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(log_error)?,
            path: path.to_path_buf(),
        };
        let reader = BufReader::new(File::open(path).map_err(log_error)?);
        for (number, line) in reader.lines().enumerate() {
            let line = line.map_err(log_error)?;
            if line.trim().is_empty() {
                continue;
            }
            // A torn last line (killed mid-write) is the only acceptable damage.
            if let Ok(entry) = serde_json::from_str::<LogLine>(&line) {
                record.replay(entry);
            } else if let Ok(planned) = serde_json::from_str::<ReceiptLine>(&line) {
                record.receipts.insert(planned.key, planned.receipts);
            } else {
                tracing::warn!(line = number + 1, "skipping an unreadable submit-log line");
            }
        }
        Ok(record)
    }

    fn replay(&mut self, entry: LogLine) {
        self.stats.submits += 1;
        if entry.n > 1 {
            self.stats.duplicate_submits += 1;
        }
        let gateway_index = self.gateways.iter().position(|g| *g == entry.gateway);
        let slot = self.answers.entry(entry.key).or_insert_with(|| {
            if let Some(index) = gateway_index {
                self.next_id[index] = entry.provider_id.parse().unwrap_or(0);
            }
            (
                SubmitAnswer {
                    provider_id: entry.provider_id,
                    gateway: entry.gateway,
                    duplicate: false,
                },
                0,
            )
        });
        slot.1 = slot.1.max(entry.n);
        self.stats.distinct_keys = self.answers.len() as u64;
    }

    /// Takes a submit: the first answer of a known key, or a new provider id. Its log line
    /// is written (handed to the operating system) before the answer is returned.
    pub fn submit(&mut self, key: &str) -> Result<SubmitAnswer, SimError> {
        let (answer, n) = match self.answers.get(key) {
            Some((first, count)) => (
                SubmitAnswer {
                    duplicate: true,
                    ..first.clone()
                },
                count + 1,
            ),
            None => {
                let index = (xxhash_rust::xxh3::xxh3_64(key.as_bytes())
                    % self.gateways.len() as u64) as usize;
                let id = self.next_id[index] % self.id_wrap + 1;
                (
                    SubmitAnswer {
                        provider_id: id.to_string(),
                        gateway: self.gateways[index].clone(),
                        duplicate: false,
                    },
                    1,
                )
            }
        };
        let line = LogLine {
            key: key.to_owned(),
            provider_id: answer.provider_id.clone(),
            gateway: answer.gateway.clone(),
            at: chrono::Utc::now().to_rfc3339(),
            n,
        };
        let mut bytes = serde_json::to_vec(&line)?;
        bytes.push(b'\n');
        self.append(&bytes)?;
        self.replay(line);
        Ok(answer)
    }

    /// What a submit under `key` got, without submitting: the first answer, or `None` when no
    /// submit under it took effect.
    pub fn lookup(&self, key: &str) -> Option<SubmitAnswer> {
        self.answers.get(key).map(|(first, _)| first.clone())
    }

    pub fn count_conflict(&mut self) {
        self.stats.conflicts += 1;
    }

    /// Appends one line to the log; once it returns, the line is in the page cache, where a
    /// killed simulator keeps it. The write is done in place, on the runtime thread: a line
    /// of a few hundred bytes to the page cache (no fsync) takes microseconds, while handing
    /// each one to tokio's blocking pool, as this did, cost two thread switches per line: in
    /// a 200,000-message drain 31 % of the simulator's CPU samples were in the scheduler's
    /// task switch (`perf`), 0.10 CPU s per 1,000 messages in all (loadtest/README.md).
    fn append(&mut self, bytes: &[u8]) -> Result<(), SimError> {
        self.log.write_all(bytes).map_err(|source| SimError::Log {
            path: self.path.clone(),
            source,
        })
    }

    /// Records, before any is posted, the receipts a first submit of `key` gets.
    pub fn plan_receipts(
        &mut self,
        key: &str,
        receipts: Vec<PlannedReceipt>,
    ) -> Result<(), SimError> {
        let line = ReceiptLine {
            key: key.to_owned(),
            receipts,
        };
        let mut bytes = serde_json::to_vec(&line)?;
        bytes.push(b'\n');
        self.append(&bytes)?;
        self.receipts.insert(line.key, line.receipts);
        Ok(())
    }

    /// Every key's effect, one JSON line each. `with_receipts` is false when the simulator
    /// posts no receipts at all.
    pub fn effects(&self, with_receipts: bool) -> String {
        let mut out = String::with_capacity(self.answers.len() * 160);
        for (key, (answer, count)) in &self.answers {
            let effect = Effect {
                key: key.clone(),
                submits: *count,
                gateway: answer.gateway.clone(),
                provider_id: answer.provider_id.clone(),
                receipts: with_receipts
                    .then(|| self.receipts.get(key).cloned().unwrap_or_default()),
            };
            if let Ok(line) = serde_json::to_string(&effect) {
                out.push_str(&line);
                out.push('\n');
            }
        }
        out
    }

    pub fn count_rejection(&mut self) {
        self.stats.injected_rejections += 1;
    }

    pub fn count_error(&mut self) {
        self.stats.injected_errors += 1;
    }

    pub fn count_receipt(&mut self, delivered: bool) {
        if delivered {
            self.stats.receipts_sent += 1;
        } else {
            self.stats.receipts_failed += 1;
        }
    }

    pub fn count_timeout(&mut self) {
        self.stats.injected_timeouts += 1;
    }

    pub fn stats(&self) -> Stats {
        self.stats.clone()
    }

    pub fn key_counts(&self) -> String {
        let mut out = String::with_capacity(self.answers.len() * 48);
        for (key, (_, count)) in &self.answers {
            out.push_str(key);
            out.push(' ');
            out.push_str(&count.to_string());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dedupes_wraps_per_gateway_and_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        let gateways = vec!["a".to_owned(), "b".to_owned()];
        let mut record = Record::open(&path, &gateways, 3).unwrap();
        let first = record.submit("k1").unwrap();
        let again = record.submit("k1").unwrap();
        assert_eq!(first.provider_id, again.provider_id);
        assert!(again.duplicate && !first.duplicate);
        let mut ids_by_gateway: HashMap<String, Vec<u32>> = HashMap::new();
        for i in 0..40 {
            let answer = record.submit(&format!("key-{i}")).unwrap();
            ids_by_gateway
                .entry(answer.gateway)
                .or_default()
                .push(answer.provider_id.parse().unwrap());
        }
        // Both gateways issue ids 1..=3 and wrap: the same id from two gateways.
        for ids in ids_by_gateway.values() {
            assert!(ids.iter().all(|id| (1..=3).contains(id)), "{ids:?}");
        }
        assert_eq!(ids_by_gateway.len(), 2);
        let stats = record.stats();
        assert_eq!(stats.distinct_keys, 41);
        assert_eq!(stats.duplicate_submits, 1);
        assert_eq!(stats.submits, 42);
        drop(record);

        let mut reopened = Record::open(&path, &gateways, 3).unwrap();
        assert_eq!(reopened.stats(), stats);
        let replay = reopened.submit("k1").unwrap();
        assert_eq!(replay.provider_id, first.provider_id);
        assert!(reopened.key_counts().contains("k1 3\n"));
    }
}
