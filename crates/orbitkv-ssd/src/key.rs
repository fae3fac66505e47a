//! The block key.

/// Identity of one KV block on the SSD tier. The full key is stored in every on-disk
/// header and compared on every read.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct SsdKey {
    /// Model/config fingerprint.
    pub fingerprint: [u8; 32],
    /// Shard (TP rank, layer group, ...).
    pub shard: u32,
    /// Namespace salt.
    pub salt: [u8; 32],
    /// Generation of the namespace.
    pub generation: u64,
    /// Chained content hash of the block.
    pub hash: [u8; 32],
}

/// Encoded size of a key in headers and journal records.
pub const KEY_BYTES: usize = 32 + 4 + 32 + 8 + 32;

/// Every field, as integers: 14 word writes instead of three length-prefixed
/// byte slices (recovery hashes millions of keys). Consistent with `Eq`.
impl std::hash::Hash for SsdKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        fn words<H: std::hash::Hasher>(b: &[u8; 32], state: &mut H) {
            for w in b.chunks_exact(8) {
                let mut a = [0u8; 8];
                a.copy_from_slice(w);
                state.write_u64(u64::from_le_bytes(a));
            }
        }
        words(&self.hash, state);
        state.write_u64(self.generation);
        state.write_u32(self.shard);
        words(&self.fingerprint, state);
        words(&self.salt, state);
    }
}

impl SsdKey {
    /// Little-endian fixed encoding (fingerprint, shard, salt, generation, hash).
    pub fn encode(&self, out: &mut [u8; KEY_BYTES]) {
        out[0..32].copy_from_slice(&self.fingerprint);
        out[32..36].copy_from_slice(&self.shard.to_le_bytes());
        out[36..68].copy_from_slice(&self.salt);
        out[68..76].copy_from_slice(&self.generation.to_le_bytes());
        out[76..108].copy_from_slice(&self.hash);
    }

    /// Inverse of [`SsdKey::encode`].
    pub fn decode(b: &[u8; KEY_BYTES]) -> SsdKey {
        let mut k = SsdKey {
            fingerprint: [0; 32],
            shard: 0,
            salt: [0; 32],
            generation: 0,
            hash: [0; 32],
        };
        k.fingerprint.copy_from_slice(&b[0..32]);
        k.shard = u32::from_le_bytes([b[32], b[33], b[34], b[35]]);
        k.salt.copy_from_slice(&b[36..68]);
        let mut g = [0u8; 8];
        g.copy_from_slice(&b[68..76]);
        k.generation = u64::from_le_bytes(g);
        k.hash.copy_from_slice(&b[76..108]);
        k
    }
}

impl std::fmt::Debug for SsdKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        fn hex8(b: &[u8; 32]) -> String {
            b[..8].iter().map(|x| format!("{x:02x}")).collect()
        }
        write!(
            f,
            "SsdKey(fp={}.., shard={}, salt={}.., gen={}, hash={}..)",
            hex8(&self.fingerprint),
            self.shard,
            hex8(&self.salt),
            self.generation,
            hex8(&self.hash)
        )
    }
}
