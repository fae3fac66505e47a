//! Manager configuration: embedded defaults, optional TOML file, environment
//! (`ORBITKV_*`) and flags, in increasing precedence.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0}")]
    Args(#[from] clap::Error),
    #[error("reading config file {path}: {err}")]
    Read { path: PathBuf, err: std::io::Error },
    #[error("config file {path}: {err}")]
    Toml { path: PathBuf, err: toml::de::Error },
    #[error("invalid size {0:?}: use bytes or a suffix KiB, MiB, GiB (also K, M, G)")]
    Size(String),
    #[error("invalid setting: {0}")]
    Invalid(String),
}

/// Command line of `orbitkv serve` / `orbitkv-manager`.
#[derive(Debug, Parser, Default)]
#[command(
    name = "orbitkv serve",
    about = "Run the OrbitKV Manager (one per host).",
    after_help = "Limits, each checked at start-up (a clear error names the flag to change; \
docs/operations.md, Limits):\n  \
- at most 16384 arena segments (--segment-size; auto keeps at most 64)\n  \
- open files: segments + 2 x --max-connections + 256 within the hard RLIMIT_NOFILE \
(the soft limit is raised to it)\n  \
- vm.max_map_count: segments + 8192 mappings in every process that maps the arena\n  \
- huge pages: dram_size / page size free pages of that size (--hugepages)\n  \
- a client needs 32 free file descriptors during its handshake, whatever the segment count"
)]
pub struct Args {
    /// Unix socket path [default: $XDG_RUNTIME_DIR/orbitkv/manager.sock or /tmp/orbitkv-<uid>/manager.sock]
    #[arg(long, env = "ORBITKV_SOCKET")]
    pub socket: Option<PathBuf>,
    /// Total DRAM arena size, e.g. 4GiB [default: 1GiB]
    #[arg(long, env = "ORBITKV_DRAM_SIZE")]
    pub dram_size: Option<String>,
    /// Arena segment size, or "auto": 256MiB, larger for arenas above 16GiB so there are at most
    /// 64 segments (rounded to whole huge pages). At most 16384 segments: a smaller size is
    /// refused at start-up [default: auto]
    #[arg(long, env = "ORBITKV_SEGMENT_SIZE")]
    pub segment_size: Option<String>,
    /// Back the arena with reserved huge pages: off, 2MiB or 1GiB (reserve them first, e.g.
    /// `sysctl vm.nr_hugepages`; too few free is an error) [default: off]
    #[arg(long, env = "ORBITKV_HUGEPAGES")]
    pub hugepages: Option<String>,
    /// Prometheus endpoint address (loopback only), or "off" [default: 127.0.0.1:9464]
    #[arg(long, env = "ORBITKV_METRICS_ADDR")]
    pub metrics_addr: Option<String>,
    /// File holding a shared token every client must present
    #[arg(long, env = "ORBITKV_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Also accept peers with this uid (requires --token-file)
    #[arg(long = "allow-uid")]
    pub allow_uid: Vec<u32>,
    /// Socket file mode, octal [default: 600]
    #[arg(long)]
    pub socket_mode: Option<String>,
    /// Most client connections served at once (one thread each); more are refused with Busy
    /// [default: 1024]
    #[arg(long, env = "ORBITKV_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Most bytes of incomplete frame bodies buffered across all connections, beyond the first
    /// 64 KiB of each frame; a frame that needs more is answered Busy and its connection closed
    /// [default: 64MiB]
    #[arg(long, env = "ORBITKV_MAX_BUFFERED")]
    pub max_buffered_bytes: Option<String>,
    /// A new connection must deliver its whole Hello within this many milliseconds of being
    /// accepted (an absolute deadline) [default: 5000]
    #[arg(long)]
    pub hello_timeout_ms: Option<u64>,
    /// Once a frame's first byte has arrived, the whole frame must arrive within this many
    /// milliseconds (an idle connection between frames has no deadline) [default: 10000]
    #[arg(long)]
    pub frame_timeout_ms: Option<u64>,
    /// After answering a request, a session's thread polls its socket for up to this many
    /// microseconds before it sleeps: a client's next message (a quiet release, the next
    /// lookup) then costs no wake-up, for CPU spent polling. 0 to 1000 [default: 0]
    #[arg(long)]
    pub session_spin_us: Option<u64>,
    /// Accept InjectFault requests (tests only)
    #[arg(long)]
    pub enable_fault_injection: bool,
    /// Accept tensor-parallel query control: one TP lookup over every shard of a TP
    /// group, its lease redeemed by each rank's worker (contract T1) [default: off]
    #[arg(long)]
    pub enable_query_control: bool,
    /// A TP lease whose parts are not all redeemed within this many milliseconds
    /// releases the rest (a rank died before loading) [default: 300000]
    #[arg(long)]
    pub tp_lease_ttl_ms: Option<u64>,
    /// Enable the SSD tier in this directory (must not be tmpfs in direct mode)
    #[arg(long, env = "ORBITKV_SSD_DIR")]
    pub ssd_dir: Option<PathBuf>,
    /// Enable the SSD tier in the default directory ($XDG_CACHE_HOME/orbitkv/ssd or ~/.cache/orbitkv/ssd)
    #[arg(long)]
    pub ssd: bool,
    /// SSD tier capacity (preallocated; checked against free space) [default: 16GiB]
    #[arg(long, env = "ORBITKV_SSD_CAPACITY")]
    pub ssd_capacity: Option<String>,
    /// SSD I/O mode: direct (O_DIRECT) or kernel (buffered) [default: direct]
    #[arg(long, env = "ORBITKV_SSD_MODE")]
    pub ssd_mode: Option<String>,
    /// SSD I/O engine: auto (io_uring, psync fallback reported in status), uring, psync [default: auto]
    #[arg(long, env = "ORBITKV_SSD_ENGINE")]
    pub ssd_engine: Option<String>,
    /// Spill a DRAM block to SSD only once it was hit this many times (a block saved again
    /// after eviction counts one hit) [default: 0]
    #[arg(long)]
    pub ssd_admit_hits: Option<u32>,
    /// When to write to SSD: evict (blocks about to be evicted) or eager (every admitted block,
    /// write-behind; a restart recovers more) [default: evict]
    #[arg(long)]
    pub ssd_write_policy: Option<String>,
    /// Which DRAM blocks leave first: duel, s3fifo-adaptive, s3fifo, s3fifo-chain, lru,
    /// lru-chain or tinylfu (docs/performance.md compares them on traces) [default: duel]
    #[arg(long, env = "ORBITKV_CACHE_POLICY")]
    pub cache_policy: Option<String>,
    /// Seed of the policy's random choices (a u64; `duel`'s key sample, `tinylfu`'s sketch
    /// hash): the same seed decides the same in every run, for reproducible measurements.
    /// Unset, the seed is random per process, so clients cannot aim keys at the sample
    /// [default: random]
    #[arg(long, env = "ORBITKV_CACHE_POLICY_SEED")]
    pub cache_policy_seed: Option<u64>,
    /// Slots of the presence table clients read to answer "certainly absent" without a
    /// message: a power of two (1024..=268435456), `auto` (twice the 4 KiB extents of DRAM
    /// and SSD: it cannot fill up) or `off` [default: auto]
    #[arg(long, env = "ORBITKV_PRESENCE_SLOTS")]
    pub presence_slots: Option<String>,
    /// Serve this Manager's blocks to peer Managers on this TCP address (host:port). Only a
    /// literal loopback address (127.0.0.0/8, [::1]) runs without TLS; any other needs
    /// --peer-tls-cert/--peer-tls-key/--peer-tls-ca (mutual TLS) [default: off]
    #[arg(long, env = "ORBITKV_PEER_LISTEN")]
    pub peer_listen: Option<String>,
    /// A peer Manager to ask on a local miss (host:port of its --peer-listen); repeatable.
    /// Anything but a literal loopback address needs mutual TLS
    #[arg(long = "peer")]
    pub peer: Vec<String>,
    /// PEM certificate chain this Manager presents to peers (mutual TLS)
    #[arg(long, env = "ORBITKV_PEER_TLS_CERT")]
    pub peer_tls_cert: Option<PathBuf>,
    /// PEM private key of --peer-tls-cert (mode 0600 or tighter)
    #[arg(long, env = "ORBITKV_PEER_TLS_KEY")]
    pub peer_tls_key: Option<PathBuf>,
    /// PEM CA certificate(s) a peer's certificate must chain to (both directions)
    #[arg(long, env = "ORBITKV_PEER_TLS_CA")]
    pub peer_tls_ca: Option<PathBuf>,
    /// Deadline of one peer operation (connect, a frame, the bytes of one fetch, the
    /// reader's completion report) in milliseconds [default: 5000]
    #[arg(long)]
    pub peer_timeout_ms: Option<u64>,
    /// etcd v3 endpoints for membership, comma-separated: http://IP:port on literal loopback
    /// only, or https://HOST:PORT (needs --etcd-tls-ca); peers register under --etcd-prefix
    /// with a lease [default: off]
    #[arg(long, env = "ORBITKV_ETCD_ENDPOINTS")]
    pub etcd_endpoints: Option<String>,
    /// PEM CA certificate(s) the etcd server's certificate must chain to (https endpoints)
    #[arg(long, env = "ORBITKV_ETCD_TLS_CA")]
    pub etcd_tls_ca: Option<PathBuf>,
    /// PEM client certificate chain presented to etcd (with --etcd-tls-key; for etcd's
    /// --client-cert-auth)
    #[arg(long, env = "ORBITKV_ETCD_TLS_CERT")]
    pub etcd_tls_cert: Option<PathBuf>,
    /// PEM private key of --etcd-tls-cert (mode 0600 or tighter)
    #[arg(long, env = "ORBITKV_ETCD_TLS_KEY")]
    pub etcd_tls_key: Option<PathBuf>,
    /// Key prefix of the membership records in etcd [default: /orbitkv/]
    #[arg(long)]
    pub etcd_prefix: Option<String>,
    /// TTL in seconds of this Manager's etcd lease (kept alive at a third of it) [default: 10]
    #[arg(long)]
    pub etcd_ttl_s: Option<u64>,
    /// Address other Managers reach this one's --peer-listen at, registered in etcd
    /// [default: the --peer-listen address]
    #[arg(long)]
    pub peer_advertise: Option<String>,
    /// Tensor parallelism across Managers (contract T1): the worker of TP shard SHARD
    /// (its TP rank) is a client of the peer Manager at HOST:PORT (its --peer-listen), given
    /// as SHARD=HOST:PORT; repeatable. A TP lookup here pins those shards there. Needs
    /// --enable-query-control; anything but literal loopback needs mutual TLS [default: none]
    #[arg(long = "tp-shard-peer")]
    pub tp_shard_peer: Vec<String>,
    /// Most queries to peer Managers in flight at once for one TP lookup [default: 8]
    #[arg(long)]
    pub tp_peer_parallel: Option<usize>,
    /// On a local miss with several peers to ask: probe at most this many at once and
    /// fetch from the longest hit; 1 asks them one at a time [default: 4]
    #[arg(long)]
    pub peer_fill_parallel: Option<usize>,
    /// Checksum peer transfers of 4 MiB or more on a helper thread while the next
    /// block moves: on, off, or auto (on with 4 or more CPUs available) [default: auto]
    #[arg(long)]
    pub peer_hash_thread: Option<String>,
    /// Split a fetch from one peer of 16 MiB or more over up to this many connections
    /// (ranges of at least 8 MiB, received in parallel, committed together) [default: 4 with
    /// 8 or more CPUs available, else 1]
    #[arg(long)]
    pub peer_fill_streams: Option<usize>,
    /// TOML config file (keys as the long flags with underscores)
    #[arg(long, env = "ORBITKV_CONFIG")]
    pub config: Option<PathBuf>,
    /// Log level: error, warn, info, debug
    #[arg(long, env = "ORBITKV_LOG")]
    pub log_level: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    socket: Option<PathBuf>,
    dram_size: Option<String>,
    segment_size: Option<String>,
    hugepages: Option<String>,
    metrics_addr: Option<String>,
    token_file: Option<PathBuf>,
    allow_uid: Option<Vec<u32>>,
    socket_mode: Option<String>,
    enable_fault_injection: Option<bool>,
    enable_query_control: Option<bool>,
    tp_lease_ttl_ms: Option<u64>,
    max_connections: Option<usize>,
    max_buffered_bytes: Option<String>,
    hello_timeout_ms: Option<u64>,
    frame_timeout_ms: Option<u64>,
    session_spin_us: Option<u64>,
    log_level: Option<String>,
    ssd_dir: Option<PathBuf>,
    ssd: Option<bool>,
    ssd_capacity: Option<String>,
    ssd_mode: Option<String>,
    ssd_engine: Option<String>,
    ssd_admit_hits: Option<u32>,
    ssd_write_policy: Option<String>,
    presence_slots: Option<String>,
    cache_policy: Option<String>,
    cache_policy_seed: Option<u64>,
    peer_listen: Option<String>,
    peer: Option<Vec<String>>,
    peer_tls_cert: Option<PathBuf>,
    peer_tls_key: Option<PathBuf>,
    peer_tls_ca: Option<PathBuf>,
    peer_timeout_ms: Option<u64>,
    etcd_endpoints: Option<String>,
    etcd_tls_ca: Option<PathBuf>,
    etcd_tls_cert: Option<PathBuf>,
    etcd_tls_key: Option<PathBuf>,
    etcd_prefix: Option<String>,
    etcd_ttl_s: Option<u64>,
    peer_advertise: Option<String>,
    tp_shard_peer: Option<Vec<String>>,
    tp_peer_parallel: Option<usize>,
    peer_fill_parallel: Option<usize>,
    peer_hash_thread: Option<String>,
    peer_fill_streams: Option<usize>,
}

/// Validated SSD-tier settings.
#[derive(Debug, Clone)]
pub struct SsdSettings {
    pub dir: PathBuf,
    pub capacity: u64,
    pub mode: orbitkv_ssd::IoMode,
    pub engine: orbitkv_ssd::EnginePref,
    pub admit_hits: u32,
    pub write_policy: orbitkv_core::SpillPolicy,
}

fn default_ssd_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/var/tmp"));
    base.join("orbitkv").join("ssd")
}

/// Validated settings.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    pub socket: PathBuf,
    pub dram_size: u64,
    pub segment_size: u64,
    /// Page size backing the arena segments.
    pub page_size: orbitkv_shm::PageSize,
    pub metrics_addr: Option<SocketAddr>,
    pub token: Option<Vec<u8>>,
    pub allow_uids: Vec<u32>,
    pub socket_mode: u32,
    pub enable_fault_injection: bool,
    /// TP lookups and lease redemption accepted (contract T1).
    pub enable_query_control: bool,
    /// Deadline of a TP lease's unredeemed parts.
    pub tp_lease_ttl: std::time::Duration,
    pub max_connections: usize,
    /// Bytes of incomplete frame bodies buffered across connections (beyond each frame's first 64 KiB).
    pub max_buffered_bytes: usize,
    /// Absolute deadline for a connection's Hello, from accept.
    pub hello_timeout: std::time::Duration,
    /// Deadline for a whole frame, from its first byte.
    pub frame_timeout: std::time::Duration,
    /// How long a session's thread polls for the next request before it sleeps.
    pub session_spin: std::time::Duration,
    pub log_level: crate::log::Level,
    pub ssd: Option<SsdSettings>,
    /// DRAM eviction policy.
    pub cache_policy: orbitkv_core::policy::PolicyKind,
    /// Seed of `duel`'s key sample and `tinylfu`'s sketch (`None`: random per process).
    pub cache_policy_seed: Option<u64>,
    /// Slots of the presence table (0: none is published).
    pub presence_slots: u64,
    /// Peer Managers (contract D3); `None` when this Manager neither serves nor asks peers.
    pub peers: Option<PeerSettings>,
}

/// Mutual-TLS files for Manager↔Manager traffic.
#[derive(Debug, Clone)]
pub struct PeerTlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// etcd membership settings.
#[derive(Debug, Clone)]
pub struct EtcdSettings {
    /// `host:port` of each endpoint: a literal loopback `IP:port` over plain
    /// HTTP, or any `host:port` over HTTPS when `tls` is set.
    pub endpoints: Vec<String>,
    /// HTTPS to etcd: the CA its certificate must chain to, and an optional
    /// client certificate and key.
    pub tls: Option<EtcdTlsFiles>,
    pub prefix: String,
    pub ttl_s: u64,
}

/// TLS files for the etcd gateway.
#[derive(Debug, Clone)]
pub struct EtcdTlsFiles {
    pub ca: PathBuf,
    /// Client certificate chain and key (both or neither).
    pub client: Option<(PathBuf, PathBuf)>,
}

/// Validated peer-tier settings.
#[derive(Debug, Clone)]
pub struct PeerSettings {
    pub listen: Option<SocketAddr>,
    /// Static peers, `host:port` as given.
    pub peers: Vec<String>,
    pub tls: Option<PeerTlsFiles>,
    pub timeout: std::time::Duration,
    pub etcd: Option<EtcdSettings>,
    /// What this Manager registers in etcd.
    pub advertise: Option<String>,
    /// TP shards whose rank is a client of a peer Manager: shard → `host:port`.
    pub tp_shards: std::collections::BTreeMap<u32, String>,
    /// Most peer queries in flight at once for one TP lookup.
    pub tp_parallel: usize,
    /// Most peers probed at once on a local miss (1: one at a time).
    pub fill_parallel: usize,
    /// Checksum transfers of 4 MiB or more on a helper thread (`--peer-hash-thread`,
    /// `auto` resolved at start-up).
    pub hash_thread: bool,
    /// Most connections one fetch from one peer is split over (`--peer-fill-streams`).
    pub fill_streams: usize,
}

/// Whether `addr` (`host:port`) names a literal loopback IP.
pub fn is_literal_loopback(addr: &str) -> bool {
    addr.parse::<SocketAddr>().is_ok_and(|a| a.ip().is_loopback())
}

/// `host:port` with a non-empty host and a port.
fn check_host_port(what: &str, addr: &str) -> Result<(), ConfigError> {
    let ok = addr.parse::<SocketAddr>().is_ok()
        || addr
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && !h.contains(['/', ' ']) && p.parse::<u16>().is_ok());
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Invalid(format!("{what} {addr:?} is not host:port")))
    }
}

fn peer_settings(a: &mut Args, file: &mut FileConfig) -> Result<Option<PeerSettings>, ConfigError> {
    let listen_s = a.peer_listen.take().or(file.peer_listen.take());
    let mut peers = std::mem::take(&mut a.peer);
    peers.extend(file.peer.take().unwrap_or_default());
    let etcd_s = a.etcd_endpoints.take().or(file.etcd_endpoints.take());
    let cert = a.peer_tls_cert.take().or(file.peer_tls_cert.take());
    let key = a.peer_tls_key.take().or(file.peer_tls_key.take());
    let ca = a.peer_tls_ca.take().or(file.peer_tls_ca.take());
    let advertise = a.peer_advertise.take().or(file.peer_advertise.take());
    let etcd_ca = a.etcd_tls_ca.take().or(file.etcd_tls_ca.take());
    let etcd_cert = a.etcd_tls_cert.take().or(file.etcd_tls_cert.take());
    let etcd_key = a.etcd_tls_key.take().or(file.etcd_tls_key.take());
    let mut tp_shard_s = std::mem::take(&mut a.tp_shard_peer);
    tp_shard_s.extend(file.tp_shard_peer.take().unwrap_or_default());
    let tp_parallel = a.tp_peer_parallel.or(file.tp_peer_parallel).unwrap_or(8);
    if !(1..=64).contains(&tp_parallel) {
        return Err(ConfigError::Invalid(format!(
            "tp_peer_parallel {tp_parallel} must be 1..=64"
        )));
    }
    let fill_parallel = a.peer_fill_parallel.or(file.peer_fill_parallel).unwrap_or(4);
    if !(1..=64).contains(&fill_parallel) {
        return Err(ConfigError::Invalid(format!(
            "peer_fill_parallel {fill_parallel} must be 1..=64"
        )));
    }
    let hash_thread = match a
        .peer_hash_thread
        .take()
        .or(file.peer_hash_thread.take())
        .as_deref()
        .unwrap_or("auto")
    {
        "on" => true,
        "off" => false,
        // The helper needs a core of its own beside the socket threads.
        "auto" => std::thread::available_parallelism().is_ok_and(|n| n.get() >= 4),
        other => {
            return Err(ConfigError::Invalid(format!(
                "peer_hash_thread {other:?} must be on, off or auto"
            )));
        }
    };
    // Each stream's socket threads want a core on each side.
    let fill_streams = a.peer_fill_streams.or(file.peer_fill_streams).unwrap_or_else(|| {
        if std::thread::available_parallelism().is_ok_and(|n| n.get() >= 8) {
            4
        } else {
            1
        }
    });
    if !(1..=8).contains(&fill_streams) {
        return Err(ConfigError::Invalid(format!(
            "peer_fill_streams {fill_streams} must be 1..=8"
        )));
    }
    let query_control = a.enable_query_control || file.enable_query_control.unwrap_or(false);
    if !tp_shard_s.is_empty() && !query_control {
        return Err(ConfigError::Invalid(
            "--tp-shard-peer places TP shards on peer Managers, which needs tensor-parallel query control: add --enable-query-control (on every Manager of the group)".into(),
        ));
    }
    if listen_s.is_none() && peers.is_empty() && etcd_s.is_none() && tp_shard_s.is_empty() {
        if cert.is_some()
            || key.is_some()
            || ca.is_some()
            || advertise.is_some()
            || etcd_ca.is_some()
            || etcd_cert.is_some()
            || etcd_key.is_some()
        {
            return Err(ConfigError::Invalid(
                "peer or etcd TLS files or --peer-advertise given without --peer-listen, --peer, --etcd-endpoints or --tp-shard-peer"
                    .into(),
            ));
        }
        return Ok(None);
    }
    let tls = match (cert, key, ca) {
        (Some(cert), Some(key), Some(ca)) => Some(PeerTlsFiles { cert, key, ca }),
        (None, None, None) => None,
        _ => {
            return Err(ConfigError::Invalid(
                "mutual TLS between Managers needs all three of --peer-tls-cert, --peer-tls-key and --peer-tls-ca".into(),
            ));
        }
    };
    let listen = match &listen_s {
        None => None,
        Some(l) => {
            let addr: SocketAddr = l.parse().map_err(|_| {
                ConfigError::Invalid(format!("peer_listen {l:?} is not an IP address with a port"))
            })?;
            if !addr.ip().is_loopback() && tls.is_none() {
                return Err(ConfigError::Invalid(format!(
                    "peer_listen {addr} is not literal loopback: Manager-to-Manager traffic off loopback requires mutual TLS; set --peer-tls-cert, --peer-tls-key and --peer-tls-ca (or listen on 127.0.0.1)"
                )));
            }
            Some(addr)
        }
    };
    for p in &peers {
        check_host_port("peer", p)?;
        if !is_literal_loopback(p) && tls.is_none() {
            return Err(ConfigError::Invalid(format!(
                "peer {p} is not a literal loopback address: Manager-to-Manager traffic off loopback requires mutual TLS; set --peer-tls-cert, --peer-tls-key and --peer-tls-ca"
            )));
        }
    }
    if let Some(ad) = &advertise {
        check_host_port("peer_advertise", ad)?;
        if !is_literal_loopback(ad) && tls.is_none() {
            return Err(ConfigError::Invalid(format!(
                "peer_advertise {ad} is not literal loopback: requires mutual TLS (--peer-tls-cert, --peer-tls-key, --peer-tls-ca)"
            )));
        }
    }
    let mut tp_shards = std::collections::BTreeMap::new();
    for t in &tp_shard_s {
        let (shard, addr) = t
            .split_once('=')
            .and_then(|(sh, ad)| Some((sh.trim().parse::<u32>().ok()?, ad.trim())))
            .ok_or_else(|| ConfigError::Invalid(format!("tp_shard_peer {t:?} is not SHARD=HOST:PORT")))?;
        if shard as usize >= orbitkv_core::MAX_TP_SHARDS {
            return Err(ConfigError::Invalid(format!(
                "tp_shard_peer {t:?}: shard {shard} is not below {}",
                orbitkv_core::MAX_TP_SHARDS
            )));
        }
        check_host_port("tp_shard_peer", addr)?;
        if !is_literal_loopback(addr) && tls.is_none() {
            return Err(ConfigError::Invalid(format!(
                "tp_shard_peer {addr} is not a literal loopback address: Manager-to-Manager traffic off loopback requires mutual TLS; set --peer-tls-cert, --peer-tls-key and --peer-tls-ca"
            )));
        }
        if tp_shards.insert(shard, addr.to_string()).is_some() {
            return Err(ConfigError::Invalid(format!(
                "tp_shard_peer names shard {shard} twice"
            )));
        }
    }
    let ms = a.peer_timeout_ms.or(file.peer_timeout_ms).unwrap_or(5_000);
    if !(1..=600_000).contains(&ms) {
        return Err(ConfigError::Invalid(format!(
            "peer_timeout_ms {ms} must be 1..=600000 milliseconds"
        )));
    }
    let etcd = match etcd_s {
        None => {
            if etcd_ca.is_some() || etcd_cert.is_some() || etcd_key.is_some() {
                return Err(ConfigError::Invalid(
                    "etcd TLS files given without --etcd-endpoints".into(),
                ));
            }
            None
        }
        Some(list) => {
            let mut endpoints = Vec::new();
            let mut https = Vec::new();
            for e in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                if let Some(hp) = e.strip_prefix("https://") {
                    let hp = hp.trim_end_matches('/');
                    check_host_port("etcd endpoint", hp)?;
                    https.push(true);
                    endpoints.push(hp.to_string());
                    continue;
                }
                let hp = e.strip_prefix("http://").unwrap_or(e).trim_end_matches('/');
                let addr: SocketAddr = hp.parse().map_err(|_| {
                    ConfigError::Invalid(format!(
                        "etcd endpoint {e:?} must be http://IP:port (literal loopback) or https://HOST:PORT"
                    ))
                })?;
                if !addr.ip().is_loopback() {
                    return Err(ConfigError::Invalid(format!(
                        "etcd endpoint {e} is not literal loopback: plain HTTP to etcd is allowed on loopback only; use https://{hp} with --etcd-tls-ca (and --etcd-tls-cert/--etcd-tls-key if etcd checks client certificates)"
                    )));
                }
                https.push(false);
                endpoints.push(addr.to_string());
            }
            if endpoints.is_empty() {
                return Err(ConfigError::Invalid("etcd_endpoints is empty".into()));
            }
            let any_tls = https.iter().any(|&t| t);
            if any_tls && !https.iter().all(|&t| t) {
                return Err(ConfigError::Invalid(
                    "etcd endpoints mix http:// and https://: use one scheme for all".into(),
                ));
            }
            let client = match (etcd_cert, etcd_key) {
                (Some(c), Some(k)) => Some((c, k)),
                (None, None) => None,
                _ => {
                    return Err(ConfigError::Invalid(
                        "an etcd client certificate needs both --etcd-tls-cert and --etcd-tls-key".into(),
                    ));
                }
            };
            let tls = match (any_tls, etcd_ca) {
                (true, Some(ca)) => Some(EtcdTlsFiles { ca, client }),
                (true, None) => {
                    return Err(ConfigError::Invalid(
                        "https etcd endpoints need --etcd-tls-ca (the CA etcd's certificate chains to)"
                            .into(),
                    ));
                }
                (false, ca) => {
                    if ca.is_some() || client.is_some() {
                        return Err(ConfigError::Invalid(
                            "etcd TLS files given but the etcd endpoints are http://: use https:// endpoints"
                                .into(),
                        ));
                    }
                    None
                }
            };
            let prefix = a
                .etcd_prefix
                .take()
                .or(file.etcd_prefix.take())
                .unwrap_or_else(|| "/orbitkv/".into());
            let ttl_s = a.etcd_ttl_s.or(file.etcd_ttl_s).unwrap_or(10);
            if !(2..=3600).contains(&ttl_s) {
                return Err(ConfigError::Invalid(format!(
                    "etcd_ttl_s {ttl_s} must be 2..=3600"
                )));
            }
            if advertise.is_none() && listen.is_none() {
                return Err(ConfigError::Invalid(
                    "etcd membership needs --peer-listen (or --peer-advertise) so peers can reach this Manager".into(),
                ));
            }
            Some(EtcdSettings {
                endpoints,
                tls,
                prefix,
                ttl_s,
            })
        }
    };
    Ok(Some(PeerSettings {
        advertise: advertise.or_else(|| listen.map(|l| l.to_string())),
        listen,
        peers,
        tls,
        timeout: std::time::Duration::from_millis(ms),
        etcd,
        tp_shards,
        tp_parallel,
        fill_parallel,
        hash_thread,
        fill_streams,
    }))
}

pub const DEFAULT_DRAM: &str = "1GiB";
/// The smallest segment `auto` chooses.
pub const AUTO_SEGMENT_MIN: u64 = 256 << 20;
/// `auto` grows segments past [`AUTO_SEGMENT_MIN`] to keep at most this many.
pub const AUTO_SEGMENTS: u64 = 64;

/// The segment size `--segment-size auto` picks for an arena of `dram_size`
/// on `page`-sized pages: [`AUTO_SEGMENT_MIN`] up to 16 GiB arenas, beyond
/// that `dram_size / AUTO_SEGMENTS` rounded up to a whole 256 MiB and a whole
/// page. Few segments mean few fds in the Manager, few mappings and pin calls
/// per client, and a handshake of one or two fd batches (docs/operations.md).
pub fn auto_segment_size(dram_size: u64, page: u64) -> u64 {
    let unit = AUTO_SEGMENT_MIN.max(page).next_multiple_of(page);
    dram_size.div_ceil(AUTO_SEGMENTS).max(1).next_multiple_of(unit)
}
pub const DEFAULT_METRICS: &str = "127.0.0.1:9464";
pub const DEFAULT_MAX_BUFFERED: &str = "64MiB";

pub fn parse_size(s: &str) -> Result<u64, ConfigError> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| ConfigError::Size(s.into()))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" | "kb" => 1 << 10,
        "m" | "mib" | "mb" => 1 << 20,
        "g" | "gib" | "gb" => 1 << 30,
        "t" | "tib" | "tb" => 1 << 40,
        _ => return Err(ConfigError::Size(s.into())),
    };
    n.checked_mul(mult).ok_or_else(|| ConfigError::Size(s.into()))
}

/// Read a token file, refusing one that group or others may access (as ssh
/// refuses a private key with open permissions). The mode is checked on the
/// opened file, so it is the file that was read.
fn read_token_file(p: &std::path::Path) -> Result<Vec<u8>, ConfigError> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let read_err = |err| ConfigError::Read {
        path: p.to_path_buf(),
        err,
    };
    let f = std::fs::File::open(p).map_err(read_err)?;
    let mode = f.metadata().map_err(read_err)?.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(ConfigError::Invalid(format!(
            "token file {} is accessible by group/others (mode {mode:04o}), so they may read the \
             token; run `chmod 600 {}`",
            p.display(),
            p.display()
        )));
    }
    let mut raw = Vec::new();
    // More than a token can hold is refused below; never read an unbounded file.
    f.take(1 << 16).read_to_end(&mut raw).map_err(read_err)?;
    Ok(raw)
}

impl ManagerConfig {
    pub fn from_argv<I, T>(argv: I) -> Result<ManagerConfig, ConfigError>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let args = Args::try_parse_from(argv)?;
        Self::from_args(args)
    }

    pub fn from_args(mut a: Args) -> Result<ManagerConfig, ConfigError> {
        let mut file = match &a.config {
            Some(p) => {
                let text =
                    std::fs::read_to_string(p).map_err(|err| ConfigError::Read { path: p.clone(), err })?;
                toml::from_str::<FileConfig>(&text)
                    .map_err(|err| ConfigError::Toml { path: p.clone(), err })?
            }
            None => FileConfig::default(),
        };
        let peers = peer_settings(&mut a, &mut file)?;
        let uid = orbitkv_shm::peer::my_uid();
        let socket = a
            .socket
            .or(file.socket)
            .unwrap_or_else(|| orbitkv_proto::default_socket_path(uid));
        let dram_size = parse_size(a.dram_size.or(file.dram_size).as_deref().unwrap_or(DEFAULT_DRAM))?;
        let segment_flag = a.segment_size.or(file.segment_size);
        if dram_size < orbitkv_core::ALIGN {
            return Err(ConfigError::Invalid(format!(
                "dram_size {dram_size} is below one 4 KiB page"
            )));
        }
        let page_size = match a
            .hugepages
            .or(file.hugepages)
            .as_deref()
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None | Some("off") => orbitkv_shm::PageSize::Base,
            Some("2mib" | "2m" | "2mb") => orbitkv_shm::PageSize::Huge2MiB,
            Some("1gib" | "1g" | "1gb") => orbitkv_shm::PageSize::Huge1GiB,
            Some(h) => {
                return Err(ConfigError::Invalid(format!(
                    "hugepages {h:?} must be off, 2MiB or 1GiB"
                )));
            }
        };
        let page = page_size.bytes();
        let segment_size = match segment_flag.as_deref() {
            None => auto_segment_size(dram_size, page),
            Some(v) if v.eq_ignore_ascii_case("auto") => auto_segment_size(dram_size, page),
            Some(v) => parse_size(v)?,
        };
        if segment_size < orbitkv_core::ALIGN || segment_size % orbitkv_core::ALIGN != 0 {
            return Err(ConfigError::Invalid(format!(
                "segment_size {segment_size} must be a positive multiple of 4096"
            )));
        }
        let segments = dram_size.div_ceil(segment_size);
        if segments > orbitkv_proto::MAX_SEGMENTS as u64 {
            let least = dram_size
                .div_ceil(orbitkv_proto::MAX_SEGMENTS as u64)
                .next_multiple_of(page);
            return Err(ConfigError::Invalid(format!(
                "dram_size {dram_size} in segments of {segment_size} bytes makes {segments} segments, \
                 above the limit of {} (each segment is one fd in the Manager and one mapping in every \
                 client); use --segment-size {least} or larger, or leave it unset (auto)",
                orbitkv_proto::MAX_SEGMENTS
            )));
        }
        if !dram_size.is_multiple_of(page) || !segment_size.is_multiple_of(page) {
            return Err(ConfigError::Invalid(format!(
                "with {page_size} pages, dram_size ({dram_size}) and segment_size ({segment_size}) \
                 must be whole multiples of {page} bytes"
            )));
        }
        let metrics = a
            .metrics_addr
            .or(file.metrics_addr)
            .unwrap_or_else(|| DEFAULT_METRICS.into());
        let metrics_addr = if metrics.eq_ignore_ascii_case("off") {
            None
        } else {
            let addr: SocketAddr = metrics.parse().map_err(|_| {
                ConfigError::Invalid(format!("metrics_addr {metrics:?} is not host:port or \"off\""))
            })?;
            if !addr.ip().is_loopback() {
                return Err(ConfigError::Invalid(format!(
                    "metrics_addr {addr} is not loopback; the metrics endpoint has no authentication, so only 127.0.0.0/8 or [::1] is allowed"
                )));
            }
            Some(addr)
        };
        let token = match a.token_file.or(file.token_file) {
            Some(p) => {
                let raw = read_token_file(&p)?;
                let t = raw.trim_ascii().to_vec();
                if t.len() < 16 || t.len() > orbitkv_proto::MAX_TOKEN {
                    return Err(ConfigError::Invalid(format!(
                        "token in {} must be 16..=1024 bytes",
                        p.display()
                    )));
                }
                Some(t)
            }
            None => None,
        };
        let mut allow_uids = a.allow_uid;
        allow_uids.extend(file.allow_uid.unwrap_or_default());
        if !allow_uids.is_empty() && token.is_none() {
            return Err(ConfigError::Invalid(
                "--allow-uid admits other users and requires --token-file".into(),
            ));
        }
        let mode_s = a.socket_mode.or(file.socket_mode).unwrap_or_else(|| "600".into());
        let socket_mode = u32::from_str_radix(mode_s.trim_start_matches("0o"), 8)
            .ok()
            .filter(|m| *m <= 0o777 && m & 0o007 == 0)
            .ok_or_else(|| {
                ConfigError::Invalid(format!(
                    "socket_mode {mode_s:?} must be octal and grant nothing to others"
                ))
            })?;
        let max_connections = a.max_connections.or(file.max_connections).unwrap_or(1024);
        if max_connections == 0 {
            return Err(ConfigError::Invalid("max_connections must be at least 1".into()));
        }
        let max_buffered_bytes = parse_size(
            a.max_buffered_bytes
                .or(file.max_buffered_bytes)
                .as_deref()
                .unwrap_or(DEFAULT_MAX_BUFFERED),
        )?;
        let max_buffered_bytes = usize::try_from(max_buffered_bytes)
            .ok()
            .filter(|b| *b >= orbitkv_proto::MAX_BODY)
            .ok_or_else(|| {
                ConfigError::Invalid(format!(
                    "max_buffered_bytes {max_buffered_bytes} must be at least 4MiB (one frame of the largest size)"
                ))
            })?;
        let millis = |name: &str, v: u64| match v {
            1..=3_600_000 => Ok(std::time::Duration::from_millis(v)),
            _ => Err(ConfigError::Invalid(format!(
                "{name} {v} must be 1..=3600000 milliseconds"
            ))),
        };
        let hello_timeout = millis(
            "hello_timeout_ms",
            a.hello_timeout_ms.or(file.hello_timeout_ms).unwrap_or(5_000),
        )?;
        let tp_lease_ttl = millis(
            "tp_lease_ttl_ms",
            a.tp_lease_ttl_ms.or(file.tp_lease_ttl_ms).unwrap_or(300_000),
        )?;
        let frame_timeout = millis(
            "frame_timeout_ms",
            a.frame_timeout_ms.or(file.frame_timeout_ms).unwrap_or(10_000),
        )?;
        let session_spin = match a.session_spin_us.or(file.session_spin_us).unwrap_or(0) {
            v @ 0..=1000 => std::time::Duration::from_micros(v),
            v => {
                return Err(ConfigError::Invalid(format!(
                    "session_spin_us {v} must be 0..=1000 microseconds"
                )));
            }
        };
        let log_level = crate::log::Level::parse(a.log_level.or(file.log_level).as_deref().unwrap_or("info"))
            .ok_or_else(|| ConfigError::Invalid("log_level must be error, warn, info or debug".into()))?;
        let ssd_dir = a
            .ssd_dir
            .or(file.ssd_dir)
            .or_else(|| (a.ssd || file.ssd.unwrap_or(false)).then(default_ssd_dir));
        let ssd = match ssd_dir {
            None => None,
            Some(dir) => {
                let capacity =
                    parse_size(a.ssd_capacity.or(file.ssd_capacity).as_deref().unwrap_or("16GiB"))?;
                let mode = match a.ssd_mode.or(file.ssd_mode).as_deref().unwrap_or("direct") {
                    "direct" => orbitkv_ssd::IoMode::Direct,
                    "kernel" => orbitkv_ssd::IoMode::Kernel,
                    m => {
                        return Err(ConfigError::Invalid(format!(
                            "ssd_mode {m:?} must be direct or kernel"
                        )));
                    }
                };
                let engine = match a.ssd_engine.or(file.ssd_engine).as_deref().unwrap_or("auto") {
                    "auto" => orbitkv_ssd::EnginePref::Auto,
                    "uring" | "io_uring" => orbitkv_ssd::EnginePref::Uring,
                    "psync" => orbitkv_ssd::EnginePref::Psync,
                    e => {
                        return Err(ConfigError::Invalid(format!(
                            "ssd_engine {e:?} must be auto, uring or psync"
                        )));
                    }
                };
                let admit_hits = a.ssd_admit_hits.or(file.ssd_admit_hits).unwrap_or(0);
                let write_policy = match a
                    .ssd_write_policy
                    .or(file.ssd_write_policy)
                    .as_deref()
                    .unwrap_or("evict")
                {
                    "evict" => orbitkv_core::SpillPolicy::Evict,
                    "eager" => orbitkv_core::SpillPolicy::Eager,
                    p => {
                        return Err(ConfigError::Invalid(format!(
                            "ssd_write_policy {p:?} must be evict or eager"
                        )));
                    }
                };
                Some(SsdSettings {
                    dir,
                    capacity,
                    mode,
                    engine,
                    admit_hits,
                    write_policy,
                })
            }
        };
        let cache_policy = match a.cache_policy.or(file.cache_policy) {
            Some(name) => name
                .parse::<orbitkv_core::policy::PolicyKind>()
                .map_err(|e| ConfigError::Invalid(format!("cache_policy: {e}")))?,
            None => orbitkv_core::policy::PolicyKind::default(),
        };
        let cache_policy_seed = a.cache_policy_seed.or(file.cache_policy_seed);
        // A Manager that asks peers on a local miss cannot let a local table answer
        // "certainly absent": the block may be one peer fill away (session.rs `lookup`).
        let asks_peers = peers
            .as_ref()
            .is_some_and(|p| !p.peers.is_empty() || p.etcd.is_some());
        let presence_setting = a.presence_slots.or(file.presence_slots);
        let presence_slots = match presence_setting.as_deref().unwrap_or("auto") {
            "auto" if asks_peers => 0,
            "off" => 0,
            n if asks_peers => {
                return Err(ConfigError::Invalid(format!(
                    "presence_slots {n:?} with peers to ask (--peer / --etcd-endpoints): a local presence \
                     table would answer misses that a peer could fill; use presence_slots auto or off"
                )));
            }
            "auto" => {
                // Every block takes at least one 4 KiB extent (DRAM arena and SSD file),
                // so twice that many slots can never saturate: 16 bytes per 4 KiB cached
                // (0.4 %), capped at 2^28 slots.
                let bytes = dram_size.saturating_add(ssd.as_ref().map_or(0, |s| s.capacity));
                orbitkv_shm::presence::slots_for(bytes / orbitkv_core::ALIGN)
            }
            n => n
                .parse::<u64>()
                .ok()
                .filter(|n| {
                    n.is_power_of_two()
                        && (orbitkv_shm::presence::MIN_SLOTS..=orbitkv_shm::presence::MAX_SLOTS).contains(n)
                })
                .ok_or_else(|| {
                    ConfigError::Invalid(format!(
                        "presence_slots {n:?} must be auto, off or a power of two from {} to {}",
                        orbitkv_shm::presence::MIN_SLOTS,
                        orbitkv_shm::presence::MAX_SLOTS
                    ))
                })?,
        };
        Ok(ManagerConfig {
            presence_slots,
            peers,
            ssd,
            cache_policy,
            cache_policy_seed,
            socket,
            dram_size,
            segment_size,
            page_size,
            metrics_addr,
            token,
            allow_uids,
            socket_mode,
            enable_fault_injection: a.enable_fault_injection || file.enable_fault_injection.unwrap_or(false),
            enable_query_control: a.enable_query_control || file.enable_query_control.unwrap_or(false),
            tp_lease_ttl,
            max_connections,
            max_buffered_bytes,
            hello_timeout,
            frame_timeout,
            session_spin,
            log_level,
        })
    }

    /// Segment sizes: `dram_size` split into `segment_size` pieces, the last
    /// one possibly smaller (rounded down to the 4 KiB granularity).
    pub fn segment_sizes(&self) -> Vec<u64> {
        let mut left = self.dram_size / orbitkv_core::ALIGN * orbitkv_core::ALIGN;
        let mut out = Vec::new();
        while left > 0 {
            let s = left.min(self.segment_size);
            out.push(s);
            left -= s;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer_cfg(extra: &[&str]) -> Result<ManagerConfig, ConfigError> {
        let mut argv = vec!["x", "--socket", "/nonexistent/s.sock"];
        argv.extend_from_slice(extra);
        ManagerConfig::from_argv(argv)
    }

    #[test]
    fn peer_settings_validate() {
        let c = peer_cfg(&["--peer-listen", "127.0.0.1:7470", "--peer", "[::1]:7471"]).expect("loopback");
        let p = c.peers.expect("peers");
        assert_eq!(p.advertise.as_deref(), Some("127.0.0.1:7470"));
        assert!(p.tls.is_none() && p.etcd.is_none());
        assert!(peer_cfg(&[]).expect("none").peers.is_none());
        let c = peer_cfg(&[
            "--enable-query-control",
            "--tp-shard-peer",
            "1=127.0.0.1:7471",
            "--tp-shard-peer",
            "3=127.0.0.1:7471",
        ])
        .expect("tp across Managers");
        let p = c.peers.expect("a peer tier for the TP links");
        assert_eq!(p.tp_shards.len(), 2);
        assert_eq!(p.tp_shards.get(&3).map(String::as_str), Some("127.0.0.1:7471"));
        assert_eq!(p.tp_parallel, 8);
        assert_eq!(p.fill_parallel, 4);
        let auto = std::thread::available_parallelism().is_ok_and(|n| n.get() >= 4);
        assert_eq!(p.hash_thread, auto, "auto: on with 4 or more CPUs");
        let streams = if std::thread::available_parallelism().is_ok_and(|n| n.get() >= 8) {
            4
        } else {
            1
        };
        assert_eq!(p.fill_streams, streams, "4 with 8 or more CPUs");
        let c = peer_cfg(&["--peer", "127.0.0.1:1", "--peer-fill-streams", "3"]).expect("3 streams");
        assert_eq!(c.peers.expect("peers").fill_streams, 3);
        assert!(peer_cfg(&["--peer", "127.0.0.1:1", "--peer-fill-streams", "0"]).is_err());
        assert!(peer_cfg(&["--peer", "127.0.0.1:1", "--peer-fill-streams", "9"]).is_err());
        for (v, want) in [("on", true), ("off", false)] {
            let c = peer_cfg(&["--peer", "127.0.0.1:1", "--peer-hash-thread", v]).expect(v);
            assert_eq!(c.peers.expect("peers").hash_thread, want);
        }
        assert!(p.peers.is_empty(), "a TP shard peer is not asked on a local miss");
        let c = peer_cfg(&[
            "--peer-listen",
            "127.0.0.1:7470",
            "--etcd-endpoints",
            "https://etcd-1.example:2379, https://10.0.0.9:2379",
            "--etcd-tls-ca",
            "ca.crt",
            "--etcd-tls-cert",
            "m.crt",
            "--etcd-tls-key",
            "m.key",
        ])
        .expect("etcd over https, any host");
        let e = c.peers.expect("peers").etcd.expect("etcd");
        assert_eq!(e.endpoints, ["etcd-1.example:2379", "10.0.0.9:2379"]);
        assert!(e.tls.is_some_and(|t| t.client.is_some()));
        for bad in [
            &["--peer-listen", "10.0.0.1:7470"][..],
            &["--peer", "localhost:7470"][..],
            &["--peer", "127.0.0.1:1", "--peer-tls-cert", "a.crt"][..],
            &["--peer", "nonsense"][..],
            &[
                "--peer-tls-cert",
                "a",
                "--peer-tls-key",
                "b",
                "--peer-tls-ca",
                "c",
            ][..],
            &[
                "--peer-listen",
                "127.0.0.1:1",
                "--etcd-endpoints",
                "http://10.0.0.1:2379",
            ][..],
            &[
                "--peer-listen",
                "127.0.0.1:1",
                "--etcd-endpoints",
                "https://127.0.0.1:2379",
            ][..],
            &[
                "--peer",
                "127.0.0.1:1",
                "--etcd-endpoints",
                "http://127.0.0.1:2379",
            ][..],
            &["--peer", "127.0.0.1:1", "--peer-timeout-ms", "0"][..],
            &["--peer", "127.0.0.1:1", "--peer-fill-parallel", "0"][..],
            &["--peer", "127.0.0.1:1", "--peer-hash-thread", "yes"][..],
            // etcd over TLS: a CA for https, TLS files only with https, one scheme,
            // a client certificate with its key.
            &[
                "--peer-listen",
                "127.0.0.1:1",
                "--etcd-endpoints",
                "https://etcd.example:2379",
            ][..],
            &[
                "--peer-listen",
                "127.0.0.1:1",
                "--etcd-endpoints",
                "http://127.0.0.1:2379",
                "--etcd-tls-ca",
                "ca.crt",
            ][..],
            &[
                "--peer-listen",
                "127.0.0.1:1",
                "--etcd-endpoints",
                "https://127.0.0.1:2379,http://127.0.0.1:2380",
                "--etcd-tls-ca",
                "ca.crt",
            ][..],
            &[
                "--peer-listen",
                "127.0.0.1:1",
                "--etcd-endpoints",
                "https://127.0.0.1:2379",
                "--etcd-tls-ca",
                "ca.crt",
                "--etcd-tls-cert",
                "m.crt",
            ][..],
            &["--peer-listen", "127.0.0.1:1", "--etcd-tls-ca", "ca.crt"][..],
            &["--etcd-tls-ca", "ca.crt"][..],
            // TP across Managers: query control on, shard=host:port, loopback
            // unless TLS, each shard once, a sane bound.
            &["--tp-shard-peer", "1=127.0.0.1:7471"][..],
            &["--enable-query-control", "--tp-shard-peer", "1:127.0.0.1:7471"][..],
            &["--enable-query-control", "--tp-shard-peer", "64=127.0.0.1:7471"][..],
            &["--enable-query-control", "--tp-shard-peer", "1=10.0.0.2:7471"][..],
            &[
                "--enable-query-control",
                "--tp-shard-peer",
                "1=127.0.0.1:7471",
                "--tp-shard-peer",
                "1=127.0.0.1:7472",
            ][..],
            &[
                "--enable-query-control",
                "--tp-shard-peer",
                "1=127.0.0.1:7471",
                "--tp-peer-parallel",
                "0",
            ][..],
        ] {
            assert!(peer_cfg(bad).is_err(), "{bad:?} must be refused");
        }
        let c = peer_cfg(&[
            "--peer-listen",
            "10.0.0.1:7470",
            "--peer",
            "host-b.example:7470",
            "--peer-tls-cert",
            "a.crt",
            "--peer-tls-key",
            "a.key",
            "--peer-tls-ca",
            "ca.crt",
            "--etcd-endpoints",
            "http://127.0.0.1:2379,127.0.0.1:2380",
        ])
        .expect("off loopback with TLS");
        let p = c.peers.expect("peers");
        assert!(p.tls.is_some());
        assert_eq!(p.etcd.expect("etcd").endpoints.len(), 2);
    }

    #[test]
    fn auto_segments_stay_few_and_whole_pages_at_any_arena_size() {
        const G: u64 = 1 << 30;
        assert_eq!(auto_segment_size(1 << 30, 4096), 256 << 20);
        assert_eq!(
            auto_segment_size(16 * G, 4096),
            256 << 20,
            "64 segments of 256 MiB"
        );
        assert_eq!(auto_segment_size(96 * G, 4096), 1536 << 20);
        assert_eq!(auto_segment_size(1 << 40, 4096), 16 * G);
        assert_eq!(auto_segment_size(8 * G, G), G, "1 GiB pages: whole pages");
        for (dram, page) in [
            (3 * G, 4096),
            (100 * G + (8 << 20), 2 << 20),
            (2048 * G, G),
            (5 << 20, 4096),
        ] {
            let seg = auto_segment_size(dram, page);
            assert!(
                seg.is_multiple_of(page) && seg >= 256 << 20,
                "{dram} {page}: {seg}"
            );
            assert!(
                dram.div_ceil(seg) <= AUTO_SEGMENTS,
                "{dram}: {} segments",
                dram.div_ceil(seg)
            );
        }
        let c = ManagerConfig::from_argv(["x", "--dram-size", "96GiB"]).expect("96 GiB");
        assert_eq!(c.segment_sizes(), vec![1536 << 20; 64]);
        let c =
            ManagerConfig::from_argv(["x", "--dram-size", "4GiB", "--segment-size", "auto"]).expect("auto");
        assert_eq!(c.segment_sizes(), vec![256 << 20; 16]);
        let c = ManagerConfig::from_argv(["x", "--dram-size", "4GiB", "--hugepages", "1GiB"])
            .expect("1 GiB pages");
        assert_eq!(c.segment_sizes(), vec![G; 4]);
    }

    #[test]
    fn serve_help_names_every_start_up_limit() {
        use clap::CommandFactory;
        let help = Args::command().render_long_help().to_string();
        for limit in [
            "16384 arena segments",
            "RLIMIT_NOFILE",
            "vm.max_map_count",
            "huge pages",
            "32 free file descriptors",
        ] {
            assert!(help.contains(limit), "--help does not name {limit:?}:\n{help}");
        }
    }

    #[test]
    fn more_segments_than_the_limit_are_refused_naming_the_fix() {
        let ok =
            ManagerConfig::from_argv(["x", "--dram-size", "64MiB", "--segment-size", "4KiB"]).expect("16384");
        assert_eq!(ok.segment_sizes().len(), orbitkv_proto::MAX_SEGMENTS);
        let e = ManagerConfig::from_argv(["x", "--dram-size", "1GiB", "--segment-size", "4KiB"])
            .expect_err("262144 segments");
        let msg = e.to_string();
        assert!(
            msg.contains("262144 segments") && msg.contains("--segment-size 65536"),
            "{msg}"
        );
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("1GiB").ok(), Some(1 << 30));
        assert_eq!(parse_size("64M").ok(), Some(64 << 20));
        assert_eq!(parse_size("4096").ok(), Some(4096));
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("99999999999999T").is_err());
    }

    #[test]
    fn defaults_and_validation() {
        let c = ManagerConfig::from_argv(["x", "--socket", "/tmp/s.sock"]).expect("defaults");
        assert_eq!(c.dram_size, 1 << 30);
        assert_eq!(c.segment_sizes(), vec![256 << 20; 4]);
        assert_eq!(c.socket_mode, 0o600);
        let e = ManagerConfig::from_argv(["x", "--metrics-addr", "0.0.0.0:9464"]).expect_err("non-loopback");
        assert!(e.to_string().contains("not loopback"));
        let e = ManagerConfig::from_argv(["x", "--allow-uid", "1000"]).expect_err("needs token");
        assert!(e.to_string().contains("requires --token-file"));
        assert_eq!(c.max_buffered_bytes, 64 << 20);
        assert_eq!(c.hello_timeout, std::time::Duration::from_secs(5));
        assert_eq!(c.frame_timeout, std::time::Duration::from_secs(10));
        assert_eq!(
            c.session_spin,
            std::time::Duration::ZERO,
            "sessions sleep at once by default"
        );
        let spin = ManagerConfig::from_argv(["x", "--session-spin-us", "40"]).expect("spin");
        assert_eq!(spin.session_spin, std::time::Duration::from_micros(40));
        let e = ManagerConfig::from_argv(["x", "--session-spin-us", "1001"]).expect_err("too long");
        assert!(
            e.to_string().contains("session_spin_us 1001 must be 0..=1000"),
            "{e}"
        );
        let e = ManagerConfig::from_argv(["x", "--max-buffered-bytes", "1MiB"]).expect_err("below a frame");
        assert!(e.to_string().contains("at least 4MiB"), "{e}");
        let e = ManagerConfig::from_argv(["x", "--hello-timeout-ms", "0"]).expect_err("zero");
        assert!(e.to_string().contains("hello_timeout_ms"), "{e}");
        let e = ManagerConfig::from_argv(["x", "--socket-mode", "666"]).expect_err("world");
        assert!(e.to_string().contains("grant nothing to others"));
        let c =
            ManagerConfig::from_argv(["x", "--dram-size", "10MiB", "--segment-size", "4MiB"]).expect("ok");
        assert_eq!(c.segment_sizes(), vec![4 << 20, 4 << 20, 2 << 20]);
    }

    #[test]
    fn presence_slots_auto_off_or_a_power_of_two() {
        let c = ManagerConfig::from_argv(["x", "--dram-size", "1GiB"]).expect("defaults");
        // auto: twice the 4 KiB extents of 1 GiB.
        assert_eq!(c.presence_slots, 1 << 19);
        let c = ManagerConfig::from_argv(["x", "--presence-slots", "off"]).expect("off");
        assert_eq!(c.presence_slots, 0);
        let c = ManagerConfig::from_argv(["x", "--presence-slots", "4096"]).expect("4096");
        assert_eq!(c.presence_slots, 4096);
        for bad in ["1000", "512", "0", "lots"] {
            let e = ManagerConfig::from_argv(["x", "--presence-slots", bad]).expect_err(bad);
            assert!(e.to_string().contains("presence_slots"), "{e}");
        }
        // A Manager that asks peers on a miss publishes no table (auto), and refuses one.
        let c = ManagerConfig::from_argv(["x", "--peer", "127.0.0.1:9"]).expect("peer");
        assert_eq!(c.presence_slots, 0);
        let e = ManagerConfig::from_argv(["x", "--peer", "127.0.0.1:9", "--presence-slots", "4096"])
            .expect_err("explicit table with peers");
        assert!(e.to_string().contains("peer"), "{e}");
    }

    #[test]
    fn cache_policy_defaults_parses_and_names_the_choices() {
        use orbitkv_core::policy::PolicyKind;
        let c = ManagerConfig::from_argv(["x"]).expect("defaults");
        assert_eq!(c.cache_policy, PolicyKind::Duel);
        let c = ManagerConfig::from_argv(["x", "--cache-policy", "lru"]).expect("lru");
        assert_eq!(c.cache_policy, PolicyKind::Lru);
        assert_eq!(c.cache_policy_seed, None, "random per process unless set");
        let c = ManagerConfig::from_argv(["x", "--cache-policy-seed", "42"]).expect("seed");
        assert_eq!(c.cache_policy_seed, Some(42));
        ManagerConfig::from_argv(["x", "--cache-policy-seed", "-1"]).expect_err("not a u64");
        let e = ManagerConfig::from_argv(["x", "--cache-policy", "mru"]).expect_err("unknown");
        assert!(
            e.to_string().contains("\"mru\"")
                && e.to_string().contains("duel")
                && e.to_string().contains("s3fifo-adaptive"),
            "{e}"
        );
    }

    #[test]
    fn token_file_open_to_others_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("token");
        std::fs::write(&p, "0123456789abcdef-secret\n").expect("write");
        let ps = p.to_string_lossy().to_string();
        for mode in [0o644, 0o640, 0o604, 0o620] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
            let e = ManagerConfig::from_argv(["x", "--token-file", &ps]).expect_err("open token file");
            let msg = e.to_string();
            assert!(
                msg.contains(&ps) && msg.contains(&format!("mode {mode:04o}")),
                "{msg}"
            );
            assert!(msg.contains(&format!("chmod 600 {ps}")), "{msg}");
        }
        for mode in [0o600, 0o400] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
            let c = ManagerConfig::from_argv(["x", "--token-file", &ps]).expect("private token file");
            assert_eq!(c.token.as_deref(), Some(&b"0123456789abcdef-secret"[..]));
        }
    }

    #[test]
    fn toml_file_is_overridden_by_flags() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("m.toml");
        std::fs::write(&p, "dram_size = \"8MiB\"\nmetrics_addr = \"off\"\n").expect("write");
        let ps = p.to_string_lossy().to_string();
        let c = ManagerConfig::from_argv(["x", "--config", &ps]).expect("ok");
        assert_eq!((c.dram_size, c.metrics_addr), (8 << 20, None));
        let c = ManagerConfig::from_argv(["x", "--config", &ps, "--dram-size", "16MiB"]).expect("ok");
        assert_eq!(c.dram_size, 16 << 20);
        std::fs::write(&p, "dram_sise = \"8MiB\"\n").expect("write");
        let e = ManagerConfig::from_argv(["x", "--config", &ps]).expect_err("typo");
        assert!(e.to_string().contains("dram_sise"));
    }

    #[test]
    fn hugepages_parse_and_sizes_must_be_whole_pages() {
        let c = ManagerConfig::from_argv(["m", "--hugepages", "2MiB", "--dram-size", "64MiB"]).expect("ok");
        assert_eq!(c.page_size, orbitkv_shm::PageSize::Huge2MiB);
        let c = ManagerConfig::from_argv(["m", "--dram-size", "64MiB"]).expect("ok");
        assert_eq!(c.page_size, orbitkv_shm::PageSize::Base);
        for argv in [
            vec!["m", "--hugepages", "2MiB", "--dram-size", "5MiB"],
            vec!["m", "--hugepages", "2MiB", "--segment-size", "3MiB"],
            vec![
                "m",
                "--hugepages",
                "1GiB",
                "--dram-size",
                "1GiB",
                "--segment-size",
                "256MiB",
            ],
            vec!["m", "--hugepages", "64KiB"],
        ] {
            let e = ManagerConfig::from_argv(argv.clone()).expect_err("refused");
            assert!(
                e.to_string().contains("hugepages") || e.to_string().contains("multiples"),
                "{argv:?}: {e}"
            );
        }
    }
}
