//! Writing replies: an answer, a last error reply before closing, and the
//! refusals of a connection (authentication, framing, `--max-connections`).

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use orbitkv_proto::{ErrorCode, FrameError, Response, write_frame};

use crate::parts::ServerCounters;

/// How long a last error reply before closing may block on a peer that does not read.
const CLOSING_REPLY_TIMEOUT: Duration = Duration::from_millis(100);

pub(super) fn reply(stream: &UnixStream, id: u32, resp: &Response) -> Result<(), FrameError> {
    let mut w = stream;
    write_frame(&mut w, resp.kind() as u16, id, &resp.encode())?;
    w.flush()?;
    Ok(())
}

/// A last error reply on a connection about to be closed: best effort, and it
/// cannot hold the thread on a peer that stopped reading.
pub(super) fn reply_and_close(stream: &UnixStream, id: u32, code: ErrorCode, msg: impl Into<String>) {
    let _ = stream.set_write_timeout(Some(CLOSING_REPLY_TIMEOUT));
    let _ = reply(stream, id, &Response::error(code, msg));
}

pub(super) fn refuse(stream: &UnixStream, counters: &ServerCounters, id: u32, code: ErrorCode, msg: &str) {
    let n = match code {
        ErrorCode::Auth => ServerCounters::inc(&counters.auth_refused),
        _ => ServerCounters::inc(&counters.bad_frames),
    };
    warn_sampled!(n, "refusing connection: {msg}");
    reply_and_close(stream, id, code, msg);
}

/// Answer a connection over `--max-connections` with `Busy` and close it, from
/// the accept loop (no thread is spent on it; the write cannot block: the reply
/// is far smaller than an empty socket buffer).
pub fn refuse_over_limit(stream: UnixStream, counters: &ServerCounters, limit: usize) {
    let n = ServerCounters::inc(&counters.connections_refused);
    let msg = format!("the Manager already serves its limit of {limit} connections (--max-connections)");
    warn_sampled!(n, "refusing connection: {msg}");
    reply_and_close(&stream, 0, ErrorCode::Busy, msg);
}

pub(super) fn frame_code(e: &FrameError) -> ErrorCode {
    match e {
        FrameError::Version(_) => ErrorCode::Version,
        FrameError::TooLarge(_) => ErrorCode::TooLarge,
        FrameError::Refused { code, .. } => *code,
        _ => ErrorCode::BadFrame,
    }
}
