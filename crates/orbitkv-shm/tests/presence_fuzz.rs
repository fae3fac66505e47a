//! The presence reader against memory another process writes: arbitrary
//! bytes (never a panic, never an access outside the mapping) and a writer
//! racing readers (a block present throughout is never reported absent).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use orbitkv_shm::Mapping;
use orbitkv_shm::presence::{MAGIC, MIN_SLOTS, Presence, PresenceView, PresenceWriter, table_bytes};
use proptest::prelude::*;
use rustix::fs::MemfdFlags;

fn memfd_with(bytes: &[u8], size: u64) -> std::os::fd::OwnedFd {
    let fd = rustix::fs::memfd_create("presence-fuzz", MemfdFlags::CLOEXEC).expect("memfd");
    rustix::fs::ftruncate(&fd, size).expect("size");
    let n = bytes.len().min(size as usize);
    let mut done = 0;
    while done < n {
        done += rustix::io::pwrite(&fd, &bytes[done..n], done as u64).expect("pwrite");
    }
    fd
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Arbitrary table contents, with a plausible header half the time so
    /// the probe loop runs over garbage slots.
    #[test]
    fn arbitrary_bytes_never_panic(
        mut bytes in proptest::collection::vec(any::<u8>(), 0..(table_bytes(MIN_SLOTS) as usize + 64)),
        plausible in any::<bool>(),
        max_probe in any::<u64>(),
        fps in proptest::collection::vec(any::<u64>(), 1..64),
    ) {
        let size = table_bytes(MIN_SLOTS);
        if plausible && bytes.len() >= 64 {
            bytes[0..8].copy_from_slice(&MAGIC.to_le_bytes());
            bytes[8..16].copy_from_slice(&0u64.to_le_bytes());
            bytes[16..24].copy_from_slice(&MIN_SLOTS.to_le_bytes());
            bytes[32..40].copy_from_slice(&max_probe.to_le_bytes());
            bytes[48..56].copy_from_slice(&0u64.to_le_bytes());
        }
        let view = PresenceView::open(memfd_with(&bytes, size), MIN_SLOTS).expect("view");
        let _ = view.stats();
        for fp in &fps {
            let _ = view.contains(*fp);
        }
        let _ = view.present_prefix(fps.iter().copied());
    }

    /// A file shorter than the announced table is refused at open.
    #[test]
    fn short_files_are_refused(len in 0u64..table_bytes(MIN_SLOTS)) {
        prop_assert!(PresenceView::open(memfd_with(&[], len), MIN_SLOTS).is_err());
    }
}

/// Another "process" scribbles random words over the whole table while
/// readers probe: answers are meaningless, but nothing panics or faults.
#[test]
fn readers_survive_a_concurrent_scribbler() {
    let size = table_bytes(MIN_SLOTS);
    let fd = memfd_with(&[], size);
    let scribble = Mapping::map(&fd, size, false).expect("rw mapping");
    let view = PresenceView::open(fd.try_clone().expect("dup"), MIN_SLOTS).expect("view");
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let t = std::thread::spawn(move || {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let words = size / 8;
        while !s.load(Ordering::Relaxed) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let w = x % words;
            let v = match w {
                0 => MAGIC,
                2 => MIN_SLOTS,
                _ => x.rotate_left(17),
            };
            let _ = scribble.write_at(w * 8, &v.to_le_bytes());
        }
    });
    let mut answers = [0usize; 3];
    for fp in 0..200_000u64 {
        match view.contains(fp.wrapping_mul(0x9e37_79b9_7f4a_7c15)) {
            Ok(Presence::Absent) => answers[0] += 1,
            Ok(Presence::Maybe) => answers[1] += 1,
            Err(_) => answers[2] += 1,
        }
    }
    stop.store(true, Ordering::Relaxed);
    t.join().expect("scribbler");
    assert_eq!(answers.iter().sum::<usize>(), 200_000);
}

/// The real writer inserting and removing while readers probe keys that stay
/// present throughout. Each resident is re-inserted (a second copy, placed
/// further down its run) and then its first copy removed, so the backward
/// shift moves the surviving copy under the readers' feet; churn keeps the
/// runs long. A reader must never answer `Absent` for a resident.
#[test]
fn a_racing_writer_never_hides_a_present_block() {
    let slots = MIN_SLOTS;
    let mut w = PresenceWriter::create(slots).expect("create");
    // Homes crowded into the first quarter so runs are long.
    fn home(x: u64) -> u64 {
        x % (MIN_SLOTS / 4)
    }
    let resident: Vec<u64> = (0..64u64).map(|i| home(i * 3) | (1 << 50) | (i << 32)).collect();
    for fp in &resident {
        assert!(w.insert(*fp));
    }
    let view = PresenceView::open(w.fd().try_clone().expect("dup"), slots).expect("view");
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let ours = resident.clone();
    let writer = std::thread::spawn(move || {
        let resident = ours;
        let mut x = 88_172_645_463_325_252u64;
        let mut live: Vec<u64> = Vec::new();
        let mut moves = 0u64;
        while !s.load(Ordering::Relaxed) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let r = resident[(x >> 3) as usize % resident.len()];
            assert!(w.insert(r));
            assert!(w.remove(r));
            moves += 1;
            if live.len() < 300 && x.is_multiple_of(2) {
                let fp = home(x) | (3 << 52) | ((x >> 40) << 32);
                if w.insert(fp) {
                    live.push(fp);
                }
            } else if !live.is_empty() {
                let fp = live.swap_remove((x >> 8) as usize % live.len());
                assert!(w.remove(fp));
            }
        }
        (w, moves)
    });
    for round in 0..10_000 {
        for fp in &resident {
            assert_eq!(
                view.contains(*fp),
                Ok(Presence::Maybe),
                "round {round}: {fp:#x} hidden"
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    let (w, moves) = writer.join().expect("writer");
    assert!(!w.is_saturated());
    assert!(moves > 1000, "the writer raced the readers ({moves} moves)");
}
