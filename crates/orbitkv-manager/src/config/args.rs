//! The sources of the settings: the command line of `orbitkv serve` (with its
//! `ORBITKV_*` environment variables) and the keys of the TOML file, one struct for both.

use std::path::PathBuf;

use clap::Parser;
use serde::Deserialize;

/// Command line of `orbitkv serve` / `orbitkv-manager`, and the keys of its `--config` TOML
/// file (the long flags' names with underscores; an unknown key, `config` included, is
/// refused). A flag or its environment variable wins over the file.
#[derive(Debug, Parser, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
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
    /// hash, the block index's hash): the same seed decides the same in every run, for
    /// reproducible measurements. Unset, the seed is random per process, so clients cannot
    /// aim keys at the sample or the index [default: random]
    #[arg(long, env = "ORBITKV_CACHE_POLICY_SEED")]
    pub cache_policy_seed: Option<u64>,
    /// Share of DRAM that applications' retention hints may keep (0 to 0.95; 0 turns hints
    /// off and refuses them). A keep over it displaces only the same namespace's kept blocks
    /// expected back last [default: 0.8]
    #[arg(long, env = "ORBITKV_RETAIN_SHARE")]
    pub retain_share: Option<f64>,
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
    /// Remote tier: seed nodes of a Redis Cluster (or Valkey), HOST:PORT[,HOST:PORT...]; give
    /// several, so a reconnect does not depend on one node. Blocks committed here are written
    /// to it, and a local miss (after DRAM, SSD and peers) is read from it. Anything but
    /// literal loopback needs --remote-tls-ca [default: none, no remote tier]
    #[arg(long, env = "ORBITKV_REMOTE_NODES")]
    pub remote_nodes: Option<String>,
    /// ACL user of the remote tier [default: orbitkv]
    #[arg(long, env = "ORBITKV_REMOTE_USER")]
    pub remote_user: Option<String>,
    /// File holding the ACL user's password (mode 0600 or tighter; required with --remote-nodes)
    #[arg(long, env = "ORBITKV_REMOTE_PASSWORD_FILE")]
    pub remote_password_file: Option<PathBuf>,
    /// PEM CA the cluster's TLS certificates must chain to: TLS to the remote tier
    #[arg(long, env = "ORBITKV_REMOTE_TLS_CA")]
    pub remote_tls_ca: Option<PathBuf>,
    /// PEM client certificate chain for the cluster's TLS (with --remote-tls-key)
    #[arg(long, env = "ORBITKV_REMOTE_TLS_CERT")]
    pub remote_tls_cert: Option<PathBuf>,
    /// PEM private key of --remote-tls-cert
    #[arg(long, env = "ORBITKV_REMOTE_TLS_KEY")]
    pub remote_tls_key: Option<PathBuf>,
    /// Prefix of every key the remote tier writes (the ACL user should be confined to it)
    /// [default: okv:]
    #[arg(long)]
    pub remote_prefix: Option<String>,
    /// Longest wait for one remote request, its one retry included, in milliseconds [default: 200]
    #[arg(long)]
    pub remote_deadline_ms: Option<u64>,
    /// Blocks waiting to be written to the remote tier; beyond it new ones are dropped
    /// (counted, never waited for) [default: 4096]
    #[arg(long)]
    pub remote_write_queue: Option<usize>,
    /// Write a block to the remote tier only once lookups have hit it this many times
    /// (saving it again after an eviction counts one, with an SSD tier); 0 writes every
    /// committed block [default: 0]
    #[arg(long)]
    pub remote_admit_hits: Option<u32>,
    /// Publish KV events (blocks stored in / removed from this Manager) in vLLM's KV-event
    /// wire format on this ZeroMQ PUB endpoint: tcp://127.0.0.1:PORT (loopback only: the
    /// stream has no authentication) or ipc:///absolute/path [default: off]
    #[arg(long, env = "ORBITKV_KV_EVENTS")]
    pub kv_events: Option<String>,
    /// ZeroMQ ROUTER endpoint where a late or reconnecting subscriber asks for the batches
    /// it missed (vLLM's replay protocol), same rules as --kv-events [default: none]
    #[arg(long)]
    pub kv_events_replay: Option<String>,
    /// Batches kept for replay (also bounded to 64 MiB) [default: 10000]
    #[arg(long)]
    pub kv_events_buffer: Option<usize>,
    /// Publish block hashes as their low 64 bits, big-endian, as an int (vLLM's
    /// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1), not as bytes; the same as
    /// --kv-events-hash-form vllm-int
    #[arg(long)]
    pub kv_events_int_hashes: bool,
    /// How block hashes are published, for the engine whose router reads them: bytes
    /// (vLLM's default), vllm-int (as --kv-events-int-hashes) or sglang (SGLang's signed
    /// 64-bit page hashes and media names) [default: bytes]
    #[arg(long)]
    pub kv_events_hash_form: Option<String>,
    /// TOML config file (keys as the long flags with underscores)
    #[arg(long, env = "ORBITKV_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Log level: error, warn, info, debug
    #[arg(long, env = "ORBITKV_LOG")]
    pub log_level: Option<String>,
    /// Log line format: text (RFC 3339 time, level, message) or json (one object a line)
    #[arg(long, env = "ORBITKV_LOG_FORMAT")]
    pub log_format: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
