//! Adoption (see `tiers.rs`): blocks recovered from disk at start stay
//! *dormant* until their namespace registers, then become visible SSD-only
//! blocks (current generation and registered block size only; the rest is
//! queued for deletion).

use super::CacheState;
use super::entries::Entry;
use crate::keys::{BlockKey, NsId, TierKey};

impl CacheState {
    /// Blocks found on disk at start. They stay dormant until their namespace
    /// registers; generations only move forward.
    pub fn adopt_recovered(&mut self, items: impl IntoIterator<Item = (TierKey, u64)>) {
        for (tk, len) in items {
            self.restore_generation(tk.ns.fingerprint, tk.generation);
            self.tier
                .dormant
                .entry(tk.ns)
                .or_default()
                .push((tk.generation, tk.hash, len));
        }
        let registered: Vec<NsId> = self.namespaces.keys().copied().collect();
        for ns in registered {
            self.adopt_dormant(ns);
        }
    }

    /// Make dormant blocks of `ns` visible: only the current generation and
    /// the registered block size qualify; the rest is queued for deletion.
    pub(super) fn adopt_dormant(&mut self, ns: NsId) {
        let Some(info) = self.namespaces.get(&ns).cloned() else {
            return;
        };
        let Some(items) = self.tier.dormant.remove(&info.key) else {
            return;
        };
        let current = self.generations.get(&info.key.fingerprint).copied().unwrap_or(0);
        for (generation, hash, len) in items {
            let key = BlockKey { ns, generation, hash };
            let tk = TierKey {
                ns: info.key,
                generation,
                hash,
            };
            if generation == current && len == info.block_bytes && !self.index.contains_key(&key) {
                let (r, _) = self.index.insert_ref(key, Entry::on_ssd_only(len));
                self.note_visibility(key, true, false);
                self.policy.get().tiers_insert(r, len);
                self.tier.ssd_used += len;
                self.counters.ssd_adopted_blocks += 1;
            } else {
                self.tier.removals.push(tk);
                self.counters.ssd_rejected_blocks += 1;
            }
        }
    }

    pub(super) fn forget_dormant(&mut self, tk: &TierKey) {
        if let Some(v) = self.tier.dormant.get_mut(&tk.ns) {
            v.retain(|(g, h, _)| !(*g == tk.generation && *h == tk.hash));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::tiers::tests::h;
    use crate::keys::{Fingerprint, NamespaceKey};

    #[test]
    fn recovered_blocks_adopt_only_matching_namespace_generation_and_size() {
        let mut c = CacheState::new(&[4 * 4096]);
        let key = NamespaceKey {
            fingerprint: Fingerprint([1; 32]),
            shard: 0,
            salt: [0; 32],
        };
        c.restore_generation(key.fingerprint, 2);
        c.adopt_recovered([
            (
                TierKey {
                    ns: key,
                    generation: 2,
                    hash: h(1),
                },
                4096,
            ),
            (
                TierKey {
                    ns: key,
                    generation: 1,
                    hash: h(2),
                },
                4096,
            ), // stale generation
            (
                TierKey {
                    ns: key,
                    generation: 2,
                    hash: h(3),
                },
                8192,
            ), // other block size
        ]);
        assert_eq!(c.gauges().dormant_ssd_blocks, 3);
        let (ns, generation) = c.register_namespace(key, 4096).expect("ns");
        assert_eq!(generation, 2);
        assert!(c.is_visible(ns, &h(1)));
        assert!(!c.is_visible(ns, &h(2)) && !c.is_visible(ns, &h(3)));
        assert_eq!(c.take_ssd_removals().len(), 2);
        assert_eq!(
            (c.counters().ssd_adopted_blocks, c.counters().ssd_rejected_blocks),
            (1, 2)
        );
        c.check_invariants().expect("invariants");
    }
}
