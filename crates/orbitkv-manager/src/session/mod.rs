//! One client connection: authentication, arena hand-off, request loop.
//!
//! This module holds what a connection owns (`Conn`: its reader, its open
//! cache session, ended exactly once, and its `--max-connections` place); each
//! stage of serving it has its own submodule:
//!
//! - `handshake.rs`: peer credentials, the Hello and its token, the arena fds;
//! - `requests.rs`: the request loop (one step per frame, framing failures);
//! - `handlers.rs`: the answer to each kind of request;
//! - `reply.rs`: writing replies, and refusing connections.

mod handlers;
mod handshake;
mod reply;
mod requests;

use std::os::unix::net::UnixStream;
use std::sync::Arc;

use orbitkv_core::{SessionEnd, SessionId};
use orbitkv_shm::peer::ProcessHandle;

use crate::framing::PeerReader;
use crate::parts::{Quarantined, ServerCounters};
use crate::shared::Shared;
pub use handshake::serve_connection;
pub use reply::refuse_over_limit;

/// Who an authenticated session is, as its requests are served.
#[derive(Clone, Copy)]
struct SessionCtx {
    session: SessionId,
    control: bool,
    pid: i32,
    uid: u32,
}

/// One authenticated connection and everything it owns: its reader (and the
/// frame budget it holds), the open cache session (ended exactly once, when
/// this is dropped) and its `--max-connections` place. Its session thread
/// holds it and serves it (`request_loop`).
struct Conn {
    reader: PeerReader,
    ctx: SessionCtx,
    open: OpenSession,
    _slot: ConnectionSlot,
}

impl Conn {
    fn stream(&self) -> &UnixStream {
        self.reader.stream()
    }

    /// End the session this way when this connection is dropped.
    fn ended(&mut self, how: SessionEnd) {
        self.open.how = Some(how);
    }
}

/// One of the `--max-connections` places, held by the connection until it ends.
pub struct ConnectionSlot(pub Arc<Shared>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.connections().give_back_place();
    }
}

/// One open cache session, ended exactly once when this is dropped: as the
/// request loop reported, or as `Vanished` on every other way out, including a
/// panic unwinding the session's thread (a panic proves nothing about drain, so
/// acquired leases and save slots go to quarantine like any vanished client's).
struct OpenSession {
    shared: Arc<Shared>,
    id: SessionId,
    pid: i32,
    process: Option<ProcessHandle>,
    how: Option<SessionEnd>,
}

impl OpenSession {
    fn new(shared: &Arc<Shared>, pid: i32, process: Option<ProcessHandle>) -> OpenSession {
        let id = shared.cache().write().open_session();
        ServerCounters::inc(&shared.counters.sessions_opened);
        OpenSession {
            shared: shared.clone(),
            id,
            pid,
            process,
            how: None,
        }
    }
}

impl Drop for OpenSession {
    fn drop(&mut self) {
        if self.how.is_none() && std::thread::panicking() {
            log!(
                Error,
                "session {} (pid {}): its thread panicked; ending the session as vanished",
                self.id.0,
                self.pid
            );
        }
        let how = self.how.unwrap_or(SessionEnd::Vanished);
        end(&self.shared, self.id, self.pid, self.process.take(), how);
    }
}

fn end(shared: &Shared, session: SessionId, pid: i32, process: Option<ProcessHandle>, how: SessionEnd) {
    if how == SessionEnd::Clean {
        return; // already ended under the lock in the Close handler
    }
    ServerCounters::inc(&shared.counters.sessions_vanished);
    let mut cache = shared.cache().write();
    let _ = cache.end_session(session, SessionEnd::Vanished);
    if cache.is_quarantined(session) {
        drop(cache);
        log!(
            Info,
            "session {} (pid {pid}) vanished holding leases/slots: quarantined until the process is gone",
            session.0
        );
        shared.quarantine().hold(Quarantined {
            session,
            pid,
            process,
        });
    }
}

#[cfg(test)]
mod tests {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    use std::sync::atomic::Ordering;

    use orbitkv_core::{AcquireStep, CacheError, CacheState, Fingerprint, NamespaceKey, NsId};
    use orbitkv_shm::{PageSize, Segment};

    use super::*;
    use crate::config::ManagerConfig;

    const BLOCK: u64 = 4096;

    fn shared() -> Shared {
        let config =
            ManagerConfig::from_argv(["x", "--socket", "/nonexistent/orbitkv-test.sock"]).expect("config");
        let segment = Segment::create("orbitkv-session-test", 4 * BLOCK, PageSize::Base).expect("memfd");
        Shared::new(config, vec![segment], CacheState::new(&[4 * BLOCK]), None)
    }

    /// A session that acquired a lease (source addresses handed out), then its
    /// thread panics: the session is ended and quarantined, not left open.
    #[test]
    fn a_panicking_session_thread_ends_its_session_as_vanished() {
        let shared = Arc::new(shared());
        let pid = std::process::id() as i32;
        let caught = catch_unwind(AssertUnwindSafe(|| {
            let open = OpenSession::new(&shared, pid, None);
            let mut c = shared.cache().write();
            let key = NamespaceKey {
                fingerprint: Fingerprint([3; 32]),
                shard: 0,
                salt: [0; 32],
            };
            let (ns, _) = c.register_namespace(key, BLOCK).expect("namespace");
            let h: [orbitkv_core::BlockHash; 1] = [[5; 32]];
            let (id, _) = c.begin_save(open.id, ns, &h).expect("begin");
            c.commit_save(open.id, id).expect("commit");
            let lease = c.lookup(open.id, ns, &h).expect("lookup").lease.expect("hit");
            assert!(matches!(c.acquire(open.id, lease), Ok(AcquireStep::Ready(_))));
            drop(c);
            panic!("injected: a request handler panicked");
        }));
        assert!(caught.is_err());
        let q = shared.quarantine().sessions();
        assert_eq!(q.len(), 1, "the session went to quarantine");
        let s = q[0];
        assert!(shared.cache().write().is_quarantined(s));
        assert_eq!(shared.counters.sessions_vanished.load(Ordering::Relaxed), 1);
    }

    /// Leaving before the request loop (e.g. the fd hand-off failed) ends the
    /// session too; it holds nothing, so nothing is quarantined.
    #[test]
    fn a_session_left_before_its_loop_is_ended() {
        let shared = Arc::new(shared());
        let id = OpenSession::new(&shared, std::process::id() as i32, None).id;
        assert!(shared.quarantine().sessions().is_empty());
        assert!(matches!(
            shared.cache().write().lookup(id, NsId(1), &[]),
            Err(CacheError::SessionClosed(_) | CacheError::UnknownSession(_))
        ));
    }
}
