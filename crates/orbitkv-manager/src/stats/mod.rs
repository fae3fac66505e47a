//! One snapshot of every counter and gauge, rendered as JSON (`orbitkv
//! status`, the Stats request) or Prometheus text (`/metrics`).
//!
//! The snapshot (`snapshot.rs`) is one table of the scalar metrics, a line
//! each, grouped by what they report; the latency histograms
//! (`crate::latency`) are rendered after them.

mod snapshot;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use orbitkv_shm::Segment;

use crate::config::ManagerConfig;
use crate::parts::{Cache, Clock, Connections, Quarantine, ServerCounters};
use crate::peer::PeerTier;
use crate::presence::Presence;
use crate::tier::Tier;
pub use snapshot::snapshot;

/// (name, help, kind, value). `kind` is "counter" or "gauge".
type Metric = (&'static str, &'static str, &'static str, u64);

/// Everything a snapshot reads, and nothing else of the Manager (the metrics
/// server holds only this; see `Shared::stats`).
pub struct View<'a> {
    pub cache: &'a Cache,
    pub quarantine: &'a Quarantine,
    pub counters: &'a ServerCounters,
    pub connections: &'a Connections,
    pub tier: Option<&'a dyn Tier>,
    pub presence: Option<&'a Presence>,
    pub peers: Option<&'a PeerTier>,
    pub remote: Option<&'a crate::remote::RemoteTier>,
    pub events: Option<&'a crate::events::EventCounters>,
    pub segments: &'a [Segment],
    pub config: &'a ManagerConfig,
    pub clock: Clock,
    pub metrics_addr: Option<SocketAddr>,
}

fn ld(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

pub fn json(v: &View<'_>) -> String {
    let mut m = serde_json::Map::new();
    for (name, _, _, value) in snapshot(v) {
        m.insert(name.into(), value.into());
    }
    m.insert("socket".into(), v.config.socket.display().to_string().into());
    m.insert(
        "metrics_addr".into(),
        v.metrics_addr.map(|a| a.to_string()).into(),
    );
    m.insert("version".into(), env!("CARGO_PKG_VERSION").into());
    m.insert(
        "ssd".into(),
        match (&v.config.ssd, v.tier.map(|t| t.status())) {
            (Some(cfg), Some(t)) => serde_json::json!({
                "enabled": true,
                "dir": cfg.dir.display().to_string(),
                "mode": if cfg.mode == orbitkv_ssd::IoMode::Direct { "direct" } else { "kernel" },
                "engine": t.engine,
                "fallback_reason": t.fallback_reason,
                "admit_hits": cfg.admit_hits,
                "write_policy": if cfg.write_policy == orbitkv_core::SpillPolicy::Eager { "eager" } else { "evict" },
            }),
            _ => serde_json::json!({ "enabled": false }),
        },
    );
    m.insert(
        "peers".into(),
        v.peers
            .map_or_else(|| serde_json::json!({ "enabled": false }), |p| p.status_json()),
    );
    m.insert(
        "remote".into(),
        match &v.config.remote {
            Some(r) => serde_json::json!({
                "enabled": true,
                "nodes": r.store.nodes,
                "user": r.store.username,
                "tls": r.store.tls.is_some(),
                "prefix": r.store.key_prefix,
                "deadline_ms": r.store.deadline.as_millis() as u64,
                "write_queue": r.write_queue,
                "admit_hits": r.admit_hits,
            }),
            None => serde_json::json!({ "enabled": false }),
        },
    );
    m.insert(
        "kv_events".into(),
        match &v.config.events {
            Some(e) => serde_json::json!({
                "enabled": true,
                "endpoint": e.endpoint,
                "replay": e.replay,
                "buffer": e.buffer,
                "hash_form": e.form.name(),
            }),
            None => serde_json::json!({ "enabled": false }),
        },
    );
    m.insert(
        "latency_us".into(),
        v.counters
            .latency
            .all()
            .iter()
            .map(|(name, _, h)| {
                let s = h.summary();
                let q = |p: f64| s.quantile_us(p).map_or(serde_json::Value::Null, serde_json::Value::from);
                let mean = (s.count > 0).then(|| s.sum_ns as f64 / s.count as f64 / 1e3);
                let v = serde_json::json!({ "count": s.count, "mean": mean, "p50_le": q(0.5), "p99_le": q(0.99) });
                ((*name).to_string(), v)
            })
            .collect::<serde_json::Map<_, _>>()
            .into(),
    );
    m.insert("pid".into(), std::process::id().into());
    m.insert(
        "segment_sizes".into(),
        v.segments
            .iter()
            .map(|s| serde_json::Value::from(s.size()))
            .collect::<Vec<_>>()
            .into(),
    );
    serde_json::Value::Object(m).to_string()
}

pub fn prometheus(v: &View<'_>) -> String {
    let mut out = String::new();
    for (name, help, kind, value) in snapshot(v) {
        out.push_str(&format!(
            "# HELP orbitkv_{name} {help}\n# TYPE orbitkv_{name} {kind}\norbitkv_{name} {value}\n"
        ));
    }
    for (name, help, h) in v.counters.latency.all() {
        out.push_str(&h.summary().prometheus(name, help));
    }
    if let Some(p) = v.peers {
        out.push_str(&p.prometheus());
    }
    out
}
