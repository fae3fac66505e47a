//! The peer tier in `orbitkv status` (the `peers` object) and in `/metrics`
//! (per-peer series, TP and source counters).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::{PeerHealth, PeerTier};

impl PeerTier {
    /// The `peers` object of `orbitkv status`.
    pub fn status_json(&self) -> serde_json::Value {
        let now = Instant::now();
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let src = &self.source;
        let peers: Vec<serde_json::Value> = self
            .health()
            .iter()
            .map(|(addr, h)| {
                let down = h.down_until.is_some_and(|t| t > now);
                serde_json::json!({
                    "addr": addr,
                    "source": if h.discovered { "etcd" } else { "static" },
                    "health": if down { "down" } else if h.fetches == 0 { "unknown" } else { "up" },
                    "fetches": h.fetches,
                    "hit_fetches": h.hit_fetches,
                    "blocks": h.blocks,
                    "bytes": h.bytes,
                    "errors": h.errors,
                    "mean_latency_us": h.latency_us.checked_div(h.fetches.saturating_sub(h.errors)).unwrap_or(0),
                    "last_error": h.last_error,
                })
            })
            .collect();
        let listen = *self.listen_addr.lock().unwrap_or_else(|p| p.into_inner());
        serde_json::json!({
            "enabled": true,
            "listen": listen.map(|a| a.to_string()),
            "advertise": self.settings.advertise,
            "tls": self.tls.is_some(),
            "hash_thread": self.settings.hash_thread,
            "fill_streams": self.settings.fill_streams,
            "etcd": match &self.settings.etcd {
                None => serde_json::Value::from("off"),
                Some(_) => self.etcd_status.read().unwrap_or_else(|p| p.into_inner()).clone().into(),
            },
            "peers": peers,
            "tp": {
                "shard_peers": self.settings.tp_shards,
                "parallel": self.settings.tp_parallel,
                "pins": ld(&self.tp.pins),
                "errors": ld(&self.tp.errors),
                "settles": ld(&self.tp.settles),
                "releases": ld(&self.tp.releases),
                "remote_leases": self.tp.remote_leases(),
                "served_pins": ld(&self.tp.served_pins),
            },
            "source": {
                "connections": ld(&src.connections),
                "refused": ld(&src.refused),
                "bad_frames": ld(&src.bad_frames),
                "fetches": ld(&src.fetches),
                "blocks_sent": ld(&src.blocks_sent),
                "bytes_sent": ld(&src.bytes_sent),
                "leases_open": ld(&src.leases_open),
                "leases_done": ld(&src.leases_done),
                "leases_dropped": ld(&src.leases_dropped),
                "probes": ld(&src.probes),
                "probes_released": ld(&src.probes_released),
            },
        })
    }

    /// Per-peer series for `/metrics` (label `peer`).
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        let health = self.health();
        let now = Instant::now();
        type Get = fn(&PeerHealth) -> u64;
        let series: [(&str, &str, &str, Get); 6] = [
            ("peer_fetches_total", "Fetches sent to a peer", "counter", |h| {
                h.fetches
            }),
            (
                "peer_blocks_total",
                "Blocks received from a peer and stored",
                "counter",
                |h| h.blocks,
            ),
            (
                "peer_bytes_total",
                "Bytes received from a peer and stored",
                "counter",
                |h| h.bytes,
            ),
            (
                "peer_errors_total",
                "Failed fetches (a miss) per peer",
                "counter",
                |h| h.errors,
            ),
            (
                "peer_latency_us_total",
                "Sum of successful fetch latencies per peer, microseconds",
                "counter",
                |h| h.latency_us,
            ),
            (
                "peer_up",
                "1 unless the peer failed within the back-off",
                "gauge",
                |_| 0,
            ),
        ];
        for (name, help, kind, get) in series {
            out.push_str(&format!(
                "# HELP orbitkv_{name} {help}\n# TYPE orbitkv_{name} {kind}\n"
            ));
            for (addr, h) in &health {
                let v = if name == "peer_up" {
                    u64::from(h.down_until.is_none_or(|t| t <= now))
                } else {
                    get(h)
                };
                out.push_str(&format!("orbitkv_{name}{{peer=\"{addr}\"}} {v}\n"));
            }
        }
        let src = &self.source;
        let remote = AtomicU64::new(self.tp.remote_leases() as u64);
        for (name, help, kind, v) in [
            (
                "peer_tp_pins_total",
                "TP pin queries sent to Managers holding TP shards",
                "counter",
                &self.tp.pins,
            ),
            (
                "peer_tp_errors_total",
                "Failed TP queries to peers (each made a TP lookup a miss)",
                "counter",
                &self.tp.errors,
            ),
            (
                "peer_tp_remote_leases",
                "TP leases with parts pinned on peers, not yet ended by their owner",
                "gauge",
                &remote,
            ),
            (
                "peer_tp_served_pins_total",
                "TP pins served for other Managers",
                "counter",
                &self.tp.served_pins,
            ),
            (
                "peer_source_blocks_sent_total",
                "Blocks sent to peers",
                "counter",
                &src.blocks_sent,
            ),
            (
                "peer_source_bytes_sent_total",
                "Bytes sent to peers",
                "counter",
                &src.bytes_sent,
            ),
            (
                "peer_source_leases_open",
                "Source leases held for peers now",
                "gauge",
                &src.leases_open,
            ),
            (
                "peer_source_refused_total",
                "Peer connections refused (TLS, limit)",
                "counter",
                &src.refused,
            ),
            (
                "peer_source_bad_frames_total",
                "Peer connections closed for garbage",
                "counter",
                &src.bad_frames,
            ),
        ] {
            out.push_str(&format!(
                "# HELP orbitkv_{name} {help}\n# TYPE orbitkv_{name} {kind}\norbitkv_{name} {}\n",
                v.load(Ordering::Relaxed)
            ));
        }
        out
    }
}
