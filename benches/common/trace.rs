//! Prefix-block traces (the public Mooncake FAST25 format: one JSON object
//! per line, `hash_ids` one id per 512-token block, `timestamp` in ms) and the
//! offline optimum over them, shared by the trace simulators.
#![allow(dead_code)]

use std::collections::{BTreeSet, HashMap};

use orbitkv_core::{CacheState, Fingerprint, NamespaceKey, NsId, SessionId};

/// One request of a trace: its arrival (ms from the trace's start, 0 when
/// the trace has none) and its block ids, prefix first.
#[derive(Debug, Clone)]
pub struct Request {
    pub t_ms: u64,
    pub ids: Vec<u64>,
}

/// The requests of a trace file, in file order.
pub fn parse_requests(path: &str) -> Result<Vec<Request>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("{path}:{}: {e}", n + 1))?;
        let ids = v
            .get("hash_ids")
            .and_then(|h| h.as_array())
            .ok_or_else(|| format!("{path}:{}: no `hash_ids` array", n + 1))?;
        let ids: Option<Vec<u64>> = ids.iter().map(|x| x.as_u64()).collect();
        let ids = ids.ok_or_else(|| format!("{path}:{}: `hash_ids` must be non-negative integers", n + 1))?;
        let t_ms = match v.get("timestamp") {
            None => 0,
            Some(t) => t.as_u64().ok_or_else(|| {
                format!(
                    "{path}:{}: `timestamp` must be a non-negative integer (ms)",
                    n + 1
                )
            })?,
        };
        out.push(Request { t_ms, ids });
    }
    if out.is_empty() {
        return Err(format!("{path}: no requests"));
    }
    Ok(out)
}

/// The block ids of every request of a trace file.
pub fn parse_trace(path: &str) -> Result<Vec<Vec<u64>>, String> {
    Ok(parse_requests(path)?.into_iter().map(|r| r.ids).collect())
}

pub fn hash_of(id: u64) -> [u8; 32] {
    let mut h = [0u8; 32];
    h[..8].copy_from_slice(&id.to_le_bytes());
    h[8] = 1;
    h
}

#[derive(Default, Clone, Copy, Debug)]
pub struct Tally {
    pub requested: u64,
    pub served: u64,
}

impl Tally {
    pub fn rate(&self) -> f64 {
        self.served as f64 / self.requested.max(1) as f64
    }
}

pub fn run_opt(trace: &[Vec<u64>], capacity: u64) -> Tally {
    run_opt_with(trace, capacity, |_, _| {})
}

/// [`run_opt`], calling `on_hit(request, position)` for every served block.
pub fn run_opt_with(trace: &[Vec<u64>], capacity: u64, mut on_hit: impl FnMut(usize, usize)) -> Tally {
    // next[r][i]: index of the next request after r that names trace[r][i].
    let mut next: Vec<Vec<u64>> = trace.iter().map(|r| vec![u64::MAX; r.len()]).collect();
    let mut seen: HashMap<u64, u64> = HashMap::new();
    for (r, req) in trace.iter().enumerate().rev() {
        for (i, id) in req.iter().enumerate() {
            next[r][i] = seen.get(id).copied().unwrap_or(u64::MAX);
        }
        for id in req {
            seen.insert(*id, r as u64);
        }
    }
    let mut due: HashMap<u64, u64> = HashMap::new();
    let mut by_due: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut t = Tally::default();
    for (r, req) in trace.iter().enumerate() {
        let hit = req.iter().take_while(|id| due.contains_key(id)).count();
        t.requested += req.len() as u64;
        t.served += hit as u64;
        (0..hit).for_each(|i| on_hit(r, i));
        for (i, id) in req.iter().enumerate() {
            let nu = next[r][i];
            if let Some(old) = due.get(id).copied() {
                by_due.remove(&(old, *id));
                due.insert(*id, nu);
                by_due.insert((nu, *id));
                continue;
            }
            if due.len() as u64 >= capacity {
                let Some(&(far, victim)) = by_due.last() else {
                    continue;
                };
                if far <= nu {
                    continue; // bypass: the newcomer is needed later than every resident
                }
                by_due.pop_last();
                due.remove(&victim);
            }
            due.insert(*id, nu);
            by_due.insert((nu, *id));
        }
    }
    t
}

/// End a simulator's `main`: an error printed after the simulator's name, exit status 2.
pub fn exit_on_error(name: &str, r: Result<(), String>) {
    if let Err(e) = r {
        eprintln!("{name}: {e}");
        std::process::exit(2);
    }
}

/// `--capacity`'s comma-separated block counts.
pub fn parse_capacities(v: &str) -> Result<Vec<u64>, String> {
    v.split(',')
        .map(|c| {
            c.trim()
                .parse::<u64>()
                .map_err(|e| format!("--capacity {c}: {e}"))
        })
        .collect()
}

/// A replay's one session and namespace of `block_bytes` blocks.
pub fn open_replay(cache: &mut CacheState, block_bytes: u64) -> Result<(SessionId, NsId), String> {
    let s = cache.open_session();
    let key = NamespaceKey {
        fingerprint: Fingerprint([7; 32]),
        shard: 0,
        salt: [0; 32],
    };
    let (ns, _) = cache
        .register_namespace(key, block_bytes)
        .map_err(|e| e.to_string())?;
    Ok((s, ns))
}
