//! SSD tier at scale: fill a tier with N blocks of B bytes from a child process, SIGKILL
//! the child while it is still writing, reopen and report recovery time (by phase), the
//! blocks recovered, a byte-exact check of a sample, and that deliberately torn blocks
//! and the batch in flight at the kill are never served wrong.
//!
//! Baselines in the same run: a plain sequential read of the journal file the recovery
//! replays (`read(2)` in 4 MiB chunks), and the fill's own write bandwidth.
//!
//! Usage: ssd_scale [OUT.json] [--dir D] [--blocks N] [--block-bytes B] [--writers W]
//!   [--batch K] [--mode direct|kernel] [--engine auto|uring|psync] [--io-threads T]
//!   [--queue-depth Q] [--sample S] [--no-sync] [--keep] [--verify background|headers|journal]
//!   [--reopen-only] (time three opens of a directory kept with --keep, no fill)
//!   [--no-header-reopen] (skip the clean reopen with every header read)
//! Defaults: 2,097,152 blocks of 20 KiB (40 GiB of payload, 48 GiB of data file with the
//! 4 KiB header per block), 4 writers, batches of 64, direct mode, sync on (the tier's
//! defaults), sample 20,000, recovery after the kill with headers checked in the background
//! (what the Manager uses; the time until that check finishes is reported too). The directory (default /var/tmp/orbitkv-ssd-scale) is
//! removed at the end unless --keep.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use orbitkv_ssd::format::{JOURNAL_RECORD_SIZE, JournalRecord, RecordKind};
use orbitkv_ssd::{
    EnginePref, IoMode, RecoveryPhase, RecoveryProgress, RecoveryVerify, SsdConfig, SsdError, SsdKey, SsdTier,
};

/// Blocks the child writes after the fill, while the parent kills it.
const TAIL_BLOCKS: u64 = 1 << 16;

#[derive(Clone)]
struct Opts {
    out: String,
    dir: PathBuf,
    blocks: u64,
    block_bytes: usize,
    writers: usize,
    batch: usize,
    mode: IoMode,
    engine: EnginePref,
    io_threads: usize,
    queue_depth: u32,
    sample: u64,
    sync: bool,
    keep: bool,
    verify: RecoveryVerify,
}

fn parse(args: &[String]) -> Opts {
    let val = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let num = |name: &str, d: u64| val(name).and_then(|v| v.parse().ok()).unwrap_or(d);
    let flag = |name: &str| args.iter().any(|a| a == name);
    Opts {
        out: args
            .get(1)
            .filter(|a| !a.starts_with("--"))
            .cloned()
            .unwrap_or_else(|| "bench-results/ssd_scale.json".into()),
        dir: val("--dir").map_or_else(|| PathBuf::from("/var/tmp/orbitkv-ssd-scale"), PathBuf::from),
        blocks: num("--blocks", 2_097_152).max(1),
        block_bytes: num("--block-bytes", 20 << 10).max(8) as usize,
        writers: num("--writers", 4).max(1) as usize,
        batch: num("--batch", 64).max(1) as usize,
        mode: match val("--mode").as_deref() {
            Some("kernel") => IoMode::Kernel,
            _ => IoMode::Direct,
        },
        engine: match val("--engine").as_deref() {
            Some("uring") => EnginePref::Uring,
            Some("psync") => EnginePref::Psync,
            _ => EnginePref::Auto,
        },
        io_threads: num("--io-threads", 1).clamp(1, 64) as usize,
        queue_depth: num("--queue-depth", 64).clamp(1, 4096) as u32,
        sample: num("--sample", 20_000),
        sync: !flag("--no-sync"),
        keep: flag("--keep"),
        verify: match val("--verify").as_deref() {
            Some("headers") => RecoveryVerify::Headers,
            Some("journal") => RecoveryVerify::JournalOnly,
            _ => RecoveryVerify::Background,
        },
    }
}

fn key(i: u64) -> SsdKey {
    let mut hash = [0u8; 32];
    hash[..8].copy_from_slice(&i.to_le_bytes());
    hash[8..16].copy_from_slice(&(!i).to_le_bytes());
    SsdKey {
        fingerprint: [0x5c; 32],
        shard: (i % 8) as u32,
        salt: [0xa5; 32],
        generation: 1,
        hash,
    }
}

/// Deterministic content of block `i`: little-endian words `i * K + w`.
fn fill_payload(i: u64, out: &mut [u8]) {
    let base = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for (w, c) in out.chunks_mut(8).enumerate() {
        let v = base.wrapping_add(w as u64).to_le_bytes();
        c.copy_from_slice(&v[..c.len()]);
    }
}

/// A 4096-aligned region of a Vec (so direct-mode writes and reads need no bounce copy).
struct Aligned {
    v: Vec<u8>,
    off: usize,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let v = vec![0u8; len + 4096];
        let off = v.as_ptr().align_offset(4096);
        Aligned { v, off, len }
    }
    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.v[self.off..self.off + self.len]
    }
    fn as_ref(&self) -> &[u8] {
        &self.v[self.off..self.off + self.len]
    }
}

fn tier_cfg(o: &Opts, verify: RecoveryVerify) -> SsdConfig {
    let ext = SsdTier::extent_bytes(o.block_bytes as u64);
    let mut c = SsdConfig::new(&o.dir, (o.blocks + TAIL_BLOCKS) * ext);
    c.mode = o.mode;
    c.engine = o.engine;
    c.io_threads = o.io_threads;
    c.queue_depth = o.queue_depth;
    c.sync = o.sync;
    c.verify_on_open = verify;
    c
}

/// Write the payloads of blocks `a .. a + n` into `buf` (one per `st` bytes)
/// and return them keyed, ready for `write_batch`.
fn fill_batch(buf: &mut Aligned, st: usize, a: u64, n: usize, block_bytes: usize) -> Vec<(SsdKey, &[u8])> {
    for (j, chunk) in buf.as_mut().chunks_mut(st).take(n).enumerate() {
        fill_payload(a + j as u64, &mut chunk[..block_bytes]);
    }
    let buf: &Aligned = buf;
    (0..n)
        .map(|j| (key(a + j as u64), &buf.as_ref()[j * st..j * st + block_bytes]))
        .collect()
}

fn stride(block_bytes: usize) -> usize {
    block_bytes.next_multiple_of(4096)
}

/// Write keys `[lo, hi)` from `writers` threads, batch by batch; `done` counts blocks.
fn write_range(t: &SsdTier, o: &Opts, lo: u64, hi: u64, done: &AtomicU64, failed: &AtomicBool) {
    let next = AtomicU64::new(lo);
    std::thread::scope(|s| {
        for _ in 0..o.writers {
            s.spawn(|| {
                let st = stride(o.block_bytes);
                let mut buf = Aligned::new(st * o.batch);
                loop {
                    let a = next.fetch_add(o.batch as u64, Relaxed);
                    if a >= hi || failed.load(Relaxed) {
                        return;
                    }
                    let b = (a + o.batch as u64).min(hi);
                    let n = (b - a) as usize;
                    let items = fill_batch(&mut buf, st, a, n, o.block_bytes);
                    for (j, r) in t.write_batch(&items).into_iter().enumerate() {
                        if let Err(e) = r {
                            eprintln!("write of block {} failed: {e}", a + j as u64);
                            failed.store(true, Relaxed);
                        }
                    }
                    done.fetch_add(n as u64, Relaxed);
                }
            });
        }
    });
}

/// The child: open (create) the tier, fill it, print `FILLED`, then keep writing tail
/// batches (`B lo hi` before, `A lo hi` after each) until killed.
fn child(o: &Opts) {
    let (t, _) = match SsdTier::open(tier_cfg(o, RecoveryVerify::Headers), &mut |_| {}) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("child: open failed: {e}");
            std::process::exit(2);
        }
    };
    let done = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let t0 = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| write_range(&t, o, 0, o.blocks, &done, &failed));
        let mut last = Instant::now();
        while done.load(Relaxed) < o.blocks && !failed.load(Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
            if last.elapsed() >= Duration::from_secs(5) {
                last = Instant::now();
                let d = done.load(Relaxed);
                let secs = t0.elapsed().as_secs_f64();
                let gbps = d as f64 * o.block_bytes as f64 / secs / 1e9;
                let eta = (o.blocks - d) as f64 / (d as f64 / secs).max(1.0);
                eprintln!(
                    "fill: {d}/{} blocks ({:.1}%), {gbps:.2} GB/s payload, {:.0} s elapsed, ETA {eta:.0} s",
                    o.blocks,
                    d as f64 * 100.0 / o.blocks as f64,
                    secs
                );
            }
        }
    });
    if failed.load(Relaxed) {
        std::process::exit(3);
    }
    let secs = t0.elapsed().as_secs_f64();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "FILLED {} {secs}", o.blocks);
    let _ = out.flush();
    let st = stride(o.block_bytes);
    let mut buf = Aligned::new(st * o.batch);
    let mut a = o.blocks;
    while a < o.blocks + TAIL_BLOCKS {
        let b = (a + o.batch as u64).min(o.blocks + TAIL_BLOCKS);
        let n = (b - a) as usize;
        let items = fill_batch(&mut buf, st, a, n, o.block_bytes);
        let _ = writeln!(out, "B {a} {b}");
        let _ = out.flush();
        let ok = t.write_batch(&items).iter().all(|r| r.is_ok());
        let _ = writeln!(out, "A {a} {b} {ok}");
        let _ = out.flush();
        a = b;
    }
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Phase timestamps of one open.
struct Timed {
    secs: f64,
    phases: Vec<(String, f64)>,
    report: orbitkv_ssd::RecoveryReport,
    tier: SsdTier,
}

fn timed_open(o: &Opts, verify: RecoveryVerify) -> Timed {
    let t0 = Instant::now();
    let mut marks: Vec<(RecoveryPhase, f64)> = Vec::new();
    let mut cb = |p: RecoveryProgress| {
        if marks.last().is_none_or(|m| m.0 != p.phase) {
            marks.push((p.phase, t0.elapsed().as_secs_f64()));
        }
    };
    let (tier, report) = match SsdTier::open(tier_cfg(o, verify), &mut cb) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("reopen failed: {e}");
            std::process::exit(1);
        }
    };
    let secs = t0.elapsed().as_secs_f64();
    // A phase runs from its first callback to the next phase's first callback: `journal`
    // is replay and extent placement, `verifyheaders` the header reads plus data-file
    // sizing, the journal rewrite and the index build (`journal` includes those three
    // when headers are not verified); `setup` is lock, space check and engine start.
    let mut phases = Vec::new();
    let mut prev = ("setup".to_string(), 0.0);
    for (p, at) in marks {
        phases.push((prev.0, at - prev.1));
        prev = (format!("{p:?}").to_lowercase(), at);
    }
    phases.push((prev.0, secs - prev.1));
    Timed {
        secs,
        phases,
        report,
        tier,
    }
}

/// `open`'s own step timings (`RecoveryReport::timings`), for the log.
fn steps_line(r: &orbitkv_ssd::RecoveryReport) -> String {
    r.timings
        .iter()
        .map(|(k, d)| format!("{k} {:.3}", d.as_secs_f64()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn steps_json(r: &orbitkv_ssd::RecoveryReport) -> serde_json::Value {
    r.timings
        .iter()
        .map(|(k, d)| serde_json::json!({"step": k, "secs": d.as_secs_f64()}))
        .collect()
}

/// Baseline: read the journal file front to back with plain 4 MiB reads; also returns the
/// last put record per key of interest.
fn read_journal(dir: &Path, want: &[u64]) -> (u64, f64, HashMap<u64, JournalRecord>) {
    let t0 = Instant::now();
    let mut f = match std::fs::File::open(dir.join(orbitkv_ssd::JOURNAL_FILE)) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("open journal: {e}");
            std::process::exit(1);
        }
    };
    let mut all = Vec::new();
    let mut chunk = vec![0u8; 4 << 20];
    loop {
        match f.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => all.extend_from_slice(&chunk[..n]),
            Err(e) => {
                eprintln!("read journal: {e}");
                std::process::exit(1);
            }
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let keys: HashMap<SsdKey, u64> = want.iter().map(|&i| (key(i), i)).collect();
    let mut found = HashMap::new();
    for rec in all.chunks_exact(JOURNAL_RECORD_SIZE) {
        let mut b = [0u8; JOURNAL_RECORD_SIZE];
        b.copy_from_slice(rec);
        if let Ok(r) = JournalRecord::decode(&b)
            && r.kind == RecordKind::Put
            && let Some(&i) = keys.get(&r.key)
        {
            found.insert(i, r);
        }
    }
    (all.len() as u64, secs, found)
}

fn patch(dir: &Path, off: u64, bytes: &[u8]) {
    let r = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(orbitkv_ssd::DATA_FILE))
        .and_then(|f| {
            f.write_all_at(bytes, off)?;
            f.sync_all()
        });
    if let Err(e) = r {
        eprintln!("patching data file: {e}");
        std::process::exit(1);
    }
}

/// Outcome of reading one block.
#[derive(Debug, PartialEq)]
enum Got {
    Exact,
    Wrong,
    Missing,
    Corrupt,
    Error,
}

fn check(t: &SsdTier, o: &Opts, i: u64, buf: &mut Aligned, want: &mut [u8]) -> Got {
    fill_payload(i, want);
    match t.read(key(i), buf.as_mut()) {
        Ok(n) if n == o.block_bytes && buf.as_ref()[..n] == *want => Got::Exact,
        Ok(_) => Got::Wrong,
        Err(SsdError::NotFound) => Got::Missing,
        Err(SsdError::Corrupt { .. }) => Got::Corrupt,
        Err(e) => {
            eprintln!("read of block {i}: {e}");
            Got::Error
        }
    }
}

/// Flags that take a value, and flags alone: anything else is refused, so a
/// typo or `--help` never starts a fill of tens of GiB.
const VALUE_FLAGS: &[&str] = &[
    "--dir",
    "--blocks",
    "--block-bytes",
    "--writers",
    "--batch",
    "--mode",
    "--engine",
    "--io-threads",
    "--queue-depth",
    "--sample",
    "--verify",
];
const BARE_FLAGS: &[&str] = &[
    "--no-sync",
    "--keep",
    "--child",
    "--reopen-only",
    "--no-header-reopen",
];

fn check_args(args: &[String]) -> Result<(), String> {
    let mut i = 1;
    while i < args.len() {
        let a = args[i].as_str();
        if VALUE_FLAGS.contains(&a) {
            if args.get(i + 1).is_none() {
                return Err(format!("{a} needs a value"));
            }
            i += 2;
        } else if BARE_FLAGS.contains(&a) || (i == 1 && !a.starts_with('-')) {
            i += 1;
        } else {
            return Err(format!("unknown argument {a:?}"));
        }
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Err(e) = check_args(&args) {
        let usage: String = include_str!("ssd_scale.rs")
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .map(|l| format!("{}\n", l.trim_start_matches("//!").trim_start()))
            .collect();
        eprintln!("ssd_scale: {e}\n\n{usage}");
        std::process::exit(if args.iter().any(|a| a == "--help" || a == "-h") {
            0
        } else {
            2
        });
    }
    let o = parse(&args);
    if args.iter().any(|a| a == "--child") {
        child(&o);
        return;
    }
    if args.iter().any(|a| a == "--reopen-only") {
        // Profiling aid: time opens of an existing directory (kept with --keep), no fill.
        for _ in 0..3 {
            let r = timed_open(&o, o.verify);
            eprintln!(
                "reopen: {} blocks in {:.3} s: {}",
                r.report.recovered.len(),
                r.secs,
                steps_line(&r.report)
            );
        }
        return;
    }
    if o.blocks < 16 {
        eprintln!("--blocks must be at least 16");
        std::process::exit(1);
    }
    let _ = std::fs::remove_dir_all(&o.dir);
    let ext = SsdTier::extent_bytes(o.block_bytes as u64);
    eprintln!(
        "ssd_scale: {} blocks of {} B into {} ({:.1} GiB of data file), {} writers, batch {}",
        o.blocks,
        o.block_bytes,
        o.dir.display(),
        ((o.blocks + TAIL_BLOCKS) * ext) as f64 / (1u64 << 30) as f64,
        o.writers,
        o.batch
    );

    // 1. Fill from a child and SIGKILL it mid-write.
    let mut cmd = Command::new(std::env::current_exe().unwrap_or_else(|_| PathBuf::from(&args[0])));
    cmd.args(&args[1..]).arg("--child").stdout(Stdio::piped());
    let mut ch = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("spawn child: {e}");
            std::process::exit(1);
        }
    };
    let Some(stdout) = ch.stdout.take() else {
        eprintln!("child has no stdout");
        std::process::exit(1);
    };
    let mut lines = BufReader::new(stdout).lines();
    let mut fill_secs: f64 = 0.0;
    let mut filled = false;
    let mut in_flight: Option<(u64, u64)> = None;
    let mut acked_tail: Vec<(u64, u64)> = Vec::new();
    let mut tail_batches = 0;
    while let Some(Ok(l)) = lines.next() {
        let f: Vec<&str> = l.split_whitespace().collect();
        match f.as_slice() {
            ["FILLED", _, s] => {
                fill_secs = s.parse().unwrap_or(0.0);
                filled = true;
            }
            ["B", a, b] => in_flight = Some((a.parse().unwrap_or(0), b.parse().unwrap_or(0))),
            ["A", a, b, ok] => {
                if *ok == "true" {
                    acked_tail.push((a.parse().unwrap_or(0), b.parse().unwrap_or(0)));
                }
                in_flight = None;
                tail_batches += 1;
                // Kill after a few acknowledged tail batches, at a moment that is likely mid-write.
                if tail_batches >= 3 {
                    break;
                }
            }
            _ => {}
        }
    }
    if !filled {
        eprintln!("child exited before filling the tier: {:?}", ch.wait());
        std::process::exit(1);
    }
    let _ = ch.kill(); // SIGKILL
    let status = ch.wait();
    // Lines the child printed before the kill (the batch it was writing).
    for l in lines.map_while(Result::ok) {
        let f: Vec<&str> = l.split_whitespace().collect();
        match f.as_slice() {
            ["B", a, b] => in_flight = Some((a.parse().unwrap_or(0), b.parse().unwrap_or(0))),
            ["A", a, b, ok] => {
                if *ok == "true" {
                    acked_tail.push((a.parse().unwrap_or(0), b.parse().unwrap_or(0)));
                }
                in_flight = None;
            }
            _ => {}
        }
    }
    let fill_bytes = o.blocks * o.block_bytes as u64;
    eprintln!(
        "filled {} blocks in {fill_secs:.1} s ({:.2} GB/s payload); child killed ({status:?}); in flight at the kill: {in_flight:?}",
        o.blocks,
        fill_bytes as f64 / fill_secs.max(1e-9) / 1e9
    );

    // 2. Baseline journal read; tear two blocks (payload tail of one, header of another).
    let torn_payload = 1u64;
    let torn_header = 2u64;
    let (journal_bytes, journal_read_secs, recs) = read_journal(&o.dir, &[torn_payload, torn_header]);
    let (Some(rp), Some(rh)) = (recs.get(&torn_payload), recs.get(&torn_header)) else {
        eprintln!("journal lacks the blocks to tear");
        std::process::exit(1);
    };
    let junk = vec![0xeeu8; 512];
    patch(&o.dir, rp.offset + 4096 + rp.len.saturating_sub(512), &junk);
    patch(&o.dir, rh.offset + 64, &junk[..8]);

    // 3. Recovery after the kill (the tier's default: headers verified at open).
    eprintln!("recovering ({} journal bytes)...", journal_bytes);
    let r = timed_open(&o, o.verify);
    eprintln!(
        "recovered {} blocks in {:.3} s ({:?}): {}",
        r.report.recovered.len(),
        r.secs,
        o.verify,
        steps_line(&r.report)
    );
    // Reads while the background check runs: the torn ones must fail their own checks.
    let mut buf = Aligned::new(stride(o.block_bytes));
    let mut want = vec![0u8; o.block_bytes];
    let early_p = check(&r.tier, &o, torn_payload, &mut buf, &mut want);
    let early_h = check(&r.tier, &o, torn_header, &mut buf, &mut want);
    let tw = Instant::now();
    r.tier.wait_header_check();
    let check_secs = tw.elapsed().as_secs_f64() + r.secs;
    let hc = r.tier.header_check();
    eprintln!("header check finished {check_secs:.3} s after open began: {hc:?}");

    // 4. Verify: a sample byte-exact, the torn ones never served, the in-flight batch
    // exact or absent, the acknowledged tail exact.
    let mut counts: HashMap<String, u64> = HashMap::new();
    let mut bad = Vec::new();
    let step = (o.blocks / o.sample.max(1)).max(1);
    let mut i = 3;
    let t0 = Instant::now();
    while i < o.blocks {
        let g = check(&r.tier, &o, i, &mut buf, &mut want);
        if g != Got::Exact {
            bad.push(format!("block {i}: {g:?}"));
        }
        *counts.entry(format!("sample_{g:?}").to_lowercase()).or_default() += 1;
        i += step;
    }
    let sample_secs = t0.elapsed().as_secs_f64();
    for &(a, b) in &acked_tail {
        for i in a..b {
            let g = check(&r.tier, &o, i, &mut buf, &mut want);
            if g != Got::Exact {
                bad.push(format!("acknowledged tail block {i}: {g:?}"));
            }
        }
    }
    let mut in_flight_outcomes: HashMap<String, u64> = HashMap::new();
    if let Some((a, b)) = in_flight {
        for i in a..b {
            let g = check(&r.tier, &o, i, &mut buf, &mut want);
            if !matches!(g, Got::Exact | Got::Missing | Got::Corrupt) {
                bad.push(format!("in-flight block {i}: {g:?}"));
            }
            *in_flight_outcomes
                .entry(format!("{g:?}").to_lowercase())
                .or_default() += 1;
        }
    }
    let gp = check(&r.tier, &o, torn_payload, &mut buf, &mut want);
    let gh = check(&r.tier, &o, torn_header, &mut buf, &mut want);
    for (what, g) in [("payload", &early_p), ("header", &early_h)] {
        if !matches!(g, Got::Missing | Got::Corrupt) {
            bad.push(format!("{what}-torn block read during the header check: {g:?}"));
        }
    }
    if !matches!(gp, Got::Missing | Got::Corrupt) {
        bad.push(format!("payload-torn block: {gp:?} (want Missing or Corrupt)"));
    }
    if !matches!(gh, Got::Missing | Got::Corrupt) {
        bad.push(format!("header-torn block: {gh:?} (want Missing or Corrupt)"));
    }
    let recovered = r.report.recovered.len() as u64;
    let rep = serde_json::json!({
        "verify": format!("{:?}", o.verify),
        "secs": r.secs,
        "header_check": {"finished_after_secs": check_secs, "total": hc.total,
            "checked": hc.checked, "dropped": hc.dropped},
        "phases": r.phases.iter().map(|(k, v)| serde_json::json!({"phase": k, "secs": v})).collect::<Vec<_>>(),
        "steps": steps_json(&r.report),
        "blocks_recovered": recovered,
        "journal_records": r.report.journal_records,
        "corrupt": r.report.corrupt,
        "torn": r.report.torn,
        "overlapped": r.report.overlapped,
    });
    drop(r);

    // 5. Clean restarts (compacted journal): headers verified, and journal only.
    // (`--no-header-reopen` skips the first: minutes at 2 M blocks on a slow disk.)
    let (clean_h_secs, clean_h_phases, clean_h_steps) = if args.iter().any(|a| a == "--no-header-reopen") {
        (f64::NAN, Vec::new(), serde_json::Value::Null)
    } else {
        let clean_h = timed_open(&o, RecoveryVerify::Headers);
        eprintln!("clean reopen, headers: {}", steps_line(&clean_h.report));
        (clean_h.secs, clean_h.phases.clone(), steps_json(&clean_h.report))
    };
    let clean_j = timed_open(&o, RecoveryVerify::JournalOnly);
    let clean_j_secs = clean_j.secs;
    let clean_j_phases = clean_j.phases.clone();
    let clean_j_steps = steps_json(&clean_j.report);
    eprintln!("clean reopen, journal only: {}", steps_line(&clean_j.report));
    drop(clean_j);
    eprintln!("clean reopen: headers {clean_h_secs:.3} s, journal only {clean_j_secs:.3} s");

    let ok = bad.is_empty();
    for b in bad.iter().take(20) {
        eprintln!("FAIL: {b}");
    }
    let json = serde_json::json!({
        "bench": "ssd_scale",
        "blocks": o.blocks,
        "block_bytes": o.block_bytes,
        "data_file_bytes": (o.blocks + TAIL_BLOCKS) * ext,
        "mode": if o.mode == IoMode::Direct { "direct" } else { "kernel" },
        "writers": o.writers,
        "batch": o.batch,
        "sync": o.sync,
        "fill": {"secs": fill_secs, "payload_gbps": fill_bytes as f64 / fill_secs.max(1e-9) / 1e9},
        "baseline_journal_read": {"bytes": journal_bytes, "secs": journal_read_secs,
            "gbps": journal_bytes as f64 / journal_read_secs.max(1e-9) / 1e9},
        "recovery_after_kill": rep,
        "clean_reopen_headers": {"secs": clean_h_secs, "steps": clean_h_steps,
            "phases": clean_h_phases.iter().map(|(k, v)| serde_json::json!({"phase": k, "secs": v})).collect::<Vec<_>>()},
        "clean_reopen_journal_only": {"secs": clean_j_secs, "steps": clean_j_steps,
            "phases": clean_j_phases.iter().map(|(k, v)| serde_json::json!({"phase": k, "secs": v})).collect::<Vec<_>>()},
        "sample": {"checked": counts.values().sum::<u64>(), "outcomes": counts, "secs": sample_secs},
        "acknowledged_tail_blocks": acked_tail.iter().map(|(a, b)| b - a).sum::<u64>(),
        "in_flight_at_kill": in_flight_outcomes,
        "torn_payload_read": format!("{gp:?}"),
        "torn_header_read": format!("{gh:?}"),
        "ok": ok,
    });
    if let Some(p) = Path::new(&o.out).parent() {
        let _ = std::fs::create_dir_all(p);
    }
    // Not json_out::write_json: the whole document goes to stdout as well, and a
    // failed write is reported without failing the run (its exit status is `ok`).
    match serde_json::to_string_pretty(&json) {
        Ok(s) => {
            println!("{s}");
            if let Err(e) = std::fs::write(&o.out, s + "\n") {
                eprintln!("writing {}: {e}", o.out);
            }
        }
        Err(e) => eprintln!("json: {e}"),
    }
    if !o.keep {
        let _ = std::fs::remove_dir_all(&o.dir);
    }
    if !ok {
        std::process::exit(1);
    }
}
