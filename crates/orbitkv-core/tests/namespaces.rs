//! Namespace registration refuses block sizes no segment can hold.

use orbitkv_core::{CacheError, CacheState, Fingerprint, NamespaceKey};

fn key(b: u8) -> NamespaceKey {
    NamespaceKey {
        fingerprint: Fingerprint([b; 32]),
        shard: 0,
        salt: [0; 32],
    }
}

#[test]
fn a_block_larger_than_every_segment_is_refused_at_registration() {
    // Three segments of 64 KiB: a 64 KiB block fits, 64 KiB + 1 never could.
    let mut c = CacheState::new(&[64 << 10; 3]);
    c.register_namespace(key(1), 64 << 10).expect("fits one segment");
    let e = c
        .register_namespace(key(2), (64 << 10) + 1)
        .expect_err("larger than a segment");
    assert_eq!(
        e,
        CacheError::BlockLargerThanSegment {
            block_bytes: (64 << 10) + 1,
            segment: 64 << 10
        }
    );
    assert!(e.to_string().contains("--segment-size"), "{e}");
}
