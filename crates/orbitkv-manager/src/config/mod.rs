//! Manager configuration: embedded defaults, optional TOML file, environment
//! (`ORBITKV_*`) and flags, in increasing precedence.
//!
//! This module holds the validated [`ManagerConfig`] and the parsing entry
//! ([`ManagerConfig::from_argv`]); each concern has its own submodule:
//!
//! - `args.rs`: the command line and the TOML file's keys;
//! - `sizes.rs`: size values and the arena's layout (pages, segments);
//! - `ssd.rs`: SSD-tier settings;
//! - `peer.rs`: peer-tier settings (mutual TLS, etcd, TP shard peers);
//! - `token.rs`: the shared-token file.

mod args;
mod check;
mod events;
mod peer;
mod remote;
mod sizes;
mod ssd;
mod token;

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;

pub use args::Args;
pub use events::{EventsSettings, HashForm};
use peer::peer_settings;
pub use peer::{EtcdSettings, EtcdTlsFiles, PeerSettings, PeerTlsFiles, is_literal_loopback};
pub use remote::RemoteSettings;
pub use sizes::{
    AUTO_SEGMENT_MIN, AUTO_SEGMENTS, DEFAULT_DRAM, DEFAULT_MAX_BUFFERED, auto_segment_size, parse_size,
};
pub use ssd::SsdSettings;

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
    pub log_format: crate::log::Format,
    pub ssd: Option<SsdSettings>,
    /// DRAM eviction policy.
    pub cache_policy: orbitkv_core::policy::PolicyKind,
    /// Seed of `duel`'s key sample and `tinylfu`'s sketch (`None`: random per process).
    pub cache_policy_seed: Option<u64>,
    /// Share of DRAM retention hints may keep (0: hints are refused).
    pub retain_share: f64,
    /// Slots of the presence table (0: none is published).
    pub presence_slots: u64,
    /// Peer Managers (contract D3); `None` when this Manager neither serves nor asks peers.
    pub peers: Option<PeerSettings>,
    /// The remote tier (a Redis Cluster); `None` without `--remote-nodes`.
    pub remote: Option<RemoteSettings>,
    /// KV events published for routers; `None` without `--kv-events`.
    pub events: Option<EventsSettings>,
}

pub const DEFAULT_METRICS: &str = "127.0.0.1:9464";
/// Share of DRAM retention hints may keep unless configured.
pub const DEFAULT_RETAIN_SHARE: f64 = 0.8;
pub const MAX_RETAIN_SHARE: f64 = 0.95;

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
                toml::from_str::<Args>(&text).map_err(|err| ConfigError::Toml { path: p.clone(), err })?
            }
            None => Args::default(),
        };
        let peers = peer_settings(&mut a, &mut file)?;
        let remote = remote::remote_settings(&mut a, &mut file)?;
        let events = events::events_settings(&mut a, &mut file)?;
        let uid = orbitkv_shm::peer::my_uid();
        let socket = a
            .socket
            .or(file.socket)
            .unwrap_or_else(|| orbitkv_proto::default_socket_path(uid));
        let (dram_size, page_size, segment_size) = sizes::arena_layout(
            a.dram_size.or(file.dram_size),
            a.segment_size.or(file.segment_size),
            a.hugepages.or(file.hugepages),
        )?;
        let metrics = a
            .metrics_addr
            .or(file.metrics_addr)
            .unwrap_or_else(|| DEFAULT_METRICS.into());
        let metrics_addr = if metrics.eq_ignore_ascii_case("off") {
            None
        } else {
            Some(check::loopback(
                &metrics,
                || format!("metrics_addr {metrics:?} is not host:port or \"off\""),
                |addr| {
                    format!(
                        "metrics_addr {addr} is not loopback; the metrics endpoint has no authentication, so only 127.0.0.0/8 or [::1] is allowed"
                    )
                },
            )?)
        };
        let token = match a.token_file.or(file.token_file) {
            Some(p) => {
                let raw = token::read_token_file(&p)?;
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
        allow_uids.extend(file.allow_uid);
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
        let millis = |name: &str, v: u64| {
            check::bounded(name, v, 1..=3_600_000, "milliseconds").map(std::time::Duration::from_millis)
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
        let spin_us = a.session_spin_us.or(file.session_spin_us).unwrap_or(0);
        let spin_us = check::bounded("session_spin_us", spin_us, 0..=1000, "microseconds")?;
        let session_spin = std::time::Duration::from_micros(spin_us);
        let log_level = crate::log::Level::parse(a.log_level.or(file.log_level).as_deref().unwrap_or("info"))
            .ok_or_else(|| ConfigError::Invalid("log_level must be error, warn, info or debug".into()))?;
        let log_format =
            crate::log::Format::parse(a.log_format.or(file.log_format).as_deref().unwrap_or("text"))
                .ok_or_else(|| ConfigError::Invalid("log_format must be text or json".into()))?;
        let ssd_dir = a
            .ssd_dir
            .or(file.ssd_dir)
            .or_else(|| (a.ssd || file.ssd).then(ssd::default_ssd_dir));
        let ssd = match ssd_dir {
            None => None,
            Some(dir) => Some(ssd::settings(
                dir,
                a.ssd_capacity.or(file.ssd_capacity),
                a.ssd_mode.or(file.ssd_mode),
                a.ssd_engine.or(file.ssd_engine),
                a.ssd_admit_hits.or(file.ssd_admit_hits),
                a.ssd_write_policy.or(file.ssd_write_policy),
            )?),
        };
        let cache_policy = match a.cache_policy.or(file.cache_policy) {
            Some(name) => name
                .parse::<orbitkv_core::policy::PolicyKind>()
                .map_err(|e| ConfigError::Invalid(format!("cache_policy: {e}")))?,
            None => orbitkv_core::policy::PolicyKind::default(),
        };
        let cache_policy_seed = a.cache_policy_seed.or(file.cache_policy_seed);
        let retain_share = a
            .retain_share
            .or(file.retain_share)
            .unwrap_or(DEFAULT_RETAIN_SHARE);
        if !(0.0..=MAX_RETAIN_SHARE).contains(&retain_share) {
            return Err(ConfigError::Invalid(format!(
                "retain_share {retain_share} must be from 0 (hints off) to {MAX_RETAIN_SHARE}: \
                 hints may never keep all of DRAM from unhinted requests"
            )));
        }
        // A Manager that asks peers on a local miss cannot let a local table answer
        // "certainly absent": the block may be one peer fill away (session/handlers.rs `lookup`).
        // The same holds for the remote tier (read on a local miss).
        let asks_peers = peers
            .as_ref()
            .is_some_and(|p| !p.peers.is_empty() || p.etcd.is_some())
            || remote.is_some();
        let presence_setting = a.presence_slots.or(file.presence_slots);
        let presence_slots = match presence_setting.as_deref().unwrap_or("auto") {
            "auto" if asks_peers => 0,
            "off" => 0,
            n if asks_peers => {
                return Err(ConfigError::Invalid(format!(
                    "presence_slots {n:?} with peers or a remote tier to ask (--peer / --etcd-endpoints / \
                     --remote-nodes): a local presence table would answer misses that they could fill; use \
                     presence_slots auto or off"
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
            remote,
            events,
            ssd,
            cache_policy,
            cache_policy_seed,
            retain_share,
            socket,
            dram_size,
            segment_size,
            page_size,
            metrics_addr,
            token,
            allow_uids,
            socket_mode,
            enable_fault_injection: a.enable_fault_injection || file.enable_fault_injection,
            enable_query_control: a.enable_query_control || file.enable_query_control,
            tp_lease_ttl,
            max_connections,
            max_buffered_bytes,
            hello_timeout,
            frame_timeout,
            session_spin,
            log_level,
            log_format,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn log_format_text_by_default_json_on_request_anything_else_refused() {
        let c = ManagerConfig::from_argv(["x"]).expect("defaults");
        assert_eq!(c.log_format, crate::log::Format::Text);
        let c = ManagerConfig::from_argv(["x", "--log-format", "json"]).expect("json");
        assert_eq!(c.log_format, crate::log::Format::Json);
        let e = ManagerConfig::from_argv(["x", "--log-format", "logfmt"]).expect_err("unknown");
        assert!(e.to_string().contains("log_format must be text or json"), "{e}");
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
        let c = ManagerConfig::from_argv(["x"]).expect("default");
        assert_eq!(c.retain_share, DEFAULT_RETAIN_SHARE);
        let c = ManagerConfig::from_argv(["x", "--retain-share", "0"]).expect("off");
        assert_eq!(c.retain_share, 0.0);
        for bad in ["0.96", "-0.1", "NaN"] {
            let flag = format!("--retain-share={bad}");
            let e = ManagerConfig::from_argv(["x", flag.as_str()]).expect_err(bad);
            assert!(e.to_string().contains("retain_share"), "{bad}: {e}");
        }
        let e = ManagerConfig::from_argv(["x", "--cache-policy", "mru"]).expect_err("unknown");
        assert!(
            e.to_string().contains("\"mru\"")
                && e.to_string().contains("duel")
                && e.to_string().contains("s3fifo-adaptive"),
            "{e}"
        );
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
    fn toml_file_lists_and_switches_add_to_the_flags_and_cannot_name_another_file() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("m.toml");
        let ps = p.to_string_lossy().to_string();
        let token = dir.path().join("token");
        std::fs::write(&token, "0123456789abcdef0123456789abcdef").expect("write");
        std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod");
        let toml = format!(
            "allow_uid = [4242]\nenable_fault_injection = true\nenable_query_control = true\n\
             token_file = {:?}\nmetrics_addr = \"off\"\n",
            token.to_string_lossy()
        );
        std::fs::write(&p, toml).expect("write");
        let c = ManagerConfig::from_argv(["x", "--config", &ps, "--allow-uid", "7"]).expect("ok");
        assert!(
            c.allow_uids.contains(&7) && c.allow_uids.contains(&4242),
            "{:?}",
            c.allow_uids
        );
        assert!(c.enable_fault_injection && c.enable_query_control && c.token.is_some());
        let c = ManagerConfig::from_argv(["x", "--metrics-addr", "off"]).expect("ok");
        assert!(!c.enable_fault_injection && !c.enable_query_control && c.token.is_none());
        std::fs::write(&p, "config = \"/etc/other.toml\"\n").expect("write");
        let e = ManagerConfig::from_argv(["x", "--config", &ps]).expect_err("nested config");
        assert!(e.to_string().contains("config"), "{e}");
    }
}
