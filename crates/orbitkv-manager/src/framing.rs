//! Reading frames from a peer under the Manager's connection limits:
//!
//! - an absolute deadline for the whole `Hello` (`--hello-timeout-ms`, from
//!   accept: a peer dripping one byte at a time cannot extend it);
//! - once a frame's first byte has arrived, a deadline for the whole frame
//!   (`--frame-timeout-ms`); an idle connection between frames has none;
//! - before the `Hello`, only a `Hello` header of at most `MAX_HELLO_BODY`
//!   bytes is accepted, so nothing large is buffered for an unauthenticated peer;
//! - body buffers grow as bytes arrive (never the announced length up front);
//!   past the first `FIRST_BODY_CHUNK` bytes of a frame, their capacity is
//!   charged to one budget shared by all connections (`--max-buffered-bytes`),
//!   and a frame that cannot get budget is refused with `Busy`. The charge is
//!   returned when the frame has been handled or the connection ends.
//!
//! So the Manager buffers at most `max_buffered_bytes + max_connections × 64 KiB`
//! of frame bodies, whatever its peers announce, plus a fixed 8 KiB receive
//! buffer per connection (one `recv` per small frame, not one per header and body).

use std::io::{self, Read};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use orbitkv_proto::{
    ErrorCode, FIRST_BODY_CHUNK, FrameError, FrameGuard, Header, Kind, MAX_HELLO_BODY, read_frame_guarded,
};
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::net::RecvFlags;

use crate::shared::Shared;

/// Bytes of each frame's body buffer not charged to the shared budget.
pub const PER_FRAME_ALLOWANCE: usize = FIRST_BODY_CHUNK;

/// Why a read stopped at a deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stall {
    /// The `Hello` was not complete within the Hello deadline.
    Hello,
    /// A started frame was not complete within the frame deadline.
    Frame,
}

/// A connection's frame reader. Holds the budget charged for the body of the
/// frame last read until [`PeerReader::next_frame`] is called again or the
/// reader is dropped (by then the caller has dropped that body).
pub struct PeerReader {
    stream: Arc<UnixStream>,
    shared: Arc<Shared>,
    /// `Some` while the Hello is awaited: its absolute deadline.
    hello_deadline: Option<Instant>,
    /// Deadline of the frame being read (set when its first byte arrives).
    frame_deadline: Option<Instant>,
    /// Capacity of the current body buffer.
    held: usize,
    /// Bytes of the current frame received so far, and its announced length.
    received: usize,
    announced: Option<usize>,
    request_id: u32,
    stalled: Option<Stall>,
    /// Bytes received and not yet handed to the frame reader: one `recv` brings
    /// a small frame's header and body together (and may bring the start of
    /// the next frame, kept here for it). `pos..end` is unread.
    buf: Box<[u8]>,
    pos: usize,
    end: usize,
}

/// The receive buffer: a lookup of 32 blocks is about 1 KiB; larger frame
/// bodies are read straight into their own buffer once this one is drained.
const RECV_BUFFER: usize = 8192;

impl PeerReader {
    /// A reader for a fresh connection: the Hello deadline runs from now.
    pub fn new(stream: Arc<UnixStream>, shared: Arc<Shared>) -> PeerReader {
        let hello_deadline = Some(Instant::now() + shared.config.hello_timeout);
        PeerReader {
            stream,
            shared,
            hello_deadline,
            frame_deadline: None,
            held: 0,
            received: 0,
            announced: None,
            request_id: 0,
            stalled: None,
            buf: vec![0; RECV_BUFFER].into_boxed_slice(),
            pos: 0,
            end: 0,
        }
    }

    /// Read the next frame (the first one must be a `Hello`, see the module
    /// documentation). The budget charged for the previous frame is returned first.
    pub fn next_frame(&mut self) -> Result<(Header, Vec<u8>), FrameError> {
        self.release();
        self.frame_deadline = None;
        self.received = 0;
        self.announced = None;
        self.request_id = 0;
        read_frame_guarded(self)
    }

    /// The connection this reader reads (replies are written to it).
    pub fn stream(&self) -> &Arc<UnixStream> {
        &self.stream
    }

    /// The Hello was read: later frames have no deadline until their first byte.
    pub fn hello_done(&mut self) {
        self.hello_deadline = None;
    }

    /// The request id of the frame being read, once its header arrived (0 before).
    pub fn request_id(&self) -> u32 {
        self.request_id
    }

    /// Set when the last read failed at a deadline.
    pub fn stalled(&self) -> Option<Stall> {
        self.stalled
    }

    /// "got X of Y bytes" for the frame being read, for log lines.
    pub fn progress(&self) -> String {
        match self.announced {
            Some(len) => format!("{} of {} bytes", self.received, orbitkv_proto::HEADER_LEN + len),
            None => format!("{} of {} header bytes", self.received, orbitkv_proto::HEADER_LEN),
        }
    }

    fn charged(held: usize) -> usize {
        held.saturating_sub(PER_FRAME_ALLOWANCE)
    }

    fn release(&mut self) {
        let charged = Self::charged(self.held);
        if charged > 0 {
            self.shared.connections().refund_frame_bytes(charged);
        }
        self.held = 0;
    }

    fn deadline(&self) -> Option<(Instant, Stall)> {
        match (self.hello_deadline, self.frame_deadline) {
            (Some(h), _) => Some((h, Stall::Hello)),
            (None, Some(f)) => Some((f, Stall::Frame)),
            (None, None) => None,
        }
    }

    fn timed_out(&mut self, stall: Stall) -> io::Error {
        self.stalled = Some(stall);
        io::Error::new(io::ErrorKind::TimedOut, "deadline passed")
    }
}

impl PeerReader {
    /// One receive from the socket into `buf`, waiting as the deadlines allow.
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some((deadline, stall)) = self.deadline() else {
            // Idle between frames: wait as long as the peer likes (polling
            // first for `--session-spin-us`, when set).
            if let Some(n) = self.spin_recv(buf)? {
                return Ok(n);
            }
            return self.wait_readable_then_recv(buf);
        };
        loop {
            match rustix::net::recv(&*self.stream, &mut *buf, RecvFlags::DONTWAIT) {
                Ok((n, _)) => return Ok(n),
                Err(rustix::io::Errno::AGAIN) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.timed_out(stall));
            }
            let timeout = Timespec::try_from(left.max(Duration::from_millis(1))).unwrap_or(Timespec {
                tv_sec: 1,
                tv_nsec: 0,
            });
            let mut fds = [PollFd::new(&*self.stream, PollFlags::IN)];
            match rustix::event::poll(&mut fds, Some(&timeout)) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Sleep until the socket is readable, then receive. Not a blocking
    /// `recv`: a Unix stream socket's blocking reader also wakes whenever the
    /// peer consumes bytes this side sent (the "write space" wake-up walks the
    /// same wait queue and a blocked `recv` does not filter it), so a session
    /// thread waiting for the next request woke once more per reply. `poll` for
    /// `POLLIN` filters those wake-ups out; measured in docs/performance.md.
    fn wait_readable_then_recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut fds = [PollFd::new(&*self.stream, PollFlags::IN)];
            match rustix::event::poll(&mut fds, None) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
            match rustix::net::recv(&*self.stream, &mut *buf, RecvFlags::DONTWAIT) {
                Ok((n, _)) => return Ok(n),
                Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Poll the socket without sleeping for up to `--session-spin-us`:
    /// `Some(n)` when bytes arrived meanwhile, `None` when the caller should
    /// block (spinning off, or nothing came).
    fn spin_recv(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        let spin = self.shared.config.session_spin;
        if spin.is_zero() {
            return Ok(None);
        }
        let start = Instant::now();
        loop {
            match rustix::net::recv(&*self.stream, &mut *buf, RecvFlags::DONTWAIT) {
                Ok((n, _)) => return Ok(Some(n)),
                Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
            if start.elapsed() >= spin {
                return Ok(None);
            }
            std::hint::spin_loop();
        }
    }
}

impl Read for PeerReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.pos == self.end {
            if out.len() >= self.buf.len() {
                let n = self.recv(out)?;
                self.received += n;
                return Ok(n);
            }
            let mut buf = std::mem::take(&mut self.buf);
            let got = self.recv(&mut buf);
            self.buf = buf;
            (self.pos, self.end) = (0, got?);
        }
        let n = out.len().min(self.end - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        self.received += n;
        Ok(n)
    }
}

impl FrameGuard for PeerReader {
    fn frame_started(&mut self) {
        self.frame_deadline = Some(Instant::now() + self.shared.config.frame_timeout);
    }

    fn check_header(&mut self, header: &Header) -> Result<(), FrameError> {
        self.request_id = header.request_id;
        self.announced = Some(header.len as usize);
        if self.hello_deadline.is_none() {
            return Ok(());
        }
        if header.kind != Kind::Hello as u16 {
            return Err(FrameError::Refused {
                code: ErrorCode::BadFrame,
                message: "first frame must be Hello".into(),
            });
        }
        if header.len as usize > MAX_HELLO_BODY {
            return Err(FrameError::Refused {
                code: ErrorCode::TooLarge,
                message: format!(
                    "Hello of {} bytes exceeds the limit of {MAX_HELLO_BODY}",
                    header.len
                ),
            });
        }
        Ok(())
    }

    fn grow_body(&mut self, bytes: usize) -> Result<(), FrameError> {
        let after = self.held.saturating_add(bytes);
        let charge = Self::charged(after) - Self::charged(self.held);
        if charge > 0 {
            let limit = self.shared.config.max_buffered_bytes;
            self.shared
                .connections()
                .charge_frame_bytes(charge, limit)
                .map_err(|cur| FrameError::Refused {
                    code: ErrorCode::Busy,
                    message: format!(
                        "the Manager cannot buffer this {}-byte frame now: {cur} of its {limit} bytes for \
                         incomplete frames are in use (--max-buffered-bytes); retry later",
                        self.announced.unwrap_or(0)
                    ),
                })?;
        }
        self.held = after;
        Ok(())
    }
}

impl Drop for PeerReader {
    fn drop(&mut self) {
        self.release();
    }
}
