//! The start-up baseline for `benches/arena_scale.py`: a plain parallel first
//! touch of `SIZE` bytes, with no Manager — map the memory, then write every
//! page on `THREADS` threads in 64 MiB chunks. `shm` maps one memfd shared (the
//! arena's kind of memory), `shm:K` K memfds of SIZE/K bytes each (the arena's
//! split: page faults of one file contend on that file's page cache), `anon`
//! private anonymous memory. Prints one JSON object: {"kind", "bytes",
//! "threads", "seconds", "gb_per_s"}.
//!
//! Usage: first_touch SIZE_BYTES THREADS shm|shm:K|anon

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use orbitkv_shm::Mapping;

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let [_, size, threads, kind] = args.as_slice() else {
        return Err("usage: first_touch SIZE_BYTES THREADS shm|anon".into());
    };
    let size: usize = size.parse().map_err(|e| format!("size: {e}"))?;
    let threads: usize = threads.parse().map_err(|e| format!("threads: {e}"))?;
    let t0 = Instant::now();
    let mut anon: Vec<u8> = Vec::new();
    let mut maps: Vec<Mapping> = Vec::new();
    let files = match kind.as_str() {
        "anon" => 0,
        "shm" => 1,
        k => k
            .strip_prefix("shm:")
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .ok_or(format!("kind {k:?} must be shm, shm:K or anon"))?,
    };
    let regions: Vec<(usize, usize)> = if let Some(each) = size.checked_div(files) {
        let each = each / 4096 * 4096;
        for _ in 0..files {
            let fd = rustix::fs::memfd_create("first-touch", rustix::fs::MemfdFlags::CLOEXEC)
                .map_err(|e| e.to_string())?;
            rustix::fs::ftruncate(&fd, each as u64).map_err(|e| e.to_string())?;
            maps.push(Mapping::map(&fd, each as u64, false).map_err(|e| e.to_string())?);
        }
        maps.iter().map(|m| (m.as_ptr() as usize, m.len())).collect()
    } else {
        // Reserved, not yet touched: the kernel hands out zero pages on first write.
        anon.reserve_exact(size);
        vec![(anon.as_mut_ptr() as usize, anon.capacity())]
    };
    const CHUNK: usize = 64 << 20;
    let chunks: Vec<(usize, usize)> = regions
        .iter()
        .flat_map(|&(p, len)| {
            (0..len.div_ceil(CHUNK)).map(move |c| (p + c * CHUNK, CHUNK.min(len - c * CHUNK)))
        })
        .collect();
    let len: usize = regions.iter().map(|r| r.1).sum();
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                while let Some(&(at, n)) = chunks.get(next.fetch_add(1, Ordering::Relaxed)) {
                    // SAFETY: `[at, at + n)` lies inside one live region mapped
                    // or reserved above, which nothing else reads or writes; the
                    // counter gives each chunk to one thread.
                    unsafe { std::ptr::write_bytes(at as *mut u8, 1, n) };
                }
            });
        }
    });
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "{{\"kind\": \"{kind}\", \"bytes\": {len}, \"threads\": {threads}, \"seconds\": {secs:.4}, \"gb_per_s\": {:.2}}}",
        len as f64 / secs / 1e9
    );
    Ok(())
}
