//! A fill from several peers at once: every candidate probed (at most
//! `--peer-fill-parallel` in flight), the longest hit told to send (or fetched
//! split), every other hit released.

use std::io::Write;
use std::time::Instant;

use orbitkv_proto::peer::PeerRequest;
use orbitkv_proto::{FrameError, write_frame};

use super::fill::{Want, check_leased, read_leased, send_and_read_leased, send_request};
use super::transport::Conn;
use super::{PeerError, PeerTier, tp};
use crate::parts::Arena;

impl PeerTier {
    /// Probe every candidate at once (bounded), fetch from the longest hit,
    /// release the other hits. See the module comment.
    /// `asks`: the `Probe` and the `Fetch` of the same blocks (a winner big
    /// enough to split is fetched over several connections, [`Go::Split`]).
    pub(super) fn fill_parallel(
        &self,
        arena: Arena<'_>,
        asks: (&PeerRequest, &PeerRequest),
        want: Want<'_>,
        candidates: Vec<String>,
    ) -> usize {
        let (hashes, block_bytes) = (want.hashes, want.block_bytes);
        let (probe, fetch) = asks;
        let t0 = Instant::now();
        let (kind, body) = (probe.kind(), probe.encode());
        let timeout = self.settings.timeout;
        let asked = hashes.len();
        // How the winner of `blocks` blocks delivers: told to `Send` on its
        // probe's connection, or, when large, fetched split over several.
        let go = |conn: &mut Conn, lease: u64, blocks: u32| -> Go {
            let streams = self.streams_for(blocks as usize, block_bytes as usize);
            if streams > 1 {
                return Go::Split {
                    lease,
                    blocks,
                    streams,
                };
            }
            let send = PeerRequest::Send { lease };
            Go::Sent(send_request(conn, send.kind(), &send.encode(), timeout))
        };
        // In flight at once without a thread each: write a wave's probes, then
        // read their answers (every peer works on its probe meanwhile).
        let mut answers = Vec::with_capacity(candidates.len());
        let mut early: Option<(usize, Go)> = None;
        // Probes whose answers are read after the early winner's bytes.
        let mut pending: Vec<(String, Sent)> = Vec::new();
        for wave in candidates.chunks(self.settings.fill_parallel) {
            let sent: Vec<(&String, Sent)> = wave
                .iter()
                .map(|addr| {
                    let fresh = || -> Result<(Conn, bool), PeerError> {
                        let mut c = self.connect(addr)?;
                        send_request(&mut c, kind, &body, timeout)?;
                        Ok((c, false))
                    };
                    let r = match self.take_conn(addr) {
                        Some(mut c) => match send_request(&mut c, kind, &body, timeout) {
                            Ok(()) => Ok((c, true)),
                            Err(_) => fresh(),
                        },
                        None => fresh(),
                    };
                    (addr, r)
                })
                .collect();
            let mut sent = sent.into_iter();
            for (addr, r) in sent.by_ref() {
                let r = r.and_then(|(mut c, pooled)| match read_leased(&mut c) {
                    Ok(l) => Ok((c, l)),
                    // A pooled connection the source had closed: once more on a fresh one.
                    Err(e) if pooled && !tp::is_timeout(&e) => {
                        let mut c = self.connect(addr)?;
                        let l = send_and_read_leased(&mut c, kind, &body, timeout)?;
                        Ok((c, l))
                    }
                    Err(e) => Err(e),
                });
                let mut r = r.and_then(|(c, l)| check_leased(c, l, asked, block_bytes));
                // The first whole hit in rendezvous order cannot be beaten: ask
                // it to send now and read its bytes before the other answers
                // (a slow peer must not stall its stream).
                if early.is_none()
                    && let Ok((conn, (lease, blocks, _))) = &mut r
                    && *blocks as usize == asked
                {
                    early = Some((answers.len(), go(conn, *lease, *blocks)));
                }
                answers.push((addr.clone(), r));
                if early.is_some() {
                    break;
                }
            }
            if early.is_some() {
                pending.extend(sent.map(|(a, r)| (a.clone(), r)));
                break; // later waves could not do better
            }
        }
        // Otherwise the longest hit; `max_by_key` keeps the last of equals, so
        // walk in reverse to let the earliest in rendezvous order win a tie.
        let best = early.as_ref().map(|(i, _)| *i).or_else(|| {
            answers
                .iter()
                .enumerate()
                .rev()
                .filter_map(|(i, (_, r))| match r {
                    Ok((_, (_, blocks, _))) if *blocks > 0 => Some((i, *blocks)),
                    _ => None,
                })
                .max_by_key(|&(_, blocks)| blocks)
                .map(|(i, _)| i)
        });
        // Ask the winner to send first; release the others while it reads its slots.
        let mut winner = None;
        if let Some(i) = best
            && let (addr, Ok((conn, (lease, blocks, _)))) = &mut answers[i]
        {
            let how = match early.take() {
                Some((_, how)) => how,
                None => go(conn, *lease, *blocks),
            };
            winner = Some((addr.clone(), how));
        }
        let mut winner_conn = None;
        for (i, (addr, r)) in answers.into_iter().enumerate() {
            match r {
                Ok((conn, _)) if Some(i) == best => winner_conn = Some(conn),
                Ok((mut conn, (lease, blocks, _))) => {
                    if blocks > 0 {
                        let done = PeerRequest::Done { lease, stored: false };
                        let sent = write_frame(&mut conn, done.kind(), 0, &done.encode())
                            .map_err(PeerError::from)
                            .and_then(|()| conn.flush().map_err(PeerError::from));
                        if sent.is_err() {
                            conn.close();
                            continue;
                        }
                    }
                    self.put_conn(&addr, conn);
                    self.note_fetch(&addr, Ok(0), t0, block_bytes);
                }
                Err(e) => {
                    self.note_fetch(&addr, Err(e), t0, block_bytes);
                }
            }
        }
        let stored = match (winner, winner_conn) {
            (Some((addr, Go::Sent(sent))), Some(mut conn)) => {
                let got = sent
                    .and_then(|()| read_leased(&mut conn))
                    .and_then(|leased| self.receive_leased(arena, &addr, conn, leased, want));
                self.note_fetch(&addr, got, t0, block_bytes)
            }
            (
                Some((
                    addr,
                    Go::Split {
                        lease,
                        blocks,
                        streams,
                    },
                )),
                Some(mut conn),
            ) => {
                // The probe's lease keeps the blocks pinned at the source while
                // the split fetch leases them range by range; released after.
                let n = blocks as usize;
                let got = self.fetch_split(arena, &addr, fetch, want.of(&hashes[..n]), streams);
                let done = PeerRequest::Done { lease, stored: false };
                let released = write_frame(&mut conn, done.kind(), 0, &done.encode())
                    .map_err(PeerError::from)
                    .and_then(|()| conn.flush().map_err(PeerError::from));
                match released {
                    Ok(()) => self.put_conn(&addr, conn),
                    // The source may have let it go already (its timeout); closing ends it anyway.
                    Err(_) => conn.close(),
                }
                self.note_fetch(&addr, got, t0, block_bytes)
            }
            _ => 0,
        };
        // Probes not read yet (an early winner): release their hits now.
        for (addr, r) in pending {
            match r.and_then(|(mut c, pooled)| read_leased(&mut c).map(|l| (c, l, pooled))) {
                Ok((mut conn, (lease, blocks, _), _)) => {
                    if blocks > 0 {
                        let done = PeerRequest::Done { lease, stored: false };
                        if write_frame(&mut conn, done.kind(), 0, &done.encode()).is_err()
                            || conn.flush().is_err()
                        {
                            conn.close();
                            continue;
                        }
                    }
                    self.put_conn(&addr, conn);
                    self.note_fetch(&addr, Ok(0), t0, block_bytes);
                }
                // A stale pooled connection is not the peer's fault; anything else is.
                Err(e) => {
                    if !matches!(&e, PeerError::Frame(FrameError::Closed)) {
                        self.note_fetch(&addr, Err(e), t0, block_bytes);
                    }
                }
            }
        }
        stored
    }
}

/// A request written on a connection (`true`: a pooled one), or why not.
type Sent = Result<(Conn, bool), PeerError>;

/// How the winner of a parallel probe delivers its blocks.
enum Go {
    /// Told to `Send` on its probe's connection (the outcome of that request).
    Sent(Result<(), PeerError>),
    /// Fetched split over `streams` connections ([`PeerTier::fetch_split`]),
    /// its probed `lease` of `blocks` blocks held until that fetch ends.
    Split { lease: u64, blocks: u32, streams: usize },
}
