//! Who is on the other end of a Unix socket, and proof that it is gone.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::event::{PollFd, PollFlags};
use rustix::process::{Pid, PidfdFlags};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    /// 0 when the peer's process is not visible in this process's pid namespace.
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

impl PeerCred {
    /// The peer's process is visible here (same pid namespace, or a child one).
    pub fn pid_visible(&self) -> bool {
        self.pid > 0
    }
}

/// What to do when a peer's pid is not visible (`PeerCred::pid == 0`).
pub const PID_NAMESPACE_FIX: &str = "run the Manager and its engines in one pid namespace \
     (Kubernetes: shareProcessNamespace: true in the pod; Docker: --pid container:<manager>, \
     compose pid: \"service:<manager>\"; docs/operations.md, Containers)";

/// `SO_PEERCRED` of a connected Unix stream socket (kernel-verified).
pub fn peer_cred(sock: &UnixStream) -> io::Result<PeerCred> {
    let c = crate::ucred::peercred(sock.as_fd())?;
    Ok(PeerCred {
        pid: c.pid,
        uid: c.uid,
        gid: c.gid,
    })
}

/// The effective uid of this process.
pub fn my_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// A pidfd pins the identity of a process: unlike a pid it cannot be reused,
/// so "readable" is proof that *this* process exited.
#[derive(Debug)]
pub struct ProcessHandle {
    fd: OwnedFd,
}

impl ProcessHandle {
    /// Open a handle for `pid` as seen in this pid namespace.
    pub fn open(pid: i32) -> io::Result<ProcessHandle> {
        let pid = Pid::from_raw(pid).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "pid 0"))?;
        let fd = rustix::process::pidfd_open(pid, PidfdFlags::empty())?;
        Ok(ProcessHandle { fd })
    }

    /// True once the process has exited.
    pub fn exited(&self) -> io::Result<bool> {
        let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
        let n = rustix::event::poll(
            &mut fds,
            Some(&rustix::event::Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            }),
        )?;
        Ok(n > 0 && !fds[0].revents().is_empty())
    }

    pub fn fd(&self) -> impl AsFd + '_ {
        &self.fd
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_cred_and_pidfd() {
        let (a, _b) = UnixStream::pair().expect("pair");
        let c = peer_cred(&a).expect("cred");
        assert_eq!(c.uid, my_uid());
        assert_eq!(c.pid as u32, std::process::id());
        assert!(c.pid_visible());
        let me = ProcessHandle::open(c.pid).expect("pidfd");
        assert!(!me.exited().expect("poll"));
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let h = ProcessHandle::open(child.id() as i32).expect("pidfd");
        child.wait().expect("wait");
        assert!(h.exited().expect("poll"));
    }
}
