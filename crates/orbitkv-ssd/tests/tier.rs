#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use common::*;
use orbitkv_ssd::format::{BlockHeader, FORMAT_VERSION, JOURNAL_RECORD_SIZE, JournalRecord, RecordKind};
use orbitkv_ssd::{EnginePref, IoMode, RecoveryPhase, SsdConfig, SsdError, SsdKey, SsdTier};

const MODES: [IoMode; 2] = [IoMode::Direct, IoMode::Kernel];
const ENGINES: [EnginePref; 2] = [EnginePref::Uring, EnginePref::Psync];
const LENS: [usize; 7] = [0, 1, 4095, 4096, 10_000, 65_536, 1 << 20];

#[test]
fn roundtrip_all_modes_and_engines() {
    for mode in MODES {
        for engine in ENGINES {
            let d = tempdir();
            let (t, rep) = open(&cfg(d.path(), mode, engine));
            assert!(rep.recovered.is_empty());
            let want = if engine == EnginePref::Uring {
                "io_uring"
            } else {
                "psync"
            };
            assert_eq!(t.engine().kind, want);
            assert_eq!(t.engine().fallback_reason, None);

            // Aligned sources (the shared-memory arena case) and unaligned ones.
            let aligned: Vec<Aligned> = LENS
                .iter()
                .enumerate()
                .map(|(i, &l)| Aligned::from(&payload(i as u64, l)))
                .collect();
            let unaligned: Vec<Vec<u8>> = LENS
                .iter()
                .enumerate()
                .map(|(i, &l)| {
                    let mut v = vec![0u8; l + 1];
                    v[1..].copy_from_slice(&payload(100 + i as u64, l));
                    v
                })
                .collect();
            let mut items: Vec<(orbitkv_ssd::SsdKey, &[u8])> = Vec::new();
            for (i, a) in aligned.iter().enumerate() {
                items.push((key(i as u64), a.as_ref()));
            }
            for (i, v) in unaligned.iter().enumerate() {
                items.push((key(100 + i as u64), &v[1..]));
            }
            for r in t.write_batch(&items) {
                r.expect("write");
            }
            assert_eq!(t.len(), items.len());

            // Read into aligned, rounded-up buffers and into unaligned exact ones.
            let mut dst_a: Vec<Aligned> = items
                .iter()
                .map(|(_, d)| Aligned::new(d.len().next_multiple_of(4096).max(4096)))
                .collect();
            {
                let mut reqs: Vec<(orbitkv_ssd::SsdKey, &mut [u8])> = items
                    .iter()
                    .zip(dst_a.iter_mut())
                    .map(|((k, _), b)| (*k, b.as_mut()))
                    .collect();
                for (r, (_, d)) in t.read_batch(&mut reqs).into_iter().zip(items.iter()) {
                    assert_eq!(r.expect("read"), d.len());
                }
            }
            for ((_, d), b) in items.iter().zip(&dst_a) {
                assert_eq!(&b.as_ref()[..d.len()], *d, "{mode:?} {engine:?}");
            }
            for (k, d) in &items {
                let mut v = vec![0u8; d.len() + 1];
                let n = t.read(*k, &mut v[1..]).expect("read unaligned");
                assert_eq!(&v[1..1 + n], *d);
            }
            // Too-small buffer and a miss.
            let mut small = vec![0u8; 10];
            assert!(matches!(
                t.read(key(6), &mut small),
                Err(SsdError::BufferTooSmall { .. })
            ));
            assert!(matches!(t.read(key(9999), &mut small), Err(SsdError::NotFound)));
            let s = t.stats();
            assert_eq!(s.blocks_written, items.len() as u64);
            assert_eq!(s.checksum_failures, 0);
            assert!(s.bytes_read > 0);
        }
    }
}

#[test]
fn auto_engine_reports_choice() {
    let d = tempdir();
    let (t, _) = open(&cfg(d.path(), IoMode::Direct, EnginePref::Auto));
    let info = t.engine();
    assert!(
        info.kind == "io_uring" || info.fallback_reason.is_some(),
        "{info:?}"
    );
}

#[test]
fn reopen_recovers_in_both_modes() {
    for mode in MODES {
        let d = tempdir();
        let c = cfg(d.path(), mode, EnginePref::Auto);
        {
            let (t, _) = open(&c);
            write_keys(&t, 50, |i| 3000 + i as usize * 100);
            assert!(t.remove(&key(7)));
            t.write(key(3), &payload(333, 5000)).unwrap(); // overwrite
        }
        let mut phases = Vec::new();
        let (t, rep) = SsdTier::open(c.clone(), &mut |p| phases.push(p.phase)).unwrap();
        assert!(phases.contains(&RecoveryPhase::Journal));
        assert!(phases.contains(&RecoveryPhase::VerifyHeaders));
        assert_eq!(phases.last(), Some(&RecoveryPhase::Done));
        assert_eq!(rep.recovered.len(), 49);
        assert_eq!(rep.corrupt + rep.torn + rep.rejected_version, 0);
        assert!(!t.contains(&key(7)));
        for i in 0..50u64 {
            if i == 7 {
                continue;
            }
            let want = if i == 3 {
                payload(333, 5000)
            } else {
                payload(i, 3000 + i as usize * 100)
            };
            let mut buf = vec![0u8; 16384];
            let n = t.read(key(i), &mut buf).unwrap();
            assert_eq!(&buf[..n], &want[..]);
        }
        // Space accounting survives the reopen.
        let used_before = t.used_bytes();
        drop(t);
        let (t, _) = open(&c);
        assert_eq!(t.used_bytes(), used_before);
    }
}

#[test]
fn bit_flip_in_payload_is_corrupt_never_data() {
    for mode in MODES {
        let d = tempdir();
        let c = cfg(d.path(), mode, EnginePref::Auto);
        let (t, _) = open(&c);
        write_keys(&t, 4, |_| 8192);
        let off = find_extent(d.path(), &key(2)).unwrap();
        let mut b = read_at(d.path(), off + 4096 + 100, 1);
        b[0] ^= 0x10;
        patch(d.path(), off + 4096 + 100, &b);
        t.drop_page_cache().unwrap();
        let mut buf = Aligned::new(8192);
        match t.read(key(2), buf.as_mut()) {
            Err(SsdError::Corrupt { reason, .. }) => {
                assert!(reason.contains("checksum"), "{reason}")
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
        assert!(
            buf.as_ref().iter().all(|&x| x == 0),
            "corrupt bytes left in the buffer"
        );
        assert_eq!(t.stats().checksum_failures, 1);
        assert!(!t.contains(&key(2)), "corrupt block stays indexed");
        for i in [0u64, 1, 3] {
            let n = t.read(key(i), buf.as_mut()).unwrap();
            assert_eq!(&buf.as_ref()[..n], &payload(i, 8192)[..]);
        }
        drop(t);
        let (t, rep) = open(&c);
        assert_eq!(rep.recovered.len(), 3);
        assert!(!t.contains(&key(2)));
    }
}

#[test]
fn truncated_data_file_loses_only_those_blocks() {
    let d = tempdir();
    let c = cfg(d.path(), IoMode::Direct, EnginePref::Auto);
    let (t, _) = open(&c);
    write_keys(&t, 10, |_| 4096 * 3);
    let cut = find_extent(d.path(), &key(6)).unwrap() + 4096 + 100;
    drop(t);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(d.path().join(orbitkv_ssd::DATA_FILE))
        .unwrap();
    f.set_len(cut).unwrap();
    drop(f);
    let (t, rep) = open(&c);
    let lost: Vec<u64> = (0..10).filter(|i| !t.contains(&key(*i))).collect();
    assert!(lost.contains(&6), "{lost:?}");
    assert_eq!(rep.torn as usize, lost.len());
    assert_eq!(rep.recovered.len(), 10 - lost.len());
    let mut buf = Aligned::new(4096 * 3);
    for i in (0..10u64).filter(|i| !lost.contains(i)) {
        t.read(key(i), buf.as_mut()).unwrap();
        assert_eq!(buf.as_ref(), &payload(i, 4096 * 3)[..]);
    }
}

#[test]
fn truncation_under_a_live_tier_reads_corrupt() {
    let (d, _, t) = two_blocks(IoMode::Kernel, EnginePref::Psync);
    let off = find_extent(d.path(), &key(2)).unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(d.path().join(orbitkv_ssd::DATA_FILE))
        .unwrap();
    f.set_len(off + 4096 + 10).unwrap();
    let mut buf = vec![0u8; 4096];
    assert!(matches!(t.read(key(2), &mut buf), Err(SsdError::Corrupt { .. })));
    t.read(key(1), &mut buf).unwrap();
    assert_eq!(buf, payload(1, 4096));
}

#[test]
fn torn_journal_tail_loses_only_the_last_records() {
    let d = tempdir();
    let c = cfg(d.path(), IoMode::Direct, EnginePref::Auto);
    {
        let (t, _) = open(&c);
        write_keys(&t, 5, |_| 4096);
    }
    let jp = d.path().join(orbitkv_ssd::JOURNAL_FILE);
    let len = std::fs::metadata(&jp).unwrap().len();
    assert_eq!(len, 5 * JOURNAL_RECORD_SIZE as u64);
    let f = std::fs::OpenOptions::new().write(true).open(&jp).unwrap();
    f.set_len(len - 50).unwrap();
    drop(f);
    let (t, rep) = open(&c);
    assert_eq!(rep.torn, 1);
    assert_eq!(rep.recovered.len(), 4);
    assert!(!t.contains(&key(4)));
    let mut buf = Aligned::new(4096);
    for i in 0..4u64 {
        t.read(key(i), buf.as_mut()).unwrap();
        assert_eq!(buf.as_ref(), &payload(i, 4096)[..]);
    }
    // The journal was rewritten aligned: new writes survive the next reopen.
    t.write(key(4), &payload(4, 4096)).unwrap();
    drop(t);
    let (_, rep) = open(&c);
    assert_eq!((rep.recovered.len(), rep.torn), (5, 0));
}

#[test]
fn other_format_version_is_rejected() {
    // (a) A block header of another version.
    let (d, c, t) = two_blocks(IoMode::Direct, EnginePref::Auto);
    let off = find_extent(d.path(), &key(1)).unwrap();
    patch(d.path(), off + 8, &(FORMAT_VERSION + 1).to_le_bytes());
    let mut buf = Aligned::new(4096);
    match t.read(key(1), buf.as_mut()) {
        Err(SsdError::Corrupt { reason, .. }) => assert!(reason.contains("version"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // Put it back in the index through the journal to check the open-time check too.
    drop(t);
    let mut h = read_at(d.path(), off, 4096);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    let bh = BlockHeader::decode(&h).unwrap();
    append_record(d.path(), &put(bh.seq, bh.key, off, bh.len, bh.payload_sum));
    let (t, rep) = open(&c);
    assert_eq!(rep.rejected_version, 1);
    assert!(!t.contains(&key(1)));
    assert!(t.contains(&key(2)));
    drop(t);

    // (b) A journal record of another version.
    let rec = JournalRecord {
        version: 2,
        ..put(1000, key(50), 0, 4096, 0)
    };
    append_record(d.path(), &rec);
    let (t, rep) = open(&c);
    assert_eq!(rep.rejected_version, 1);
    assert!(!t.contains(&key(50)));
    assert_eq!(rep.recovered.len(), 1);
}

/// Write keys `0..n` to `t`, key `i` with `len(i)` bytes of its payload.
fn write_keys(t: &SsdTier, n: u64, len: impl Fn(u64) -> usize) {
    for i in 0..n {
        t.write(key(i), &payload(i, len(i))).unwrap();
    }
}

/// A tier in a new directory (`mode`, `engine`) holding blocks 1 and 2 of
/// 4096 bytes: the directory, the configuration, the tier.
fn two_blocks(mode: IoMode, engine: EnginePref) -> (tempfile::TempDir, SsdConfig, SsdTier) {
    let d = tempdir();
    let c = cfg(d.path(), mode, engine);
    let (t, _) = open(&c);
    t.write(key(1), &payload(1, 4096)).unwrap();
    t.write(key(2), &payload(2, 4096)).unwrap();
    (d, c, t)
}

/// A journal record of this format version: a put of `key` at `offset` in data file 0.
fn put(seq: u64, key: SsdKey, offset: u64, len: u64, payload_sum: u64) -> JournalRecord {
    JournalRecord {
        version: FORMAT_VERSION as u16,
        kind: RecordKind::Put,
        seq,
        key,
        file: 0,
        offset,
        len,
        payload_sum,
    }
}

/// Append `rec`, encoded, to the journal in `dir`.
fn append_record(dir: &std::path::Path, rec: &JournalRecord) {
    use std::io::Write;
    let mut enc = [0u8; JOURNAL_RECORD_SIZE];
    rec.encode(&mut enc);
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join(orbitkv_ssd::JOURNAL_FILE))
        .unwrap();
    f.write_all(&enc).unwrap();
}

#[test]
fn header_key_mismatch_is_rejected() {
    let (d, c, t) = two_blocks(IoMode::Kernel, EnginePref::Uring);
    let off = find_extent(d.path(), &key(1)).unwrap();
    let mut bh = BlockHeader::decode(&read_at(d.path(), off, 4096)).unwrap();
    bh.key = key(99); // a valid header, for another key
    let mut h = vec![0u8; 4096];
    bh.encode(&mut h);
    patch(d.path(), off, &h);
    let mut buf = vec![0u8; 4096];
    match t.read(key(1), &mut buf) {
        Err(SsdError::Corrupt { reason, .. }) => assert!(reason.contains("key"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert_ne!(buf, payload(1, 4096));
    assert_eq!(t.stats().header_failures, 1);
    drop(t);
    // Re-point the journal at it: the open-time header check refuses it as well.
    append_record(d.path(), &put(bh.seq, key(1), off, bh.len, bh.payload_sum));
    let (t, rep) = open(&c);
    assert_eq!(rep.corrupt, 1);
    assert!(!t.contains(&key(1)) && !t.contains(&key(99)));
    assert!(t.contains(&key(2)));
}

#[test]
fn direct_on_tmpfs_is_refused_with_a_clear_error() {
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("no /dev/shm; skipping");
        return;
    }
    let d = tempfile::tempdir_in(shm).unwrap();
    let c = cfg(d.path(), IoMode::Direct, EnginePref::Auto);
    let err = SsdTier::open(c.clone(), &mut |_| {}).err().expect("must fail");
    let msg = err.to_string();
    assert!(matches!(err, SsdError::DirectUnsupported { .. }), "{msg}");
    assert!(msg.contains(&d.path().display().to_string()), "{msg}");
    assert!(msg.contains("kernel"), "{msg}");
    // Kernel mode is fine there.
    let mut k = c;
    k.mode = IoMode::Kernel;
    k.capacity_bytes = 1 << 20;
    let (t, _) = open(&k);
    t.write(key(1), b"hello").unwrap();
}

#[test]
fn capacity_beyond_free_space_is_refused() {
    let d = tempdir();
    let mut c = cfg(d.path(), IoMode::Direct, EnginePref::Auto);
    c.capacity_bytes = 1 << 62;
    let err = SsdTier::open(c, &mut |_| {}).err().expect("must fail");
    assert!(matches!(err, SsdError::InsufficientSpace { .. }), "{err}");
    assert!(err.to_string().contains(&d.path().display().to_string()));
    let mut c = cfg(d.path(), IoMode::Direct, EnginePref::Auto);
    c.queue_depth = 0;
    assert!(matches!(
        SsdTier::open(c, &mut |_| {}),
        Err(SsdError::InvalidConfig {
            field: "queue_depth",
            ..
        })
    ));
}

#[test]
fn second_open_of_a_directory_is_locked() {
    let d = tempdir();
    let c = cfg(d.path(), IoMode::Direct, EnginePref::Auto);
    let (_t, _) = open(&c);
    assert!(matches!(
        SsdTier::open(c, &mut |_| {}),
        Err(SsdError::Locked { .. })
    ));
}

#[test]
fn full_remove_and_space_reuse() {
    let d = tempdir();
    let mut c = cfg(d.path(), IoMode::Direct, EnginePref::Auto);
    c.capacity_bytes = 10 * 8192; // ten 4 KiB blocks (header + payload)
    let (t, _) = open(&c);
    write_keys(&t, 10, |_| 4096);
    assert_eq!(t.used_bytes(), 10 * 8192);
    assert!(matches!(
        t.write(key(10), &payload(10, 4096)),
        Err(SsdError::Full { .. })
    ));
    assert_eq!(t.stats().full_rejections, 1);
    // Touch key 0 so that key 1 becomes the oldest.
    let mut buf = vec![0u8; 4096];
    t.read(key(0), &mut buf).unwrap();
    assert_eq!(t.oldest(2), vec![key(1), key(2)]);
    assert!(t.remove(&key(1)));
    assert!(!t.remove(&key(1)));
    t.write(key(10), &payload(10, 4096)).unwrap();
    // Need two adjacent free extents for a 12 KiB block.
    assert!(matches!(
        t.write(key(11), &payload(11, 12288)),
        Err(SsdError::Full { .. })
    ));
    assert!(t.remove(&key(4)) && t.remove(&key(5)));
    t.write(key(11), &payload(11, 12288)).unwrap();
    let mut big = vec![0u8; 12288];
    t.read(key(11), &mut big).unwrap();
    assert_eq!(big, payload(11, 12288));
    assert!(matches!(
        t.write(key(12), &vec![0u8; 1 << 20]),
        Err(SsdError::TooLarge { .. })
    ));
}

#[test]
fn journal_is_compacted() {
    let d = tempdir();
    let mut c = cfg(d.path(), IoMode::Kernel, EnginePref::Auto);
    c.journal_compact_min_records = 32;
    let (t, _) = open(&c);
    for i in 0..500u64 {
        t.write(key(i), &payload(i, 100)).unwrap();
        if i >= 5 {
            t.remove(&key(i - 5));
        }
    }
    let s = t.stats();
    assert!(s.journal_compactions > 0);
    assert!(s.journal_records <= 64, "{s:?}");
    assert!(t.journal_bytes() <= 64 * JOURNAL_RECORD_SIZE as u64);
    drop(t);
    let (t, rep) = open(&c);
    assert_eq!(rep.recovered.len(), 5);
    let mut buf = vec![0u8; 100];
    for i in 495..500u64 {
        t.read(key(i), &mut buf).unwrap();
        assert_eq!(buf, payload(i, 100));
    }
}

#[test]
fn concurrent_readers_and_writers() {
    for (mode, engine) in [
        (IoMode::Direct, EnginePref::Uring),
        (IoMode::Kernel, EnginePref::Uring),
        (IoMode::Direct, EnginePref::Psync),
    ] {
        let d = tempdir();
        let mut c = cfg(d.path(), mode, engine);
        c.capacity_bytes = 4 << 20;
        c.queue_depth = 4; // several jobs share one ring
        let (t, _) = open(&c);
        let t = std::sync::Arc::new(t);
        let mut hs = Vec::new();
        for w in 0..4u64 {
            let t = t.clone();
            hs.push(std::thread::spawn(move || {
                let mut bufs: Vec<Aligned> = (0..3).map(|_| Aligned::new(8192)).collect();
                for i in 0..150u64 {
                    let ks: Vec<u64> = (0..3).map(|j| w * 1000 + ((i + j) % 40)).collect();
                    let datas: Vec<Vec<u8>> = ks.iter().map(|&k| payload(k, 8192)).collect();
                    let items: Vec<_> = ks.iter().zip(&datas).map(|(&k, d)| (key(k), &d[..])).collect();
                    for r in t.write_batch(&items) {
                        match r {
                            Ok(()) | Err(SsdError::Full { .. }) => {}
                            Err(e) => panic!("{e}"),
                        }
                    }
                    let rs: Vec<u64> = (0..3).map(|j| w * 1000 + ((i * 7 + j) % 40)).collect();
                    let mut reqs: Vec<_> = rs
                        .iter()
                        .zip(bufs.iter_mut())
                        .map(|(&r, b)| (key(r), b.as_mut()))
                        .collect();
                    let res = t.read_batch(&mut reqs);
                    for ((r, out), b) in rs.iter().zip(res).zip(&bufs) {
                        match out {
                            Ok(n) => assert_eq!(&b.as_ref()[..n], &payload(*r, 8192)[..]),
                            Err(SsdError::NotFound) => {}
                            Err(e) => panic!("{e}"),
                        }
                    }
                    if i % 3 == 0
                        && let Some(k) = t.oldest(1).first()
                    {
                        t.remove(k);
                    }
                }
            }));
        }
        for h in hs {
            h.join().unwrap();
        }
        let s = t.stats();
        assert_eq!(
            s.checksum_failures + s.header_failures + s.read_errors,
            0,
            "{s:?}"
        );
        assert!(s.blocks_read > 0);
    }
}

#[test]
fn config_defaults_validate() {
    let c = SsdConfig::new("/nonexistent-but-fine", 1 << 20);
    assert_eq!(c.mode, IoMode::Direct);
    assert_eq!(c.engine, EnginePref::Auto);
}

#[test]
fn shrinking_capacity_drops_only_blocks_beyond_it() {
    let d = tempdir();
    let mut c = cfg(d.path(), IoMode::Direct, EnginePref::Auto);
    c.capacity_bytes = 20 * 8192;
    {
        let (t, _) = open(&c);
        write_keys(&t, 20, |_| 4096);
    }
    c.capacity_bytes = 10 * 8192;
    let (t, rep) = open(&c);
    assert_eq!(rep.out_of_capacity, 10);
    assert_eq!(rep.recovered.len(), 10);
    assert_eq!(t.capacity_bytes(), 10 * 8192);
    let mut buf = Aligned::new(4096);
    for (k, _) in &rep.recovered {
        t.read(*k, buf.as_mut()).unwrap();
        assert_eq!(buf.as_ref(), &payload(k.generation, 4096)[..]);
    }
    drop(t);
    c.capacity_bytes = 40 * 8192;
    let (t, rep) = open(&c);
    assert_eq!(rep.recovered.len(), 10);
    t.write(key(100), &payload(100, 4096 * 20)).unwrap();
}
