//! The remote value format: what is served and what is a miss.

use orbitkv_remote::value::{HEADER_BYTES, Mismatch, encode, store_key, verify};
use orbitkv_ssd::SsdKey;
use proptest::prelude::*;

fn key(generation: u64, salt: u8) -> SsdKey {
    SsdKey {
        fingerprint: [7; 32],
        shard: 1,
        salt: [salt; 32],
        generation,
        hash: [9; 32],
    }
}

fn payload(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 + 7) as u8).collect()
}

#[test]
fn a_value_round_trips_to_exactly_its_payload() {
    for n in [0usize, 1, 4096, 262_144] {
        let k = key(3, 0);
        let p = payload(n);
        let v = encode(&k, &p);
        assert_eq!(v.len(), HEADER_BYTES + n);
        assert_eq!(verify(&v, &k, n as u64), Ok(&p[..]));
    }
}

#[test]
fn another_block_salt_generation_shard_or_model_is_a_miss() {
    let k = key(3, 0);
    let v = encode(&k, &payload(4096));
    let mut others = vec![key(4, 0), key(3, 1)];
    let mut shard = k;
    shard.shard = 2;
    let mut model = k;
    model.fingerprint[31] ^= 1;
    let mut hash = k;
    hash.hash[0] ^= 1;
    others.extend([shard, model, hash]);
    for o in others {
        assert_eq!(verify(&v, &o, 4096), Err(Mismatch::OtherKey), "{o:?}");
    }
}

#[test]
fn every_damage_is_a_miss_with_its_reason() {
    let k = key(3, 0);
    let p = payload(8192);
    let v = encode(&k, &p);
    assert_eq!(
        verify(&v, &k, 4096),
        Err(Mismatch::Length {
            stored: 8192,
            expected: 4096
        })
    );
    assert_eq!(verify(&v[..HEADER_BYTES - 1], &k, 8192), Err(Mismatch::Truncated));
    assert_eq!(verify(&v[..v.len() - 1], &k, 8192), Err(Mismatch::PayloadLength));
    let mut longer = v.clone();
    longer.push(0);
    assert_eq!(verify(&longer, &k, 8192), Err(Mismatch::PayloadLength));
    let mut torn = v.clone();
    let last = torn.len() - 1;
    torn[last] ^= 0xff;
    assert_eq!(verify(&torn, &k, 8192), Err(Mismatch::PayloadSum));
    let mut magic = v.clone();
    magic[0] ^= 1;
    assert_eq!(verify(&magic, &k, 8192), Err(Mismatch::Magic));
    let mut version = v.clone();
    version[8] = 2;
    assert_eq!(verify(&version, &k, 8192), Err(Mismatch::Version(2)));
    let mut flags = v.clone();
    flags[10] = 1;
    assert_eq!(verify(&flags, &k, 8192), Err(Mismatch::Header));
    // A header byte changed without fixing its checksum (the key, the length, the sum).
    for at in [16usize, 124, 132] {
        let mut h = v.clone();
        h[at] ^= 1;
        assert_eq!(verify(&h, &k, 8192), Err(Mismatch::HeaderSum), "byte {at}");
    }
}

#[test]
fn store_keys_name_no_fingerprint_or_salt_and_differ_per_block() {
    let a = store_key("okv:", &key(3, 0));
    assert!(a.starts_with("okv:") && a.len() == 4 + 64, "{a}");
    assert!(a[4..].bytes().all(|c| c.is_ascii_hexdigit()));
    assert!(!a.contains("0707"), "the fingerprint does not appear");
    assert_ne!(a, store_key("okv:", &key(4, 0)));
    assert_ne!(a, store_key("okv:", &key(3, 1)));
    assert_eq!(a, store_key("okv:", &key(3, 0)));
}

proptest! {
    /// Whatever the store returns, `verify` never panics, and serves bytes only when the
    /// value is exactly an encoding of the block asked for.
    #[test]
    fn arbitrary_bytes_never_panic_and_only_a_true_encoding_is_served(
        bytes in proptest::collection::vec(any::<u8>(), 0..600),
        len in 0u64..400,
    ) {
        let k = key(3, 0);
        if let Ok(p) = verify(&bytes, &k, len) {
            prop_assert_eq!(encode(&k, p), bytes);
        }
    }

    /// A valid value with one byte changed anywhere is never served.
    #[test]
    fn one_changed_byte_is_never_served(at in 0usize..(HEADER_BYTES + 300), flip in 1u8..=255) {
        let k = key(3, 0);
        let mut v = encode(&k, &payload(300));
        v[at] ^= flip;
        prop_assert!(verify(&v, &k, 300).is_err());
    }
}
