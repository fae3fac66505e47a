//! State shared by the Manager's threads.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;
use std::time::Instant;

use orbitkv_core::{CacheState, SessionId};
use orbitkv_shm::Segment;
use orbitkv_shm::peer::ProcessHandle;

use crate::config::ManagerConfig;
use crate::tier::Tier;

/// Server-level counters (the cache's own counters live in `CacheState`).
#[derive(Debug, Default)]
pub struct ServerCounters {
    pub sessions_opened: AtomicU64,
    pub sessions_closed_clean: AtomicU64,
    pub sessions_vanished: AtomicU64,
    pub auth_refused: AtomicU64,
    pub bad_frames: AtomicU64,
    pub restore_failures_injected: AtomicU64,
    pub commit_failures_injected: AtomicU64,
    pub leases_acquired: AtomicU64,
    pub connections_refused: AtomicU64,
    pub hello_timeouts: AtomicU64,
    pub frame_timeouts: AtomicU64,
    pub frame_buffer_refusals: AtomicU64,
    /// Leases named by `ReleaseQuiet` requests, and those the Manager could
    /// not release (already ended; nobody is waiting for an answer).
    pub quiet_releases: AtomicU64,
    pub quiet_release_failures: AtomicU64,
}

impl ServerCounters {
    /// Count one more; returns the new total (for [`crate::log::warn_sampled`]).
    pub fn inc(c: &AtomicU64) -> u64 {
        c.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// A session held in quarantine until its process is proven gone.
#[derive(Debug)]
pub struct Quarantined {
    pub session: SessionId,
    pub pid: i32,
    /// `None` when the pid could not be opened (e.g. another pid namespace):
    /// such holds stay until the Manager restarts; reported in metrics.
    pub process: Option<ProcessHandle>,
}

pub struct Shared {
    pub config: ManagerConfig,
    pub segments: Vec<Segment>,
    /// The cache lock: shared for the common case of lookup, acquire and
    /// release ([`Shared::cache_shared`]), exclusive for everything else
    /// ([`Shared::cache`]).
    cache: RwLock<CacheState>,
    /// Bumped and signalled whenever staging reads finish (acquires waiting
    /// on a block another lease is staging wake up); see [`Shared::wait_staged`].
    staged: (Mutex<u64>, Condvar),
    /// The tier below DRAM (the SSD), when configured.
    pub tier: Option<Box<dyn Tier>>,
    /// The presence table clients read (None with `--presence-slots off`).
    pub presence: Option<crate::presence::Presence>,
    /// Peer Managers (filled on a local miss; our blocks served to them), when configured.
    pub peers: Option<crate::peer::PeerTier>,
    pub quarantine: Mutex<Vec<Quarantined>>,
    pub restore_faults: AtomicU32,
    pub commit_faults: AtomicU32,
    pub counters: ServerCounters,
    pub shutdown: AtomicBool,
    pub metrics_addr: Mutex<Option<SocketAddr>>,
    pub started: Instant,
    /// Connections with a live session thread (bounded by `max_connections`).
    pub connections: AtomicUsize,
    /// Bytes of incomplete frame bodies charged to `--max-buffered-bytes`
    /// (see `framing::PeerReader`).
    pub frame_buffer_bytes: AtomicUsize,
    /// Held by a generation reset from its bump to the end of its fsync, so the
    /// generations file is written in the order of the bumps while the cache
    /// lock is free for everyone else during the fsync ([`Shared::generation_writes`]).
    generation_writes: Mutex<()>,
}

impl Shared {
    pub fn new(
        config: ManagerConfig,
        segments: Vec<Segment>,
        cache: CacheState,
        tier: Option<Box<dyn Tier>>,
    ) -> Shared {
        Shared {
            config,
            segments,
            cache: RwLock::new(cache),
            staged: (Mutex::new(0), Condvar::new()),
            tier,
            presence: None,
            peers: None,
            quarantine: Mutex::new(Vec::new()),
            restore_faults: AtomicU32::new(0),
            commit_faults: AtomicU32::new(0),
            counters: ServerCounters::default(),
            shutdown: AtomicBool::new(false),
            metrics_addr: Mutex::new(None),
            started: Instant::now(),
            connections: AtomicUsize::new(0),
            frame_buffer_bytes: AtomicUsize::new(0),
            generation_writes: Mutex::new(()),
        }
    }

    /// Serialises generation resets: take it before the bump and hold it until
    /// the table is durable, so a later bump's table is never overwritten by an
    /// earlier one, without holding the cache lock across the fsync.
    pub fn generation_writes(&self) -> MutexGuard<'_, ()> {
        self.generation_writes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cache lock, exclusive. The policy first catches up with the hits
    /// of lookups made under the shared lock (`CacheState::apply_touches`), so
    /// every decision made under this guard sees them. A panic while holding
    /// the lock is a Manager bug; the state is still consistent at every
    /// `CacheState` method boundary, so recover it.
    pub fn cache(&self) -> RwLockWriteGuard<'_, CacheState> {
        let mut g = self.cache.write().unwrap_or_else(|p| p.into_inner());
        g.apply_touches();
        g
    }

    /// The cache lock, shared: only for `CacheState`'s `&self` operations
    /// (`lookup_shared`, `try_acquire_shared`, `try_release_shared`, status).
    /// Many sessions hold it at once; a preempted holder stalls no other reader.
    pub fn cache_shared(&self) -> RwLockReadGuard<'_, CacheState> {
        self.cache.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Give up the exclusive `cache` guard and wait (up to 100 ms) until a
    /// staging read finishes. The epoch is read before the guard is dropped,
    /// and stagers bump it after updating the cache, so no wake-up is lost.
    pub fn wait_staged(&self, cache: RwLockWriteGuard<'_, CacheState>) {
        let (m, cv) = &self.staged;
        let seen = *m.lock().unwrap_or_else(|p| p.into_inner());
        drop(cache);
        let g = m.lock().unwrap_or_else(|p| p.into_inner());
        let _unused = cv.wait_timeout_while(g, Duration::from_millis(100), |epoch| *epoch == seen);
    }

    /// Staging reads finished (after their results are in the cache).
    pub fn notify_staged(&self) {
        let (m, cv) = &self.staged;
        *m.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        cv.notify_all();
    }

    pub fn quarantine(&self) -> MutexGuard<'_, Vec<Quarantined>> {
        self.quarantine.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutdown.load(Ordering::Relaxed)
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("socket", &self.config.socket)
            .field("segments", &self.segments.len())
            .field("tier", &self.tier.as_ref().map(|t| t.status().engine))
            .finish_non_exhaustive()
    }
}
