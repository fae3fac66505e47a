//! The start-up baseline for `benches/arena_scale.py`: a plain parallel first
//! touch of `SIZE` bytes, with no Manager — map the memory, then write every
//! page on `THREADS` threads in 64 MiB chunks. `shm` maps a memfd shared (the
//! arena's kind of memory), `anon` private anonymous memory. Prints one JSON
//! object: {"kind", "bytes", "threads", "seconds", "gb_per_s"}.
//!
//! Usage: first_touch SIZE_BYTES THREADS shm|anon

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
    let base: Vec<u8>;
    let mapping: Mapping;
    let (ptr, len) = match kind.as_str() {
        "shm" => {
            let fd = rustix::fs::memfd_create("first-touch", rustix::fs::MemfdFlags::CLOEXEC)
                .map_err(|e| e.to_string())?;
            rustix::fs::ftruncate(&fd, size as u64).map_err(|e| e.to_string())?;
            mapping = Mapping::map(&fd, size as u64, false).map_err(|e| e.to_string())?;
            (mapping.as_ptr() as usize, mapping.len())
        }
        "anon" => {
            // Reserved, not yet touched: the kernel hands out zero pages on first write.
            let mut v = Vec::with_capacity(size);
            let p = v.as_mut_ptr() as usize;
            base = v;
            (p, base.capacity())
        }
        other => return Err(format!("kind {other:?} must be shm or anon")),
    };
    const CHUNK: usize = 64 << 20;
    let chunks = len.div_ceil(CHUNK);
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                loop {
                    let c = next.fetch_add(1, Ordering::Relaxed);
                    if c >= chunks {
                        break;
                    }
                    let n = CHUNK.min(len - c * CHUNK);
                    // SAFETY: `[ptr + c*CHUNK, +n)` lies inside the live region
                    // mapped or reserved above, which nothing else reads or
                    // writes; the counter gives each chunk to one thread.
                    unsafe { std::ptr::write_bytes((ptr + c * CHUNK) as *mut u8, 1, n) };
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
