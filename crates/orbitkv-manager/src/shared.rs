//! State shared by the Manager's threads, in parts each thread can be handed
//! alone (`crate::parts`): the cache lock ([`Cache`]), the quarantine
//! ([`Quarantine`]), the connection places and frame budget ([`Connections`]),
//! armed faults ([`Faults`]), the stop flag ([`Shutdown`]) and the clock
//! ([`Clock`]).
//!
//! Who gets what: the session threads (and the accept loop that starts them)
//! use the whole [`Shared`]; every other thread's closure keeps it alive but
//! hands the thread only its parts: the policy thread the [`Cache`], the
//! reaper a `server::Reaper`, the SSD worker a `tier::WriteBehind`, the
//! metrics server a `stats::View`, each peer source thread a `peer::Source`
//! (built here, [`Shared`] being its `peer::SourceHost`), the etcd and
//! TP-release threads the `PeerTier`, each with the [`Shutdown`] flag where it
//! polls it.

use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard};

use orbitkv_core::CacheState;
use orbitkv_shm::Segment;

use crate::config::ManagerConfig;
use crate::parts::{Arena, Cache, Clock, Connections, Faults, Quarantine, ServerCounters, Shutdown};
use crate::peer::{Source, SourceHost};
use crate::tier::Tier;

/// Everything the Manager's threads share. The session threads use it whole;
/// every other thread is handed only its parts (see the module documentation).
pub struct Shared {
    pub config: ManagerConfig,
    pub segments: Vec<Segment>,
    cache: Cache,
    /// The tier below DRAM (the SSD), when configured.
    pub tier: Option<Box<dyn Tier>>,
    /// The presence table clients read (None with `--presence-slots off`).
    pub presence: Option<crate::presence::Presence>,
    /// Peer Managers (filled on a local miss; our blocks served to them), when configured.
    pub peers: Option<crate::peer::PeerTier>,
    /// The remote tier (committed blocks written behind; read on a miss after peers), when configured.
    pub remote: Option<crate::remote::RemoteTier>,
    /// The KV-event stream's counters (its publisher thread owns the rest), when `--kv-events` is set.
    pub events: Option<std::sync::Arc<crate::events::EventCounters>>,
    quarantine: Quarantine,
    faults: Faults,
    pub counters: ServerCounters,
    shutdown: Shutdown,
    metrics_addr: Option<SocketAddr>,
    clock: Clock,
    connections: Connections,
    /// `orbitkv trace`: off unless a client arms it.
    tracer: std::sync::Arc<crate::trace::Tracer>,
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
            cache: Cache::new(cache),
            tier,
            presence: None,
            peers: None,
            remote: None,
            events: None,
            quarantine: Quarantine::default(),
            faults: Faults::default(),
            counters: ServerCounters::default(),
            shutdown: Shutdown::default(),
            metrics_addr: None,
            clock: Clock::start(),
            connections: Connections::default(),
            tracer: std::sync::Arc::default(),
            generation_writes: Mutex::new(()),
        }
    }

    /// Serialises generation resets: take it before the bump and hold it until
    /// the table is durable, so a later bump's table is never overwritten by an
    /// earlier one, without holding the cache lock across the fsync.
    pub fn generation_writes(&self) -> MutexGuard<'_, ()> {
        self.generation_writes.lock().unwrap_or_else(|p| p.into_inner())
    }

    #[inline]
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// The cache with the arena's segments.
    #[inline]
    pub fn arena(&self) -> Arena<'_> {
        Arena {
            cache: &self.cache,
            segments: &self.segments,
        }
    }

    pub fn quarantine(&self) -> &Quarantine {
        &self.quarantine
    }

    #[inline]
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    pub fn shutdown(&self) -> &Shutdown {
        &self.shutdown
    }

    pub fn clock(&self) -> Clock {
        self.clock
    }

    pub fn connections(&self) -> &Connections {
        &self.connections
    }

    pub fn tracer(&self) -> &crate::trace::Tracer {
        &self.tracer
    }

    /// Where `/metrics` is served, if it is.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Set before the state is shared: the tracer the cache's visibility sink also tells.
    pub fn set_tracer(&mut self, tracer: std::sync::Arc<crate::trace::Tracer>) {
        self.tracer = tracer;
    }

    /// Set before the state is shared (at start-up, once the endpoint is bound).
    pub fn set_metrics_addr(&mut self, addr: Option<SocketAddr>) {
        self.metrics_addr = addr;
    }

    /// What a stats snapshot reads (`/metrics`, the Stats request).
    pub fn stats(&self) -> crate::stats::View<'_> {
        crate::stats::View {
            cache: &self.cache,
            quarantine: &self.quarantine,
            counters: &self.counters,
            connections: &self.connections,
            tier: self.tier.as_deref(),
            presence: self.presence.as_ref(),
            peers: self.peers.as_ref(),
            remote: self.remote.as_ref(),
            events: self.events.as_deref(),
            segments: &self.segments,
            config: &self.config,
            clock: self.clock,
            metrics_addr: self.metrics_addr,
        }
    }
}

/// Each peer source thread keeps the whole state alive and serves from its
/// [`Source`] part only.
impl SourceHost for Shared {
    fn source(&self) -> Option<Source<'_>> {
        Some(Source {
            peer: self.peers.as_ref()?,
            arena: self.arena(),
            tier: self.tier.as_deref(),
            ssd_read: &self.counters.latency.ssd_read,
            config: &self.config,
            clock: self.clock(),
            shutdown: self.shutdown(),
        })
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

#[cfg(test)]
impl Shared {
    /// A Manager's state for unit tests: `config`, `slots` DRAM slots of
    /// `block` bytes in one segment, the tier `tier` opens on the cache (setting
    /// its SSD bookkeeping up there), one open session and one namespace of
    /// `block`-byte blocks.
    pub(crate) fn for_test(
        config: ManagerConfig,
        slots: u64,
        block: u64,
        tier: impl FnOnce(&mut CacheState) -> Box<dyn Tier>,
    ) -> (Shared, orbitkv_core::SessionId, orbitkv_core::NsId) {
        use orbitkv_core::{Fingerprint, NamespaceKey};
        let segment =
            Segment::create("orbitkv-unit-test", slots * block, orbitkv_shm::PageSize::Base).expect("memfd");
        let mut cache = CacheState::new(&[slots * block]);
        let tier = tier(&mut cache);
        let s = cache.open_session();
        let key = NamespaceKey {
            fingerprint: Fingerprint([7; 32]),
            shard: 0,
            salt: [0; 32],
        };
        let (ns, _) = cache.register_namespace(key, block).expect("namespace");
        (Shared::new(config, vec![segment], cache, Some(tier)), s, ns)
    }
}
