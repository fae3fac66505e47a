//! The OrbitKV Manager: one per host.
//!
//! Threads: an accept loop on the Unix socket, one thread per session, a
//! quarantine reaper, and the loopback metrics endpoint. Cache policy lives in
//! `orbitkv_core::CacheState` behind one mutex; this crate adds I/O only.
#![deny(unsafe_code)] // allowed only in `tier/ssd.rs` and `tier/peer_slots.rs`, for arena slices handed to the SSD engine and to peer transfers, `checksum.rs`, for AVX2 intrinsics, and `malloc.rs`, for `mallopt`

pub mod checksum;
pub mod config;
mod events;
mod framing;
mod latency;
pub mod limits;
#[macro_use]
pub mod log;
mod malloc;
mod memory;
mod metrics;
mod parts;
mod peer;
mod presence;
mod remote;
mod server;
mod session;
mod shared;
mod stats;
mod tier;
mod tp;
mod trace;
mod visibility;

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;

pub use config::{ConfigError, ManagerConfig};
use orbitkv_shm::Segment;
use shared::Shared;

#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("creating the DRAM arena: {0}")]
    Arena(#[from] orbitkv_shm::ShmError),
    #[error("binding {path}: {err}")]
    Bind { path: PathBuf, err: std::io::Error },
    #[error("binding the metrics endpoint {addr}: {err}")]
    Metrics { addr: SocketAddr, err: std::io::Error },
    #[error("opening the SSD tier: {0}")]
    Ssd(#[from] orbitkv_ssd::SsdError),
    #[error(transparent)]
    Presence(#[from] presence::PresenceError),
    #[error("peer tier: {0}")]
    Peer(String),
    #[error("binding the peer listener {addr}: {err}")]
    PeerBind { addr: SocketAddr, err: std::io::Error },
    #[error(transparent)]
    Remote(#[from] orbitkv_remote::store::RemoteError),
    #[error(transparent)]
    Events(#[from] events::EventsError),
    #[error("starting a thread: {0}")]
    Thread(std::io::Error),
}

/// A running Manager. Dropping it does not stop it; call [`Manager::shutdown`].
#[derive(Debug)]
pub struct Manager {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Manager {
    pub fn start(config: ManagerConfig) -> Result<Manager, ManagerError> {
        log::set_level(config.log_level);
        log::set_format(config.log_format);
        let sizes = config.segment_sizes();
        let limits = limits::check(sizes.len() as u64, config.max_connections as u64)?;
        if let Some(free) = config.page_size.free_pages() {
            // Fail before creating anything, with the whole arena's need in the message.
            let needed = config.dram_size / config.page_size.bytes();
            if free < needed {
                return Err(orbitkv_shm::ShmError::HugePages {
                    size: config.dram_size,
                    page: config.page_size,
                    needed,
                    free,
                    path: config.page_size.free_pages_path().unwrap_or_default(),
                }
                .into());
            }
        }
        if config.page_size == orbitkv_shm::PageSize::Base
            && let Some(warning) = memory::MemoryRoom::read().check(config.dram_size)?
        {
            log!(Warn, "{warning}");
        }
        let started = std::time::Instant::now();
        let threads = orbitkv_shm::populate_threads();
        let segments = Segment::create_arena("orbitkv-arena", &sizes, config.page_size, threads)?;
        let took = started.elapsed().as_secs_f64();
        log!(
            Info,
            "arena: {} bytes in {} segment(s) of {} pages, populated on {threads} threads in {took:.2} s \
             ({:.1} GB/s); fd limit {}, vm.max_map_count {}",
            config.dram_size,
            segments.len(),
            config.page_size,
            config.dram_size as f64 / took.max(1e-9) / 1e9,
            limits.nofile,
            limits.max_map_count.map_or("unknown".into(), |m| m.to_string())
        );
        let listener =
            server::bind(&config.socket, config.socket_mode).map_err(|err| ManagerError::Bind {
                path: config.socket.clone(),
                err,
            })?;
        let metrics = match config.metrics_addr {
            Some(addr) => Some(TcpListener::bind(addr).map_err(|err| ManagerError::Metrics { addr, err })?),
            None => None,
        };
        let sizes: Vec<u64> = segments.iter().map(|s| s.size()).collect();
        let mut cache =
            orbitkv_core::CacheState::with_policy_seed(&sizes, config.cache_policy, config.cache_policy_seed);
        let dram_bytes: u64 = sizes.iter().sum();
        cache.set_retention_cap((dram_bytes as f64 * config.retain_share) as u64);
        let below: Option<Box<dyn tier::Tier>> = match &config.ssd {
            Some(settings) => Some(Box::new(tier::open(settings, &mut cache)?)),
            None => None,
        };
        let (presence, publisher) = match config.presence_slots {
            0 => (None, None),
            slots => {
                let (p, sink) = presence::Presence::start(slots)?;
                (Some(p), Some(sink))
            }
        };
        let tracer = std::sync::Arc::new(trace::Tracer::default());
        let (events, event_sink, event_counters) = match &config.events {
            Some(e) => {
                let (p, sink, counters) = events::Publisher::bind(e)?;
                (Some(p), Some(sink), Some(counters))
            }
            None => (None, None, None),
        };
        cache.set_presence_sink(Box::new(visibility::Visibility {
            presence: publisher,
            events: event_sink,
            tracer: tracer.clone(),
        }));
        let peers = match &config.peers {
            Some(p) => {
                Some(peer::PeerTier::new(p.clone(), config.allow_uids.clone()).map_err(ManagerError::Peer)?)
            }
            None => None,
        };
        let remote = match &config.remote {
            Some(r) => {
                cache.set_remote_admit_hits(r.admit_hits);
                Some(remote::RemoteTier::open(r)?)
            }
            None => None,
        };
        let mut shared = Shared::new(config, segments, cache, below);
        shared.set_tracer(tracer);
        shared.presence = presence;
        shared.peers = peers;
        shared.remote = remote;
        shared.events = event_counters;
        shared.set_metrics_addr(metrics.as_ref().and_then(|m| m.local_addr().ok()));
        let shared = Arc::new(shared);
        let mut threads = Vec::new();
        let spawn = |name: &str, f: Job| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(f)
                .map_err(ManagerError::Thread)
        };
        // Each service thread gets only its parts of `shared` (its handle
        // keeps the whole alive); see `shared.rs`.
        let service = |name: &str, f: Box<dyn FnOnce(Arc<Shared>) + Send>| {
            let sh = shared.clone();
            spawn(name, Box::new(move || f(sh)))
        };
        if let Some(m) = metrics {
            threads.push(service(
                "orbitkv-metrics",
                Box::new(move |sh| metrics::serve(&sh.stats(), sh.shutdown(), m)),
            )?);
        }
        threads.push(service(
            "orbitkv-accept",
            Box::new(move |sh| server::accept_loop(sh, listener)),
        )?);
        threads.push(service(
            "orbitkv-reaper",
            Box::new(|sh| {
                server::reaper(server::Reaper {
                    quarantine: sh.quarantine(),
                    cache: sh.cache(),
                    peers: sh.peers.as_ref(),
                    clock: sh.clock(),
                    shutdown: sh.shutdown(),
                })
            }),
        )?);
        if let Some(p) = events {
            threads.push(service(
                "orbitkv-events",
                Box::new(move |sh| p.run(sh.cache(), sh.shutdown())),
            )?);
        }
        threads.push(service(
            "orbitkv-policy",
            Box::new(|sh| server::policy_replay(sh.cache(), sh.shutdown())),
        )?);
        if shared.tier.is_some() {
            threads.push(service(
                "orbitkv-ssd",
                Box::new(|sh| {
                    if let Some(tier) = sh.tier.as_deref() {
                        tier::worker(
                            tier::WriteBehind {
                                arena: sh.arena(),
                                tier,
                            },
                            sh.shutdown(),
                            &sh.counters.latency.ssd_write,
                        );
                    }
                }),
            )?);
        }
        if shared.remote.is_some() {
            threads.push(service(
                "orbitkv-remote",
                Box::new(|sh| {
                    if let Some(r) = sh.remote.as_ref() {
                        remote::writer(
                            r,
                            sh.arena(),
                            sh.tier.as_deref(),
                            &sh.counters.latency.ssd_read,
                            sh.shutdown(),
                        );
                    }
                }),
            )?);
        }
        let mut peer_threads = Vec::new();
        let mut peer_spawn = |name: &str, f: Job| peer_threads.push(spawn(name, f));
        start_peers(&shared, &mut peer_spawn).map_err(|err| ManagerError::PeerBind {
            addr: shared
                .config
                .peers
                .as_ref()
                .and_then(|p| p.listen)
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0))),
            err,
        })?;
        for t in peer_threads {
            threads.push(t?);
        }
        log!(
            Info,
            "serving on {} (arena {} bytes in {} segment(s), cache policy {}; metrics {})",
            shared.config.socket.display(),
            shared.config.dram_size,
            shared.segments.len(),
            shared.config.cache_policy,
            shared
                .metrics_addr()
                .map_or("off".to_string(), |a| format!("http://{a}/metrics"))
        );
        Ok(Manager { shared, threads })
    }

    pub fn socket_path(&self) -> &std::path::Path {
        &self.shared.config.socket
    }

    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.shared.metrics_addr()
    }

    /// Stop accepting, remove the socket file and join the service threads.
    /// Session threads end with their connections (or the process).
    pub fn shutdown(mut self) {
        self.shared.shutdown().request();
        if let Some(p) = &self.shared.presence {
            p.close(); // clients still mapping it must not trust it any more
        }
        if let Some(addr) = self.metrics_addr() {
            let _ = std::net::TcpStream::connect(addr); // wake the blocking accept
        }
        if let Some(p) = &self.shared.peers {
            peer::wake_listener(p); // and the peer listener; closes peer connections
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.shared.config.socket);
        log!(Info, "stopped");
    }
}

/// A thread body, handed to a spawner that starts it under a name.
type Job = Box<dyn FnOnce() + Send>;

/// Start the peer listener and the etcd membership and TP-release threads, as
/// configured. Each thread keeps `shared` alive and is handed only its parts:
/// every peer connection's thread its `peer::Source`, the others the
/// `PeerTier` and the [`parts::Shutdown`] flag.
fn start_peers(shared: &Arc<Shared>, spawn: &mut dyn FnMut(&str, Job)) -> std::io::Result<()> {
    let Some(peer) = shared.peers.as_ref() else {
        return Ok(());
    };
    if let Some(listener) = peer::listen(peer)? {
        let sh = shared.clone();
        spawn(
            "orbitkv-peer-accept",
            Box::new(move || peer::accept_loop(sh, listener)),
        );
    }
    if peer.settings.etcd.is_some() {
        let sh = shared.clone();
        spawn(
            "orbitkv-etcd",
            Box::new(move || {
                if let Some(peer) = sh.peers.as_ref() {
                    peer::membership(peer, sh.shutdown());
                }
            }),
        );
    }
    if peer.has_tp_shard_peers() {
        let rx = peer.forwarder();
        let sh = shared.clone();
        spawn(
            "orbitkv-tp-release",
            Box::new(move || {
                if let Some(peer) = sh.peers.as_ref() {
                    peer::forward_releases(peer, sh.shutdown(), rx);
                }
            }),
        );
    }
    Ok(())
}

/// Entry point of `orbitkv serve` and the `orbitkv-manager` binary: run until
/// SIGINT/SIGTERM. Returns the process exit code.
pub fn run_until_signal(argv: Vec<String>, stop: Arc<std::sync::atomic::AtomicBool>) -> i32 {
    let config = match ManagerConfig::from_argv(argv) {
        Ok(c) => c,
        Err(ConfigError::Args(e)) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
        Err(e) => {
            eprintln!("orbitkv serve: {e}");
            return 2;
        }
    };
    let tuned = malloc::tune();
    let manager = match Manager::start(config) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("orbitkv serve: {e}");
            return 1;
        }
    };
    if !tuned {
        log!(
            Info,
            "the C allocator is not glibc's: large fill buffers use its defaults (docs/operations.md, Memory)"
        );
    }
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    manager.shutdown();
    0
}
