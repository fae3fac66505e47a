//! One client connection: authentication, arena hand-off, request loop.

use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use orbitkv_core::{
    AcquireStep, CacheError, Fingerprint, LeaseId, NamespaceKey, NsId, SaveId, SaveStatus, SessionEnd,
    SessionId,
};
use orbitkv_proto::{
    DecodeError, ErrorCode, FD_BATCH, FrameError, HELLO_CONTROL_ONLY, Header, Kind, Request, Response,
    SaveItem, SegmentInfo, decode_request, write_frame,
};
use orbitkv_shm::Segment;
use orbitkv_shm::fdpass::send_with_fds;
use orbitkv_shm::peer::{PeerCred, ProcessHandle, my_uid, peer_cred};

use crate::framing::{PeerReader, Stall};
use crate::shared::{Quarantined, ServerCounters, Shared};
use crate::stats;

/// How long a last error reply before closing may block on a peer that does not read.
const CLOSING_REPLY_TIMEOUT: Duration = Duration::from_millis(100);

fn reply(stream: &UnixStream, id: u32, resp: &Response) -> Result<(), FrameError> {
    let mut w = stream;
    write_frame(&mut w, resp.kind() as u16, id, &resp.encode())?;
    w.flush()?;
    Ok(())
}

/// A last error reply on a connection about to be closed: best effort, and it
/// cannot hold the thread on a peer that stopped reading.
fn reply_and_close(stream: &UnixStream, id: u32, code: ErrorCode, msg: impl Into<String>) {
    let _ = stream.set_write_timeout(Some(CLOSING_REPLY_TIMEOUT));
    let _ = reply(stream, id, &Response::error(code, msg));
}

fn refuse(stream: &UnixStream, shared: &Shared, id: u32, code: ErrorCode, msg: &str) {
    let n = match code {
        ErrorCode::Auth => ServerCounters::inc(&shared.counters.auth_refused),
        _ => ServerCounters::inc(&shared.counters.bad_frames),
    };
    warn_sampled!(n, "refusing connection: {msg}");
    reply_and_close(stream, id, code, msg);
}

/// Answer a connection over `--max-connections` with `Busy` and close it, from
/// the accept loop (no thread is spent on it; the write cannot block: the reply
/// is far smaller than an empty socket buffer).
pub fn refuse_over_limit(stream: UnixStream, shared: &Shared, limit: usize) {
    let n = ServerCounters::inc(&shared.counters.connections_refused);
    let msg = format!("the Manager already serves its limit of {limit} connections (--max-connections)");
    warn_sampled!(n, "refusing connection: {msg}");
    reply_and_close(&stream, 0, ErrorCode::Busy, msg);
}

/// Constant-time comparison (length is not secret).
fn token_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn authorize(shared: &Shared, cred: &PeerCred) -> Result<(), String> {
    if cred.uid == my_uid() || shared.config.allow_uids.contains(&cred.uid) {
        Ok(())
    } else {
        Err(format!(
            "peer uid {} is not allowed (Manager uid {})",
            cred.uid,
            my_uid()
        ))
    }
}

/// Who an authenticated session is, as its requests are served.
#[derive(Clone, Copy)]
struct SessionCtx {
    session: SessionId,
    control: bool,
    pid: i32,
    uid: u32,
}

/// One authenticated connection and everything it owns: its reader (and the
/// frame budget it holds), the open cache session (ended exactly once, when
/// this is dropped) and its `--max-connections` place. Its session thread
/// holds it and serves it (`request_loop`).
struct Conn {
    reader: PeerReader,
    ctx: SessionCtx,
    open: OpenSession,
    _slot: ConnectionSlot,
}

impl Conn {
    fn stream(&self) -> &UnixStream {
        self.reader.stream()
    }

    /// End the session this way when this connection is dropped.
    fn ended(&mut self, how: SessionEnd) {
        self.open.how = Some(how);
    }
}

/// One of the `--max-connections` places, held by the connection until it ends.
pub struct ConnectionSlot(pub Arc<Shared>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::AcqRel);
    }
}

pub fn serve_connection(shared: Arc<Shared>, stream: UnixStream, slot: ConnectionSlot) {
    let cred = match peer_cred(&stream) {
        Ok(c) => c,
        Err(e) => {
            log!(Warn, "SO_PEERCRED failed: {e}");
            return;
        }
    };
    if let Err(msg) = authorize(&shared, &cred) {
        refuse(&stream, &shared, 0, ErrorCode::Auth, &msg);
        return;
    }
    let stream = Arc::new(stream);
    // The Hello deadline is absolute, from here; only a small Hello frame is accepted.
    let mut reader = PeerReader::new(stream.clone(), shared.clone());
    let (hello_id, token, flags) = match reader.next_frame() {
        Ok((h, body)) => match decode_request(h.kind, &body) {
            Ok(Request::Hello { token, flags, .. }) => (h.request_id, token, flags),
            Ok(_) | Err(_) => {
                refuse(
                    &stream,
                    &shared,
                    h.request_id,
                    ErrorCode::BadFrame,
                    "malformed Hello",
                );
                return;
            }
        },
        Err(FrameError::Closed) => return,
        Err(_) if reader.stalled() == Some(Stall::Hello) => {
            let n = ServerCounters::inc(&shared.counters.hello_timeouts);
            let t = shared.config.hello_timeout;
            warn_sampled!(
                n,
                "no Hello within {t:?} from pid {} (uid {}; got {}); closing",
                cred.pid,
                cred.uid,
                reader.progress()
            );
            reply_and_close(
                &stream,
                reader.request_id(),
                ErrorCode::BadFrame,
                format!("no complete Hello within {t:?} of connecting (--hello-timeout-ms); closing"),
            );
            return;
        }
        Err(e) => {
            refuse(
                &stream,
                &shared,
                reader.request_id(),
                frame_code(&e),
                &e.to_string(),
            );
            return;
        }
    };
    reader.hello_done();
    if let Some(expected) = &shared.config.token
        && !token_eq(expected, &token)
    {
        {
            refuse(
                &stream,
                &shared,
                hello_id,
                ErrorCode::Auth,
                "wrong or missing token",
            );
            return;
        }
    }
    let process = ProcessHandle::open(cred.pid).ok();
    let open = OpenSession::new(&shared, cred.pid, process);
    let session = open.id;
    // A control-only session gets no arena: it can never copy (see `refused_for_control`).
    let control = flags & HELLO_CONTROL_ONLY != 0;
    let mut conn = Conn {
        reader,
        ctx: SessionCtx {
            session,
            control,
            pid: cred.pid,
            uid: cred.uid,
        },
        open,
        _slot: slot,
    };
    let hello = Response::HelloOk {
        presence_slots: shared.presence.as_ref().map_or(0, |p| p.slots()),
        session: session.0,
        segments: shared
            .segments
            .iter()
            .enumerate()
            .map(|(i, s)| SegmentInfo {
                id: i as u32,
                size: s.size(),
            })
            .collect(),
    };
    let mut frame = Vec::new();
    if write_frame(&mut frame, hello.kind() as u16, hello_id, &hello.encode()).is_err() {
        return;
    }
    // Every authenticated session may look up, so every one gets the presence
    // table (sealed: it can only map it read-only).
    let presence: Vec<_> = shared.presence.iter().map(|p| p.fd().as_fd()).collect();
    if let Err(e) = send_with_fds(&stream, &frame, &presence) {
        log!(Warn, "session {}: sending the hello reply failed: {e}", session.0);
        return; // `conn` ends the session as vanished
    }
    if !control && let Err(e) = send_arena_fds(&stream, &shared.segments) {
        log!(
            Warn,
            "session {}: sending the {} arena fds failed: {e}",
            session.0,
            shared.segments.len()
        );
        return;
    }
    log!(
        Debug,
        "session {} opened by pid {} uid {}{}",
        session.0,
        cred.pid,
        cred.uid,
        if control { " (control-only)" } else { "" }
    );

    // A peer that sends requests but never reads the replies must not hold a
    // thread for good: a reply that cannot be written within the frame deadline
    // ends the session (as a vanished connection).
    let _ = stream.set_write_timeout(Some(shared.config.frame_timeout));
    let how = request_loop(&shared, &mut conn);
    conn.ended(how);
}

/// The arena's fds, in segment order, in `ArenaFds` frames of at most
/// `FD_BATCH` each: a client maps and closes each batch before the next, so no
/// segment count needs more than `FD_BATCH` free fds in the client, and no
/// message exceeds the kernel's per-message fd limit.
fn send_arena_fds(stream: &UnixStream, segments: &[Segment]) -> std::io::Result<()> {
    let mut frame = Vec::new();
    for (i, batch) in segments.chunks(FD_BATCH).enumerate() {
        let msg = Response::ArenaFds {
            first: (i * FD_BATCH) as u32,
            count: batch.len() as u32,
        };
        frame.clear();
        write_frame(&mut frame, msg.kind() as u16, 0, &msg.encode()).map_err(std::io::Error::other)?;
        let fds: Vec<_> = batch.iter().map(|s| s.fd().as_fd()).collect();
        send_with_fds(stream, &frame, &fds)?;
    }
    Ok(())
}

/// One open cache session, ended exactly once when this is dropped: as the
/// request loop reported, or as `Vanished` on every other way out, including a
/// panic unwinding the session's thread (a panic proves nothing about drain, so
/// acquired leases and save slots go to quarantine like any vanished client's).
struct OpenSession {
    shared: Arc<Shared>,
    id: SessionId,
    pid: i32,
    process: Option<ProcessHandle>,
    how: Option<SessionEnd>,
}

impl OpenSession {
    fn new(shared: &Arc<Shared>, pid: i32, process: Option<ProcessHandle>) -> OpenSession {
        let id = shared.cache().open_session();
        ServerCounters::inc(&shared.counters.sessions_opened);
        OpenSession {
            shared: shared.clone(),
            id,
            pid,
            process,
            how: None,
        }
    }
}

impl Drop for OpenSession {
    fn drop(&mut self) {
        if self.how.is_none() && std::thread::panicking() {
            log!(
                Error,
                "session {} (pid {}): its thread panicked; ending the session as vanished",
                self.id.0,
                self.pid
            );
        }
        let how = self.how.unwrap_or(SessionEnd::Vanished);
        end(&self.shared, self.id, self.pid, self.process.take(), how);
    }
}

fn frame_code(e: &FrameError) -> ErrorCode {
    match e {
        FrameError::Version(_) => ErrorCode::Version,
        FrameError::TooLarge(_) => ErrorCode::TooLarge,
        FrameError::Refused { code, .. } => *code,
        _ => ErrorCode::BadFrame,
    }
}

/// Requests that hand out arena addresses, refused to a control-only session so
/// that it provably never copies (and its leases can be dropped with its connection).
fn refused_for_control(req: &Request) -> Option<Response> {
    let what = match req {
        Request::Acquire { .. } => "Acquire",
        Request::BeginSave { .. } => "BeginSave",
        _ => return None,
    };
    Some(Response::error(
        ErrorCode::InvalidArgument,
        format!(
            "{what} hands out arena addresses; this session is control-only (connect with the arena mapped)"
        ),
    ))
}

/// What one request asks of its connection.
enum Step {
    /// Answer, and read on.
    Reply(u32, Response),
    /// Nothing to answer (a quiet release); read on.
    Quiet,
    /// Answer, then the session is over (a `Close`).
    Last(u32, Response, SessionEnd),
    /// Framing is lost: a last error reply, then the connection is closed and
    /// the session ends as vanished.
    Close(u32, ErrorCode, String),
}

/// A frame that could not be read: counted and logged; the last reply to
/// send before closing, if any. The session then ends as vanished.
fn frame_failed(shared: &Shared, conn: &Conn, e: FrameError) -> Option<(u32, ErrorCode, String)> {
    let (session, pid) = (conn.ctx.session, conn.ctx.pid);
    let reader = &conn.reader;
    match e {
        FrameError::Closed => None,
        _ if reader.stalled() == Some(Stall::Frame) => {
            let n = ServerCounters::inc(&shared.counters.frame_timeouts);
            let t = shared.config.frame_timeout;
            warn_sampled!(
                n,
                "session {} (pid {pid}): frame incomplete {t:?} after its first byte (got {}); closing",
                session.0,
                reader.progress()
            );
            Some((
                reader.request_id(),
                ErrorCode::BadFrame,
                format!("frame incomplete {t:?} after its first byte (--frame-timeout-ms); closing"),
            ))
        }
        FrameError::Io(e) => {
            log!(Debug, "session {}: read failed: {e}", session.0);
            None
        }
        e => {
            // Framing is lost: answer once, then drop the connection.
            let n = match e {
                FrameError::Refused {
                    code: ErrorCode::Busy,
                    ..
                } => ServerCounters::inc(&shared.counters.frame_buffer_refusals),
                _ => ServerCounters::inc(&shared.counters.bad_frames),
            };
            warn_sampled!(n, "session {} (pid {pid}): {e}; closing", session.0);
            Some((reader.request_id(), frame_code(&e), e.to_string()))
        }
    }
}

/// Serve one request (it may block: an SSD read, a peer fetch).
fn step(shared: &Shared, ctx: SessionCtx, h: &Header, req: Result<Request, DecodeError>) -> Step {
    let SessionCtx {
        session,
        control,
        pid,
        uid,
    } = ctx;
    match req {
        // The one request with no reply: nothing is written, whatever happens.
        Ok(Request::ReleaseQuiet { leases }) => {
            release_quiet(shared, session, pid, &leases);
            Step::Quiet
        }
        // A malformed one-way frame cannot be answered without breaking the
        // client's reply order: framing is lost, as for a bad header.
        Err(e) if h.kind == Kind::ReleaseQuiet as u16 => {
            let n = ServerCounters::inc(&shared.counters.bad_frames);
            warn_sampled!(
                n,
                "session {} (pid {pid}): bad ReleaseQuiet: {e}; closing",
                session.0
            );
            Step::Close(
                h.request_id,
                ErrorCode::BadFrame,
                format!("ReleaseQuiet: {e}; closing"),
            )
        }
        Ok(Request::Close) => {
            let r = shared.cache().end_session(session, SessionEnd::Clean);
            ServerCounters::inc(&shared.counters.sessions_closed_clean);
            Step::Last(h.request_id, map(r.map(|_| Response::Ok)), SessionEnd::Clean)
        }
        Ok(req) => Step::Reply(
            h.request_id,
            match control.then(|| refused_for_control(&req)).flatten() {
                Some(refusal) => refusal,
                None => match crate::tp::handle(shared, session, uid, control, &req, map) {
                    Some(r) => r,
                    None => handle(shared, session, req),
                },
            },
        ),
        Err(e) => {
            ServerCounters::inc(&shared.counters.bad_frames);
            Step::Reply(
                h.request_id,
                Response::error(ErrorCode::BadFrame, format!("kind {:#06x}: {e}", h.kind)),
            )
        }
    }
}

/// Serve the session's requests in order until it ends.
fn request_loop(shared: &Shared, conn: &mut Conn) -> SessionEnd {
    loop {
        // The previous frame's body was dropped at the end of the last
        // iteration; `next_frame` returns its budget first.
        let (h, body) = match conn.reader.next_frame() {
            Ok(x) => x,
            Err(e) => {
                if let Some((id, code, msg)) = frame_failed(shared, conn, e) {
                    reply_and_close(conn.stream(), id, code, msg);
                }
                return SessionEnd::Vanished;
            }
        };
        let s = step(shared, conn.ctx, &h, decode_request(h.kind, &body));
        if let Some(how) = finish(conn.stream(), s) {
            return how;
        }
    }
}

/// Write what a step answers, waiting as the write timeout allows; `Some`
/// when the session is over.
fn finish(stream: &UnixStream, s: Step) -> Option<SessionEnd> {
    match s {
        Step::Quiet => None,
        Step::Reply(id, resp) => reply(stream, id, &resp).err().map(|_| SessionEnd::Vanished),
        Step::Last(id, resp, how) => {
            let _ = reply(stream, id, &resp);
            Some(how)
        }
        Step::Close(id, code, msg) => {
            reply_and_close(stream, id, code, msg);
            Some(SessionEnd::Vanished)
        }
    }
}

/// `ReleaseQuiet`: release each lease as `Release` would, answer nothing. A
/// lease that cannot be released (already ended, another session's) is
/// counted and logged; the client asked not to wait, so it is not told.
fn release_quiet(shared: &Shared, s: SessionId, pid: i32, leases: &[u64]) {
    for &l in leases {
        ServerCounters::inc(&shared.counters.quiet_releases);
        if let Err(e) = release(shared, s, LeaseId(l)) {
            let n = ServerCounters::inc(&shared.counters.quiet_release_failures);
            warn_sampled!(n, "session {} (pid {pid}): quiet release of lease {l}: {e}", s.0);
        }
    }
}

/// Release one lease: the shared-lock path when ending it frees nothing.
fn release(shared: &Shared, s: SessionId, l: LeaseId) -> Result<(), CacheError> {
    // Bound first: the shared guard must be gone before the exclusive path
    // below takes the lock (a match scrutinee's temporaries live to its end).
    let fast = shared.cache_shared().try_release_shared(s, l);
    match fast {
        Ok(true) => Ok(()),
        // A doomed block to reap or a TP part to end: the exclusive path.
        Ok(false) => shared.cache().release(s, l),
        Err(e) => Err(e),
    }
}

fn end(shared: &Shared, session: SessionId, pid: i32, process: Option<ProcessHandle>, how: SessionEnd) {
    if how == SessionEnd::Clean {
        return; // already ended under the lock in the Close handler
    }
    ServerCounters::inc(&shared.counters.sessions_vanished);
    let mut cache = shared.cache();
    let _ = cache.end_session(session, SessionEnd::Vanished);
    if cache.is_quarantined(session) {
        drop(cache);
        log!(
            Info,
            "session {} (pid {pid}) vanished holding leases/slots: quarantined until the process is gone",
            session.0
        );
        shared.quarantine().push(Quarantined {
            session,
            pid,
            process,
        });
    }
}

fn cache_code(e: &CacheError) -> ErrorCode {
    match e {
        CacheError::UnknownSession(_) | CacheError::SessionClosed(_) => ErrorCode::SessionClosed,
        CacheError::UnknownNamespace(_) => ErrorCode::UnknownNamespace,
        CacheError::BlockBytesMismatch { .. }
        | CacheError::BadBlockBytes(_)
        | CacheError::BlockLargerThanSegment { .. } => ErrorCode::InvalidArgument,
        CacheError::UnknownLease(_) | CacheError::UnknownSave(_) => ErrorCode::NotFound,
        CacheError::NotOwner { .. } => ErrorCode::NotOwner,
        CacheError::Busy { .. } => ErrorCode::Busy,
        CacheError::NoStagingSpace { .. } => ErrorCode::RestoreFailed,
        CacheError::TpGroup(_) => ErrorCode::InvalidArgument,
        CacheError::UnknownTpLease => ErrorCode::NotFound,
    }
}

fn map(r: Result<Response, CacheError>) -> Response {
    r.unwrap_or_else(|e| Response::error(cache_code(&e), e.to_string()))
}

fn handle(shared: &Shared, s: SessionId, req: Request) -> Response {
    match req {
        Request::Hello { .. } => Response::error(ErrorCode::BadFrame, "Hello sent twice"),
        Request::RegisterNamespace {
            fingerprint,
            shard,
            salt,
            block_bytes,
        } => {
            let key = NamespaceKey {
                fingerprint: Fingerprint(fingerprint),
                shard,
                salt,
            };
            map(shared
                .cache()
                .register_namespace(key, block_bytes)
                .map(|(ns, generation)| Response::Namespace {
                    ns: ns.0,
                    generation,
                    presence_key: shared.presence.as_ref().map_or([0; 16], |p| p.namespace_key(ns)),
                }))
        }
        Request::Lookup { ns, hashes } => {
            map(lookup(shared, s, NsId(ns), &hashes).map(|r| Response::LookupOk {
                lease: r.lease.map_or(0, |l| l.0),
                hit_blocks: r.hit_blocks,
                generation: r.generation,
                ssd_blocks: r.ssd_blocks,
            }))
        }
        Request::Acquire { lease } => {
            if let Some(resp) = acquire_from_dram(shared, s, lease) {
                return resp;
            }
            let mut cache = shared.cache();
            let injected = shared
                .restore_faults
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok();
            if injected {
                // Nothing was handed out, so no copy can be in flight: retire now.
                ServerCounters::inc(&shared.counters.restore_failures_injected);
                let released = cache.release(s, LeaseId(lease));
                return match released {
                    Ok(()) => Response::error(
                        ErrorCode::RestoreFailed,
                        format!("restore of lease {lease} failed: injected fault; lease released"),
                    ),
                    Err(e) => map(Err(e)),
                };
            }
            drop(cache);
            acquire(shared, s, LeaseId(lease))
        }
        Request::Release { lease } => map(release(shared, s, LeaseId(lease)).map(|_| Response::Ok)),
        Request::BeginSave { ns, hashes } => {
            map(shared
                .cache()
                .begin_save(s, NsId(ns), &hashes)
                .map(|(id, st)| Response::SaveBegun {
                    save: id.0,
                    items: st
                        .into_iter()
                        .map(|x| match x {
                            SaveStatus::Allocated(slot) => SaveItem::Allocated {
                                segment: slot.segment,
                                offset: slot.offset,
                            },
                            SaveStatus::Present => SaveItem::Present,
                            SaveStatus::Refused => SaveItem::Refused,
                        })
                        .collect(),
                }))
        }
        Request::CommitSave { save } => {
            let mut cache = shared.cache();
            let injected = shared
                .commit_faults
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok();
            if injected {
                ServerCounters::inc(&shared.counters.commit_failures_injected);
                return match cache.abort_save(s, SaveId(save)) {
                    Ok(()) => Response::error(
                        ErrorCode::SaveFailed,
                        format!(
                            "commit of save {save} failed: injected fault; the save was aborted, nothing became visible"
                        ),
                    ),
                    Err(e) => map(Err(e)),
                };
            }
            map(cache
                .commit_save(s, SaveId(save))
                .map(|blocks| Response::Committed { blocks }))
        }
        Request::AbortSave { save } => map(shared.cache().abort_save(s, SaveId(save)).map(|_| Response::Ok)),
        Request::ResetGeneration { ns } => {
            let mut cache = shared.cache();
            let r = cache.bump_generation(NsId(ns));
            if let Ok(g) = &r {
                log!(Info, "namespace {ns}: moved to generation {g}");
                if let Some(ssd) = &shared.config.ssd {
                    // Durable before the reply: a restart must never serve the old generation.
                    if let Err(e) = crate::tier::persist_generations(&ssd.dir, &cache.generation_table()) {
                        log!(Error, "persisting generations in {}: {e}", ssd.dir.display());
                        return Response::error(
                            ErrorCode::Internal,
                            format!(
                                "generation {g} applied but not persisted in {}: {e}",
                                ssd.dir.display()
                            ),
                        );
                    }
                }
            }
            map(r.map(|generation| Response::Generation { generation }))
        }
        Request::Stats => Response::StatsOk {
            json: stats::json(shared),
        },
        Request::InjectFault {
            restore_failures,
            commit_failures,
        } => {
            if !shared.config.enable_fault_injection {
                return Response::error(
                    ErrorCode::FaultInjectionDisabled,
                    "fault injection is disabled; start the Manager with --enable-fault-injection",
                );
            }
            shared.restore_faults.store(restore_failures, Ordering::Release);
            shared.commit_faults.store(commit_failures, Ordering::Release);
            Response::Ok
        }
        Request::Close => Response::Ok, // handled in the loop
        Request::ReleaseQuiet { .. } => {
            Response::error(ErrorCode::Internal, "ReleaseQuiet reached the answering handler") // the loop handles it
        }
        Request::LookupTp { .. } | Request::RedeemTp { .. } | Request::ReleaseTp { .. } => {
            Response::error(ErrorCode::Internal, "TP request reached the plain handler") // tp::handle answers these
        }
    }
}

/// A lookup; on a local miss (partial or whole) with peers configured, the
/// missing suffix is filled from a peer into this Manager's DRAM first
/// (`peer::PeerTier::fill`) and the lookup runs again, so the reply is an
/// ordinary local hit. The local prefix stays pinned by the first lease while
/// the peer blocks are stored (they must not evict it), then that lease is
/// released in favour of the second lookup's.
fn lookup(
    shared: &Shared,
    s: SessionId,
    ns: NsId,
    hashes: &[orbitkv_core::BlockHash],
) -> Result<orbitkv_core::LookupResult, CacheError> {
    let first = {
        let cache = shared.cache_shared();
        let r = cache.lookup_shared(s, ns, hashes);
        // The policy thread replays the touch log; if it is far behind, this
        // lookup does (unless another replay runs: no lookup waits for one).
        cache.apply_touches_shared(false);
        r
    }?;
    let Some(peers) = shared.peers.as_ref() else {
        return Ok(first);
    };
    let hit = first.hit_blocks as usize;
    if hit >= hashes.len() || peers.fill(shared, ns, &hashes[hit..]) == 0 {
        return Ok(first);
    }
    let mut cache = shared.cache();
    let second = cache.lookup(s, ns, hashes);
    if let Some(l) = first.lease {
        let _ = cache.release(s, l);
    }
    second
}

/// The common restore under the shared lock: every block in DRAM and no
/// fault armed. `None` when the lease needs the exclusive path (`acquire`).
fn acquire_from_dram(shared: &Shared, s: SessionId, lease: u64) -> Option<Response> {
    if shared.restore_faults.load(Ordering::Acquire) != 0 {
        return None;
    }
    let fast = shared.cache_shared().try_acquire_shared(s, LeaseId(lease));
    match fast {
        Ok(Some(slots)) => {
            ServerCounters::inc(&shared.counters.leases_acquired);
            Some(Response::Slots {
                slots: slots.iter().map(|x| (x.segment, x.offset)).collect(),
            })
        }
        Ok(None) => None,
        Err(e) => Some(map(Err(e))),
    }
}

/// Hand out a lease's source slots, staging SSD-only blocks into DRAM first.
/// A block that fails its integrity checks is dropped (a miss from now on)
/// and the restore fails, with the lease retired: no copy was handed out.
fn acquire(shared: &Shared, s: SessionId, l: LeaseId) -> Response {
    loop {
        let mut cache = shared.cache();
        match cache.acquire(s, l) {
            Ok(AcquireStep::Ready(slots)) => {
                ServerCounters::inc(&shared.counters.leases_acquired);
                return Response::Slots {
                    slots: slots.iter().map(|x| (x.segment, x.offset)).collect(),
                };
            }
            Ok(AcquireStep::Wait) => {
                shared.wait_staged(cache);
            }
            Ok(AcquireStep::Lost { blocks }) => {
                return Response::error(
                    ErrorCode::RestoreFailed,
                    format!(
                        "restore of lease {}: {blocks} block(s) failed integrity checks on SSD and were dropped; lease released",
                        l.0
                    ),
                );
            }
            Ok(AcquireStep::Stage(jobs)) => {
                drop(cache); // the reads run outside the lock; the guard inside reports back
                crate::tier::stage_for_lease(shared, jobs);
            }
            Err(e @ CacheError::NoStagingSpace { .. }) => {
                let _ = cache.release(s, l);
                return Response::error(ErrorCode::RestoreFailed, format!("{e}; lease released"));
            }
            Err(e) => return map(Err(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::panic::{AssertUnwindSafe, catch_unwind};

    use orbitkv_core::{CacheState, NamespaceKey};
    use orbitkv_shm::{PageSize, Segment};

    use super::*;
    use crate::config::ManagerConfig;

    const BLOCK: u64 = 4096;

    fn shared() -> Shared {
        let config =
            ManagerConfig::from_argv(["x", "--socket", "/nonexistent/orbitkv-test.sock"]).expect("config");
        let segment = Segment::create("orbitkv-session-test", 4 * BLOCK, PageSize::Base).expect("memfd");
        Shared::new(config, vec![segment], CacheState::new(&[4 * BLOCK]), None)
    }

    /// A session that acquired a lease (source addresses handed out), then its
    /// thread panics: the session is ended and quarantined, not left open.
    #[test]
    fn a_panicking_session_thread_ends_its_session_as_vanished() {
        let shared = Arc::new(shared());
        let pid = std::process::id() as i32;
        let caught = catch_unwind(AssertUnwindSafe(|| {
            let open = OpenSession::new(&shared, pid, None);
            let mut c = shared.cache();
            let key = NamespaceKey {
                fingerprint: Fingerprint([3; 32]),
                shard: 0,
                salt: [0; 32],
            };
            let (ns, _) = c.register_namespace(key, BLOCK).expect("namespace");
            let h: [orbitkv_core::BlockHash; 1] = [[5; 32]];
            let (id, _) = c.begin_save(open.id, ns, &h).expect("begin");
            c.commit_save(open.id, id).expect("commit");
            let lease = c.lookup(open.id, ns, &h).expect("lookup").lease.expect("hit");
            assert!(matches!(c.acquire(open.id, lease), Ok(AcquireStep::Ready(_))));
            drop(c);
            panic!("injected: a request handler panicked");
        }));
        assert!(caught.is_err());
        let q = shared.quarantine();
        assert_eq!(q.len(), 1, "the session went to quarantine");
        let s = q[0].session;
        drop(q);
        assert!(shared.cache().is_quarantined(s));
        assert_eq!(shared.counters.sessions_vanished.load(Ordering::Relaxed), 1);
    }

    /// Leaving before the request loop (e.g. the fd hand-off failed) ends the
    /// session too; it holds nothing, so nothing is quarantined.
    #[test]
    fn a_session_left_before_its_loop_is_ended() {
        let shared = Arc::new(shared());
        let id = OpenSession::new(&shared, std::process::id() as i32, None).id;
        assert!(shared.quarantine().is_empty());
        assert!(matches!(
            shared.cache().lookup(id, NsId(1), &[]),
            Err(CacheError::SessionClosed(_) | CacheError::UnknownSession(_))
        ));
    }
}
