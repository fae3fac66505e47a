//! Identity types: what makes two cached blocks interchangeable (contract K1).

use std::fmt;

/// Every block hash is exactly this many bytes (vLLM `sha256_cbor` digests,
/// or OrbitKV-derived chain hashes of the same width).
pub const HASH_BYTES: usize = 32;

/// A portable block hash (contract K2: deterministic across processes).
pub type BlockHash = [u8; HASH_BYTES];

/// Model artifacts + computation settings, hashed by the adapter.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub [u8; 32]);

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0[..6] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("…")
    }
}

/// Everything that must match for two engines to share bytes: the deployment
/// fingerprint, the shard (TP/PP rank position) and the tenant salt domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NamespaceKey {
    pub fingerprint: Fingerprint,
    pub shard: u32,
    /// Salt domain; all zeros for "no salt".
    pub salt: [u8; 32],
}

/// Manager-local handle of a registered namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NsId(pub u32);

/// A cache key (contract K1): namespace, generation, block hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockKey {
    pub ns: NsId,
    pub generation: u64,
    pub hash: BlockHash,
}

impl BlockKey {
    /// The keys of `hashes` (a chain, in order) in namespace `ns` at `generation`.
    pub fn chain(ns: NsId, generation: u64, hashes: &[BlockHash]) -> impl Iterator<Item = BlockKey> + '_ {
        hashes.iter().map(move |&hash| BlockKey { ns, generation, hash })
    }
}

/// A block's identity outside this process (on disk): the namespace identity
/// instead of the Manager-local [`NsId`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TierKey {
    pub ns: NamespaceKey,
    pub generation: u64,
    pub hash: BlockHash,
}

/// Where a block's bytes live in the shared DRAM arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Slot {
    pub segment: u32,
    pub offset: u64,
    /// Allocated length (block bytes rounded up to the arena alignment).
    pub len: u64,
}

/// Session identity (one client connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u64);

/// Lease identity (pins a lookup's hit blocks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(pub u64);

/// Pending save identity (allocated slots, invisible until commit).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SaveId(pub u64);
