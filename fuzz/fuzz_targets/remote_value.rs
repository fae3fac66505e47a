//! What a Manager reads from the remote store (any writer may have put any bytes there):
//! `verify` never panics, and serves a payload only for an exact encoding of the block.
#![no_main]
use libfuzzer_sys::fuzz_target;
use orbitkv_remote::value::{encode, verify};
use orbitkv_ssd::SsdKey;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let want = SsdKey {
        fingerprint: [data[0]; 32],
        shard: 0,
        salt: [0; 32],
        generation: u64::from(data[1]),
        hash: [1; 32],
    };
    let block_bytes = (data.len() as u64).saturating_sub(162);
    if let Ok(payload) = verify(&data[2..], &want, block_bytes) {
        assert_eq!(encode(&want, payload), &data[2..]);
    }
});
