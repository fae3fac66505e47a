//! Serving this Manager's blocks to peer Managers.
//!
//! Each accepted connection gets a thread and a Manager-internal cache
//! session. A `Fetch` is a lookup + acquire under that session (SSD-only
//! blocks are staged into DRAM first), the blocks are written from their
//! pinned slots, then the source waits for the reader's `Done` and releases
//! the lease. The lease also ends when the connection ends (read error, EOF,
//! no `Done` within `--peer-timeout-ms` of the last byte sent, garbage) and at
//! shutdown (every live connection is shut down), because ending the session
//! releases everything it holds. No lease is ended while its bytes are still
//! being written or hashed: the writer is this same thread, and a checksum
//! helper thread (transfers of 4 MiB or more) has ended before it goes on. A
//! `Probe` pins the same way and answers only the count; the lease is then
//! sent on `Send`, released on `Done`, or ends as above (no answer within
//! `--peer-timeout-ms`). TP requests (`TpPin` / `TpSettle` / `TpRelease`,
//! `tp.rs`) pin TP leases owned by this connection's session; while it owns
//! any, idleness does not close it.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use orbitkv_core::{Fingerprint, LeaseId, LeasedSlot, NamespaceKey, SessionEnd, SessionId};
use orbitkv_proto::peer::{PeerRequest, PeerResponse, decode_peer_request};
use orbitkv_proto::{FrameError, read_frame, write_frame};

use super::source_context::{Source, SourceHost};
use super::transport::{self, Conn};
use crate::config::ManagerConfig;
use crate::parts::Cache;

/// Most peer connections served at once.
const MAX_PEER_CONNECTIONS: u64 = 64;
/// A connection with no frame for this long is closed (readers pool idle connections for less).
pub const IDLE: Duration = Duration::from_secs(30);

static NEXT_CONN: AtomicU64 = AtomicU64::new(1);
static REFUSALS: crate::log::Occurrences = crate::log::Occurrences::new();

/// The peer listener: one thread per connection (each holds `host` alive
/// and serves it with its [`Source`] part only).
pub fn accept_loop<H: SourceHost>(host: Arc<H>, listener: TcpListener) {
    let Some(src) = host.source() else {
        return;
    };
    let peer = src.peer;
    let open = Arc::new(AtomicU64::new(0));
    for stream in listener.incoming() {
        if src.shutdown.requested() {
            break;
        }
        let Ok(stream) = stream else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        if open.load(Ordering::Relaxed) >= MAX_PEER_CONNECTIONS {
            peer.source.refused.fetch_add(1, Ordering::Relaxed);
            warn_sampled!(
                REFUSALS.inc(),
                "refusing a peer connection: {MAX_PEER_CONNECTIONS} are open"
            );
            continue;
        }
        open.fetch_add(1, Ordering::Relaxed);
        let sh = host.clone();
        let count = open.clone();
        let spawned = std::thread::Builder::new()
            .name("orbitkv-peer".into())
            .spawn(move || {
                if let Some(src) = sh.source() {
                    serve(src, stream);
                }
                count.fetch_sub(1, Ordering::Relaxed);
            });
        if let Err(e) = spawned {
            open.fetch_sub(1, Ordering::Relaxed);
            log!(Warn, "starting a peer thread: {e}");
        }
    }
}

fn serve(src: Source<'_>, stream: TcpStream) {
    let peer = src.peer;
    let remote = stream
        .peer_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string());
    let id = NEXT_CONN.fetch_add(1, Ordering::Relaxed);
    peer.track(id, &stream);
    if src.shutdown.requested() {
        peer.untrack(id);
        return;
    }
    match transport::accept(stream, peer.tls(), peer.settings.timeout, &peer.allowed_uids) {
        Ok(mut conn) => {
            peer.source.connections.fetch_add(1, Ordering::Relaxed);
            log!(
                Debug,
                "peer {remote} connected{}",
                if conn.is_tls() { " (mutual TLS)" } else { "" }
            );
            let session = SourceSession::open(src.arena.cache);
            if let Err(e) = requests(src, &mut conn, session.id) {
                log!(
                    Debug,
                    "peer {remote}: {e}; connection closed, its source leases released"
                );
            }
            conn.close();
        }
        // Connected and closed without a byte (a port probe): nothing to refuse.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && e.to_string().contains("end of file") => {
            log!(Debug, "peer {remote} closed before the TLS handshake: {e}");
        }
        Err(e) => {
            peer.source.refused.fetch_add(1, Ordering::Relaxed);
            warn_sampled!(REFUSALS.inc(), "refusing peer {remote}: {e}");
        }
    }
    peer.untrack(id);
}

/// The source's cache session for one peer connection; ending it releases
/// every lease it holds. Its slots are read only by this Manager's own thread
/// (the source writes them to the socket), which has stopped when this drops,
/// so the end is `Clean` (no quarantine: no other process holds an address).
struct SourceSession<'a> {
    cache: &'a Cache,
    id: SessionId,
}

impl<'a> SourceSession<'a> {
    fn open(cache: &'a Cache) -> Self {
        let id = cache.write().open_session();
        SourceSession { cache, id }
    }
}

impl Drop for SourceSession<'_> {
    fn drop(&mut self) {
        let _ = self.cache.write().end_session(self.id, SessionEnd::Clean);
    }
}

#[derive(Debug, thiserror::Error)]
enum SourceError {
    #[error("{0}")]
    Frame(#[from] FrameError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Bad(String),
}

fn requests(src: Source<'_>, conn: &mut Conn, s: SessionId) -> Result<(), SourceError> {
    let peer = src.peer;
    loop {
        conn.set_timeouts(Some(idle(src.config)))?;
        let (h, body) = match read_frame(conn) {
            Ok(x) => x,
            Err(FrameError::Closed) => return Ok(()),
            // An idle TP link keeps the TP leases it pinned until they end by
            // their own rules (release, redemption, deadline): not by idleness.
            Err(FrameError::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) && src.arena.cache.write().tp_leases_of(s) > 0 =>
            {
                continue;
            }
            Err(e) => {
                if !matches!(e, FrameError::Io(_)) {
                    peer.source.bad_frames.fetch_add(1, Ordering::Relaxed);
                }
                return Err(e.into());
            }
        };
        conn.set_timeouts(Some(peer.settings.timeout))?;
        match decode_peer_request(h.kind, &body) {
            Ok(req @ (PeerRequest::Fetch(_) | PeerRequest::Probe(_))) => {
                let probe = matches!(req, PeerRequest::Probe(_));
                let (PeerRequest::Fetch(q) | PeerRequest::Probe(q)) = req else {
                    continue;
                };
                let key = NamespaceKey {
                    fingerprint: Fingerprint(q.fingerprint),
                    shard: q.shard,
                    salt: q.salt,
                };
                let want = Want {
                    key,
                    block_bytes: q.block_bytes,
                    generation: q.generation,
                    probe,
                };
                fetch(src, conn, s, h.request_id, want, &q.hashes)?;
            }
            // A `Send` for no probed lease: nothing is pinned for it, a miss.
            Ok(PeerRequest::Send { .. }) => {
                miss(conn, h.request_id, 1)?;
            }
            // Outside a fetch: a duplicate completion report counts nothing.
            Ok(PeerRequest::Done { .. }) => {}
            // Tensor parallelism across Managers: this Manager holds shards.
            Ok(
                req @ (PeerRequest::TpPin { .. }
                | PeerRequest::TpSettle { .. }
                | PeerRequest::TpRelease { .. }),
            ) => {
                let r = super::tp::serve(src, s, req);
                write_frame(conn, r.kind(), h.request_id, &r.encode())?;
                conn.flush()?;
                if let PeerResponse::Error { message } = r {
                    return Err(SourceError::Bad(format!("TP request refused: {message}")));
                }
            }
            Err(e) => {
                peer.source.bad_frames.fetch_add(1, Ordering::Relaxed);
                let r = PeerResponse::Error {
                    message: format!("kind {:#06x}: {e}", h.kind),
                };
                let _ = write_frame(conn, r.kind(), h.request_id, &r.encode());
                let _ = conn.flush();
                return Err(SourceError::Bad(format!("bad frame: {e}")));
            }
        }
    }
}

fn miss(conn: &mut Conn, id: u32, block_bytes: u64) -> Result<(), SourceError> {
    let r = PeerResponse::Leased {
        lease: 0,
        blocks: 0,
        block_bytes,
    };
    write_frame(conn, r.kind(), id, &r.encode())?;
    conn.flush()?;
    Ok(())
}

/// What a `Fetch` or `Probe` asks for.
struct Want {
    key: NamespaceKey,
    block_bytes: u64,
    generation: u64,
    /// Pin and answer with the count only; the bytes follow a `Send`.
    probe: bool,
}

fn fetch(
    src: Source<'_>,
    conn: &mut Conn,
    s: SessionId,
    id: u32,
    want: Want,
    hashes: &[[u8; 32]],
) -> Result<(), SourceError> {
    let Want {
        key,
        block_bytes,
        generation,
        probe,
    } = want;
    let (peer, cache) = (src.peer, src.arena.cache);
    let mut id = id;
    peer.source.fetches.fetch_add(1, Ordering::Relaxed);
    let found = {
        let mut cache = cache.write();
        let ns = match cache.register_namespace(key, block_bytes) {
            Ok((ns, g)) if g == generation => ns,
            // Another block size or generation: nothing here is the reader's block.
            _ => {
                drop(cache);
                return miss(conn, id, block_bytes);
            }
        };
        match cache.lookup(s, ns, hashes) {
            Ok(r) => r.lease.map(|l| (l, r.hit_blocks)),
            Err(_) => None,
        }
    };
    let Some((lease, hit)) = found else {
        return miss(conn, id, block_bytes);
    };
    if probe {
        peer.source.probes.fetch_add(1, Ordering::Relaxed);
        let head = PeerResponse::Leased {
            lease: lease.0,
            blocks: hit,
            block_bytes,
        };
        let asked = write_frame(conn, head.kind(), id, &head.encode())
            .and_then(|()| conn.flush().map_err(FrameError::from))
            .and_then(|()| read_frame(conn));
        let (h, body) = match asked {
            Ok(x) => x,
            Err(e) => {
                let _ = cache.write().release(s, lease);
                return Err(e.into());
            }
        };
        match decode_peer_request(h.kind, &body) {
            Ok(PeerRequest::Send { lease: l }) if l == lease.0 => id = h.request_id,
            // Another peer's answer was better: the reader lets this one go.
            Ok(PeerRequest::Done { lease: l, .. }) if l == lease.0 => {
                let _ = cache.write().release(s, lease);
                peer.source.probes_released.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            _ => {
                let _ = cache.write().release(s, lease);
                peer.source.bad_frames.fetch_add(1, Ordering::Relaxed);
                return Err(SourceError::Bad(
                    "expected Send or Done for the probed lease".into(),
                ));
            }
        }
    }
    let Some(slots) = acquire(src, s, lease) else {
        return miss(conn, id, block_bytes);
    };
    peer.source.leases_open.fetch_add(1, Ordering::Relaxed);
    let result = send(src, conn, id, lease, &slots, block_bytes);
    // Whatever happened, the lease ends here or with the session (connection end).
    let _ = cache.write().release(s, lease);
    peer.source.leases_open.fetch_sub(1, Ordering::Relaxed);
    match &result {
        Ok(true) => peer.source.leases_done.fetch_add(1, Ordering::Relaxed),
        _ => peer.source.leases_dropped.fetch_add(1, Ordering::Relaxed),
    };
    result.map(|_| ())
}

/// Write the blocks and their checksums, then wait for the reader's `Done`.
/// `Ok(true)`: the reader reported completion; an error ends the connection.
fn send(
    src: Source<'_>,
    conn: &mut Conn,
    id: u32,
    lease: LeaseId,
    slots: &[LeasedSlot],
    block_bytes: u64,
) -> Result<bool, SourceError> {
    let head = PeerResponse::Leased {
        lease: lease.0,
        blocks: slots.len() as u32,
        block_bytes,
    };
    write_frame(conn, head.kind(), id, &head.encode())?;
    let len = block_bytes as usize;
    let peer = src.peer;
    let segments = src.arena.segments;
    let stall = stall_ms(src.config);
    // The slots stay pinned until the caller releases the lease, after this
    // returns, so after the checksum helper (if any) has ended.
    let checksums = super::checksums_alongside(
        peer.hash_ahead(slots.len(), len),
        |sink| {
            for (i, slot) in slots.iter().enumerate() {
                if i == 1
                    && let Some(ms) = stall
                {
                    // Fault injection (tests): hold the transfer mid-way so a test can
                    // kill this Manager while a reader has half of the bytes.
                    std::thread::sleep(Duration::from_millis(ms));
                }
                sink(super::Piece::Bytes(crate::tier::send_leased_slot(
                    segments, slot, len, conn,
                )?));
            }
            Ok::<(), SourceError>(())
        },
        || SourceError::Bad("the checksum thread panicked".into()),
    )?;
    let n = slots.len() as u64;
    let tail = PeerResponse::Sent { checksums };
    write_frame(conn, tail.kind(), id, &tail.encode())?;
    conn.flush()?;
    peer.source.blocks_sent.fetch_add(n, Ordering::Relaxed);
    peer.source
        .bytes_sent
        .fetch_add(n * block_bytes, Ordering::Relaxed);
    // The reader's completion report, within the peer timeout of the last byte.
    let (h, body) = read_frame(conn)?;
    match decode_peer_request(h.kind, &body) {
        Ok(PeerRequest::Done { lease: l, .. }) if l == lease.0 => Ok(true),
        Ok(_) => Err(SourceError::Bad("expected Done for the open lease".into())),
        Err(e) => {
            peer.source.bad_frames.fetch_add(1, Ordering::Relaxed);
            Err(SourceError::Bad(format!("bad frame: {e}")))
        }
    }
}

/// Acquire a lease's slots, staging SSD-only blocks first. `None`: the lease
/// could not be served (it is released).
fn acquire(src: Source<'_>, s: SessionId, l: LeaseId) -> Option<Vec<LeasedSlot>> {
    crate::tier::acquire_slots(src.arena, src.tier, src.ssd_read, s, l)
        .map_err(|e| e.release_held(src.arena.cache, s, l))
        .ok()
}

/// How long a connection may sit with no frame: [`IDLE`], or
/// `ORBITKV_PEER_IDLE_MS` with `--enable-fault-injection` (tests).
fn idle(config: &ManagerConfig) -> Duration {
    if !config.enable_fault_injection {
        return IDLE;
    }
    std::env::var("ORBITKV_PEER_IDLE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(IDLE, Duration::from_millis)
}

/// `ORBITKV_PEER_STALL_MS`, honoured only with `--enable-fault-injection`:
/// pause that long after the first block of every multi-block transfer.
fn stall_ms(config: &ManagerConfig) -> Option<u64> {
    if !config.enable_fault_injection {
        return None;
    }
    std::env::var("ORBITKV_PEER_STALL_MS").ok()?.parse().ok()
}
