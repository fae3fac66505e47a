//! The session's socket: handshake with fd receipt, then request/reply.

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use orbitkv_proto::{
    ErrorCode, FrameError, HEADER_LEN, Header, Request, Response, decode_response, read_frame, write_frame,
};
use orbitkv_shm::Mapping;
use orbitkv_shm::fdpass::recv_with_fds;

use crate::ClientError;

/// An open connection, its session id and the mapped arena segments.
pub(crate) type Opened = (Conn, u64, Vec<SegmentView>);

/// One arena segment as the Manager announced it; mapped unless control-only.
#[derive(Debug)]
pub(crate) struct SegmentView {
    pub(crate) id: u32,
    pub(crate) size: u64,
    pub(crate) mapping: Option<Mapping>,
}

#[derive(Debug)]
struct Inner {
    stream: UnixStream,
    next_id: u32,
    broken: bool,
}

#[derive(Debug)]
pub(crate) struct Conn {
    inner: Mutex<Inner>,
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

impl Conn {
    /// Connect and authenticate. With `map_arena` false the session is opened
    /// control-only (`HELLO_CONTROL_ONLY`): the Manager passes no arena fds.
    pub(crate) fn open(
        path: &Path,
        token: Option<&[u8]>,
        timeout: Duration,
        map_arena: bool,
    ) -> Result<Opened, ClientError> {
        let mut stream = UnixStream::connect(path).map_err(|e| {
            ClientError::Unavailable(format!(
                "cannot connect to {}: {e} (is `orbitkv serve` running?)",
                path.display()
            ))
        })?;
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

        let mut raw = [0u8; HEADER_LEN];
        let mut fds = recv_with_fds(&stream, &mut raw).map_err(|e| {
            ClientError::Unavailable(format!("handshake with {} failed: {e}", path.display()))
        })?;
        let header = Header::decode(&raw).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let mut body = vec![0u8; header.len as usize];
        if !body.is_empty() {
            fds.extend(
                recv_with_fds(&stream, &mut body).map_err(|e| ClientError::Unavailable(e.to_string()))?,
            );
        }
        let resp = decode_response(header.kind, &body).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let (session, segments) = match resp {
            Response::HelloOk { session, segments } => (session, segments),
            Response::Error { code, message } => return Err(refusal(code, message)),
            other => {
                return Err(ClientError::Protocol(format!(
                    "expected HelloOk, got {:?}",
                    other.kind()
                )));
            }
        };
        let expected_fds = if map_arena { segments.len() } else { 0 };
        if fds.len() != expected_fds {
            return Err(ClientError::Protocol(format!(
                "Manager announced {} segment(s) and passed {} fd(s); expected {expected_fds}",
                segments.len(),
                fds.len()
            )));
        }
        let mut maps = Vec::with_capacity(segments.len());
        for (info, fd) in segments.iter().zip(fds) {
            maps.push(SegmentView {
                id: info.id,
                size: info.size,
                mapping: Some(Mapping::map(&fd, info.size, false)?),
            });
        }
        if !map_arena {
            // A control-only session: the Manager passed no fds at all.
            maps.extend(segments.iter().map(|info| SegmentView {
                id: info.id,
                size: info.size,
                mapping: None,
            }));
        }
        Ok((
            Conn {
                inner: Mutex::new(Inner {
                    stream,
                    next_id: 2,
                    broken: false,
                }),
            },
            session,
            maps,
        ))
    }

    pub(crate) fn call(&self, req: &Request) -> Result<Response, ClientError> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if g.broken {
            return Err(ClientError::Unavailable(
                "connection to the Manager is broken".into(),
            ));
        }
        let id = g.next_id;
        g.next_id = g.next_id.wrapping_add(1);
        let r = (|| {
            write_frame(&mut g.stream, req.kind() as u16, id, &req.encode()).map_err(io_err)?;
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

    pub(crate) fn shutdown(&self) {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let _ = g.stream.shutdown(std::net::Shutdown::Both);
    }
}
