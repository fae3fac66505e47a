//! The request loop of an authenticated session: read a frame, serve it as one
//! step, write what it answers; a frame that cannot be read ends the session.

use std::os::unix::net::UnixStream;

use orbitkv_core::SessionEnd;
use orbitkv_proto::{DecodeError, ErrorCode, FrameError, Header, Kind, Request, Response, decode_request};

use super::handlers::{handle, map, release_quiet};
use super::reply::{frame_code, reply, reply_and_close};
use super::{Conn, SessionCtx};
use crate::framing::Stall;
use crate::latency::{Histogram, Latencies};
use crate::parts::ServerCounters;
use crate::shared::Shared;

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

/// The latency histogram a request's time goes to, if its path has one.
fn timed_path<'a>(l: &'a Latencies, req: &Request) -> Option<&'a Histogram> {
    match req {
        Request::Lookup { .. } | Request::LookupTp { .. } => Some(&l.lookup),
        Request::Acquire { .. } | Request::RedeemTp { .. } => Some(&l.acquire),
        Request::BeginSave { .. } => Some(&l.begin_save),
        Request::CommitSave { .. } => Some(&l.commit_save),
        _ => None,
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
            if shared.tracer().armed(shared.clock()) {
                shared.tracer().released(pid, session, &leases, true);
            }
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
            let r = shared.cache().write().end_session(session, SessionEnd::Clean);
            ServerCounters::inc(&shared.counters.sessions_closed_clean);
            Step::Last(h.request_id, map(r.map(|_| Response::Ok)), SessionEnd::Clean)
        }
        Ok(req) => {
            let started = std::time::Instant::now();
            let timed = timed_path(&shared.counters.latency, &req);
            // Copied only while a trace is armed (`orbitkv trace`).
            let traced = shared.tracer().armed(shared.clock()).then(|| req.clone());
            let reply = match control.then(|| refused_for_control(&req)).flatten() {
                Some(refusal) => refusal,
                None => match crate::tp::handle(shared, session, uid, control, &req, map) {
                    Some(r) => r,
                    None => handle(shared, session, req),
                },
            };
            if let Some(hist) = timed {
                hist.since(started);
            }
            if let Some(req) = traced {
                shared
                    .tracer()
                    .observe(shared.cache(), session, pid, &req, &reply);
            }
            Step::Reply(h.request_id, reply)
        }
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
pub(super) fn request_loop(shared: &Shared, conn: &mut Conn) -> SessionEnd {
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
