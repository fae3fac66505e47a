//! An arena of more segments than the client may hold fds: the Manager passes
//! them in batches and the client maps and closes each batch, so 1,040
//! segments serve a process whose `RLIMIT_NOFILE` is 256. One test in this
//! binary: it lowers the limit of the whole test process.

mod support;

use support::*;

const SEG: usize = 64 * 1024;
const SEGMENTS: usize = 1040;

#[test]
fn many_segments_serve_a_client_limited_to_256_fds() {
    let m = ManagerProc::start(&[
        "--dram-size",
        &(SEG * SEGMENTS).to_string(),
        "--segment-size",
        &SEG.to_string(),
    ]);
    use rustix::process::{Resource, Rlimit, setrlimit};
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(256),
            maximum: Some(256),
        },
    )
    .expect("lower RLIMIT_NOFILE");

    let hashes: Vec<[u8; 32]> = (0..SEGMENTS)
        .map(|i| {
            let mut h = [7u8; 32];
            h[..8].copy_from_slice(&(i as u64).to_le_bytes());
            h
        })
        .collect();
    let blocks: Vec<Vec<u8>> = (0..SEGMENTS).map(|i| block(i as u8, SEG)).collect();
    // Two clients at once, each mapping every segment: the Manager's fds stay
    // with the Manager, each client holds none after its handshake.
    let a = m.client();
    let b = m.client();
    let ns_a = a.register_namespace([3; 32], SEG as u64, 0, b"").expect("ns");
    let src: Vec<&[u8]> = blocks.iter().map(|v| v.as_slice()).collect();
    let r = a.save(&ns_a, &hashes, &src).expect("save");
    assert_eq!((r.stored, r.refused), (SEGMENTS as u32, 0));

    let ns_b = b.register_namespace([3; 32], SEG as u64, 0, b"").expect("ns");
    let mut out = vec![vec![0u8; SEG]; SEGMENTS];
    let mut dst: Vec<&mut [u8]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
    assert_eq!(
        b.restore(&ns_b, &hashes, &mut dst).expect("restore"),
        SEGMENTS as u32
    );
    for (i, (got, want)) in out.iter().zip(&blocks).enumerate() {
        assert!(got == want, "block {i} (segment {i}) differs");
    }
    let fds = std::fs::read_dir("/proc/self/fd").expect("fds").count();
    assert!(
        fds < 64,
        "{fds} fds open in the client process: arena fds were kept"
    );
    a.close().expect("close");
    b.close().expect("close");
    assert_eq!(m.stats()["live_leases"], 0);
}
