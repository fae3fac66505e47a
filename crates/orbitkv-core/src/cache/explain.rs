//! Why a block is not served: the diagnosis behind `orbitkv trace`. Read-only
//! (the shared lock suffices), never on a lookup's own path: the Manager asks
//! only while a trace is armed.

use crate::keys::{BlockHash, BlockKey, NsId, SessionId};

use super::{CacheError, CacheState};

/// Why a lookup in a namespace stopped at a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissReason {
    /// Visible now (saved or filled since the lookup answered).
    VisibleNow,
    /// Indexed but doomed (a generation reset or an SSD drop): invisible to
    /// lookups, freed once its pins end.
    Doomed,
    /// Allocated by an open save of session `.0`, not committed yet.
    BeingSaved(SessionId),
    /// Indexed in another namespace of the same fingerprint and shard with a
    /// different salt (another tenant's or request's salt).
    OtherSalt,
    /// Not indexed in this generation: never saved here, evicted, or saved
    /// before the fingerprint's last generation reset (which purges its blocks;
    /// the caller reports the generation).
    Absent,
}

impl MissReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            MissReason::VisibleNow => "visible now",
            MissReason::Doomed => "doomed",
            MissReason::BeingSaved(_) => "being saved",
            MissReason::OtherSalt => "other salt",
            MissReason::Absent => "absent",
        }
    }
}

impl CacheState {
    /// Why `hash` is not served in `ns` now (see [`MissReason`], checked in
    /// that order).
    pub fn explain_miss(&self, ns: NsId, hash: &BlockHash) -> Result<MissReason, CacheError> {
        let info = self.ns(ns)?;
        let generation = self.generation_of(ns)?;
        let key = BlockKey {
            ns,
            generation,
            hash: *hash,
        };
        if let Some(e) = self.index.get(&key) {
            return Ok(if e.doomed {
                MissReason::Doomed
            } else {
                MissReason::VisibleNow
            });
        }
        if let Some(save) = self.saves.values().find(|o| o.is_saving(ns, hash)) {
            return Ok(MissReason::BeingSaved(save.session));
        }
        let salted = self.namespaces.iter().any(|(&other, o)| {
            other != ns
                && o.key.fingerprint == info.key.fingerprint
                && o.key.shard == info.key.shard
                && o.key.salt != info.key.salt
                && self
                    .index
                    .get(&BlockKey {
                        ns: other,
                        generation,
                        hash: *hash,
                    })
                    .is_some_and(|e| !e.doomed)
        });
        Ok(if salted {
            MissReason::OtherSalt
        } else {
            MissReason::Absent
        })
    }

    /// The namespace identity of `ns` (for diagnostics).
    pub fn namespace_key(&self, ns: NsId) -> Result<crate::keys::NamespaceKey, CacheError> {
        Ok(self.ns(ns)?.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{Fingerprint, NamespaceKey};

    fn key(salt: u8) -> NamespaceKey {
        NamespaceKey {
            fingerprint: Fingerprint([7; 32]),
            shard: 0,
            salt: [salt; 32],
        }
    }

    #[test]
    fn each_reason_in_order() {
        let mut c = CacheState::new(&[1 << 20]);
        let s = c.open_session();
        let (ns, _) = c.register_namespace(key(0), 4096).expect("ns");
        let (salted, _) = c.register_namespace(key(1), 4096).expect("salted ns");
        let h = |i: u8| [i; 32];
        assert_eq!(c.explain_miss(ns, &h(1)).expect("explain"), MissReason::Absent);

        let (save, _) = c.begin_save(s, ns, &[h(1)]).expect("begin");
        assert_eq!(
            c.explain_miss(ns, &h(1)).expect("explain"),
            MissReason::BeingSaved(s)
        );
        c.commit_save(s, save).expect("commit");
        assert_eq!(
            c.explain_miss(ns, &h(1)).expect("explain"),
            MissReason::VisibleNow
        );

        let (other, _) = c.begin_save(s, salted, &[h(2)]).expect("begin");
        c.commit_save(s, other).expect("commit");
        assert_eq!(c.explain_miss(ns, &h(2)).expect("explain"), MissReason::OtherSalt);
        assert_eq!(
            c.explain_miss(salted, &h(2)).expect("explain"),
            MissReason::VisibleNow
        );

        assert_eq!(c.bump_generation(ns).expect("reset"), 1);
        assert_eq!(c.explain_miss(ns, &h(1)).expect("explain"), MissReason::Absent);
        assert!(c.explain_miss(NsId(999), &h(1)).is_err());
    }
}
