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

/// Approximate heap bytes of a hash table (std's SwissTable) with room for
/// `capacity` items of `(K, V)`: its buckets (`capacity` is 7/8 of them once
/// past 8) of one pair and one control byte each, plus a group of control bytes.
pub(crate) fn table_bytes<K, V>(capacity: usize) -> u64 {
    if capacity == 0 {
        return 0;
    }
    let buckets = if capacity < 8 {
        capacity + 1
    } else {
        capacity / 7 * 8
    };
    (buckets * (std::mem::size_of::<(K, V)>() + 1) + 16) as u64
}

/// Heap bytes of a `Vec` or `VecDeque` with room for `capacity` items of `T`.
pub(crate) fn vec_bytes<T>(capacity: usize) -> u64 {
    (capacity * std::mem::size_of::<T>()) as u64
}

/// Approximate heap bytes of a `BTreeMap`/`BTreeSet` of `len` items of `T`:
/// leaves of 11 items about 2/3 full, plus node headers.
pub(crate) fn btree_bytes<T>(len: usize) -> u64 {
    (len * std::mem::size_of::<T>() * 3 / 2 + len.div_ceil(7) * 16) as u64
}
