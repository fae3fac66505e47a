//! Throughput and recovery benchmark for the SSD tier; `benches/ssd/run.sh` drives it and
//! compares it with fio. Prints one JSON object on stdout.
//!
//!   ssd_bench throughput --dir D --mode direct|kernel --engine auto|uring|psync \
//!       --bs BYTES --total BYTES --qd N [--batch ITEMS] [--sync 0|1] [--threads RINGS]
//!   ssd_bench recovery --dir D --mode direct|kernel --blocks N --bs BYTES

use std::collections::HashMap;
use std::time::Instant;

use orbitkv_ssd::{EnginePref, IoMode, RecoveryVerify, SsdConfig, SsdKey, SsdTier};

type BoxErr = Box<dyn std::error::Error>;

fn key(n: u64) -> SsdKey {
    let mut h = [0u8; 32];
    h[..8].copy_from_slice(&n.to_le_bytes());
    SsdKey {
        fingerprint: [1; 32],
        shard: 0,
        salt: [2; 32],
        generation: 1,
        hash: h,
    }
}

/// A 4096-aligned region inside a Vec, like a slot of the shared-memory arena.
struct Arena {
    v: Vec<u8>,
    off: usize,
}

impl Arena {
    fn new(len: usize) -> Arena {
        let v = vec![0u8; len + 4096];
        let off = v.as_ptr().align_offset(4096);
        Arena { v, off }
    }
    fn slots(&mut self, bs: usize, n: usize) -> Vec<&mut [u8]> {
        self.v[self.off..self.off + bs * n].chunks_mut(bs).collect()
    }
}

/// Write `n` blocks of `bs` bytes (keys 0..n) in batches of `batch`.
fn write_blocks(t: &SsdTier, arena: &mut Arena, bs: usize, n: usize, batch: usize) -> Result<(), BoxErr> {
    let mut i = 0;
    while i < n {
        let k = batch.min(n - i);
        let slots = arena.slots(bs, k);
        let items: Vec<(SsdKey, &[u8])> = slots
            .iter()
            .enumerate()
            .map(|(j, s)| (key((i + j) as u64), &**s))
            .collect();
        for r in t.write_batch(&items) {
            r?;
        }
        i += k;
    }
    Ok(())
}

fn args() -> Result<(String, HashMap<String, String>), BoxErr> {
    let mut it = std::env::args().skip(1);
    let cmd = it.next().ok_or("missing subcommand")?;
    let mut m = HashMap::new();
    while let Some(k) = it.next() {
        let k = k.trim_start_matches("--").to_string();
        let v = it.next().ok_or(format!("missing value for --{k}"))?;
        m.insert(k, v);
    }
    Ok((cmd, m))
}

fn get<T: std::str::FromStr>(m: &HashMap<String, String>, k: &str, d: Option<T>) -> Result<T, BoxErr> {
    match m.get(k) {
        Some(v) => v.parse().map_err(|_| format!("bad --{k} {v}").into()),
        None => d.ok_or_else(|| format!("missing --{k}").into()),
    }
}

fn config(m: &HashMap<String, String>, capacity: u64) -> Result<SsdConfig, BoxErr> {
    let dir: String = get(m, "dir", None)?;
    let mut c = SsdConfig::new(dir, capacity);
    c.mode = match m.get("mode").map(String::as_str) {
        Some("kernel") => IoMode::Kernel,
        Some("direct") | None => IoMode::Direct,
        Some(x) => return Err(format!("bad --mode {x}").into()),
    };
    c.engine = match m.get("engine").map(String::as_str) {
        Some("uring") => EnginePref::Uring,
        Some("psync") => EnginePref::Psync,
        Some("auto") | None => EnginePref::Auto,
        Some(x) => return Err(format!("bad --engine {x}").into()),
    };
    c.queue_depth = get(m, "qd", Some(32))?;
    c.psync_threads = c.queue_depth as usize;
    c.io_threads = get(m, "threads", Some(1))?;
    c.sync = get::<u8>(m, "sync", Some(1))? != 0;
    Ok(c)
}

fn throughput(m: &HashMap<String, String>) -> Result<(), BoxErr> {
    let bs: usize = get(m, "bs", None)?;
    let total: u64 = get(m, "total", None)?;
    let n = (total / bs as u64) as usize;
    let cfg = config(m, n as u64 * SsdTier::extent_bytes(bs as u64) + (16 << 20))?;
    // Items per write_batch/read_batch call (default: one queue depth's worth).
    let qd: usize = get(m, "batch", Some(cfg.queue_depth as usize))?;
    let dir = cfg.dir.clone();
    let (t, _) = SsdTier::open(cfg.clone(), &mut |_| {})?;
    let mut arena = Arena::new(bs * qd);
    for (i, s) in arena.slots(bs, qd).into_iter().enumerate() {
        for (j, b) in s.iter_mut().enumerate() {
            *b = (i * 31 + j * 7) as u8;
        }
    }
    // Write.
    let t0 = Instant::now();
    write_blocks(&t, &mut arena, bs, n, qd)?;
    let wsecs = t0.elapsed().as_secs_f64();
    // Make reads come from the disk, not the page cache.
    t.drop_page_cache()?;
    let t0 = Instant::now();
    let mut i = 0usize;
    while i < n {
        let k = qd.min(n - i);
        let mut items: Vec<(SsdKey, &mut [u8])> = arena
            .slots(bs, k)
            .into_iter()
            .enumerate()
            .map(|(j, s)| (key((i + j) as u64), s))
            .collect();
        for r in t.read_batch(&mut items) {
            r?;
        }
        i += k;
    }
    let rsecs = t0.elapsed().as_secs_f64();
    let s = t.stats();
    let bytes = (n * bs) as f64;
    println!(
        "{{\"bs\":{bs},\"blocks\":{n},\"engine\":\"{}\",\"write_MBps\":{:.1},\"read_MBps\":{:.1},\"checksum_failures\":{}}}",
        t.engine().kind,
        bytes / wsecs / 1e6,
        bytes / rsecs / 1e6,
        s.checksum_failures
    );
    drop(t);
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

fn drop_cache_of(path: &std::path::Path) -> Result<(), BoxErr> {
    let f = std::fs::File::open(path)?;
    rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed)?;
    Ok(())
}

fn recovery(m: &HashMap<String, String>) -> Result<(), BoxErr> {
    let blocks: usize = get(m, "blocks", None)?;
    let bs: usize = get(m, "bs", Some(4096))?;
    let mut cfg = config(m, blocks as u64 * SsdTier::extent_bytes(bs as u64) + (16 << 20))?;
    cfg.sync = false; // building the fixture only
    let dir = cfg.dir.clone();
    let batch = 256usize;
    {
        let (t, _) = SsdTier::open(cfg.clone(), &mut |_| {})?;
        let mut arena = Arena::new(bs * batch);
        write_blocks(&t, &mut arena, bs, blocks, batch)?;
        t.drop_page_cache()?;
    }
    let mut out = Vec::new();
    for (name, verify) in [
        ("journal_only", RecoveryVerify::JournalOnly),
        ("headers", RecoveryVerify::Headers),
    ] {
        drop_cache_of(&dir.join(orbitkv_ssd::DATA_FILE))?;
        drop_cache_of(&dir.join(orbitkv_ssd::JOURNAL_FILE))?;
        let mut c = cfg.clone();
        c.verify_on_open = verify;
        let t0 = Instant::now();
        let (t, rep) = SsdTier::open(c, &mut |_| {})?;
        let secs = t0.elapsed().as_secs_f64();
        if rep.recovered.len() != blocks {
            return Err(format!("recovered {} of {blocks}", rep.recovered.len()).into());
        }
        out.push(format!("\"{name}_s\":{secs:.4}"));
        drop(t);
    }
    println!("{{\"blocks\":{blocks},\"bs\":{bs},{}}}", out.join(","));
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

fn main() -> Result<(), BoxErr> {
    let (cmd, m) = args()?;
    match cmd.as_str() {
        "throughput" => throughput(&m),
        "recovery" => recovery(&m),
        _ => Err(format!("unknown subcommand {cmd}").into()),
    }
}
