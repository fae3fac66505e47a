//! Passing file descriptors over Unix stream sockets (`SCM_RIGHTS`).

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags,
};

/// Most fds one message may carry.
pub const MAX_FDS: usize = 64;

/// Send `data` with `fds` attached to its first byte. Loops until all of
/// `data` is written (the fds go with the first chunk only).
pub fn send_with_fds(sock: &UnixStream, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many fds"));
    }
    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !anc.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("ancillary buffer too small"));
    }
    let mut sent = rustix::net::sendmsg(sock, &[IoSlice::new(data)], &mut anc, SendFlags::NOSIGNAL)?;
    while sent < data.len() {
        let n = rustix::net::send(sock, &data[sent..], SendFlags::NOSIGNAL)?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        sent += n;
    }
    Ok(())
}

/// Receive exactly `buf.len()` bytes; collect fds arriving with them (close-on-exec).
/// Fails if the kernel truncated the control data (fds would be lost).
pub fn recv_with_fds(sock: &UnixStream, buf: &mut [u8]) -> io::Result<Vec<OwnedFd>> {
    let mut fds = Vec::new();
    let mut got = 0;
    while got < buf.len() {
        let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut anc = RecvAncillaryBuffer::new(&mut space);
        let msg = rustix::net::recvmsg(
            sock,
            &mut [IoSliceMut::new(&mut buf[got..])],
            &mut anc,
            RecvFlags::CMSG_CLOEXEC,
        )?;
        if msg.flags.contains(rustix::net::ReturnFlags::CTRUNC) {
            return Err(io::Error::other("control data truncated: file descriptors lost"));
        }
        for m in anc.drain() {
            if let RecvAncillaryMessage::ScmRights(rights) = m {
                fds.extend(rights);
            }
        }
        if msg.bytes == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        got += msg.bytes;
    }
    Ok(fds)
}
