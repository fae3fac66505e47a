//! One snapshot of every counter and gauge, rendered as JSON (`orbitkv
//! status`, the Stats request) or Prometheus text (`/metrics`).
//!
//! The snapshot is built section by section, each a function named for what it
//! reports: `cache.rs` (the cache's counters and gauges), `server.rs` (the
//! server's connections and frames), `tiers.rs` (the SSD tier and the presence
//! table).

mod cache;
mod server;
mod tiers;

use std::sync::atomic::{AtomicU64, Ordering};

use crate::shared::Shared;
use cache::{dram, lookups, saves, sessions, state, tp};
use server::connections;
use tiers::{presence_table, ssd_tier};

/// (name, help, kind, value). `kind` is "counter" or "gauge".
type Metric = (&'static str, &'static str, &'static str, u64);

pub fn snapshot(shared: &Shared) -> Vec<Metric> {
    // Each source read once, under its own lock, before any section is built.
    let (c, g) = {
        let cache = shared.cache();
        (cache.counters().clone(), cache.gauges())
    };
    let q = shared.quarantine();
    let unprovable = q.iter().filter(|x| x.process.is_none()).count() as u64;
    drop(q);
    let sc = &shared.counters;
    let ssd = shared.tier.as_ref().map(|t| t.status().stats).unwrap_or_default();
    let presence = shared.presence.as_ref().map(|p| p.stats());
    [
        lookups(&c, sc),
        saves(&c),
        sessions(&c, sc),
        connections(shared, sc),
        dram(&g),
        tp(&c, &g),
        state(shared, &g, unprovable),
        ssd_tier(&c, &g, &ssd),
        presence_table(presence),
    ]
    .concat()
}

fn ld(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

pub fn json(shared: &Shared) -> String {
    let mut m = serde_json::Map::new();
    for (name, _, _, v) in snapshot(shared) {
        m.insert(name.into(), v.into());
    }
    m.insert("socket".into(), shared.config.socket.display().to_string().into());
    let metrics = shared.metrics_addr.lock().ok().and_then(|a| *a);
    m.insert("metrics_addr".into(), metrics.map(|a| a.to_string()).into());
    m.insert("version".into(), env!("CARGO_PKG_VERSION").into());
    m.insert(
        "ssd".into(),
        match (&shared.config.ssd, shared.tier.as_ref().map(|t| t.status())) {
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
        shared
            .peers
            .as_ref()
            .map_or_else(|| serde_json::json!({ "enabled": false }), |p| p.status_json()),
    );
    m.insert("pid".into(), std::process::id().into());
    m.insert(
        "segment_sizes".into(),
        shared
            .segments
            .iter()
            .map(|s| serde_json::Value::from(s.size()))
            .collect::<Vec<_>>()
            .into(),
    );
    serde_json::Value::Object(m).to_string()
}

pub fn prometheus(shared: &Shared) -> String {
    let mut out = String::new();
    for (name, help, kind, v) in snapshot(shared) {
        out.push_str(&format!(
            "# HELP orbitkv_{name} {help}\n# TYPE orbitkv_{name} {kind}\norbitkv_{name} {v}\n"
        ));
    }
    if let Some(p) = shared.peers.as_ref() {
        out.push_str(&p.prometheus());
    }
    out
}
