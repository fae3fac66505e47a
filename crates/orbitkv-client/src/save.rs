//! Save bookkeeping: [`PendingSave`] and its per-block [`SlotStatus`],
//! `begin_save` / `commit_save` / `abort_save`, and `start_save`, a pending
//! save held by a [`SaveGuard`] (aborted unless committed).

use orbitkv_proto::{Request, Response, SaveItem};

use crate::{Client, ClientError, Hash, Namespace, SaveGuard, check_count};

/// Outcome of one block of a save.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotStatus {
    Allocated { segment: u32, offset: u64 },
    Present,
    Refused,
}

#[derive(Debug, Clone)]
pub struct PendingSave {
    pub id: u64,
    pub items: Vec<SlotStatus>,
}

impl Client {
    pub fn begin_save(&self, ns: &Namespace, hashes: &[Hash]) -> Result<PendingSave, ClientError> {
        check_count(hashes.len())?;
        match self.call(&Request::BeginSave {
            ns: ns.id,
            hashes: hashes.to_vec(),
        })? {
            Response::SaveBegun { save, items } => {
                if items.len() != hashes.len() {
                    return Err(ClientError::Protocol("save reply length mismatch".into()));
                }
                Ok(PendingSave {
                    id: save,
                    items: items
                        .into_iter()
                        .map(|i| match i {
                            SaveItem::Allocated { segment, offset } => {
                                SlotStatus::Allocated { segment, offset }
                            }
                            SaveItem::Present => SlotStatus::Present,
                            SaveItem::Refused => SlotStatus::Refused,
                        })
                        .collect(),
                })
            }
            r => Err(Self::unexpected(r)),
        }
    }

    pub fn commit_save(&self, save: u64) -> Result<u32, ClientError> {
        match self.call(&Request::CommitSave { save })? {
            Response::Committed { blocks } => Ok(blocks),
            r => Err(Self::unexpected(r)),
        }
    }

    pub fn abort_save(&self, save: u64) -> Result<(), ClientError> {
        self.call_ok(&Request::AbortSave { save })
    }

    /// [`Client::begin_save`] as a guard that aborts the save when dropped
    /// uncommitted.
    pub fn start_save(&self, ns: &Namespace, hashes: &[Hash]) -> Result<SaveGuard<'_>, ClientError> {
        let pending = self.begin_save(ns, hashes)?;
        Ok(SaveGuard::new(self, pending))
    }
}
