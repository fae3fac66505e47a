//! One peer's fetch split over several connections: a contiguous range of
//! blocks, a source lease and a save each, received in parallel and committed
//! together once every range arrived and matched.

use std::io::Write;

use orbitkv_core::{BlockHash, SaveId};
use orbitkv_proto::peer::PeerRequest;
use orbitkv_proto::write_frame;

use super::fill::Want;
use super::fill_session::FillSession;
use super::transport::Conn;
use super::{PeerError, PeerTier};
use crate::parts::Arena;

/// A split fetch gives each connection at least this many bytes.
const SPLIT_MIN_BYTES: usize = 8 << 20;

impl PeerTier {
    /// How many connections a fetch of `blocks` blocks of `len` bytes is split
    /// over: `--peer-fill-streams`, at most one per [`SPLIT_MIN_BYTES`].
    pub(crate) fn streams_for(&self, blocks: usize, len: usize) -> usize {
        let per = len.saturating_mul(blocks) / SPLIT_MIN_BYTES;
        self.settings.fill_streams.min(per).min(blocks).max(1)
    }

    /// A fetch from `addr`, split over several connections when large
    /// ([`PeerTier::streams_for`]): each asks for a contiguous range of
    /// `hashes` (a source lease of its own), receives and verifies it on its
    /// own thread; only when every range arrived and matched its checksums are
    /// the saves committed, the leading ranges up to the first the source held
    /// only in part. The other ranges are asked only once the source has
    /// leased all of the first. Any failure stores nothing and closes every
    /// connection (each source lease ends with it).
    pub(super) fn fetch_split(
        &self,
        arena: Arena<'_>,
        addr: &str,
        req: &PeerRequest,
        want: Want<'_>,
        streams: usize,
    ) -> Result<usize, PeerError> {
        let (ns, hashes, block_bytes) = (want.ns, want.hashes, want.block_bytes);
        let ranges: Vec<&[BlockHash]> = hashes.chunks(hashes.len().div_ceil(streams)).collect();
        let open = |range: &[BlockHash]| -> Result<(Conn, u64, usize), PeerError> {
            // `req` with only this range's hashes.
            let mut req = req.clone();
            if let PeerRequest::Fetch(q) = &mut req {
                q.hashes = range.to_vec();
            }
            let (conn, (lease, blocks, _)) =
                self.open_leased(addr, req.kind(), &req.encode(), range.len(), block_bytes)?;
            Ok((conn, lease, blocks as usize))
        };
        let receive = |range: &[BlockHash], opened: (Conn, u64, usize)| -> Result<Part<'_>, PeerError> {
            let (mut conn, lease, blocks) = opened;
            if blocks == 0 {
                return Ok(Part {
                    conn,
                    lease,
                    blocks,
                    save: None,
                });
            }
            let mut fill = FillSession::open(arena);
            let ahead = self.hash_ahead(blocks, block_bytes as usize);
            match fill.receive_verified(&mut conn, ns, &range[..blocks], block_bytes, ahead) {
                Ok(save) => Ok(Part {
                    conn,
                    lease,
                    blocks,
                    save: Some((fill, save)),
                }),
                Err(e) => {
                    conn.close();
                    Err(e)
                }
            }
        };
        // The first range is asked first: a source without all of it gets no
        // other request (no bytes moved that could not be a prefix).
        let first = open(ranges[0])?;
        if first.2 < ranges[0].len() {
            let (conn, lease, blocks) = first;
            return self.receive_leased(
                arena,
                addr,
                conn,
                (lease, blocks as u32, block_bytes),
                want.of(ranges[0]),
            );
        }
        let parts: Vec<Result<Part<'_>, PeerError>> = std::thread::scope(|scope| {
            let others: Vec<_> = ranges[1..]
                .iter()
                .map(|r| {
                    std::thread::Builder::new()
                        .name("orbitkv-peer-fill".into())
                        .spawn_scoped(scope, || open(r).and_then(|o| receive(r, o)))
                })
                .collect();
            let mut parts = vec![receive(ranges[0], first)];
            for t in others {
                parts.push(match t {
                    Ok(t) => t
                        .join()
                        .unwrap_or_else(|_| Err(PeerError::Protocol("a fill thread panicked".into()))),
                    Err(e) => Err(PeerError::Io(e)),
                });
            }
            parts
        });
        if parts.iter().any(Result::is_err) {
            let mut first = None;
            for p in parts {
                match p {
                    // Closing ends its source lease; dropping its session aborts its save.
                    Ok(p) => p.conn.close(),
                    Err(e) => {
                        first.get_or_insert(e);
                    }
                }
            }
            return Err(first.unwrap_or_else(|| PeerError::Protocol("a fill range failed".into())));
        }
        let mut stored = 0;
        let mut leading = true;
        for (range, p) in ranges.iter().zip(parts.into_iter().flatten()) {
            let Part {
                mut conn,
                lease,
                blocks,
                save,
            } = p;
            let Some((mut fill, save)) = save else {
                leading = false;
                self.put_conn(addr, conn);
                continue;
            };
            // Ranges after one the source held only in part are not a prefix: dropped.
            let keep = leading;
            if keep {
                stored += fill.commit(save)?;
            }
            drop(fill);
            leading &= blocks == range.len();
            let done = PeerRequest::Done { lease, stored: keep };
            write_frame(&mut conn, done.kind(), 0, &done.encode())?;
            conn.flush()?;
            self.put_conn(addr, conn);
        }
        Ok(stored)
    }
}

/// One connection's part of a split fetch, received and verified, not yet
/// committed: its connection, the source lease, the blocks offered, and the
/// save holding them (none for a miss).
struct Part<'a> {
    conn: Conn,
    lease: u64,
    blocks: usize,
    save: Option<(FillSession<'a>, SaveId)>,
}
