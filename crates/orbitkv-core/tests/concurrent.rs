//! The shared-lock operations (`lookup_shared`, `try_acquire_shared`,
//! `try_release_shared`) run from many threads at once beside a writer that
//! saves, evicts and resets generations, as the Manager runs them under its
//! `RwLock`: no slot handed out is ever reused while its lease lives, every
//! invariant holds at every exclusive section, and the policy decides exactly
//! as if every lookup had taken the exclusive lock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use orbitkv_core::policy::{Policy, PolicyKind};
use orbitkv_core::{
    AcquireStep, BlockHash, BlockRef, CacheState, Fingerprint, LeaseId, NamespaceKey, NsId, SaveStatus,
    SessionEnd, SessionId,
};

const BLOCK: u64 = 4096;

fn ns_key() -> NamespaceKey {
    NamespaceKey {
        fingerprint: Fingerprint([9; 32]),
        shard: 0,
        salt: [0; 32],
    }
}

/// Chain `c`'s block `i` (chains share their first two blocks: a common prefix).
fn hash(c: u32, i: u32) -> BlockHash {
    let mut h = [0u8; 32];
    let c = if i < 2 { 0 } else { c };
    h[..4].copy_from_slice(&c.to_le_bytes());
    h[4..8].copy_from_slice(&i.to_le_bytes());
    h
}

fn chain(c: u32, len: u32) -> Vec<BlockHash> {
    (0..len).map(|i| hash(c, i)).collect()
}

/// Tiny deterministic generator (no dependency; each thread its own seed).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u32) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % u64::from(n)) as u32
    }
}

/// Which block each arena slot holds, as the writer committed it: a reader
/// that got `slot` for `hash` checks the slot still holds `hash` after its
/// "copy", i.e. the slot was not freed and reused while the lease pinned it.
type Owners = Mutex<HashMap<(u32, u64), BlockHash>>;

fn save(c: &mut CacheState, s: SessionId, ns: NsId, hashes: &[BlockHash], owners: &Owners) {
    let (id, items) = c.begin_save(s, ns, hashes).expect("begin");
    {
        let mut o = owners.lock().expect("owners");
        for (h, item) in hashes.iter().zip(&items) {
            if let SaveStatus::Allocated(slot) = item {
                o.insert((slot.segment, slot.offset), *h);
            }
        }
    }
    c.commit_save(s, id).expect("commit");
}

#[test]
fn shared_operations_beside_a_writer_never_hand_out_a_reused_slot() {
    // 48 blocks of DRAM for 24 chains of up to 8 blocks (~ 130 distinct
    // blocks): the writer evicts all the time.
    let cache = Arc::new(RwLock::new(CacheState::new(&[48 * BLOCK])));
    let owners = Arc::new(Owners::default());
    let (ns, writer_s) = {
        let mut c = cache.write().expect("lock");
        let (ns, _) = c.register_namespace(ns_key(), BLOCK).expect("ns");
        (ns, c.open_session())
    };
    let stop = Arc::new(AtomicBool::new(false));
    // Hits so far, all readers: the writer goes on until they had enough (a loaded machine
    // may run the writer's rounds before the readers get scheduled).
    let hit_count = Arc::new(AtomicU64::new(0));
    let mut readers = Vec::new();
    for t in 0..4u64 {
        let (cache, owners, stop, hit_count) =
            (cache.clone(), owners.clone(), stop.clone(), hit_count.clone());
        readers.push(std::thread::spawn(move || {
            let s = cache.write().expect("lock").open_session();
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (t + 1));
            let (mut hits, mut fast_acquires, mut fast_releases) = (0u64, 0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                let hashes = chain(rng.below(24), 1 + rng.below(8));
                let r = {
                    let c = cache.read().expect("lock");
                    let r = c.lookup_shared(s, ns, &hashes);
                    c.apply_touches_shared(true); // replays beside other readers
                    r
                };
                let Some(lease) = r.expect("lookup").lease else {
                    continue;
                };
                hits += 1;
                hit_count.fetch_add(1, Ordering::Relaxed);
                let fast = cache
                    .read()
                    .expect("lock")
                    .try_acquire_shared(s, lease)
                    .expect("acquire");
                let slots = match fast {
                    Some(slots) => {
                        fast_acquires += 1;
                        slots
                    }
                    None => match cache.write().expect("lock").acquire(s, lease).expect("acquire") {
                        AcquireStep::Ready(slots) => slots,
                        AcquireStep::Lost { .. } => continue, // lease ended by the cache
                        other => panic!("DRAM-only cache asked to {other:?}"),
                    },
                };
                let check = |when: &str| {
                    let o = owners.lock().expect("owners");
                    for (slot, h) in slots.iter().zip(&hashes) {
                        assert_eq!(
                            o.get(&(slot.segment, slot.offset)),
                            Some(h),
                            "{when}: slot {slot:?} does not hold the block it was handed out for"
                        );
                    }
                };
                check("at acquire");
                std::thread::yield_now(); // the "copy": the writer may run meanwhile
                check("before release");
                if cache
                    .read()
                    .expect("lock")
                    .try_release_shared(s, lease)
                    .expect("release")
                {
                    fast_releases += 1;
                } else {
                    cache.write().expect("lock").release(s, lease).expect("release");
                }
            }
            cache
                .write()
                .expect("lock")
                .end_session(s, SessionEnd::Clean)
                .expect("end");
            (hits, fast_acquires, fast_releases)
        }));
    }
    let mut rng = Rng(42);
    let started = std::time::Instant::now();
    let mut round = 0u32;
    while round < 3000
        || (hit_count.load(Ordering::Relaxed) <= 200
            && started.elapsed() < std::time::Duration::from_secs(60))
    {
        let mut c = cache.write().expect("lock");
        c.apply_touches();
        c.check_invariants().expect("invariants under the exclusive lock");
        let hashes = chain(rng.below(24), 1 + rng.below(8));
        save(&mut c, writer_s, ns, &hashes, &owners);
        if round % 500 == 499 {
            // Refused while leases live (Busy); when it succeeds every old block is doomed.
            let _ = c.bump_generation(ns);
        }
        drop(c);
        std::thread::yield_now();
        round += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let mut total = (0, 0, 0);
    for r in readers {
        let (h, a, rl) = r.join().expect("reader");
        total = (total.0 + h, total.1 + a, total.2 + rl);
    }
    let mut c = cache.write().expect("lock");
    c.apply_touches();
    c.check_invariants().expect("invariants at the end");
    let g = c.gauges();
    assert_eq!((g.live_leases, g.pinned_blocks), (0, 0), "every lease ended");
    let n = c.counters();
    assert_eq!(n.leases_granted, n.leases_retired);
    assert!(total.0 > 100, "readers hit: {total:?}");
    assert!(total.1 > 0 && total.2 > 0, "shared paths taken: {total:?}");
}

/// Everything but the lookups' locking is the same; each run's evictions are
/// compared after every save.
/// `policy` is cloned for both runs: seeded policies (the duel's sample) then
/// sample alike.
fn run_policy(policy: &Policy<BlockRef>, shared: bool) -> Vec<Vec<(u32, u32)>> {
    let mut c = CacheState::with_policy_instance(&[64 * BLOCK], policy.clone());
    let owners = Owners::default();
    let (ns, _) = c.register_namespace(ns_key(), BLOCK).expect("ns");
    let sessions: Vec<SessionId> = (0..3).map(|_| c.open_session()).collect();
    let mut rng = Rng(7);
    let mut history = Vec::new();
    for round in 0..400 {
        // A burst of lookups from three sessions, released, then saves.
        let mut leases = Vec::new();
        for _ in 0..6 {
            let s = sessions[rng.below(3) as usize];
            let hashes = chain(rng.below(40), 1 + rng.below(8));
            let r = if shared {
                c.lookup_shared(s, ns, &hashes)
            } else {
                c.lookup(s, ns, &hashes)
            };
            if let Some(l) = r.expect("lookup").lease {
                leases.push((s, l));
            }
        }
        for (s, l) in leases {
            c.release(s, l).expect("release");
        }
        if shared {
            if round % 2 == 0 {
                // A replay under the shared lock (a lookup's, the reaper's) ...
                assert!(c.apply_touches_shared(true) || c.touches_pending() == 0);
            }
            // ... and what the Manager's exclusive guard does first.
            c.apply_touches();
        }
        for _ in 0..2 {
            let hashes = chain(rng.below(40), 1 + rng.below(8));
            save(&mut c, sessions[0], ns, &hashes, &owners);
        }
        let mut visible: Vec<(u32, u32)> = c
            .visible_blocks()
            .iter()
            .map(|k| {
                let w =
                    |r: std::ops::Range<usize>| u32::from_le_bytes(k.hash[r].try_into().expect("4 bytes"));
                (w(0..4), w(4..8))
            })
            .collect();
        visible.sort_unstable();
        history.push(visible);
    }
    history
}

#[test]
fn touches_replayed_in_grant_order_decide_like_immediate_ones() {
    for kind in [
        PolicyKind::default(),
        PolicyKind::Lru,
        PolicyKind::S3FifoAdaptive,
        PolicyKind::S3Fifo,
        // Not TinyLfu: its instances draw hash seeds of their own as they run,
        // so two runs of it differ even with the same calls.
    ] {
        let policy = Policy::new(kind, 64 * BLOCK);
        let immediate = run_policy(&policy, false);
        let deferred = run_policy(&policy, true);
        let evicted_any = immediate
            .windows(2)
            .any(|w| !w[1].iter().all(|b| w[0].contains(b)) || w[0] != w[1]);
        assert!(evicted_any, "{kind:?}: the workload must exercise eviction");
        for (i, (a, b)) in immediate.iter().zip(&deferred).enumerate() {
            assert_eq!(a, b, "{kind:?}: visible blocks differ after round {i}");
        }
    }
}

/// `n` shared-lock lookups of chain 1's first 4 blocks, every one a hit.
fn hits(c: &CacheState, s: SessionId, ns: NsId, n: usize) -> Vec<LeaseId> {
    (0..n)
        .map(|_| {
            let r = c.lookup_shared(s, ns, &chain(1, 4)).expect("lookup");
            r.lease.expect("hit")
        })
        .collect()
}

/// Lookups replay the log only once it is far behind (or when forced: the
/// Manager's policy thread), and the log empties; below the threshold a
/// lookup leaves it to the policy thread.
#[test]
fn the_touch_log_is_replayed_past_its_threshold() {
    let owners = Owners::default();
    let mut c = CacheState::new(&[64 * BLOCK]);
    let (ns, _) = c.register_namespace(ns_key(), BLOCK).expect("ns");
    let s = c.open_session();
    save(&mut c, s, ns, &chain(1, 4), &owners);
    let mut leases = hits(&c, s, ns, 10);
    assert_eq!(c.touches_pending(), 10);
    assert!(
        !c.apply_touches_shared(false),
        "10 chains are below the threshold"
    );
    assert!(c.apply_touches_shared(true), "forced (the policy thread)");
    assert_eq!(c.touches_pending(), 0);
    leases.extend(hits(&c, s, ns, 100));
    assert!(
        !c.apply_touches_shared(false),
        "100 chains: the policy thread's job"
    );
    leases.extend(hits(&c, s, ns, 1000));
    assert!(
        c.apply_touches_shared(false),
        "1,100 chains: a lookup replays them"
    );
    assert_eq!(c.touches_pending(), 0);
    for l in leases {
        assert!(c.try_release_shared(s, l).expect("release"));
    }
    c.check_invariants().expect("invariants");
    assert_eq!(c.gauges().pinned_blocks, 0);
}
