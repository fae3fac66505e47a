//! Append-only metadata journal of fixed-size, individually checksummed records, and its
//! compaction (write a snapshot to a temporary file, fsync, rename over, fsync the dir).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
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
    /// Last put of every key that was not removed afterwards.
    pub(crate) entries: HashMap<SsdKey, JournalRecord>,
    pub(crate) max_seq: u64,
    pub(crate) records: u64,
    pub(crate) rejected_version: u64,
    pub(crate) corrupt: u64,
    pub(crate) torn: u64,
}

pub(crate) fn replay(dir: &Path, progress: &mut dyn FnMut(u64, u64)) -> io::Result<Replay> {
    let path = dir.join(JOURNAL_FILE);
    let mut out = Replay::default();
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    let total = len / JOURNAL_RECORD_SIZE as u64;
    if len % JOURNAL_RECORD_SIZE as u64 != 0 {
        // A record cut short by a crash mid-append.
        out.torn += 1;
    }
    // One slot per record up front (no rehashing as the map grows); capped, the length
    // comes from the file.
    out.entries.reserve(total.min(1 << 25) as usize);
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
                out.max_seq = out.max_seq.max(rec.seq);
                match rec.kind {
                    RecordKind::Put => {
                        let newer = out.entries.get(&rec.key).is_none_or(|e| e.seq <= rec.seq);
                        if newer {
                            out.entries.insert(rec.key, rec);
                        }
                    }
                    RecordKind::Remove => {
                        if out.entries.get(&rec.key).is_some_and(|e| e.seq <= rec.seq) {
                            out.entries.remove(&rec.key);
                        }
                    }
                }
            }
            Err(DecodeError::Version(_)) => out.rejected_version += 1,
            Err(DecodeError::BadMagic) if i + 1 == total => out.torn += 1,
            Err(_) => out.corrupt += 1,
        }
    }
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

    /// Keep appending to the journal as it is (compaction deferred, e.g. on a full disk).
    /// A torn tail is cut back to a record boundary, which needs no new space.
    pub(crate) fn reuse(dir: &Path) -> io::Result<Journal> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(FILE_MODE)
            .open(dir.join(JOURNAL_FILE))?;
        let size = file.metadata()?.len();
        let len = size - size % JOURNAL_RECORD_SIZE as u64;
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
