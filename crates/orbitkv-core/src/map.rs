//! The hash map behind every hot table of the core (index, policy, leases, sessions).
//!
//! Keys are mostly client-supplied block digests. std's SipHash cost ~35 ns per
//! key and a 32-block lookup + release hashes each block about four times (index
//! and policy, both ways): SipHash was most of the Manager's lock hold time.
//! foldhash is several times faster and still seeded per process, so a client
//! cannot choose keys that collide.

pub(crate) type Map<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// The hash state of a policy's own random choices (`duel`'s key sample,
/// `tinylfu`'s sketch): seeded by `seed` (the Manager's `--cache-policy-seed`:
/// the same choices in every process and run, for reproducible figures), else
/// random per process, so clients cannot aim keys at it.
pub(crate) fn policy_hash_state(seed: Option<u64>) -> foldhash::fast::SeedableRandomState {
    match seed {
        Some(s) => foldhash::fast::SeedableRandomState::with_seed(s, foldhash::SharedSeed::global_fixed()),
        None => foldhash::fast::SeedableRandomState::random(),
    }
}
