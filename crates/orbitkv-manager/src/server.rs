//! The listening socket, accept loop and quarantine reaper.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rustix::event::{PollFd, PollFlags, Timespec};

use crate::session;
use crate::shared::Shared;

const POLL: Timespec = Timespec {
    tv_sec: 0,
    tv_nsec: 100_000_000,
};

/// Bind the Unix socket: parent directory created 0700, stale socket of a dead
/// Manager replaced, a live Manager never displaced, file mode applied.
pub fn bind(path: &Path, mode: u32) -> io::Result<UnixListener> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    if path.exists() {
        match UnixStream::connect(path) {
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("a Manager is already serving on {}", path.display()),
                ));
            }
            Err(_) => std::fs::remove_file(path)?,
        }
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(listener)
}

/// One of the `--max-connections` places, held by a session thread until it ends.
struct ConnectionSlot(Arc<Shared>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::AcqRel);
    }
}

pub fn accept_loop(shared: Arc<Shared>, listener: UnixListener) {
    while !shared.is_shutting_down() {
        let mut fds = [PollFd::new(&listener, PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&POLL)) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => {
                log!(Error, "poll on listener failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        }
        match listener.accept() {
            Ok((stream, _)) => {
                let limit = shared.config.max_connections;
                if shared.connections.fetch_add(1, Ordering::AcqRel) >= limit {
                    shared.connections.fetch_sub(1, Ordering::AcqRel);
                    session::refuse_over_limit(stream, &shared, limit);
                    continue;
                }
                let sh = shared.clone();
                let spawned = std::thread::Builder::new()
                    .name("orbitkv-session".into())
                    .spawn(move || {
                        let _slot = ConnectionSlot(sh.clone()); // freed even if the session panics
                        session::serve_connection(sh, stream);
                    });
                if let Err(e) = spawned {
                    shared.connections.fetch_sub(1, Ordering::AcqRel);
                    log!(Error, "cannot spawn a session thread: {e}");
                }
            }
            Err(e) => log!(Warn, "accept failed: {e}"),
        }
    }
}

/// Release quarantined holds once their process is proven gone.
pub fn reaper(shared: Arc<Shared>) {
    while !shared.is_shutting_down() {
        std::thread::sleep(Duration::from_millis(50));
        let gone: Vec<_> = {
            let mut q = shared.quarantine();
            let mut gone = Vec::new();
            q.retain(|item| {
                let exited = item.process.as_ref().is_some_and(|p| p.exited().unwrap_or(false));
                if exited {
                    gone.push((item.session, item.pid));
                }
                !exited
            });
            gone
        };
        for (s, pid) in gone {
            let _ = shared.cache().process_gone(s);
            log!(Info, "session {} released from quarantine: pid {pid} exited", s.0);
        }
    }
}
