//! The handshake of a new connection: its peer credentials, the Hello (within
//! `--hello-timeout-ms`) and its token, then the reply with the presence table
//! and the arena's fds, before the request loop takes over.

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use orbitkv_proto::{
    ErrorCode, FD_BATCH, FrameError, HELLO_CONTROL_ONLY, Request, Response, SegmentInfo, decode_request,
    write_frame,
};
use orbitkv_shm::Segment;
use orbitkv_shm::fdpass::send_with_fds;
use orbitkv_shm::peer::{PID_NAMESPACE_FIX, PeerCred, ProcessHandle, my_uid, peer_cred};

use super::reply::{frame_code, refuse, reply_and_close};
use super::requests::request_loop;
use super::{Conn, ConnectionSlot, OpenSession, SessionCtx};
use crate::framing::{PeerReader, Stall};
use crate::parts::ServerCounters;
use crate::shared::Shared;

/// Constant-time comparison (length is not secret).
fn token_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn authorize(allow_uids: &[u32], cred: &PeerCred) -> Result<(), String> {
    if cred.uid == my_uid() || allow_uids.contains(&cred.uid) {
        Ok(())
    } else {
        Err(format!(
            "peer uid {} is not allowed (Manager uid {})",
            cred.uid,
            my_uid()
        ))
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
    if let Err(msg) = authorize(&shared.config.allow_uids, &cred) {
        refuse(&stream, &shared.counters, 0, ErrorCode::Auth, &msg);
        return;
    }
    if !cred.pid_visible() {
        // Without the pid there is no pidfd: the Manager could not tell a dead client
        // from a slow one, so its leases could never be freed safely.
        let msg = format!(
            "the client's process (uid {}) is not visible in the Manager's pid namespace, so the Manager \
             cannot watch it exit and free its leases; {PID_NAMESPACE_FIX}",
            cred.uid
        );
        refuse(&stream, &shared.counters, 0, ErrorCode::Auth, &msg);
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
                    &shared.counters,
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
                &shared.counters,
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
                &shared.counters,
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
