//! Random byte damage to the data file and the journal: every read returns the exact bytes,
//! or Corrupt / NotFound; never other bytes, never a panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::os::unix::fs::FileExt;

use common::*;
use orbitkv_ssd::{EnginePref, IoMode, SsdError, SsdTier};

fn len_of(i: u64) -> usize {
    [1usize, 100, 4096, 5000, 8192, 20_000][(i % 6) as usize]
}

fn damage(path: &std::path::Path, limit: u64, rng: &mut u64, flips: usize) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let len = f.metadata().unwrap().len().min(limit);
    if len == 0 {
        return;
    }
    for _ in 0..flips {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        let off = *rng % len;
        let mut b = [0u8];
        f.read_exact_at(&mut b, off).unwrap();
        b[0] ^= 1 << ((*rng >> 61) as u8);
        f.write_all_at(&b, off).unwrap();
    }
}

fn check_all(t: &SsdTier, n: u64) -> (u64, u64) {
    let (mut ok, mut bad) = (0, 0);
    let mut buf = Aligned::new(20_480);
    for i in 0..n {
        match t.read(key(i), buf.as_mut()) {
            Ok(len) => {
                assert_eq!(len, len_of(i));
                assert_eq!(&buf.as_ref()[..len], &payload(i, len)[..], "wrong bytes for {i}");
                ok += 1;
            }
            Err(SsdError::Corrupt { .. } | SsdError::NotFound) => bad += 1,
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    (ok, bad)
}

#[test]
fn random_damage_never_yields_wrong_bytes() {
    let mut rng = 0x1234_5678_9abc_def1u64;
    let (mut total_ok, mut total_bad) = (0, 0);
    for iter in 0..24u64 {
        let d = tempdir();
        let mode = if iter % 2 == 0 {
            IoMode::Direct
        } else {
            IoMode::Kernel
        };
        let engine = if iter % 4 < 2 {
            EnginePref::Uring
        } else {
            EnginePref::Psync
        };
        let mut c = cfg(d.path(), mode, engine);
        c.capacity_bytes = 2 << 20;
        let n = 30u64;
        let used = {
            let (t, _) = open(&c);
            for i in 0..n {
                t.write(key(i), &payload(i, len_of(i))).unwrap();
            }
            for i in (0..n).step_by(7) {
                t.remove(&key(i));
                t.write(key(i), &payload(i, len_of(i))).unwrap(); // reuse extents
            }
            t.used_bytes() + 64 * 1024
        };
        let flips = 1 + (iter as usize % 5) * 3;
        damage(&d.path().join(orbitkv_ssd::DATA_FILE), used, &mut rng, flips);
        if iter % 3 == 0 {
            damage(&d.path().join(orbitkv_ssd::JOURNAL_FILE), u64::MAX, &mut rng, 2);
        }
        let (t, rep) = open(&c);
        let (ok, bad) = check_all(&t, n);
        assert_eq!(ok + bad, n);
        assert!(rep.recovered.len() as u64 >= ok);
        total_ok += ok;
        total_bad += bad;
        // Damage under the live tier too (kernel mode reads see it after the cache drop).
        damage(&d.path().join(orbitkv_ssd::DATA_FILE), used, &mut rng, flips);
        t.drop_page_cache().unwrap();
        let (ok2, bad2) = check_all(&t, n);
        assert_eq!(ok2 + bad2, n);
    }
    eprintln!("served {total_ok} intact blocks, refused {total_bad}");
    assert!(total_bad > 0, "the damage never hit anything");
}
