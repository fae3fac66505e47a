//! Synthetic block chains for the in-process benches: fixed-size hashes, the
//! same hashing cost per lookup as real ones, distinct for distinct blocks.

/// The hashes of blocks `0..len` of chain `chain`: the chain number in bytes
/// 0..8 and the block's position in bytes 8..16 (little-endian), the rest zero,
/// so distinct (chain, position) pairs give distinct hashes.
pub fn synthetic_chain(chain: u64, len: u64) -> Vec<[u8; 32]> {
    (0..len)
        .map(|pos| {
            let mut h = [0u8; 32];
            h[..8].copy_from_slice(&chain.to_le_bytes());
            h[8..16].copy_from_slice(&pos.to_le_bytes());
            h
        })
        .collect()
}

// Its test is in lookup_threads.rs (one of the benches that include this file), so it
// runs once rather than once per bench.
