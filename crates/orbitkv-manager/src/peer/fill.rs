//! A fill on a local miss: the peers to ask, one at a time unless several are
//! probed at once (`probe.rs`) or one fetch is split (`split.rs`); one peer's
//! `Fetch`, its `Leased` answer, the blocks received and the `Done` report; and
//! each fetch recorded in the peer's health.

use std::io::Write;
use std::time::{Duration, Instant};

use orbitkv_core::{BlockHash, NsId};
use orbitkv_proto::peer::{BlockQuery, PeerRequest, PeerResponse, decode_peer_response};
use orbitkv_proto::{read_frame, write_frame};

use super::fill_session::FillSession;
use super::transport::Conn;
use super::{DOWN_BACKOFF, PeerError, PeerTier};
use crate::parts::Arena;

/// What a fill asks a peer for: the blocks of `hashes` in namespace `ns`, each
/// of `block_bytes`.
#[derive(Clone, Copy)]
pub(super) struct Want<'h> {
    pub(super) ns: NsId,
    pub(super) hashes: &'h [BlockHash],
    pub(super) block_bytes: u64,
}

impl<'h> Want<'h> {
    /// The same ask, for `hashes` instead (a range of the original).
    pub(super) fn of(self, hashes: &'h [BlockHash]) -> Want<'h> {
        Want { hashes, ..self }
    }
}

impl PeerTier {
    /// Fill the blocks of `hashes` (the missing suffix of a lookup in `ns`)
    /// from peers into this Manager's DRAM. Returns how many leading blocks a
    /// peer delivered and this Manager stored (visible now). Never returns bytes
    /// that failed their checks; any failure is a miss.
    pub fn fill(&self, arena: Arena<'_>, ns: NsId, hashes: &[BlockHash]) -> usize {
        let Some(first) = hashes.first() else {
            return 0;
        };
        let Some((key, generation, block_bytes)) = crate::tier::tier_namespace(arena, ns, first) else {
            return 0;
        };
        let query = BlockQuery {
            fingerprint: key.fingerprint.0,
            shard: key.shard,
            salt: key.salt,
            block_bytes,
            generation,
            hashes: hashes.to_vec(),
        };
        let req = PeerRequest::Fetch(query.clone());
        let candidates = self.candidates(first);
        let want = Want {
            ns,
            hashes,
            block_bytes,
        };
        if candidates.len() > 1 && self.settings.fill_parallel > 1 {
            let probe = PeerRequest::Probe(query);
            return self.fill_parallel(arena, (&probe, &req), want, candidates);
        }
        for addr in candidates {
            let t0 = Instant::now();
            let got = self.fetch_from(arena, &addr, &req, want);
            let n = self.note_fetch(&addr, got, t0, block_bytes);
            if n > 0 {
                return n;
            }
        }
        0
    }

    /// Record one fetch from `addr` in its health; the blocks stored (0 on error).
    pub(super) fn note_fetch(
        &self,
        addr: &str,
        got: Result<usize, PeerError>,
        t0: Instant,
        block_bytes: u64,
    ) -> usize {
        match got {
            Ok(n) => {
                let us = t0.elapsed().as_micros() as u64;
                self.record(addr, |h| {
                    h.fetches += 1;
                    h.latency_us += us;
                    h.down_until = None;
                    if n > 0 {
                        h.hit_fetches += 1;
                        h.blocks += n as u64;
                        h.bytes += n as u64 * block_bytes;
                    }
                });
                n
            }
            Err(e) => {
                warn_sampled!(
                    self.peers().get(addr).map_or(1, |h| h.errors + 1),
                    "peer {addr}: fetch failed: {e}; treated as a miss, peer skipped for {DOWN_BACKOFF:?}"
                );
                self.record(addr, |h| {
                    h.fetches += 1;
                    h.errors += 1;
                    h.last_error = Some(e.to_string());
                    h.down_until = Some(Instant::now() + DOWN_BACKOFF);
                });
                0
            }
        }
    }

    /// Send a `Fetch` or `Probe` to `addr` and read its `Leased` answer,
    /// checked against what was asked. A pooled connection that fails before
    /// any reply is retried once on a fresh connection (the source may have
    /// closed it).
    pub(super) fn open_leased(
        &self,
        addr: &str,
        kind: u16,
        body: &[u8],
        asked: usize,
        block_bytes: u64,
    ) -> Result<(Conn, (u64, u32, u64)), PeerError> {
        let (conn, leased) = match self.take_conn(addr) {
            Some(mut c) => match send_and_read_leased(&mut c, kind, body, self.settings.timeout) {
                Ok(l) => (c, l),
                Err(_) => {
                    let mut c = self.connect(addr)?;
                    let l = send_and_read_leased(&mut c, kind, body, self.settings.timeout)?;
                    (c, l)
                }
            },
            None => {
                let mut c = self.connect(addr)?;
                let l = send_and_read_leased(&mut c, kind, body, self.settings.timeout)?;
                (c, l)
            }
        };
        check_leased(conn, leased, asked, block_bytes)
    }

    /// One fetch from one peer: on one connection, or split over several
    /// when large ([`PeerTier::fetch_split`]).
    fn fetch_from(
        &self,
        arena: Arena<'_>,
        addr: &str,
        req: &PeerRequest,
        want: Want<'_>,
    ) -> Result<usize, PeerError> {
        let (n, block_bytes) = (want.hashes.len(), want.block_bytes);
        let streams = self.streams_for(n, block_bytes as usize);
        if streams > 1 && matches!(req, PeerRequest::Fetch(_)) {
            return self.fetch_split(arena, addr, req, want, streams);
        }
        let (conn, leased) = self.open_leased(addr, req.kind(), &req.encode(), n, block_bytes)?;
        self.receive_leased(arena, addr, conn, leased, want)
    }

    /// Read the blocks a `Leased` announced into our arena, report `Done`.
    pub(super) fn receive_leased(
        &self,
        arena: Arena<'_>,
        addr: &str,
        mut conn: Conn,
        leased: (u64, u32, u64),
        want: Want<'_>,
    ) -> Result<usize, PeerError> {
        let (ns, hashes, block_bytes) = (want.ns, want.hashes, want.block_bytes);
        let (lease, blocks, got_bytes) = leased;
        if blocks == 0 {
            self.put_conn(addr, conn);
            return Ok(0);
        }
        if blocks as usize > hashes.len() || got_bytes != block_bytes {
            conn.close();
            return Err(PeerError::Protocol(format!(
                "peer offered {blocks} block(s) of {got_bytes} bytes for {} of {block_bytes}",
                hashes.len()
            )));
        }
        let n = blocks as usize;
        let stored = {
            let mut reader = FillSession::open(arena);
            let ahead = self.hash_ahead(n, block_bytes as usize);
            let received = reader.receive_verified(&mut conn, ns, &hashes[..n], block_bytes, ahead);
            match received.and_then(|save| reader.commit(save)) {
                Ok(stored) => stored,
                Err(e) => {
                    conn.close();
                    return Err(e);
                }
            }
        };
        let done = PeerRequest::Done { lease, stored: true };
        write_frame(&mut conn, done.kind(), 0, &done.encode())?;
        conn.flush()?;
        self.put_conn(addr, conn);
        Ok(stored)
    }
}

/// Send a Fetch and read the `Leased` answer: (lease, blocks, block_bytes).
pub(super) fn send_and_read_leased(
    conn: &mut Conn,
    kind: u16,
    body: &[u8],
    timeout: Duration,
) -> Result<(u64, u32, u64), PeerError> {
    send_request(conn, kind, body, timeout)?;
    read_leased(conn)
}

pub(super) fn send_request(
    conn: &mut Conn,
    kind: u16,
    body: &[u8],
    timeout: Duration,
) -> Result<(), PeerError> {
    conn.set_timeouts(Some(timeout))?;
    write_frame(conn, kind, 0, body)?;
    conn.flush()?;
    Ok(())
}

/// Read a `Leased` answer: (lease, blocks, block_bytes).
pub(super) fn read_leased(conn: &mut Conn) -> Result<(u64, u32, u64), PeerError> {
    let (h, body) = read_frame(conn)?;
    match decode_peer_response(h.kind, &body).map_err(|e| PeerError::Protocol(e.to_string()))? {
        PeerResponse::Leased {
            lease,
            blocks,
            block_bytes,
        } => Ok((lease, blocks, block_bytes)),
        PeerResponse::Error { message } => Err(PeerError::Protocol(format!("peer refused: {message}"))),
        other => Err(PeerError::Protocol(format!(
            "expected Leased, got {:?}",
            other.kind()
        ))),
    }
}

/// A `Leased` answer must not offer more blocks than asked, nor another size.
pub(super) fn check_leased(
    conn: Conn,
    leased: (u64, u32, u64),
    asked: usize,
    block_bytes: u64,
) -> Result<(Conn, (u64, u32, u64)), PeerError> {
    let (_, blocks, got_bytes) = leased;
    if blocks > 0 && (blocks as usize > asked || got_bytes != block_bytes) {
        conn.close();
        return Err(PeerError::Protocol(format!(
            "peer offered {blocks} block(s) of {got_bytes} bytes for {asked} of {block_bytes}"
        )));
    }
    Ok((conn, leased))
}
