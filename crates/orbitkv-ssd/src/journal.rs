//! Append-only metadata journal of fixed-size, individually checksummed records, and its
//! compaction (write a snapshot to a temporary file, fsync, rename over, fsync the dir).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::hash::BuildHasher;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::dir::FILE_MODE;
use crate::format::{DecodeError, JOURNAL_RECORD_SIZE, JournalRecord, RecordKind};
use crate::key::SsdKey;

pub(crate) const JOURNAL_FILE: &str = "journal.okvj";
const JOURNAL_TMP: &str = "journal.okvj.tmp";

pub(crate) struct Journal {
    file: Arc<File>,
    len: u64,
    records: u64,
}

/// What replaying a journal found.
#[derive(Default)]
pub(crate) struct Replay {
    /// Last put of every key that was not removed afterwards, in journal order (which is
    /// close to sequence order).
    pub(crate) entries: Vec<JournalRecord>,
    pub(crate) max_seq: u64,
    pub(crate) records: u64,
    pub(crate) rejected_version: u64,
    pub(crate) corrupt: u64,
    pub(crate) torn: u64,
    /// The journal file existed.
    pub(crate) existed: bool,
    /// Bytes up to the end of the last record that decoded: appends may continue there
    /// (what follows is a torn or damaged tail).
    pub(crate) good_len: u64,
    /// A record before `good_len` failed to decode or had another version: a rewrite,
    /// not an append, gets rid of it.
    pub(crate) damaged_inside: bool,
}

/// Which records are live: the last put of each key that no later remove cancels, by
/// the rules of the old map replay (per key, in journal order: a put replaces the live
/// one unless that has a higher sequence number; a remove cancels it unless it has a
/// higher one). `order` holds (digest of the key, position in `recs`) of every record.
///
/// Instead of a hash table probed once a record (a cache and TLB miss each: ~90% of
/// replay at 2 M records), the pairs are sorted, so each key's records end up next to
/// each other in journal order and one sequential pass decides. A digest shared by
/// several keys (a collision, or one key written more than once) is resolved by full
/// key inside its group.
fn live_puts(recs: &[JournalRecord], order: &mut [(u64, u32)]) -> Vec<bool> {
    order.sort_unstable();
    let mut keep = vec![false; recs.len()];
    let rec = |i: u32| recs.get(i as usize);
    for group in order.chunk_by(|a, b| a.0 == b.0) {
        if let [(_, i)] = group {
            if rec(*i).is_some_and(|r| r.kind == RecordKind::Put) {
                keep[*i as usize] = true;
            }
            continue;
        }
        // (key, position of its live put), in first-seen order; groups are tiny unless
        // digests were made to collide, which a per-process seed prevents.
        let mut live: Vec<(SsdKey, Option<u32>)> = Vec::new();
        let mut by_key: HashMap<SsdKey, usize, foldhash::fast::RandomState> = HashMap::default();
        for &(_, i) in group {
            let Some(r) = rec(i) else { continue };
            let at = if group.len() <= 16 {
                live.iter().position(|(k, _)| *k == r.key)
            } else {
                by_key.get(&r.key).copied()
            };
            let at = match at {
                Some(a) => a,
                None => {
                    live.push((r.key, None));
                    if group.len() > 16 {
                        by_key.insert(r.key, live.len() - 1);
                    }
                    live.len() - 1
                }
            };
            let slot = &mut live[at].1;
            let cur = slot.and_then(rec).map(|c| c.seq);
            match r.kind {
                RecordKind::Put if cur.is_none_or(|s| s <= r.seq) => *slot = Some(i),
                RecordKind::Remove if cur.is_some_and(|s| s <= r.seq) => *slot = None,
                _ => {}
            }
        }
        for (_, slot) in live {
            if let Some(i) = slot {
                keep[i as usize] = true;
            }
        }
    }
    keep
}

pub(crate) fn replay(dir: &Path, progress: &mut dyn FnMut(u64, u64)) -> io::Result<Replay> {
    let path = dir.join(JOURNAL_FILE);
    let mut out = Replay::default();
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    out.existed = true;
    let len = file.metadata()?.len();
    let total = len / JOURNAL_RECORD_SIZE as u64;
    if len % JOURNAL_RECORD_SIZE as u64 != 0 {
        // A record cut short by a crash mid-append.
        out.torn += 1;
    }
    if total > u64::from(u32::MAX) {
        return Err(io::Error::other(format!(
            "journal holds {total} records, more than {} supported",
            u32::MAX
        )));
    }
    // Sized from the file up front (no regrowth); capped, the length comes from disk.
    let cap = total.min(1 << 25) as usize;
    let mut recs: Vec<JournalRecord> = Vec::with_capacity(cap);
    let mut order: Vec<(u64, u32)> = Vec::with_capacity(cap);
    // Keyed per process: keys a client picks cannot be made to share a digest.
    let seed = foldhash::fast::RandomState::default();
    let mut first_bad: Option<u64> = None;
    let mut rd = BufReader::with_capacity(1 << 20, file);
    let mut buf = [0u8; JOURNAL_RECORD_SIZE];
    for i in 0..total {
        rd.read_exact(&mut buf)?;
        out.records += 1;
        if i % 8192 == 0 {
            progress(i, total);
        }
        match JournalRecord::decode(&buf) {
            Ok(rec) => {
                out.good_len = (i + 1) * JOURNAL_RECORD_SIZE as u64;
                out.max_seq = out.max_seq.max(rec.seq);
                order.push((seed.hash_one(rec.key), recs.len() as u32));
                recs.push(rec);
            }
            Err(e) => {
                first_bad.get_or_insert(i);
                match e {
                    DecodeError::Version(_) => out.rejected_version += 1,
                    DecodeError::BadMagic if i + 1 == total => out.torn += 1,
                    _ => out.corrupt += 1,
                }
            }
        }
    }
    let keep = live_puts(&recs, &mut order);
    drop(order);
    // In place: nothing moves while every record is kept.
    let mut kept = keep.iter();
    recs.retain(|_| kept.next().copied().unwrap_or(false));
    out.entries = recs;
    out.damaged_inside = first_bad.is_some_and(|b| (b + 1) * (JOURNAL_RECORD_SIZE as u64) <= out.good_len);
    progress(total, total);
    Ok(out)
}

/// Write `recs` to a new private file at `tmp` and fsync it; returns it open for
/// appending, and the record count.
fn write_snapshot<'a>(tmp: &Path, recs: impl Iterator<Item = &'a JournalRecord>) -> io::Result<(File, u64)> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .mode(FILE_MODE)
        .open(tmp)?;
    let mut w = BufWriter::with_capacity(1 << 20, f);
    let mut buf = [0u8; JOURNAL_RECORD_SIZE];
    let mut records = 0u64;
    for r in recs {
        r.encode(&mut buf);
        w.write_all(&buf)?;
        records += 1;
    }
    let f = w.into_inner().map_err(|e| e.into_error())?;
    f.sync_all()?;
    Ok((f, records))
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl Journal {
    /// Atomically replace the journal with one holding exactly `recs`. On failure the
    /// temporary file is removed and the old journal is left as it was.
    pub(crate) fn create_compacted<'a>(
        dir: &Path,
        recs: impl Iterator<Item = &'a JournalRecord>,
    ) -> io::Result<Journal> {
        let tmp: PathBuf = dir.join(JOURNAL_TMP);
        let (file, records) = match write_snapshot(&tmp, recs) {
            Ok(x) => x,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };
        if let Err(e) = std::fs::rename(&tmp, dir.join(JOURNAL_FILE)) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        // The renamed file is the journal now, whatever the directory fsync says: failing
        // here would leave the caller appending to the replaced (unlinked) file. If the
        // rename is lost in a crash, the old journal comes back; it is consistent, and the
        // records appended since are lost like any unsynced tail (see README).
        let _ = sync_dir(dir);
        Ok(Journal {
            file: Arc::new(file),
            len: records * JOURNAL_RECORD_SIZE as u64,
            records,
        })
    }

    /// Keep appending to the journal as it is (no rewrite needed, or compaction deferred
    /// on a full disk). The file is cut back to `good_len` (the end of the last record
    /// that decoded) if given, else to a record boundary; cutting needs no new space.
    pub(crate) fn reuse(dir: &Path, good_len: Option<u64>) -> io::Result<Journal> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(FILE_MODE)
            .open(dir.join(JOURNAL_FILE))?;
        let size = file.metadata()?.len();
        let len = good_len.unwrap_or(size).min(size);
        let len = len - len % JOURNAL_RECORD_SIZE as u64;
        if len != size {
            file.set_len(len)?;
        }
        Ok(Journal {
            file: Arc::new(file),
            len,
            records: len / JOURNAL_RECORD_SIZE as u64,
        })
    }

    /// Append records with one positional write. On failure the file is cut back so that
    /// later appends stay record-aligned.
    pub(crate) fn append(&mut self, recs: &[JournalRecord]) -> io::Result<()> {
        if recs.is_empty() {
            return Ok(());
        }
        let mut buf = vec![0u8; recs.len() * JOURNAL_RECORD_SIZE];
        for (r, chunk) in recs.iter().zip(buf.chunks_exact_mut(JOURNAL_RECORD_SIZE)) {
            let mut one = [0u8; JOURNAL_RECORD_SIZE];
            r.encode(&mut one);
            chunk.copy_from_slice(&one);
        }
        if let Err(e) = self.file.write_all_at(&buf, self.len) {
            let _ = self.file.set_len(self.len);
            return Err(e);
        }
        self.len += buf.len() as u64;
        self.records += recs.len() as u64;
        Ok(())
    }

    pub(crate) fn records(&self) -> u64 {
        self.records
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.len
    }

    /// Handle for fdatasync outside the tier lock.
    pub(crate) fn handle(&self) -> Arc<File> {
        Arc::clone(&self.file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::FORMAT_VERSION;
    use proptest::prelude::*;

    fn key(i: u8) -> SsdKey {
        SsdKey {
            fingerprint: [1; 32],
            shard: 0,
            salt: [2; 32],
            generation: 3,
            hash: [i; 32],
        }
    }

    fn rec(k: u8, put: bool, seq: u64) -> JournalRecord {
        JournalRecord {
            version: FORMAT_VERSION as u16,
            kind: if put { RecordKind::Put } else { RecordKind::Remove },
            seq,
            key: key(k),
            file: 0,
            offset: u64::from(k) * 8192,
            len: seq,
            payload_sum: 0,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// The sorted replay keeps exactly what a map keyed by the full key keeps, with
        /// digests that collide often (4 digests for up to 12 keys) or never.
        #[test]
        fn replay_matches_full_key_map(
            narrow in any::<bool>(),
            ops in proptest::collection::vec((0u8..12, any::<bool>(), 0u64..40), 0..200),
        ) {
            let mut model: HashMap<SsdKey, JournalRecord> = HashMap::new();
            let mut recs = Vec::new();
            let mut order = Vec::new();
            for (k, put, seq) in ops {
                let r = rec(k, put, seq);
                if put {
                    if model.get(&r.key).is_none_or(|e| e.seq <= seq) {
                        model.insert(r.key, r);
                    }
                } else if model.get(&r.key).is_some_and(|e| e.seq <= seq) {
                    model.remove(&r.key);
                }
                let d = if narrow { u64::from(k % 4) } else { u64::from(k).wrapping_mul(0x9e37_79b9_7f4a_7c15) };
                order.push((d, recs.len() as u32));
                recs.push(r);
            }
            let keep = live_puts(&recs, &mut order);
            let mut got: Vec<(SsdKey, u64)> =
                recs.iter().zip(&keep).filter(|(_, k)| **k).map(|(r, _)| (r.key, r.seq)).collect();
            let mut want: Vec<(SsdKey, u64)> = model.values().map(|r| (r.key, r.seq)).collect();
            got.sort();
            want.sort();
            prop_assert_eq!(got, want);
        }
    }
}
