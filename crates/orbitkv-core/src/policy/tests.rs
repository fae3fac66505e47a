//! Unit tests of the policy facade: kind names, seeds, cold walks, chain order.

use super::*;

#[test]
fn names_round_trip_and_unknown_names_are_refused() {
    for k in PolicyKind::ALL {
        assert_eq!(k.name().parse::<PolicyKind>(), Ok(k));
    }
    let err = "belady".parse::<PolicyKind>().expect_err("unknown");
    assert!(err.contains("s3fifo") && err.contains("belady"), "{err}");
}

/// With a seed, every kind decides the same in every run (two instances in
/// one process stand in for two runs: unseeded, each draws its own hash).
#[test]
fn a_seed_makes_every_kind_reproducible() {
    fn victims(kind: PolicyKind) -> Vec<u64> {
        let mut p = Policy::seeded(kind, 64 * 10, Some(7));
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        let mut out = Vec::new();
        for _ in 0..20_000 {
            xorshift(&mut x);
            // Skewed keys, so that frequency and sampling decide something.
            let k = (x % 64) * (x >> 58) % 400;
            if p.contains(&k) {
                p.touch_chain(&[k]);
            } else {
                p.insert_chain(&[(k, 10)]);
                while p.len() > 64 {
                    out.extend(p.evict_one(|_| false));
                }
            }
        }
        out
    }
    for kind in PolicyKind::ALL {
        let a = victims(kind);
        assert!(a.len() > 1000, "{kind}: {}", a.len());
        assert_eq!(a, victims(kind), "{kind}");
    }
}

#[test]
fn a_cold_walk_in_steps_lists_what_coldest_lists() {
    // Every kind, after inserts, hits and evictions: walking each cold order
    // a few positions at a time, carrying the position and the weight listed,
    // lists exactly what one `coldest` call lists (duel: both orders, each
    // block once).
    for kind in PolicyKind::ALL {
        let mut p = Policy::seeded(kind, 400 * 10, Some(5));
        for i in 0..1500u32 {
            p.insert(i, 10 + u64::from(i % 3));
            if i % 4 == 0 {
                p.touch_chain(&[i / 2, i / 3]);
            }
            while p.len() > 400 {
                if p.evict_one(|_| false).is_none() {
                    break;
                }
            }
        }
        for (limit, step) in [(u64::MAX, 7usize), (600, 5), (1, 3), (2_000, 1)] {
            let wanted = |k: &u32| !k.is_multiple_of(5);
            let whole = p.coldest(limit, wanted);
            let mut listed: Vec<u32> = Vec::new();
            for order in p.cold_orders() {
                let (mut skip, mut bytes, mut this) = (0usize, 0u64, Vec::new());
                loop {
                    let c = p.coldest_step(order, skip, step, limit.saturating_sub(bytes), wanted);
                    assert!(c.visited <= step, "{kind}");
                    skip += c.visited;
                    bytes += c.bytes;
                    this.extend(c.keys);
                    if c.end {
                        break;
                    }
                }
                let seen: std::collections::HashSet<u32> = listed.iter().copied().collect();
                listed.extend(this.into_iter().filter(|k| !seen.contains(k)));
            }
            assert_eq!(listed, whole, "{kind}, limit {limit}, step {step}");
        }
    }
}

#[test]
fn chain_order_decides_whether_a_chain_leaves_tail_or_head_first() {
    // One save of a 4-block chain, then pressure: in chain order LRU evicts the
    // head first (stranding the rest); deepest first, the tail goes first.
    for (kind, first) in [(PolicyKind::Lru, 0u32), (PolicyKind::LruChain, 3)] {
        let mut p = Policy::new(kind, 40);
        p.insert_chain(&[(0u32, 10), (1, 10), (2, 10), (3, 10)]);
        assert_eq!(p.evict_one(|_| false), Some(first), "{kind}");
    }
    // A hit on the chain keeps the head hot in lru-chain.
    let mut p = Policy::new(PolicyKind::LruChain, 40);
    p.insert_chain(&[(0u32, 10), (1, 10)]);
    p.insert_chain(&[(5u32, 10)]);
    p.touch_chain(&[0, 1]);
    assert_eq!(p.evict_one(|_| false), Some(5));
    assert_eq!(p.evict_one(|_| false), Some(1));
    assert_eq!(p.evict_one(|k| *k == 0), None);
}
