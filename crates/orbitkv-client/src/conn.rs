//! The session's socket: handshake with fd receipt, then request/reply.

use std::io::{BufReader, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use orbitkv_proto::{
    ErrorCode, FD_BATCH, FrameError, HEADER_LEN, Header, MAX_QUIET_RELEASES, Request, Response, SegmentInfo,
    decode_response, read_frame, write_frame,
};
use orbitkv_shm::Mapping;
use orbitkv_shm::fdpass::recv_with_fds;
use orbitkv_shm::presence::PresenceView;

use crate::ClientError;
use crate::release_queue::{self, Pushed, ReleaseQueue};

/// An open connection, its session id, the mapped arena segments and the
/// presence table (when the Manager publishes one).
pub(crate) type Opened = (Conn, u64, Vec<SegmentView>, Option<PresenceView>);

/// One arena segment as the Manager announced it; mapped unless control-only.
#[derive(Debug)]
pub(crate) struct SegmentView {
    pub(crate) id: u32,
    pub(crate) size: u64,
    pub(crate) mapping: Option<Mapping>,
}

/// Replies are read through a buffer: the Manager writes each frame at once,
/// so one `read` usually brings header and body (not one syscall for each).
/// The protocol is one reply per request, so nothing is normally left in it
/// between calls (anything unasked-for fails the next call's id check, as before).
const READ_BUFFER: usize = 8192;

#[derive(Debug)]
struct Inner {
    stream: BufReader<UnixStream>,
    next_id: u32,
    broken: bool,
}

#[derive(Debug)]
pub(crate) struct Conn {
    inner: Arc<Mutex<Inner>>,
    /// Quiet releases waiting for the next request or the flusher.
    releases: Arc<ReleaseQueue>,
    /// How long a call polls for its reply before it sleeps (`ORBITKV_CLIENT_SPIN_US`).
    spin: Duration,
    /// How long a call waits for its reply (also the socket's read timeout).
    reply_timeout: Duration,
    /// A duplicate of the socket, polled without the lock for a hang-up
    /// (the Manager closed or died) while another thread waits for a reply.
    watch: std::os::fd::OwnedFd,
}

fn io_err(e: FrameError) -> ClientError {
    match e {
        FrameError::Closed => ClientError::Unavailable("the Manager closed the connection".into()),
        FrameError::Io(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            ClientError::Unavailable("timed out waiting for the Manager".into())
        }
        FrameError::Io(e) => ClientError::Unavailable(e.to_string()),
        other => ClientError::Protocol(other.to_string()),
    }
}

/// The error for a Manager that refused the handshake: `Auth` for uid/token
/// refusals, the server's own code (e.g. `Busy` over `--max-connections`) otherwise.
fn refusal(code: u16, message: String) -> ClientError {
    match ErrorCode::from_u16(code) {
        Some(ErrorCode::Auth) => ClientError::Auth(message),
        Some(code) => ClientError::Server { code, message },
        None => ClientError::Protocol(message),
    }
}

/// Environment variable: microseconds a call polls for its reply before it
/// sleeps (0 to 1000; default 0: it sleeps at once). Polling spends this
/// process's CPU to save the wake-up when the Manager answers quickly.
pub const CLIENT_SPIN_ENV: &str = "ORBITKV_CLIENT_SPIN_US";

fn spin_from_env() -> Result<Duration, ClientError> {
    let Some(v) = std::env::var_os(CLIENT_SPIN_ENV) else {
        return Ok(Duration::ZERO);
    };
    v.to_str()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .filter(|us| *us <= 1000)
        .map(Duration::from_micros)
        .ok_or_else(|| ClientError::Invalid(format!("{CLIENT_SPIN_ENV}={v:?} is not 0 to 1000 microseconds")))
}

/// Poll `stream` (peeking, never consuming) until a byte is readable, the
/// peer closed, or `spin` has passed; the blocking read that follows then
/// finds the reply without sleeping.
fn spin_for_reply(stream: &UnixStream, spin: Duration) {
    if spin.is_zero() {
        return;
    }
    let start = std::time::Instant::now();
    let mut one = [0u8; 1];
    loop {
        let flags = rustix::net::RecvFlags::DONTWAIT | rustix::net::RecvFlags::PEEK;
        match rustix::net::recv(stream, &mut one, flags) {
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {}
            _ => return, // bytes, end of stream or an error: the read reports it
        }
        if start.elapsed() >= spin {
            return;
        }
        std::hint::spin_loop();
    }
}

/// Sleep until `stream` is readable (the reply's first bytes, end of stream or
/// an error, which the read that follows reports), or fail after `timeout`.
/// Not a blocking `read`: a Unix stream socket's blocked reader also wakes each
/// time the Manager consumes bytes this side sent (the "write space" wake-up
/// shares the wait queue and a blocked `read` does not filter it), which cost
/// every call one more wake-up; `poll` for `POLLIN` filters it out.
fn wait_for_reply(stream: &UnixStream, timeout: Duration) -> Result<(), ClientError> {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let ts = Timespec::try_from(left).unwrap_or(Timespec {
            tv_sec: i64::MAX,
            tv_nsec: 0,
        });
        let mut fds = [PollFd::new(stream, PollFlags::IN)];
        match poll(&mut fds, Some(&ts)) {
            Ok(0) if left.is_zero() => {
                return Err(ClientError::Unavailable(
                    "timed out waiting for the Manager".into(),
                ));
            }
            Ok(0) | Err(rustix::io::Errno::INTR) => {}
            Ok(_) => return Ok(()),
            Err(e) => return Err(ClientError::Unavailable(format!("waiting for the Manager: {e}"))),
        }
    }
}

/// `ReleaseQuiet` frames for `leases` (at most `MAX_QUIET_RELEASES` each),
/// under this connection's next request ids; empty for no leases.
fn frame_releases(g: &mut Inner, leases: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(leases.len() * 8 + HEADER_LEN + 4);
    for chunk in leases.chunks(MAX_QUIET_RELEASES) {
        let id = g.next_id;
        g.next_id = g.next_id.wrapping_add(1);
        let req = Request::ReleaseQuiet {
            leases: chunk.to_vec(),
        };
        // A Vec takes every byte, and 4,096 leases are far below MAX_BODY.
        let _ = write_frame(&mut out, req.kind() as u16, id, &req.encode());
    }
    out
}

/// The flusher thread: sends deferred releases that no request carried
/// within the delay, until the connection closes.
fn flush_due_releases(inner: &Mutex<Inner>, queue: &ReleaseQueue) {
    while queue.wait_due() {
        let mut g = inner.lock().unwrap_or_else(|p| p.into_inner());
        let leases = queue.take();
        if leases.is_empty() || g.broken {
            continue; // a request carried them, or nothing can be sent
        }
        let out = frame_releases(&mut g, &leases);
        if g.stream.get_ref().write_all(&out).is_err() {
            g.broken = true; // the next call reports it
        }
    }
}

/// Environment variable naming one more uid a client trusts to be its Manager.
pub const SERVER_UID_ENV: &str = "ORBITKV_SERVER_UID";

/// The extra uid trusted to answer as the Manager: `explicit`, else
/// `ORBITKV_SERVER_UID`, else none (only this process's own uid).
fn trusted_uid(explicit: Option<u32>) -> Result<Option<u32>, ClientError> {
    if explicit.is_some() {
        return Ok(explicit);
    }
    match std::env::var(SERVER_UID_ENV) {
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => v
            .trim()
            .parse::<u32>()
            .map(Some)
            .map_err(|_| ClientError::Invalid(format!("{SERVER_UID_ENV}={v:?} is not a numeric uid"))),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => Err(ClientError::Invalid(format!(
            "{SERVER_UID_ENV}={v:?} is not a numeric uid"
        ))),
    }
}

/// Check who answers on the socket (`SO_PEERCRED`, kernel-verified) before
/// anything is sent: a process of another user that squats the socket path
/// must never receive the token.
fn check_server(stream: &UnixStream, path: &Path, trusted: Option<u32>) -> Result<(), ClientError> {
    let me = orbitkv_shm::peer::my_uid();
    let cred = orbitkv_shm::peer::peer_cred(stream).map_err(|e| {
        ClientError::Unavailable(format!(
            "cannot read the credentials of the process answering on {}: {e}",
            path.display()
        ))
    })?;
    if cred.uid == me || Some(cred.uid) == trusted {
        return Ok(());
    }
    let also = trusted.map_or(String::new(), |u| format!(" or the trusted uid {u}"));
    Err(ClientError::UntrustedServer(format!(
        "the process answering on {} (pid {}) runs as uid {}, not as this process's uid {me}{also}; \
         nothing was sent to it. If it is your Manager, trust its uid (Python: \
         `Client(..., server_uid={})`, or {SERVER_UID_ENV}={}); otherwise another user owns this \
         socket path",
        path.display(),
        cred.pid,
        cred.uid,
        cred.uid,
        cred.uid
    )))
}

/// Read one whole frame and the fds that arrived with its bytes. A header this
/// build cannot read (another protocol version) is a `Protocol` error, as on
/// any other frame; a socket failure is `Unavailable`, its text after `what`.
fn recv_frame_with_fds(
    stream: &UnixStream,
    what: impl Fn(&std::io::Error) -> String,
) -> Result<(Header, Vec<u8>, Vec<OwnedFd>), ClientError> {
    let io = |e: std::io::Error| ClientError::Unavailable(what(&e));
    let mut raw = [0u8; HEADER_LEN];
    let mut fds = recv_with_fds(stream, &mut raw).map_err(io)?;
    let header = Header::decode(&raw).map_err(|e| ClientError::Protocol(e.to_string()))?;
    let mut body = vec![0u8; header.len as usize];
    if !body.is_empty() {
        fds.extend(recv_with_fds(stream, &mut body).map_err(io)?);
    }
    Ok((header, body, fds))
}

/// Receive the arena's fds in the `ArenaFds` batches that follow `HelloOk`,
/// mapping each segment and closing its fd before the next batch: this process
/// never holds more than `FD_BATCH` arena fds, whatever the segment count.
fn map_segments(
    stream: &UnixStream,
    segments: &[SegmentInfo],
    path: &Path,
) -> Result<Vec<SegmentView>, ClientError> {
    let mut maps: Vec<SegmentView> = Vec::with_capacity(segments.len());
    while maps.len() < segments.len() {
        let (header, body, fds) = recv_frame_with_fds(stream, |e| {
            format!(
                "handshake with {} failed after {} of {} arena segments: {e}{}",
                path.display(),
                maps.len(),
                segments.len(),
                fd_hint(e)
            )
        })?;
        let (first, count) = match decode_response(header.kind, &body) {
            Ok(Response::ArenaFds { first, count }) => (first as usize, count as usize),
            Ok(Response::Error { code, message }) => return Err(refusal(code, message)),
            Ok(other) => {
                return Err(ClientError::Protocol(format!(
                    "expected ArenaFds, got {:?}",
                    other.kind()
                )));
            }
            Err(e) => return Err(ClientError::Protocol(e.to_string())),
        };
        if first != maps.len() || count != fds.len() || first + count > segments.len() {
            return Err(ClientError::Protocol(format!(
                "arena fd batch for segments {first}..{} carried {} fd(s); expected segment {} next, \
                 {} segments in all",
                first + count,
                fds.len(),
                maps.len(),
                segments.len()
            )));
        }
        for (info, fd) in segments[first..first + count].iter().zip(fds) {
            maps.push(SegmentView {
                id: info.id,
                size: info.size,
                mapping: Some(Mapping::map(&fd, info.size, false)?),
            });
            // `fd` is closed here: the mapping keeps the memory.
        }
    }
    Ok(maps)
}

/// A hint for a handshake that lost fds: the usual cause is a process at its
/// descriptor limit (the kernel then drops the fds and truncates the message).
fn fd_hint(e: &std::io::Error) -> String {
    if e.to_string().contains("truncated") {
        format!(
            " (this process needs {FD_BATCH} free file descriptors during the handshake; \
             raise `ulimit -n` or close descriptors)"
        )
    } else {
        String::new()
    }
}

impl Conn {
    /// Connect, check that the peer runs as a trusted uid (this process's, or
    /// `server_uid` / `ORBITKV_SERVER_UID`), then authenticate. With
    /// `map_arena` false the session is opened control-only
    /// (`HELLO_CONTROL_ONLY`): the Manager passes no arena fds.
    pub(crate) fn open(
        path: &Path,
        token: Option<&[u8]>,
        timeout: Duration,
        map_arena: bool,
        server_uid: Option<u32>,
    ) -> Result<Opened, ClientError> {
        let trusted = trusted_uid(server_uid)?;
        let mut stream = UnixStream::connect(path).map_err(|e| {
            ClientError::Unavailable(format!(
                "cannot connect to {}: {e} (is `orbitkv serve` running?)",
                path.display()
            ))
        })?;
        check_server(&stream, path, trusted)?;
        stream
            .set_read_timeout(Some(timeout))
            .map_err(|e| ClientError::Unavailable(e.to_string()))?;
        stream
            .set_write_timeout(Some(timeout))
            .map_err(|e| ClientError::Unavailable(e.to_string()))?;
        let hello = Request::Hello {
            pid: std::process::id(),
            flags: if map_arena {
                0
            } else {
                orbitkv_proto::HELLO_CONTROL_ONLY
            },
            token: token.unwrap_or_default().to_vec(),
        };
        if let Err(e) = write_frame(&mut stream, hello.kind() as u16, 1, &hello.encode()) {
            // A Manager that refuses a peer answers at once and closes; our write
            // may lose that race. Its reason is still waiting in the socket.
            if let Ok((h, body)) = read_frame(&mut stream)
                && let Ok(Response::Error { code, message }) = decode_response(h.kind, &body)
            {
                return Err(refusal(code, message));
            }
            return Err(io_err(e));
        }

        let (header, body, mut fds) = recv_frame_with_fds(&stream, |e| {
            format!("handshake with {} failed: {e}", path.display())
        })?;
        let resp = decode_response(header.kind, &body).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let (session, segments, presence_slots) = match resp {
            Response::HelloOk {
                session,
                segments,
                presence_slots,
            } => (session, segments, presence_slots),
            Response::Error { code, message } => return Err(refusal(code, message)),
            other => {
                return Err(ClientError::Protocol(format!(
                    "expected HelloOk, got {:?}",
                    other.kind()
                )));
            }
        };
        let expected_fds = usize::from(presence_slots > 0);
        if fds.len() != expected_fds {
            return Err(ClientError::Protocol(format!(
                "Manager passed {} fd(s) with its hello reply; expected {expected_fds} (the presence table)",
                fds.len()
            )));
        }
        let presence = match (presence_slots, fds.pop()) {
            (0, _) => None,
            (slots, Some(fd)) => Some(PresenceView::open(fd, slots)?),
            (_, None) => return Err(ClientError::Protocol("no presence fd".into())),
        };
        let maps = if map_arena {
            map_segments(&stream, &segments, path)?
        } else {
            // A control-only session: the Manager passes no arena fds at all.
            segments
                .iter()
                .map(|info| SegmentView {
                    id: info.id,
                    size: info.size,
                    mapping: None,
                })
                .collect()
        };
        let watch = std::os::fd::OwnedFd::from(
            stream
                .try_clone()
                .map_err(|e| ClientError::Unavailable(format!("duplicating the socket: {e}")))?,
        );
        Ok((
            Conn {
                releases: Arc::new(ReleaseQueue::new(release_queue::delay_from_env()?)),
                inner: Arc::new(Mutex::new(Inner {
                    stream: BufReader::with_capacity(READ_BUFFER, stream),
                    next_id: 2,
                    broken: false,
                })),
                spin: spin_from_env()?,
                reply_timeout: timeout,
                watch,
            },
            session,
            maps,
            presence,
        ))
    }

    /// Lock the connection and write `req` under the next request id, behind
    /// the deferred releases queued so far (one `write` for all): the guard
    /// (held until the reply is read, if one is due) and that id.
    fn write(&self, req: &Request) -> Result<(MutexGuard<'_, Inner>, u32), ClientError> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if g.broken {
            return Err(ClientError::Unavailable(
                "connection to the Manager is broken".into(),
            ));
        }
        let mut out = frame_releases(&mut g, &self.releases.take());
        let id = g.next_id;
        g.next_id = g.next_id.wrapping_add(1);
        // A request too large to frame is refused, but the releases taken
        // for it still go out.
        let framed = write_frame(&mut out, req.kind() as u16, id, &req.encode());
        if let Err(e) = g.stream.get_ref().write_all(&out) {
            g.broken = true; // part of a frame may be on the wire
            return Err(io_err(FrameError::Io(e)));
        }
        framed.map_err(io_err)?;
        Ok((g, id))
    }

    /// Queue quiet releases for the next request, or for the flusher thread
    /// once they have waited the delay (`ORBITKV_RELEASE_DELAY_US`; 0 sends
    /// them now, in their own message).
    pub(crate) fn defer_releases(&self, leases: &[u64]) -> Result<(), ClientError> {
        if self.releases.delay.is_zero() {
            return self.send_releases(leases);
        }
        if self.releases.push(leases)? == Pushed::StartFlusher {
            let (inner, queue) = (self.inner.clone(), self.releases.clone());
            let started = std::thread::Builder::new()
                .name("orbitkv-release".into())
                .spawn(move || flush_due_releases(&inner, &queue));
            if started.is_err() {
                // No thread to bound the wait: send what is queued now.
                self.releases.flusher_failed();
                return self.send_releases(&self.releases.take());
            }
        }
        Ok(())
    }

    /// Write quiet releases now (with whatever was queued before them).
    pub(crate) fn send_releases(&self, leases: &[u64]) -> Result<(), ClientError> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if g.broken {
            return Err(ClientError::Unavailable(
                "connection to the Manager is broken".into(),
            ));
        }
        let mut all = self.releases.take();
        all.extend_from_slice(leases);
        let out = frame_releases(&mut g, &all);
        if let Err(e) = g.stream.get_ref().write_all(&out) {
            g.broken = true;
            return Err(io_err(FrameError::Io(e)));
        }
        Ok(())
    }

    pub(crate) fn call(&self, req: &Request) -> Result<Response, ClientError> {
        let (mut g, id) = self.write(req)?;
        let r = (|| {
            if g.stream.buffer().is_empty() {
                spin_for_reply(g.stream.get_ref(), self.spin);
                wait_for_reply(g.stream.get_ref(), self.reply_timeout)?;
            }
            let (h, body) = read_frame(&mut g.stream).map_err(io_err)?;
            if h.request_id != id && h.request_id != 0 {
                return Err(ClientError::Protocol(format!(
                    "reply id {} for request {id}",
                    h.request_id
                )));
            }
            decode_response(h.kind, &body).map_err(|e| ClientError::Protocol(e.to_string()))
        })();
        if matches!(r, Err(ClientError::Unavailable(_) | ClientError::Protocol(_))) {
            g.broken = true; // framing can no longer be trusted
        }
        r
    }

    /// Has the Manager's end of the connection gone (closed, crashed,
    /// restarted)? One `poll` with zero timeout, without taking the lock, so it
    /// never waits for a reply another thread is expecting. A pending reply
    /// (readable data) is not a hang-up.
    pub(crate) fn hung_up(&self) -> bool {
        use rustix::event::{PollFd, PollFlags, poll};
        let mut fds = [PollFd::new(&self.watch, PollFlags::RDHUP)];
        match poll(
            &mut fds,
            Some(&rustix::event::Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            }),
        ) {
            Ok(0) => false,
            Ok(_) => fds[0]
                .revents()
                .intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR | PollFlags::NVAL),
            Err(_) => false,
        }
    }

    /// Mark the connection unusable (the Manager is gone).
    pub(crate) fn mark_broken(&self) {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).broken = true;
    }

    pub(crate) fn shutdown(&self) {
        self.releases.close();
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let _ = g.stream.get_ref().shutdown(std::net::Shutdown::Both);
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.releases.close(); // the flusher thread exits
    }
}
