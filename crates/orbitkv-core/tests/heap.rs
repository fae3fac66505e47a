//! `CacheState::heap_bytes` is a sane estimate: it grows with the resident
//! blocks, stays within plausible per-block bounds, and shows `duel`'s ghost
//! history once evictions happen.

use orbitkv_core::policy::PolicyKind;
use orbitkv_core::{CacheState, Fingerprint, NamespaceKey};

fn chain(c: u32) -> Vec<[u8; 32]> {
    (0..32u32)
        .map(|i| {
            let mut h = [0u8; 32];
            h[..4].copy_from_slice(&c.to_le_bytes());
            h[4..8].copy_from_slice(&i.to_le_bytes());
            h
        })
        .collect()
}

#[test]
fn heap_estimate_tracks_resident_blocks_and_ghosts() {
    let blocks = 8192u64;
    let mut c = CacheState::with_policy_seed(&[blocks * 4096], PolicyKind::Duel, Some(1));
    let key = NamespaceKey {
        fingerprint: Fingerprint([1; 32]),
        shard: 0,
        salt: [0; 32],
    };
    let (ns, _) = c.register_namespace(key, 4096).expect("ns");
    let s = c.open_session();
    let empty = c.heap_bytes();
    for i in 0..(blocks / 32) as u32 {
        let (id, _) = c.begin_save(s, ns, &chain(i)).expect("save");
        c.commit_save(s, id).expect("commit");
    }
    assert_eq!(c.gauges().visible_blocks, blocks);
    let full = c.heap_bytes();
    assert_eq!(full.policy.ghost, empty.policy.ghost, "no eviction yet");
    // The index's entry holds at least the 48-byte key; the policy knows a
    // block by an 8-byte reference into the index, so its entry (reference,
    // weight, flags, list links, queue element, table bucket) is smaller than
    // a key; nothing should need 2 KiB.
    let per = |bytes: u64| bytes as f64 / blocks as f64;
    assert!(
        (48.0..2048.0).contains(&per(full.index)),
        "index: {} B/block",
        per(full.index)
    );
    let policy = per(full.policy.tracked);
    assert!((16.0..48.0).contains(&policy), "policy: {policy} B/block");
    for i in (blocks / 32) as u32..(blocks / 8) as u32 {
        let (id, _) = c.begin_save(s, ns, &chain(i)).expect("save");
        c.commit_save(s, id).expect("commit");
    }
    let steady = c.heap_bytes();
    assert_eq!(c.gauges().visible_blocks, blocks);
    assert!(steady.policy.ghost > full.policy.ghost, "{steady:?}");
    assert!(steady.policy.shadows > 0, "{steady:?}");
    assert!(steady.total() > full.total());
}
