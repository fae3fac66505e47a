//! The production-size crash shape at reduced size (correctness only, no timing): a child
//! process (this test binary re-invoked) fills a tier with many tiny blocks, then keeps
//! writing; the parent SIGKILLs it mid-write, tears one block's payload and another's
//! header, reopens with the header check in the background and checks that every filled
//! block reads back byte-exact, the torn ones are never served, and the batch in flight at
//! the kill is exact or absent. `benches/ssd_scale.rs` runs the same at 2 M+ blocks.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

use common::*;
use orbitkv_ssd::format::{JOURNAL_RECORD_SIZE, JournalRecord, RecordKind};
use orbitkv_ssd::{EnginePref, IoMode, RecoveryVerify, SsdError, SsdTier};

const ENV_DIR: &str = "ORBITKV_SSD_SCALE_DIR";
/// Blocks filled before the kill (override with ORBITKV_SSD_SCALE_BLOCKS).
const BLOCKS: u64 = 100_000;
const TAIL: u64 = 4096;
const LEN: usize = 100;
const BATCH: usize = 256;

fn blocks() -> u64 {
    std::env::var("ORBITKV_SSD_SCALE_BLOCKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(BLOCKS)
}

fn scale_cfg(dir: &std::path::Path, verify: RecoveryVerify) -> orbitkv_ssd::SsdConfig {
    let mut c = cfg(dir, IoMode::Direct, EnginePref::Auto);
    c.capacity_bytes = (blocks() + TAIL) * SsdTier::extent_bytes(LEN as u64);
    c.queue_depth = 64;
    c.verify_on_open = verify;
    c
}

fn write_range(t: &SsdTier, lo: u64, hi: u64) -> bool {
    let datas: Vec<Vec<u8>> = (lo..hi).map(|g| payload(g, LEN)).collect();
    let items: Vec<_> = (lo..hi).zip(&datas).map(|(g, d)| (key(g), &d[..])).collect();
    t.write_batch(&items).iter().all(|r| r.is_ok())
}

/// The child's body; a no-op unless the parent set the env var. Prints `FILLED`, then
/// `B lo hi` before and `A lo hi` after each tail batch, until killed.
#[test]
fn scale_child_entry() {
    let Ok(dir) = std::env::var(ENV_DIR) else {
        return;
    };
    let (t, _) = SsdTier::open(scale_cfg(dir.as_ref(), RecoveryVerify::Headers), &mut |_| {}).unwrap();
    println!();
    let n = blocks();
    let mut a = 0;
    while a < n {
        let b = (a + BATCH as u64).min(n);
        assert!(write_range(&t, a, b), "child: fill write failed");
        a = b;
    }
    println!("FILLED");
    let mut a = n;
    while a < n + TAIL {
        let b = (a + 64).min(n + TAIL);
        println!("B {a} {b}");
        let ok = write_range(&t, a, b);
        println!("A {a} {b} {ok}");
        a = b;
    }
    loop {
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

/// Last put record of each of `want` in the journal.
fn journal_puts(dir: &std::path::Path, want: &[u64]) -> Vec<Option<JournalRecord>> {
    let mut bytes = Vec::new();
    std::fs::File::open(dir.join(orbitkv_ssd::JOURNAL_FILE))
        .unwrap()
        .read_to_end(&mut bytes)
        .unwrap();
    let mut out = vec![None; want.len()];
    for rec in bytes.chunks_exact(JOURNAL_RECORD_SIZE) {
        let Ok(r) = JournalRecord::decode(rec.try_into().unwrap()) else {
            continue;
        };
        for (o, &g) in out.iter_mut().zip(want) {
            if r.kind == RecordKind::Put && r.key == key(g) {
                *o = Some(r);
            }
        }
    }
    out
}

fn read_one(t: &SsdTier, g: u64) -> Result<Vec<u8>, SsdError> {
    let mut buf = Aligned::new(8192);
    let n = t.read(key(g), buf.as_mut())?;
    Ok(buf.as_ref()[..n].to_vec())
}

#[test]
fn sigkill_after_fill_recovers_every_block_and_serves_no_torn_one() {
    let td = tempdir();
    let dir = td.path().join("tier");
    let n = blocks();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["scale_child_entry", "--exact", "--nocapture", "--test-threads=1"])
        .env(ENV_DIR, &dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut filled = false;
    let mut acked = 0;
    for l in lines.by_ref() {
        let l = l.unwrap();
        if l == "FILLED" {
            filled = true;
        } else if l.starts_with("A ") {
            acked += 1;
            if acked >= 2 {
                break;
            }
        }
    }
    assert!(filled, "child exited before filling: {:?}", child.wait());
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let mut in_flight = None;
    let mut acked_tail = Vec::new();
    for l in lines.map_while(Result::ok) {
        let f: Vec<u64> = l
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect();
        if l.starts_with("B ") {
            in_flight = Some((f[0], f[1]));
        } else if l.starts_with("A ") {
            if l.ends_with("true") {
                acked_tail.push((f[0], f[1]));
            }
            in_flight = None;
        }
    }

    // Tear block 1's payload (its last bytes) and block 2's header, as a write cut short
    // under power loss would.
    let recs = journal_puts(&dir, &[1, 2]);
    let (r1, r2) = (recs[0].unwrap(), recs[1].unwrap());
    patch(&dir, r1.offset + 4096 + r1.len - 8, &[0xee; 8]);
    patch(&dir, r2.offset + 64, &[0xee; 8]);

    let (t, rep) = open(&scale_cfg(&dir, RecoveryVerify::Background));
    assert!(
        rep.recovered.len() as u64 >= n,
        "recovered {} of {n}",
        rep.recovered.len()
    );
    // While the background check may still run, neither torn block is served.
    for g in [1, 2] {
        match read_one(&t, g) {
            Err(SsdError::Corrupt { .. } | SsdError::NotFound) => {}
            other => panic!("torn block {g} served: {:?}", other.map(|v| v.len())),
        }
    }
    t.wait_header_check();
    let hc = t.header_check();
    assert!(hc.finished && hc.checked == hc.total, "{hc:?}");
    for g in (0..n).filter(|g| *g != 1 && *g != 2) {
        let got = read_one(&t, g).unwrap_or_else(|e| panic!("block {g}: {e}"));
        assert!(got == payload(g, LEN), "block {g}: wrong bytes");
    }
    for &(a, b) in &acked_tail {
        for g in a..b {
            assert_eq!(
                read_one(&t, g).unwrap(),
                payload(g, LEN),
                "acknowledged tail block {g}"
            );
        }
    }
    if let Some((a, b)) = in_flight {
        for g in a..b {
            match read_one(&t, g) {
                Ok(v) => assert_eq!(v, payload(g, LEN), "in-flight block {g}"),
                Err(SsdError::NotFound | SsdError::Corrupt { .. }) => {}
                Err(e) => panic!("in-flight block {g}: {e}"),
            }
        }
    }
    // Only the two torn blocks ever failed a read.
    assert!(t.stats().checksum_failures + t.stats().header_failures <= 2);
    drop(t);

    // A second open with headers checked at open agrees, and drops nothing more.
    let (t, rep2) = open(&scale_cfg(&dir, RecoveryVerify::Headers));
    assert_eq!(rep2.corrupt, 0);
    assert_eq!(t.len() as u64, rep.recovered.len() as u64 - 2);
}
