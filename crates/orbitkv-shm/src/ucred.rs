//! `SO_PEERCRED` read as the kernel writes it. The kernel reports pid 0 for a peer
//! whose process is not visible in this process's pid namespace (a Manager and an
//! engine in separate containers); rustix's `UCred` holds a non-zero `Pid` and
//! cannot represent that, so the raw `ucred` is read here.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `ucred` of the peer: `pid` 0 when its process is outside this pid namespace.
pub(crate) struct RawCred {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

pub(crate) fn peercred(fd: BorrowedFd<'_>) -> io::Result<RawCred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let size = std::mem::size_of::<libc::ucred>();
    let mut len = size as libc::socklen_t;
    // SAFETY: `fd` is an open descriptor borrowed for the call; `cred` is a live,
    // writable, properly aligned `ucred` of `len` bytes, and the kernel writes at
    // most `len` bytes into it and stores the length it wrote in `len`.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if len as usize != size {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("SO_PEERCRED wrote {len} bytes, expected {size}"),
        ));
    }
    Ok(RawCred {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}
