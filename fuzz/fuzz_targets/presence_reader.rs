//! The client's reader of the Manager's presence table: the table is memory
//! another process writes, so any contents must give an answer (maybe a wrong
//! "maybe", never a panic or an access outside the mapping). The first byte
//! picks whether the header is made plausible (so the probe loop runs over
//! arbitrary slots); the rest is the table image, its tail also the probes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use orbitkv_shm::presence::{MAGIC, MIN_SLOTS, PresenceView, table_bytes};
use rustix::fs::MemfdFlags;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let size = table_bytes(MIN_SLOTS);
    let mut image = vec![0u8; size as usize];
    let n = rest.len().min(image.len());
    image[..n].copy_from_slice(&rest[..n]);
    if mode & 1 == 1 {
        image[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        image[16..24].copy_from_slice(&MIN_SLOTS.to_le_bytes());
        if mode & 2 == 2 {
            image[8..16].copy_from_slice(&0u64.to_le_bytes()); // an even (stable) sequence
        }
    }
    let Ok(fd) = rustix::fs::memfd_create("presence-fuzz", MemfdFlags::CLOEXEC) else {
        return;
    };
    if rustix::fs::ftruncate(&fd, size).is_err() {
        return;
    }
    let mut done = 0;
    while done < image.len() {
        match rustix::io::pwrite(&fd, &image[done..], done as u64) {
            Ok(0) | Err(_) => return,
            Ok(k) => done += k,
        }
    }
    let view = PresenceView::open(fd, MIN_SLOTS).expect("a table of the announced size opens");
    let _ = view.stats();
    let probes: Vec<u64> = rest
        .chunks_exact(8)
        .rev()
        .take(64)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    for fp in &probes {
        let _ = view.contains(*fp);
    }
    let _ = view.present_prefix(probes.iter().copied());
});
