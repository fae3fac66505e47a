//! Pending saves: slots allocated for blocks that are not visible yet.
//! `begin_save` allocates, `commit_save` moves the slots into the index,
//! `abort_save` and [`CacheState::end_save`] (abort, or the end of the owning
//! session) give them back. Calls down into `tiers`, `entries` and `registry`.

use std::collections::HashSet;

use super::entries::{Entry, SlotFree};
use super::jobs::SaveSlot;
use super::{CacheError, CacheState};
use crate::keys::{BlockHash, BlockKey, NsId, SaveId, SessionId};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaveStatus {
    Allocated(SaveSlot),
    /// An equal key is already visible (or appears twice in this request).
    Present,
    /// Admission said no: no space could be made without evicting pinned blocks.
    Refused,
}

#[derive(Debug, Clone)]
pub(super) struct OpenSave {
    pub(super) session: SessionId,
    pub(super) ns: NsId,
    generation: u64,
    items: Vec<(BlockHash, SaveStatus)>,
}

impl OpenSave {
    /// Heap bytes of its item list.
    pub(super) fn item_bytes(&self) -> u64 {
        crate::map::vec_bytes::<(BlockHash, SaveStatus)>(self.items.capacity())
    }

    /// `hash` has a slot in this save, not yet committed (for [`CacheState::explain_miss`]).
    pub(super) fn is_saving(&self, ns: NsId, hash: &BlockHash) -> bool {
        self.ns == ns
            && self
                .items
                .iter()
                .any(|(h, st)| h == hash && matches!(st, SaveStatus::Allocated(_)))
    }

    /// Arena bytes held by this save.
    pub(super) fn bytes(&self) -> u64 {
        self.items
            .iter()
            .map(|(_, st)| match st {
                SaveStatus::Allocated(s) => s.len,
                _ => 0,
            })
            .sum()
    }
}

impl CacheState {
    /// Allocate invisible slots for the blocks of `hashes` that are not yet
    /// visible. Evicts unpinned blocks under pressure; refuses a block when
    /// no space can be made.
    pub fn begin_save(
        &mut self,
        s: SessionId,
        ns: NsId,
        hashes: &[BlockHash],
    ) -> Result<(SaveId, Vec<SaveStatus>), CacheError> {
        self.live_session(s)?;
        let generation = self.generation_of(ns)?;
        let block_bytes = self.block_bytes(ns)?;
        let mut seen = HashSet::new();
        let mut items = Vec::with_capacity(hashes.len());
        for key in BlockKey::chain(ns, generation, hashes) {
            let existing = self.index.get(&key).map(|e| e.doomed);
            let status = if existing == Some(true) {
                // A corrupt or purged copy is still being torn down: not storable yet.
                self.counters.blocks_refused += 1;
                SaveStatus::Refused
            } else if !seen.insert(key.hash) || existing.is_some() {
                self.counters.blocks_present += 1;
                SaveStatus::Present
            } else {
                match self.alloc_or_evict(block_bytes) {
                    Some(slot) => SaveStatus::Allocated(SaveSlot::new(slot)),
                    None => {
                        self.counters.blocks_refused += 1;
                        SaveStatus::Refused
                    }
                }
            };
            items.push((key.hash, status));
        }
        let id = SaveId(self.next());
        let statuses = items.iter().map(|(_, st)| *st).collect();
        self.saves.insert(
            id,
            OpenSave {
                session: s,
                ns,
                generation,
                items,
            },
        );
        if let Some(info) = self.sessions.get_mut(&s) {
            info.saves.insert(id);
        }
        self.counters.saves_begun += 1;
        Ok((id, statuses))
    }

    /// Remove a save owned by live session `s` from both owners.
    fn take_owned_save(&mut self, s: SessionId, id: SaveId) -> Result<OpenSave, CacheError> {
        self.live_session(s)?;
        let save = self.saves.get(&id).ok_or(CacheError::UnknownSave(id))?;
        if save.session != s {
            return Err(CacheError::NotOwner {
                what: "save",
                id: id.0,
            });
        }
        self.live_session(s)?.saves.remove(&id);
        self.saves.remove(&id).ok_or(CacheError::UnknownSave(id))
    }

    /// The namespace of save `id` of session `s` and the hashes of the blocks
    /// it holds slots for (what a commit would make visible), without changing
    /// anything: the Manager's remote tier queues them for writing after the commit.
    pub fn save_blocks(&self, s: SessionId, id: SaveId) -> Result<(NsId, Vec<BlockHash>), CacheError> {
        let save = self.saves.get(&id).ok_or(CacheError::UnknownSave(id))?;
        if save.session != s {
            return Err(CacheError::UnknownSave(id));
        }
        let hashes = save
            .items
            .iter()
            .filter(|(_, st)| matches!(st, SaveStatus::Allocated(_)))
            .map(|(h, _)| *h)
            .collect();
        Ok((save.ns, hashes))
    }

    /// Make a save's blocks visible. Returns the number of blocks committed.
    pub fn commit_save(&mut self, s: SessionId, id: SaveId) -> Result<u32, CacheError> {
        let save = self.take_owned_save(s, id)?;
        let ns_bytes = self.ns(save.ns).ok().map(|n| n.block_bytes);
        let mut visible = Vec::with_capacity(save.items.len());
        let mut keys = Vec::with_capacity(save.items.len());
        let mut committed = 0;
        for (hash, st) in save.items {
            let SaveStatus::Allocated(slot) = st else {
                continue;
            };
            let key = BlockKey {
                ns: save.ns,
                generation: save.generation,
                hash,
            };
            if self.index.contains_key(&key) {
                // Another session committed the same block first.
                self.free_slot(*slot, SlotFree::DuplicateOnCommit);
                continue;
            }
            let block_bytes = ns_bytes.unwrap_or(slot.len);
            let (r, _) = self.index.insert_ref(key, Entry::in_dram(*slot, block_bytes));
            self.note_visibility(key, true, true);
            visible.push((r, slot.len));
            keys.push(key);
        }
        let readmitted = self.policy.get().insert_chain(&visible);
        self.apply_pending_hints(&keys, &visible);
        for (key, again) in keys.into_iter().zip(readmitted) {
            self.note_committed(key, again);
            committed += 1;
        }
        self.counters.blocks_committed += u64::from(committed);
        Ok(committed)
    }

    /// Discard a save: its slots are freed, nothing becomes visible.
    pub fn abort_save(&mut self, s: SessionId, id: SaveId) -> Result<(), CacheError> {
        let save = self.take_owned_save(s, id)?;
        self.free_save_slots(save);
        Ok(())
    }

    /// A save ends with its session (clean close, or proof the process is gone).
    pub(super) fn end_save(&mut self, id: SaveId) {
        if let Some(save) = self.saves.remove(&id) {
            self.free_save_slots(save);
        }
    }

    fn free_save_slots(&mut self, save: OpenSave) {
        for (_, st) in save.items {
            if let SaveStatus::Allocated(slot) = st {
                self.free_slot(*slot, SlotFree::SaveAborted);
            }
        }
    }
}
