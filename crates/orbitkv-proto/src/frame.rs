//! Frame header and blocking frame I/O.

use std::io::{self, Read, Write};

use crate::PROTOCOL_VERSION;

pub const MAGIC: [u8; 4] = *b"OKV\x01";
pub const HEADER_LEN: usize = 16;
/// Largest body accepted (a lookup of `MAX_HASHES` hashes fits with room).
pub const MAX_BODY: usize = 4 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub version: u16,
    pub kind: u16,
    pub len: u32,
    pub request_id: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("bad magic {0:02x?}: not an OrbitKV peer")]
    BadMagic([u8; 4]),
    #[error("protocol version {0} not supported (this build speaks {PROTOCOL_VERSION})")]
    Version(u16),
    #[error("frame body of {0} bytes exceeds the limit of {MAX_BODY}")]
    TooLarge(u32),
    #[error("connection closed")]
    Closed,
    /// Refused by a [`FrameGuard`] (the reader's limits), with the error code
    /// to answer and why.
    #[error("{message}")]
    Refused { code: crate::ErrorCode, message: String },
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..4].copy_from_slice(&MAGIC);
        h[4..6].copy_from_slice(&self.version.to_le_bytes());
        h[6..8].copy_from_slice(&self.kind.to_le_bytes());
        h[8..12].copy_from_slice(&self.len.to_le_bytes());
        h[12..16].copy_from_slice(&self.request_id.to_le_bytes());
        h
    }

    /// Validate a raw header. The version is checked so that a peer from the
    /// future gets a clear error instead of a misparse.
    pub fn decode(raw: &[u8; HEADER_LEN]) -> Result<Header, FrameError> {
        let magic = [raw[0], raw[1], raw[2], raw[3]];
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        let version = u16::from_le_bytes([raw[4], raw[5]]);
        let kind = u16::from_le_bytes([raw[6], raw[7]]);
        let len = u32::from_le_bytes([raw[8], raw[9], raw[10], raw[11]]);
        let request_id = u32::from_le_bytes([raw[12], raw[13], raw[14], raw[15]]);
        if version != PROTOCOL_VERSION {
            return Err(FrameError::Version(version));
        }
        if len as usize > MAX_BODY {
            return Err(FrameError::TooLarge(len));
        }
        Ok(Header {
            version,
            kind,
            len,
            request_id,
        })
    }
}

/// Capacity a frame body starts with (or its length, if smaller); it then
/// doubles as bytes arrive, so a peer that announces a large body and sends
/// little of it holds little memory.
pub const FIRST_BODY_CHUNK: usize = 64 << 10;

/// Limits applied while a frame arrives from an untrusted peer: a reader
/// implementing it (with [`read_frame_guarded`]) learns when a frame starts,
/// may refuse a header before any body byte is buffered, and is asked before
/// every growth of the body buffer.
pub trait FrameGuard {
    /// The first byte of a frame has arrived (a per-frame deadline starts here).
    fn frame_started(&mut self) {}
    /// The header is valid; refuse it here to buffer none of its body.
    fn check_header(&mut self, _header: &Header) -> Result<(), FrameError> {
        Ok(())
    }
    /// The body buffer is about to grow by `bytes` of capacity. An error
    /// refuses the frame (the buffer is dropped, nothing more is read).
    fn grow_body(&mut self, _bytes: usize) -> Result<(), FrameError> {
        Ok(())
    }
}

/// A reader with no limits beyond [`MAX_BODY`].
struct Unguarded<'a, R: ?Sized>(&'a mut R);

impl<R: Read + ?Sized> Read for Unguarded<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl<R: ?Sized> FrameGuard for Unguarded<'_, R> {}

/// Read one frame. `Closed` on a clean EOF before the first header byte.
/// The body buffer grows as bytes arrive (see [`FIRST_BODY_CHUNK`]).
pub fn read_frame<R: Read + ?Sized>(r: &mut R) -> Result<(Header, Vec<u8>), FrameError> {
    read_frame_guarded(&mut Unguarded(r))
}

/// Read one frame from `r`, applying its [`FrameGuard`] limits. The body
/// buffer's capacity is at most twice the bytes received (and at least
/// [`FIRST_BODY_CHUNK`]), never the announced length up front.
pub fn read_frame_guarded<R: Read + FrameGuard + ?Sized>(r: &mut R) -> Result<(Header, Vec<u8>), FrameError> {
    let mut raw = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match r.read(&mut raw[got..]) {
            Ok(0) if got == 0 => return Err(FrameError::Closed),
            Ok(0) => return Err(FrameError::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => {
                if got == 0 {
                    r.frame_started();
                }
                got += n;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let header = Header::decode(&raw)?;
    r.check_header(&header)?;
    let len = header.len as usize;
    let mut body: Vec<u8> = Vec::new();
    while body.len() < len {
        let filled = body.len();
        if filled == body.capacity() {
            let target = len.min((2 * filled).max(FIRST_BODY_CHUNK));
            r.grow_body(target - body.capacity())?;
            body.try_reserve_exact(target - filled)
                .map_err(|e| FrameError::Io(io::Error::new(io::ErrorKind::OutOfMemory, e)))?;
        }
        let end = body.capacity().min(len);
        body.resize(end, 0);
        match r.read(&mut body[filled..end]) {
            Ok(0) => return Err(FrameError::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => body.truncate(filled + n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => body.truncate(filled),
            Err(e) => return Err(e.into()),
        }
    }
    Ok((header, body))
}

/// Write one frame (header + body) with a single buffered write.
pub fn write_frame(w: &mut impl Write, kind: u16, request_id: u32, body: &[u8]) -> Result<(), FrameError> {
    let len = u32::try_from(body.len()).map_err(|_| FrameError::TooLarge(u32::MAX))?;
    if body.len() > MAX_BODY {
        return Err(FrameError::TooLarge(len));
    }
    let mut buf = Vec::with_capacity(HEADER_LEN + body.len());
    buf.extend_from_slice(
        &Header {
            version: PROTOCOL_VERSION,
            kind,
            len,
            request_id,
        }
        .encode(),
    );
    buf.extend_from_slice(body);
    w.write_all(&buf)?;
    Ok(())
}
