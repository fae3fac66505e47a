//! A full filesystem: recovery still opens the tier (the journal rewrite is deferred),
//! stale temporary files are removed, and writes that hit ENOSPC fail cleanly (counted,
//! nothing corrupt, nothing half-indexed). Runs on a small tmpfs mounted for the test;
//! skipped, with the reason printed, where mounting is not permitted.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::path::Path;

use common::small_fs::SmallFs;
use common::*;
use orbitkv_ssd::{EnginePref, IoMode, SsdConfig, SsdError, SsdTier};

/// Fill-up checks of this test on the shared tmpfs.
impl SmallFs {
    fn mount(size: &str) -> Option<SmallFs> {
        SmallFs::mount_in(tempdir(), size)
    }

    /// Write a filler file until the filesystem reports ENOSPC, and check that not even
    /// one more byte fits.
    fn fill(&self) {
        let err = self.write_filler_until_error();
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
        let one = std::fs::write(self.mnt.join("one-more-byte"), b"x");
        assert!(one.is_err(), "the filesystem is not full");
    }

    fn unfill(&self) {
        std::fs::remove_file(self.filler()).expect("remove filler");
        let _ = std::fs::remove_file(self.mnt.join("one-more-byte"));
    }
}

fn temp_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(orbitkv_ssd::TEMP_SUFFIX))
        .collect()
}

const LEN: usize = 3000;

/// Every key in `present` reads back byte-exact; every key in `absent` is a miss.
fn check(t: &SsdTier, present: &[u64], absent: &[u64]) {
    let mut buf = vec![0u8; LEN];
    for &i in present {
        assert_eq!(t.read(key(i), &mut buf).expect("read"), LEN, "key {i}");
        assert_eq!(buf, payload(i, LEN), "key {i}");
    }
    for &i in absent {
        assert!(
            matches!(t.read(key(i), &mut buf), Err(SsdError::NotFound)),
            "key {i}"
        );
    }
}

fn small_cfg(dir: &Path) -> SsdConfig {
    let mut c = cfg(dir, IoMode::Kernel, EnginePref::Psync);
    c.capacity_bytes = 2 << 20;
    c.journal_compact_min_records = 8;
    c
}

#[test]
fn recovery_and_writes_on_a_full_filesystem() {
    let Some(fs) = SmallFs::mount("4m") else { return };
    let dir = fs.mnt.join("ssd");
    let c = small_cfg(&dir);
    {
        // No compaction while writing: the journal keeps all 70 records.
        let mut lax = c.clone();
        lax.journal_compact_min_records = 1 << 20;
        let (t, _) = open(&lax);
        for i in 0..40 {
            t.write(key(i), &payload(i, LEN)).expect("write");
        }
        // 70 records for 10 live blocks: past the limit of the next open (max(8, 2 x 10)),
        // so it rewrites the journal (a journal within the limit is appended to).
        for i in 0..30 {
            assert!(t.remove(&key(i)));
        }
    }
    let mut present: Vec<u64> = (30..40).collect();
    let mut absent: Vec<u64> = (0..30).collect();
    // Leftovers of an interrupted rewrite (journal and the Manager's generations file).
    std::fs::write(dir.join("journal.okvj.tmp"), b"").expect("tmp");
    std::fs::write(dir.join("generations.v1.tmp"), b"").expect("tmp");
    fs.fill();

    // Recovery on a full disk: opens, serves every block, leaves no temporary file.
    let (t, rep) = open(&c);
    assert!(
        rep.compaction_deferred.is_some(),
        "the journal rewrite needed no space?"
    );
    assert_eq!(rep.removed_temp.len(), 2, "{:?}", rep.removed_temp);
    assert_eq!(temp_files(&dir), Vec::<String>::new());
    check(&t, &present, &absent);

    // Serving on a full disk: a write either succeeds or fails with an I/O error, counted.
    let mut failed = 0u64;
    for i in 100..160 {
        match t.write(key(i), &payload(i, LEN)) {
            Ok(()) => present.push(i),
            Err(SsdError::Io { .. }) => {
                failed += 1;
                absent.push(i);
            }
            Err(e) => panic!("key {i}: unexpected error {e}"),
        }
    }
    assert!(failed > 0, "no write hit the full disk");
    assert_eq!(t.stats().write_errors, failed);
    assert_eq!(temp_files(&dir), Vec::<String>::new());
    check(&t, &present, &absent);
    drop(t);

    // A second restart on the still full disk, then one with space again.
    let (t, _) = open(&c);
    check(&t, &present, &absent);
    drop(t);
    fs.unfill();
    let (t, rep) = open(&c);
    assert!(rep.compaction_deferred.is_none(), "{:?}", rep.compaction_deferred);
    assert_eq!(temp_files(&dir), Vec::<String>::new());
    check(&t, &present, &absent);
    assert_eq!(t.stats().journal_records, present.len() as u64);
}
