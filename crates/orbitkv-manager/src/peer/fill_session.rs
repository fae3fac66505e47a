//! The reader side of one transfer: the Manager-internal session whose save
//! the blocks land in, reading them into its slots, checking them against the
//! source's checksums and committing.

use orbitkv_core::{BlockHash, NsId, SaveId, SaveStatus};
use orbitkv_proto::peer::{PeerResponse, decode_peer_response};
use orbitkv_proto::read_frame;

use super::transport::Conn;
use super::{PeerError, Piece, checksums_alongside};
use crate::parts::Arena;
use crate::tier::InternalSession;

/// The Manager-internal session that owns the save a fill writes into
/// (ended, its save aborted if not committed, when dropped).
pub(super) struct FillSession<'a> {
    session: InternalSession<'a>,
}

impl<'a> FillSession<'a> {
    pub(super) fn open(arena: Arena<'a>) -> Self {
        FillSession {
            session: InternalSession::open(arena),
        }
    }

    /// Receive `hashes.len()` blocks into fresh save slots and check them
    /// against the source's checksums (taken on a helper thread with `ahead`):
    /// the blocks are in and every checksum matched the source's, but nothing
    /// is visible until [`FillSession::commit`] (dropping this session aborts
    /// the save).
    pub(super) fn receive_verified(
        &mut self,
        conn: &mut Conn,
        ns: NsId,
        hashes: &[BlockHash],
        block_bytes: u64,
        ahead: bool,
    ) -> Result<SaveId, PeerError> {
        let (save, items) = self
            .session
            .arena
            .cache
            .write()
            .begin_save(self.session.id, ns, hashes)
            .map_err(|e| PeerError::Protocol(format!("no room for peer blocks: {e}")))?;
        let len = block_bytes as usize;
        let segments = self.session.arena.segments;
        let sums = checksums_alongside(
            ahead,
            |sink| read_blocks(conn, segments, &items, len, !ahead, sink),
            || PeerError::Protocol("the checksum thread panicked".into()),
        )?;
        let (h, body) = read_frame(conn)?;
        let checksums =
            match decode_peer_response(h.kind, &body).map_err(|e| PeerError::Protocol(e.to_string()))? {
                PeerResponse::Sent { checksums } => checksums,
                other => {
                    return Err(PeerError::Protocol(format!(
                        "expected Sent, got {:#06x}",
                        other.kind()
                    )));
                }
            };
        if checksums != sums {
            let _ = self.session.arena.cache.write().abort_save(self.session.id, save);
            return Err(PeerError::Protocol(
                "block checksums differ from the source's; nothing stored".into(),
            ));
        }
        Ok(save)
    }

    /// Make a verified save's blocks visible; the blocks committed.
    pub(super) fn commit(&mut self, save: SaveId) -> Result<usize, PeerError> {
        let committed = self
            .session
            .arena
            .cache
            .write()
            .commit_save(self.session.id, save)
            .map_err(|e| PeerError::Protocol(e.to_string()))?;
        Ok(committed as usize)
    }
}

/// Read the blocks of a fill in order, each into its save slot (or past it),
/// handing each to `sink` as soon as it is in.
fn read_blocks<'a>(
    conn: &mut Conn,
    segments: &'a [orbitkv_shm::Segment],
    items: &[SaveStatus],
    len: usize,
    hash_inline: bool,
    sink: &mut dyn FnMut(Piece<'a>),
) -> Result<(), PeerError> {
    let mut scratch: Vec<u8> = Vec::new();
    for st in items {
        match st {
            SaveStatus::Allocated(slot) if hash_inline => {
                let (_, sum) = crate::tier::recv_into_save_slot_hashed(segments, slot, len, conn)?;
                sink(Piece::Sum(sum));
            }
            SaveStatus::Allocated(slot) => {
                sink(Piece::Bytes(crate::tier::recv_into_save_slot(
                    segments, slot, len, conn,
                )?));
            }
            // Already here (or refused for room): read past the bytes.
            SaveStatus::Present | SaveStatus::Refused => {
                scratch.resize(len, 0);
                std::io::Read::read_exact(conn, &mut scratch)?;
                sink(Piece::Sum(crate::checksum::xxh3_64(&scratch)));
            }
        }
    }
    Ok(())
}
