//! The listening socket, accept loop and quarantine reaper.

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustix::event::{PollFd, PollFlags, Timespec};

use crate::parts::{Cache, Clock, Quarantine, Shutdown};
use crate::peer::PeerTier;
use crate::session;
use crate::shared::Shared;

const POLL: Timespec = Timespec {
    tv_sec: 0,
    tv_nsec: 100_000_000,
};

/// Bind the Unix socket in a private directory (created 0700; an existing one
/// must be ours and writable by nobody else), replacing only a stale socket of
/// a dead Manager: a live Manager is never displaced and anything that is not
/// a socket is never deleted. The socket gets `mode`.
pub fn bind(path: &Path, mode: u32) -> io::Result<UnixListener> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    private_dir(dir)?;
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
        Ok(m) if m.file_type().is_socket() => match UnixStream::connect(path) {
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("a Manager is already serving on {}", path.display()),
                ));
            }
            // Nobody listens: the socket of a Manager that died.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => std::fs::remove_file(path)?,
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "{} is a socket that cannot be probed ({e}); remove it if no Manager uses it",
                        path.display()
                    ),
                ));
            }
        },
        Ok(m) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{} exists and is {}, not a socket; it was left untouched: remove it or choose another --socket",
                    path.display(),
                    kind_of(&m)
                ),
            ));
        }
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(listener)
}

fn kind_of(m: &std::fs::Metadata) -> &'static str {
    let t = m.file_type();
    if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_symlink() {
        "a symbolic link"
    } else if t.is_fifo() {
        "a FIFO"
    } else {
        "a device or other special file"
    }
}

/// Make sure `dir` is a directory only this uid can change: created 0700 if
/// absent (its ancestors with default modes), refused if it is a symlink, is
/// owned by another uid, or is writable by group or others. Another local
/// user who could write there could replace the socket and collect the
/// tokens of every client.
fn private_dir(dir: &Path) -> io::Result<()> {
    if let Some(up) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(up)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    // lstat: a symlink is judged itself, never through its target.
    let m = std::fs::symlink_metadata(dir)?;
    let me = orbitkv_shm::peer::my_uid();
    let d = dir.display();
    let private = "choose a --socket in a directory of your own that only you can write (mode 0700)";
    let problem = if m.file_type().is_symlink() {
        Some(format!(
            "is a symbolic link; name the real directory in --socket, or {private}"
        ))
    } else if !m.is_dir() {
        Some(format!("is {}, not a directory; {private}", kind_of(&m)))
    } else if m.mode() & 0o022 != 0 && m.mode() & 0o1000 != 0 {
        Some(format!(
            "is a shared directory (mode {:04o}, like /tmp); {private}",
            m.mode() & 0o7777
        ))
    } else if m.uid() != me {
        Some(format!(
            "is owned by uid {}, not by this Manager's uid {me}; remove it (check what it holds first) \
             or {private}",
            m.uid()
        ))
    } else if m.mode() & 0o022 != 0 {
        Some(format!(
            "is writable by group or others (mode {:04o}); run `chmod 700 {d}` or {private}",
            m.mode() & 0o7777
        ))
    } else {
        None
    };
    match problem {
        None => Ok(()),
        Some(p) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("unsafe socket directory {d}: it {p}"),
        )),
    }
}

pub fn accept_loop(shared: Arc<Shared>, listener: UnixListener) {
    while !shared.shutdown().requested() {
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
                if !shared.connections().try_take_place(limit) {
                    session::refuse_over_limit(stream, &shared.counters, limit);
                    continue;
                }
                let sh = shared.clone();
                let spawned = std::thread::Builder::new()
                    .name("orbitkv-session".into())
                    .spawn(move || {
                        // The place is freed with the connection, even if its session panics.
                        let slot = session::ConnectionSlot(sh.clone());
                        session::serve_connection(sh, stream, slot);
                    });
                if let Err(e) = spawned {
                    shared.connections().give_back_place();
                    log!(Error, "cannot spawn a session thread: {e}");
                }
            }
            Err(e) => log!(Warn, "accept failed: {e}"),
        }
    }
}

/// What the reaper reads and ends: quarantined sessions, and TP leases (here
/// and, through the peer tier, on the peers holding their parts).
#[derive(Clone, Copy)]
pub struct Reaper<'a> {
    pub quarantine: &'a Quarantine,
    pub cache: &'a Cache,
    pub peers: Option<&'a PeerTier>,
    pub clock: Clock,
    pub shutdown: &'a Shutdown,
}

/// Release quarantined holds once their process is proven gone; end TP leases
/// and retention hints past their deadline.
pub fn reaper(r: Reaper<'_>) {
    while !r.shutdown.requested() {
        std::thread::sleep(Duration::from_millis(50));
        for (s, pid) in r.quarantine.take_exited() {
            let _ = r.cache.write().process_gone(s);
            log!(Info, "session {} released from quarantine: pid {pid} exited", s.0);
        }
        let now = r.clock.now_ms();
        crate::tp::expire(r.cache, r.peers, now);
        // Kept blocks past their deadline return to the policy; the exclusive
        // lock only when one is due.
        if r.cache.read().hint_expiry_due(now) {
            r.cache.write().expire_hints(now);
        }
    }
}

/// How often the policy thread replays the lookups' touch log.
const POLICY_REPLAY: Duration = Duration::from_millis(1);

/// Replay the touches logged by shared-lock lookups into the eviction policy
/// every millisecond, so lookups never do it themselves (a replay of a few
/// dozen 32-block chains is tens of microseconds of policy work, which set the
/// p99 of the lookup that drew it). Lookups replay only when this thread falls
/// far behind; the exclusive lock's holder replays what is left first.
pub fn policy_replay(cache: &Cache, shutdown: &Shutdown) {
    while !shutdown.requested() {
        std::thread::sleep(POLICY_REPLAY);
        let cache = cache.read();
        if cache.touches_pending() > 0 {
            cache.apply_touches_shared(true);
        }
    }
}
