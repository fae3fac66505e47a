//! Peer-tier settings: the listen address, static peers, mutual TLS between
//! Managers, etcd membership (with its own TLS), TP shard peers and the fill
//! knobs, validated together (`peer_settings`).

use std::net::SocketAddr;
use std::path::PathBuf;

use super::args::Args;
use super::{ConfigError, check};

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

/// TLS files for the etcd gateway: as for the remote tier's cluster, the CA
/// and an optional client certificate chain and key (both or neither).
pub type EtcdTlsFiles = orbitkv_remote::store::TlsFiles;

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

pub(super) fn peer_settings(a: &mut Args, file: &mut Args) -> Result<Option<PeerSettings>, ConfigError> {
    let listen_s = a.peer_listen.take().or(file.peer_listen.take());
    let mut peers = std::mem::take(&mut a.peer);
    peers.extend(std::mem::take(&mut file.peer));
    let etcd_s = a.etcd_endpoints.take().or(file.etcd_endpoints.take());
    let cert = a.peer_tls_cert.take().or(file.peer_tls_cert.take());
    let key = a.peer_tls_key.take().or(file.peer_tls_key.take());
    let ca = a.peer_tls_ca.take().or(file.peer_tls_ca.take());
    let advertise = a.peer_advertise.take().or(file.peer_advertise.take());
    let etcd_ca = a.etcd_tls_ca.take().or(file.etcd_tls_ca.take());
    let etcd_cert = a.etcd_tls_cert.take().or(file.etcd_tls_cert.take());
    let etcd_key = a.etcd_tls_key.take().or(file.etcd_tls_key.take());
    let mut tp_shard_s = std::mem::take(&mut a.tp_shard_peer);
    tp_shard_s.extend(std::mem::take(&mut file.tp_shard_peer));
    let tp_parallel = a.tp_peer_parallel.or(file.tp_peer_parallel).unwrap_or(8);
    let tp_parallel = check::bounded("tp_peer_parallel", tp_parallel, 1..=64, "")?;
    let fill_parallel = a.peer_fill_parallel.or(file.peer_fill_parallel).unwrap_or(4);
    let fill_parallel = check::bounded("peer_fill_parallel", fill_parallel, 1..=64, "")?;
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
    let fill_streams = check::bounded("peer_fill_streams", fill_streams, 1..=8, "")?;
    let query_control = a.enable_query_control || file.enable_query_control;
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
    let ms = check::bounded("peer_timeout_ms", ms, 1..=600_000, "milliseconds")?;
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
                let addr = check::loopback(
                    hp,
                    || {
                        format!(
                            "etcd endpoint {e:?} must be http://IP:port (literal loopback) or https://HOST:PORT"
                        )
                    },
                    |_| {
                        format!(
                            "etcd endpoint {e} is not literal loopback: plain HTTP to etcd is allowed on loopback only; use https://{hp} with --etcd-tls-ca (and --etcd-tls-cert/--etcd-tls-key if etcd checks client certificates)"
                        )
                    },
                )?;
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
            let client = check::cert_and_key(
                etcd_cert,
                etcd_key,
                "an etcd client certificate needs both --etcd-tls-cert and --etcd-tls-key",
            )?;
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
            let ttl_s = check::bounded(
                "etcd_ttl_s",
                a.etcd_ttl_s.or(file.etcd_ttl_s).unwrap_or(10),
                2..=3600,
                "",
            )?;
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

#[cfg(test)]
mod tests {
    use super::super::ManagerConfig;
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
}
