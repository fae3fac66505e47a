//! Real-process crash test: a child process (this test binary re-invoked) writes, overwrites
//! and removes blocks in a loop; the parent SIGKILLs it at a random moment, reopens the
//! directory and checks that every recovered block reads back byte-exact or is reported
//! corrupt, never wrong bytes.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use orbitkv_ssd::{EnginePref, IoMode, SsdError, SsdTier};

const ENV_DIR: &str = "ORBITKV_SSD_CRASH_DIR";
const ENV_ROUND: &str = "ORBITKV_SSD_CRASH_ROUND";

fn block_len(gen_: u64) -> usize {
    4096 * (1 + (gen_ % 5) as usize) + (gen_ % 3) as usize * 100
}

fn round_cfg(dir: &std::path::Path, round: u64) -> orbitkv_ssd::SsdConfig {
    let (mode, engine) = match round % 3 {
        0 => (IoMode::Direct, EnginePref::Uring),
        1 => (IoMode::Direct, EnginePref::Psync),
        _ => (IoMode::Kernel, EnginePref::Auto),
    };
    let mut c = cfg(dir, mode, engine);
    c.capacity_bytes = 4 << 20; // small: forces eviction and extent reuse
    c.sync = round.is_multiple_of(2);
    c.journal_compact_min_records = 256;
    c
}

/// The child's body; a no-op unless the parent set the env vars. It reports on stdout (line
/// buffered, so every line printed before the kill reaches the parent):
/// `B g..` before a write batch, `A g..` for the gens acknowledged Ok after it, and `X g`
/// before removing a key.
#[test]
fn crash_child_entry() {
    let (Ok(dir), Ok(round)) = (std::env::var(ENV_DIR), std::env::var(ENV_ROUND)) else {
        return;
    };
    let round: u64 = round.parse().unwrap();
    let c = round_cfg(std::path::Path::new(&dir), round);
    let (t, _) = SsdTier::open(c, &mut |_| {}).unwrap();
    // libtest printed "test crash_child_entry ... " without a newline; start a clean line.
    println!();
    let join = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(" ");
    let remove = |k: orbitkv_ssd::SsdKey| {
        println!("X {}", k.generation);
        t.remove(&k);
    };
    let mut next = round * 1_000_000;
    let mut batch_no = 0u64;
    loop {
        let gens: Vec<u64> = (0..8).map(|j| next + j).collect();
        next += 8;
        let datas: Vec<Vec<u8>> = gens.iter().map(|&g| payload(g, block_len(g))).collect();
        let items: Vec<_> = gens.iter().zip(&datas).map(|(&g, d)| (key(g), &d[..])).collect();
        println!("B {}", join(&gens));
        let mut acked = Vec::new();
        let mut full = false;
        for (g, r) in gens.iter().zip(t.write_batch(&items)) {
            match r {
                Ok(()) => acked.push(*g),
                Err(SsdError::Full { .. }) => full = true,
                Err(e) => panic!("child write: {e}"),
            }
        }
        println!("A {}", join(&acked));
        if full {
            for k in t.oldest(8) {
                remove(k);
            }
        }
        // Overwrite a recent key with its own content (same key, new extent).
        if batch_no.is_multiple_of(3) {
            let g = next - 3;
            t.write(key(g), &payload(g, block_len(g))).ok();
        }
        if batch_no.is_multiple_of(5) {
            remove(key(next - 1));
        }
        batch_no += 1;
        println!("CRASHCHILD {batch_no}");
    }
}

/// Reopen, read every recovered block; returns (recovered gens that read back exactly,
/// corrupt count). Panics on wrong bytes.
fn verify(dir: &std::path::Path, round: u64) -> (HashSet<u64>, u64) {
    let c = round_cfg(dir, round);
    let (t, rep) = SsdTier::open(c, &mut |_| {}).unwrap();
    let mut corrupt = rep.corrupt;
    let mut good = HashSet::new();
    let mut buf = Aligned::new(6 * 4096);
    for (k, len) in &rep.recovered {
        let g = k.generation;
        assert_eq!(*k, key(g), "recovered a key the child never wrote");
        assert_eq!(*len as usize, block_len(g), "wrong length for gen {g}");
        match t.read(*k, buf.as_mut()) {
            Ok(n) => {
                assert_eq!(
                    &buf.as_ref()[..n],
                    &payload(g, block_len(g))[..],
                    "WRONG BYTES for gen {g}"
                );
                good.insert(g);
            }
            Err(SsdError::Corrupt { .. }) => corrupt += 1,
            Err(e) => panic!("unexpected read error {e}"),
        }
    }
    (good, corrupt)
}

fn gens(rest: &str) -> impl Iterator<Item = u64> + '_ {
    rest.split_whitespace().map(|x| x.parse::<u64>().unwrap())
}

#[test]
fn sigkill_mid_write_never_serves_wrong_bytes() {
    let d = tempdir();
    let exe = std::env::current_exe().unwrap();
    let mut seed = std::process::id() as u64 ^ 0x5555;
    // Blocks that must survive a kill: acknowledged and never (about to be) removed.
    let mut alive: HashSet<u64> = HashSet::new();
    for round in 0..6u64 {
        let mut child = Command::new(&exe)
            .args(["crash_child_entry", "--exact", "--nocapture", "--test-threads=1"])
            .env(ENV_DIR, d.path())
            .env(ENV_ROUND, round.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let want_batches = 20 + seed % 60;
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        // Blocks that may or may not be there: the batch in flight, keys being removed.
        let mut maybe: HashSet<u64> = HashSet::new();
        let handle = |l: &str, alive: &mut HashSet<u64>, maybe: &mut HashSet<u64>| {
            if let Some(r) = l.strip_prefix("B ") {
                maybe.extend(gens(r));
            } else if let Some(r) = l.strip_prefix("A ") {
                alive.extend(gens(r));
            } else if let Some(r) = l.strip_prefix("X ") {
                for g in gens(r) {
                    alive.remove(&g);
                    maybe.insert(g);
                }
            }
        };
        let t0 = Instant::now();
        let mut seen = 0u64;
        while seen < want_batches {
            match lines.next() {
                Some(Ok(l)) if l.starts_with("CRASHCHILD ") => seen += 1,
                Some(Ok(l)) => handle(&l, &mut alive, &mut maybe),
                _ => panic!("child exited early after {seen} batches"),
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "child too slow");
        }
        std::thread::sleep(Duration::from_micros(seed % 3000));
        child.kill().unwrap(); // SIGKILL
        // Everything printed before the kill is still in the pipe.
        for l in lines.map_while(Result::ok) {
            handle(&l, &mut alive, &mut maybe);
        }
        let status = child.wait().unwrap();
        assert!(!status.success());
        let (good, corrupt) = verify(d.path(), round);
        let lost: Vec<&u64> = alive.difference(&good).collect();
        assert!(
            lost.is_empty(),
            "acknowledged blocks lost by a process crash: {lost:?}"
        );
        let extra: Vec<&u64> = good.difference(&alive).filter(|g| !maybe.contains(g)).collect();
        assert!(
            extra.is_empty(),
            "blocks that were never written or were removed: {extra:?}"
        );
        eprintln!(
            "round {round}: killed after {seen} batches; {} blocks read back exactly, {corrupt} corrupt",
            good.len()
        );
        assert!(!good.is_empty(), "nothing recovered");
        alive = good;
    }
}
