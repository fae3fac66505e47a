//! RAII handles: a [`Lease`] releases its pins when dropped, a [`SaveGuard`]
//! aborts its save unless committed, so "who gives this back" has one answer
//! on every path, errors and panics included.

use orbitkv_proto::ErrorCode;

use crate::{Client, ClientError, LookupHit, PendingSave, SlotStatus};

/// A lookup's pinned hit. Dropping it releases the lease (errors ignored: a
/// broken session releases it on the Manager side anyway); [`Lease::release`]
/// reports them. Copies out of it must have drained before it is released,
/// which the borrow of its slots by the copy calls enforces.
#[derive(Debug)]
pub struct Lease<'c> {
    client: &'c Client,
    hit: LookupHit,
    slots: Option<Vec<(u32, u64)>>,
    released: bool,
}

impl<'c> Lease<'c> {
    pub(crate) fn new(client: &'c Client, hit: LookupHit) -> Lease<'c> {
        let released = hit.lease == 0;
        Lease {
            client,
            hit,
            slots: None,
            released,
        }
    }

    /// The lease id (0 when nothing was hit).
    pub fn id(&self) -> u64 {
        self.hit.lease
    }

    pub fn hit_blocks(&self) -> u32 {
        self.hit.hit_blocks
    }

    /// Indices of the hit blocks read back from SSD (see [`LookupHit::ssd_blocks`]).
    pub fn ssd_blocks(&self) -> &[u32] {
        &self.hit.ssd_blocks
    }

    pub fn generation(&self) -> u64 {
        self.hit.generation
    }

    /// Stage the hit blocks (once) and return `(segment, offset)` per block.
    /// A `RestoreFailed` reply means the Manager retired the lease.
    pub fn acquire(&mut self) -> Result<&[(u32, u64)], ClientError> {
        if self.hit.hit_blocks == 0 {
            return Ok(&[]);
        }
        if self.released {
            return Err(ClientError::Invalid("lease already released".into()));
        }
        if self.slots.is_none() {
            match self.client.acquire(self.hit.lease) {
                Ok(s) => self.slots = Some(s),
                Err(e) => {
                    if matches!(
                        e,
                        ClientError::Server {
                            code: ErrorCode::RestoreFailed,
                            ..
                        }
                    ) {
                        self.released = true;
                    }
                    return Err(e);
                }
            }
        }
        Ok(self.slots.as_deref().unwrap_or(&[]))
    }

    /// Copy hit blocks `[start, start + dst.len())` into `dst` (acquiring
    /// first if needed); each destination is exactly one block.
    pub fn copy_out(
        &mut self,
        block_bytes: u64,
        start: usize,
        dst: &mut [&mut [u8]],
    ) -> Result<u64, ClientError> {
        let client = self.client;
        let slots = self.acquire()?;
        client.copy_out(slots, block_bytes, start, dst)
    }

    /// Release now and report the outcome. Safe after a failed acquire.
    pub fn release(mut self) -> Result<(), ClientError> {
        self.release_inner()
    }

    fn release_inner(&mut self) -> Result<(), ClientError> {
        if std::mem::replace(&mut self.released, true) {
            return Ok(());
        }
        self.client.release(self.hit.lease)
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        // Nothing to report to: the caller chose not to release explicitly.
        let _ = self.release_inner();
    }
}

/// An allocated, still invisible save. Dropping it aborts the save (its slots
/// are freed, nothing becomes visible, contract L4) unless it was committed.
#[derive(Debug)]
pub struct SaveGuard<'c> {
    client: &'c Client,
    pending: PendingSave,
    done: bool,
}

impl<'c> SaveGuard<'c> {
    pub(crate) fn new(client: &'c Client, pending: PendingSave) -> SaveGuard<'c> {
        SaveGuard {
            client,
            pending,
            done: false,
        }
    }

    pub fn id(&self) -> u64 {
        self.pending.id
    }

    /// Per hash: its slot, or why it has none.
    pub fn items(&self) -> &[SlotStatus] {
        &self.pending.items
    }

    /// Make the copied blocks visible; returns how many were committed.
    pub fn commit(mut self) -> Result<u32, ClientError> {
        self.done = true;
        self.client.commit_save(self.pending.id)
    }

    /// Free the slots now and report the outcome.
    pub fn abort(mut self) -> Result<(), ClientError> {
        self.done = true;
        self.client.abort_save(self.pending.id)
    }
}

impl Drop for SaveGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            // Nothing to report to; a broken session frees the slots when it ends.
            let _ = self.client.abort_save(self.pending.id);
        }
    }
}
