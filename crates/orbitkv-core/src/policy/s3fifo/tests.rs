//! Unit tests of `S3Fifo` (its queues, generations and recency order).

use super::*;
use crate::policy::xorshift;

#[test]
fn one_hit_wonders_leave_before_reused_entries() {
    let mut p = S3Fifo::new(100);
    for k in 0..10u32 {
        p.insert(k, 10);
    }
    p.touch(&3);
    p.touch(&3);
    // First victims are the untouched small-queue entries in FIFO order.
    assert_eq!(p.evict_one(|_| false), Some(0));
    assert_eq!(p.evict_one(|_| false), Some(1));
    assert_eq!(p.evict_one(|_| false), Some(2));
    // 3 was promoted to main, so 4 goes next.
    assert_eq!(p.evict_one(|_| false), Some(4));
    assert!(p.contains(&3));
}

#[test]
fn ghost_hit_goes_to_main() {
    let mut p = S3Fifo::new(100);
    p.insert(1u32, 10);
    assert_eq!(p.evict_one(|_| false), Some(1));
    p.insert(1, 10);
    p.insert(2, 10);
    // 1 re-entered through the ghost into main; 2 is in small and is the
    // victim while small is over its share.
    assert_eq!(p.evict_one(|_| false), Some(2));
}

#[test]
fn adaptive_small_queue_follows_the_ghost_hits_within_its_bounds() {
    // Capacity 1000, small target starts at 100 (10 %), bounds 50..=500.
    let mut p = S3Fifo::adaptive(1000, 1000);
    assert_eq!(p.small_target, 100);
    // Keys evicted from small that come back grow the small queue by their weight.
    for k in 0..20u32 {
        p.insert(k, 50);
    }
    let mut evicted = Vec::new();
    while p.small_bytes + p.main_bytes > 500 {
        evicted.push(p.evict_one(|_| false).expect("victim"));
    }
    for k in &evicted {
        p.insert(*k, 50);
    }
    assert_eq!(
        p.small_target, 500,
        "grew by 50 per return, capped at half the capacity"
    );
    // Returned keys sit in main; evict them from main and bring them back: it shrinks.
    for k in 100..120u32 {
        p.insert(k, 50);
    }
    let mut from_main = Vec::new();
    for _ in 0..30 {
        let k = p.evict_one(|_| false).expect("victim");
        if evicted.contains(&k) {
            from_main.push(k);
        }
    }
    assert!(!from_main.is_empty(), "main evicted some of the returned keys");
    let before = p.small_target;
    for k in &from_main {
        p.insert(*k, 50);
    }
    assert_eq!(p.small_target, (before - 50 * from_main.len() as u64).max(50));
}

#[test]
fn pinned_entries_are_never_chosen() {
    let mut p = S3Fifo::new(100);
    for k in 0..5u32 {
        p.insert(k, 20);
    }
    let pinned = |k: &u32| *k != 4;
    assert_eq!(p.evict_one(pinned), Some(4));
    assert_eq!(p.evict_one(|_| true), None);
    assert_eq!(p.len(), 4);
}

/// The recency order decides exactly as `Lru` does on the same operations
/// (pins, removals, S3-FIFO's own evictions in between), and stays bounded.
#[test]
fn the_recency_order_evicts_like_lru() {
    use super::super::Lru;
    let mut p = S3Fifo::tuned(2000, 10, 8000).with_recency();
    let mut lru = Lru::new();
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = || xorshift(&mut x);
    for step in 0..200_000u32 {
        let r = next();
        let k = (r >> 8) % 400;
        match r % 8 {
            0..=2 => {
                if !p.contains(&k) {
                    p.insert(k, 10 + (r >> 40) % 3);
                    lru.insert(k, p.weight(&k).unwrap_or(0));
                }
            }
            3..=5 => assert_eq!(p.touch_marked(&k).map(|t| t.0), lru.touch(&k)),
            6 => {
                p.remove(&k);
                lru.remove(&k);
            }
            _ => {
                let pin = (r >> 20) % 7;
                let pinned = |k: &u64| k % 7 == pin;
                if step % 3 == 0 {
                    // S3-FIFO's own choice; LRU is told.
                    if let Some(v) = p.evict_one(pinned) {
                        lru.remove(&v);
                    }
                } else {
                    assert_eq!(p.evict_least_recent(pinned), lru.evict_one(pinned));
                }
            }
        }
        assert_eq!((p.len(), p.bytes()), (lru.len(), lru.bytes()));
        if step % 1000 == 0 {
            assert_eq!(
                p.coldest_by_recency(300, |k| k % 2 == 0),
                lru.coldest(300, |k| k % 2 == 0)
            );
        }
        let queued = p.small.len() + p.main.len();
        assert!(queued <= 2 * p.len() + 1025, "{queued} for {}", p.len());
        assert!(
            p.slots.capacity() <= 400,
            "slots are reused: {}",
            p.slots.capacity()
        );
    }
}

#[test]
fn slots_and_queue_elements_are_packed() {
    use std::mem::size_of;
    assert_eq!(size_of::<crate::BlockRef>(), 8);
    assert_eq!(size_of::<Slot<crate::BlockRef>>(), 16); // + 8 bytes of slab links
    assert_eq!(size_of::<Slot<u64>>(), 16);
    assert_eq!(size_of::<Elem>(), 8);
    let mut s = Slot {
        key: 0u64,
        weight: 1,
        meta: GEN_MASK << GEN_SHIFT,
    };
    s.set_freq(MAX_FREQ);
    s.set_queue(Queue::Main);
    assert_eq!(
        (s.freq(), s.queue(), s.mark(), s.generation()),
        (3, Queue::Main, false, GEN_MASK)
    );
    s.set_freq(0);
    s.set_queue(Queue::Small);
    assert_eq!((s.freq(), s.queue(), s.generation()), (0, Queue::Small, GEN_MASK));
}

/// Generations of a few bits wrap many times over in this run (slots are
/// reused last-freed first, and removals bump them), while stale elements
/// wait in the queues: the queues still tell live from stale exactly as
/// with 28-bit generations (which do not wrap here, so they tell it as a
/// sequence number per insert did), and every decision is the same.
#[test]
fn wrapped_generations_never_revive_a_stale_element() {
    for bits in [1, 2, 3, 5] {
        let new = || S3Fifo::tuned(300, 20, 900).with_recency();
        let (mut wide, mut narrow) = (new(), new().with_generation_bits(bits));
        let mut x = 0x2545_f491_4f6c_dd1d_u64 ^ u64::from(bits);
        let mut bumps = 0u64;
        for step in 0..60_000u32 {
            xorshift(&mut x);
            let k = (x >> 8) % 60;
            match x % 16 {
                0..=5 if !wide.contains(&k) => {
                    let w = 10 + (x >> 40) % 3;
                    assert_eq!(wide.insert(k, w), narrow.insert(k, w));
                }
                6..=8 => assert_eq!(wide.touch(&k), narrow.touch(&k)),
                9..=11 => {
                    bumps += u64::from(wide.contains(&k));
                    wide.remove(&k);
                    narrow.remove(&k);
                }
                12 => {
                    let pin = (x >> 20) % 5;
                    let pinned = |k: &u64| k % 5 == pin;
                    bumps += 1;
                    assert_eq!(wide.evict_least_recent(pinned), narrow.evict_least_recent(pinned));
                }
                13 => {
                    let limit = (x >> 30) % 200;
                    assert_eq!(
                        wide.coldest(limit, |k| k % 2 == 0),
                        narrow.coldest(limit, |k| k % 2 == 0)
                    );
                }
                _ => {}
            }
            while wide.bytes() > 300 {
                let pin = (x >> 24) % 7;
                let pinned = |k: &u64| k % 7 == pin;
                let v = wide.evict_one(pinned);
                assert_eq!(v, narrow.evict_one(pinned), "step {step}");
                if v.is_none() {
                    break;
                }
            }
            assert_eq!((wide.len(), wide.bytes()), (narrow.len(), narrow.bytes()));
            assert_eq!(wide.queued(), narrow.queued(), "bits {bits}, step {step}");
        }
        // About 60 slots: each one's generation wrapped many times over.
        assert!(bumps > 5_000, "{bits}: only {bumps} bumps");
    }
}

/// A stale element waits in main (main is popped only once the small queue
/// is under its share) while its slot is reused and removed over and over,
/// far more often than 2-bit generations can count, and ends up holding a
/// live entry again in the generation the stale element names: it is
/// still stale.
#[test]
fn a_stale_element_in_a_still_main_queue_stays_stale() {
    // Small's share is 10 bytes: one entry, so small is popped while it has any.
    let mut p = S3Fifo::tuned(1000, 1, 10_000).with_generation_bits(2);
    // Keys 0..50 in main: evicted once, then readmitted through the ghost.
    for k in 0..50u64 {
        p.insert(k, 10);
        assert_eq!(p.evict_one(|_| false), Some(k));
        assert!(p.insert(k, 10));
    }
    p.remove(&7); // a stale element in main, its slot free: 1 bump
    for round in 0..999u64 {
        let k = 1000 + round;
        p.insert(k, 10); // takes the freed slot (last freed, first reused)
        p.remove(&k);
    }
    // 1000 bumps, a multiple of 4: the slot is back in the generation of
    // 7's element, and holds a live entry.
    p.insert(5000, 10);
    for k in 2000..2020u64 {
        p.insert(k, 10);
    }
    let mut evicted = Vec::new();
    while let Some(v) = p.evict_one(|_| false) {
        assert!(!evicted.contains(&v), "{v} evicted twice");
        assert!(v != 7 && !(1000..2000).contains(&v), "{v} was removed");
        evicted.push(v);
    }
    assert_eq!(evicted[0], 5000);
    assert_eq!(evicted.len(), 1 + 20 + 49);
    assert!(p.is_empty() && p.bytes() == 0);
}

#[test]
fn removed_then_reinserted_is_not_evicted_twice() {
    let mut p = S3Fifo::new(100);
    p.insert(1u32, 10);
    p.remove(&1);
    p.insert(1, 10);
    assert_eq!(p.evict_one(|_| false), Some(1));
    assert_eq!(p.evict_one(|_| false), None);
}

#[test]
fn a_small_queue_of_pinned_entries_gives_the_victim_from_main() {
    let mut p = S3Fifo::new(100);
    for k in 0..4u32 {
        p.insert(k, 10);
        p.touch(&k);
    }
    // 0..4 go to main as small passes its share; 10..14 then fill small, all pinned.
    while p.main.is_empty() {
        p.insert(100, 10);
        let v = p.evict_one(|_| false);
        assert_eq!(v, Some(100), "the untouched newcomer leaves first");
    }
    for k in 10..14u32 {
        p.insert(k, 10);
    }
    let pinned = |k: &u32| (10..14).contains(k);
    let v = p.evict_one(pinned).expect("main holds unpinned entries");
    assert!((0..4).contains(&v), "victim {v} from main");
    // Everything pinned: no victim.
    assert_eq!(p.evict_one(|_| true), None);
}
