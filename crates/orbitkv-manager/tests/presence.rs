//! The presence table with real Manager processes: misses answered without a
//! message, namespace isolation, and the faults that must never yield a hit on
//! bytes that are not there (a Manager restart, a generation reset, an
//! eviction racing lookups).

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use orbitkv_client::{Client, ClientError, Namespace};
use support::*;

const BB: usize = 64 * 1024;

fn lookups(m: &ManagerProc) -> u64 {
    m.stats()["lookups_total"].as_u64().expect("lookups_total")
}

fn save(c: &Client, ns: &Namespace, hs: &[[u8; 32]], data: &[Vec<u8>]) {
    let src: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
    let r = c.save(ns, hs, &src).expect("save");
    assert_eq!(r.refused, 0);
}

/// Restore `hs` and check every hit block byte-exact; returns the hit count.
fn restore_checked(c: &Client, ns: &Namespace, hs: &[[u8; 32]], want: &[Vec<u8>]) -> usize {
    let mut out = vec![vec![0u8; want[0].len()]; hs.len()];
    let mut dst: Vec<&mut [u8]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
    let n = c.restore(ns, hs, &mut dst).expect("restore") as usize;
    for i in 0..n {
        assert!(out[i] == want[i], "block {i} of a hit is not the saved bytes");
    }
    n
}

#[test]
fn misses_need_no_message_and_namespaces_stay_apart() {
    let m = ManagerProc::start(&["--dram-size", "4MiB", "--segment-size", "1MiB"]);
    let c = m.client();
    assert!(c.has_presence());
    let ns = c
        .register_namespace([1; 32], BB as u64, 0, b"tenant-a")
        .expect("ns");
    let hs: Vec<[u8; 32]> = (0..6).map(|i| hash(1, i)).collect();
    let data: Vec<Vec<u8>> = (0..6).map(|i| block(i, BB)).collect();

    let before = lookups(&m);
    for _ in 0..100 {
        assert_eq!(c.probably_present(&ns, &hs).expect("probe"), 0);
    }
    assert_eq!(lookups(&m), before, "a presence probe sends no lookup");

    save(&c, &ns, &hs[..4], &data[..4]);
    assert_eq!(
        c.probably_present(&ns, &hs).expect("probe"),
        4,
        "prefix up to the first absent block"
    );
    assert_eq!(restore_checked(&c, &ns, &hs, &data), 4);

    // Another client of the same namespace sees the same; another tenant's
    // salt (another namespace) gets another key: the same hashes are absent.
    let d = m.client();
    let ns_d = d
        .register_namespace([1; 32], BB as u64, 0, b"tenant-a")
        .expect("ns");
    assert_eq!(ns_d.presence_key, ns.presence_key);
    assert_eq!(d.probably_present(&ns_d, &hs).expect("probe"), 4);
    let other = d
        .register_namespace([1; 32], BB as u64, 0, b"tenant-b")
        .expect("ns");
    assert_ne!(other.presence_key, ns.presence_key);
    assert_eq!(d.probably_present(&other, &hs).expect("probe"), 0);

    // Control-only sessions (engine schedulers) get the table too.
    let ctl = Client::connect_control(m.socket(), None, Duration::from_secs(5)).expect("control");
    let ns_c = ctl
        .register_namespace([1; 32], BB as u64, 0, b"tenant-a")
        .expect("ns");
    assert_eq!(ctl.probably_present(&ns_c, &hs).expect("probe"), 4);
}

#[test]
fn a_manager_without_a_table_says_everything_may_be_present() {
    let m = ManagerProc::start(&["--presence-slots", "off"]);
    let c = m.client();
    assert!(!c.has_presence());
    let ns = c.register_namespace([1; 32], BB as u64, 0, b"").expect("ns");
    let hs: Vec<[u8; 32]> = (0..3).map(|i| hash(1, i)).collect();
    assert_eq!(c.probably_present(&ns, &hs).expect("probe"), 3);
}

#[test]
fn eviction_removes_blocks_from_the_table() {
    // 1 MiB of DRAM: 16 blocks of 64 KiB.
    let m = ManagerProc::start(&["--dram-size", "1MiB", "--segment-size", "1MiB"]);
    let c = m.client();
    let ns = c.register_namespace([2; 32], BB as u64, 0, b"").expect("ns");
    let first = [hash(2, 0)];
    save(&c, &ns, &first, &[block(0, BB)]);
    assert_eq!(c.probably_present(&ns, &first).expect("probe"), 1);
    for chain in 10..60u8 {
        save(&c, &ns, &[hash(chain, 0)], &[block(chain, BB)]);
    }
    assert_eq!(c.lookup(&ns, &first).expect("lookup").hit_blocks, 0, "evicted");
    assert_eq!(
        c.probably_present(&ns, &first).expect("probe"),
        0,
        "and gone from the table"
    );
    let st = m.stats();
    assert_eq!(st["presence_entries"], st["dram_visible_blocks"]);
}

#[test]
fn a_generation_reset_empties_the_namespace() {
    let m = ManagerProc::start(&[]);
    let c = m.client();
    let ns = c.register_namespace([3; 32], BB as u64, 0, b"").expect("ns");
    let hs: Vec<[u8; 32]> = (0..4).map(|i| hash(3, i)).collect();
    let old: Vec<Vec<u8>> = (0..4).map(|i| block(i, BB)).collect();
    save(&c, &ns, &hs, &old);
    assert_eq!(c.probably_present(&ns, &hs).expect("probe"), 4);
    c.reset_generation(&ns).expect("reset");
    assert_eq!(
        c.probably_present(&ns, &hs).expect("probe"),
        0,
        "old generation gone"
    );
    assert_eq!(c.lookup(&ns, &hs).expect("lookup").hit_blocks, 0);
    // The same hashes saved again in the new generation: new bytes, found.
    let new: Vec<Vec<u8>> = (0..4).map(|i| block(100 + i, BB)).collect();
    let ns = c.register_namespace([3; 32], BB as u64, 0, b"").expect("ns");
    save(&c, &ns, &hs, &new);
    assert_eq!(c.probably_present(&ns, &hs).expect("probe"), 4);
    assert_eq!(restore_checked(&c, &ns, &hs, &new), 4);
}

/// A Manager killed (SIGKILL) and another started on the same SSD directory:
/// the old client's mapping never answers for the new Manager, and the old
/// Manager's namespace keys match nothing in the new table.
#[test]
fn a_restarted_manager_is_never_answered_by_the_old_mapping() {
    let dir = tempfile::tempdir().expect("tmp");
    let ssd = dir.path().join("ssd").to_string_lossy().to_string();
    let args = [
        "--dram-size",
        "4MiB",
        "--segment-size",
        "1MiB",
        "--ssd-dir",
        &ssd,
        "--ssd-capacity",
        "16MiB",
        "--ssd-write-policy",
        "eager",
    ];
    let hs: Vec<[u8; 32]> = (0..4).map(|i| hash(4, i)).collect();
    let data: Vec<Vec<u8>> = (0..4).map(|i| block(40 + i, BB)).collect();
    let mut first = ManagerProc::start(&args);
    let old = first.client();
    let old_ns = old.register_namespace([4; 32], BB as u64, 0, b"").expect("ns");
    save(&old, &old_ns, &hs, &data);
    eventually("eager spills reach the SSD", || {
        first.stats()["ssd_spilled_blocks_total"].as_u64() == Some(4)
    });
    assert_eq!(old.probably_present(&old_ns, &hs).expect("probe"), 4);

    first.child.kill().expect("kill");
    first.child.wait().expect("wait");
    let second = ManagerProc::start(&args);
    // The old mapping is of a dead Manager: an error, not an answer.
    match old.probably_present(&old_ns, &hs) {
        Err(ClientError::Unavailable(_)) => {}
        other => panic!("the old mapping answered for a dead Manager: {other:?}"),
    }
    let new = second.client();
    // The old key (another secret) finds nothing in the new table...
    assert_eq!(new.probably_present(&old_ns, &hs).expect("probe"), 0);
    // ...the new registration finds the recovered blocks, byte-exact.
    let ns = new.register_namespace([4; 32], BB as u64, 0, b"").expect("ns");
    assert_ne!(ns.presence_key, old_ns.presence_key);
    assert_eq!(new.probably_present(&ns, &hs).expect("probe"), 4);
    assert_eq!(restore_checked(&new, &ns, &hs, &data), 4);

    // A Manager stopped cleanly (SIGTERM) closes its table.
    let _ = std::process::Command::new("kill")
        .arg(second.child.id().to_string())
        .status();
    eventually("the stopped Manager's table is refused", || {
        matches!(new.probably_present(&ns, &hs), Err(ClientError::Unavailable(_)))
    });
}

/// Saves evict blocks while other clients probe and restore: a probe may be
/// stale either way, but every hit restores the saved bytes, and at rest the
/// table agrees with the Manager's lookups.
#[test]
fn eviction_racing_lookups_never_hits_missing_bytes() {
    let m = ManagerProc::start(&["--dram-size", "1MiB", "--segment-size", "512KiB"]);
    const BLK: usize = 16 * 1024;
    const CHAINS: u8 = 48;
    let content = |chain: u8, i: u8| block(chain.wrapping_mul(7).wrapping_add(i), BLK);
    let chain = |c: u8| -> Vec<[u8; 32]> { (0..4).map(|i| hash(c, i)).collect() };
    let stop = Arc::new(AtomicBool::new(false));
    // Readers start once every chain was saved once: probes that miss cost no
    // round trip, so readers started at once could finish before any save.
    let saved = Arc::new(AtomicU64::new(0));
    let saver = {
        let sock = m.socket().to_path_buf();
        let stop = stop.clone();
        let saved = saved.clone();
        std::thread::spawn(move || {
            let c = Client::connect(&sock, None, Duration::from_secs(5)).expect("connect");
            let ns = c.register_namespace([5; 32], BLK as u64, 0, b"").expect("ns");
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let ch = (k % u64::from(CHAINS)) as u8;
                let data: Vec<Vec<u8>> = (0..4).map(|i| content(ch, i)).collect();
                let src: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
                // Refusals are fine here (readers pin what they restore).
                c.save(&ns, &chain(ch), &src).expect("save");
                k += 1;
                saved.store(k, Ordering::Release);
            }
            k
        })
    };
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let sock = m.socket().to_path_buf();
            let saved = saved.clone();
            std::thread::spawn(move || {
                let c = Client::connect(&sock, None, Duration::from_secs(5)).expect("connect");
                let ns = c.register_namespace([5; 32], BLK as u64, 0, b"").expect("ns");
                let t0 = std::time::Instant::now();
                while saved.load(Ordering::Acquire) < u64::from(CHAINS) {
                    assert!(
                        t0.elapsed() < Duration::from_secs(30),
                        "the saver made no progress"
                    );
                    std::thread::sleep(Duration::from_millis(1));
                }
                let (mut probes, mut hits, mut stale_maybe) = (0u64, 0u64, 0u64);
                for k in 0..3000u64 {
                    let ch = ((k * 7 + r) % u64::from(CHAINS)) as u8;
                    let hs = chain(ch);
                    probes += 1;
                    if c.probably_present(&ns, &hs).expect("probe") == 0 {
                        continue;
                    }
                    let want: Vec<Vec<u8>> = (0..4).map(|i| content(ch, i)).collect();
                    match restore_checked(&c, &ns, &hs, &want) {
                        0 => stale_maybe += 1,
                        _ => hits += 1,
                    }
                }
                (probes, hits, stale_maybe)
            })
        })
        .collect();
    let mut hits = 0;
    for r in readers {
        let (_, h, _) = r.join().expect("reader");
        hits += h;
    }
    stop.store(true, Ordering::Relaxed);
    let saves = saver.join().expect("saver");
    assert!(saves > 10 && hits > 0, "the race ran: {saves} saves, {hits} hits");
    let st = m.stats();
    assert!(
        st["evictions_total"].as_u64().unwrap_or(0) > 0,
        "evictions raced the lookups"
    );

    // At rest the table agrees with the Manager, chain by chain.
    let c = m.client();
    let ns = c.register_namespace([5; 32], BLK as u64, 0, b"").expect("ns");
    for ch in 0..CHAINS {
        let hs = chain(ch);
        let probe = c.probably_present(&ns, &hs).expect("probe");
        let hit = c.lookup(&ns, &hs).expect("lookup");
        assert_eq!(probe, hit.hit_blocks as usize, "chain {ch}");
        if hit.lease != 0 {
            c.release(hit.lease).expect("release");
        }
    }
}
