//! Peer-restore benchmark (issue 12): restore through Manager B of blocks
//! saved on Manager A (B's lookup fills from A over the peer transport, then
//! B's client copies out as for a local hit), beside, in the same run and on
//! the same loopback, a plain TCP copy of the same bytes and a TLS-only copy
//! (rustls, the same certificates and cipher suites as the peer transport).
//! Both Managers run in this process; each trial uses fresh block hashes, so
//! every restore crosses the wire.
//!
//! A restore ends with the copy out of B's arena that every local hit takes;
//! a bare copy ends when the bytes land. So the end-to-end like-for-like
//! baseline is also measured: the copy over as many connections as B's fill
//! uses, then the landed bytes copied once more into the caller's buffers
//! the way `Client::copy_out` does (on a GPU host both paths would end with
//! the same host-to-HBM copy). Ratios are given of the medians and as the
//! median of per-trial ratios (each trial against the baseline run just
//! before it, so a shared host's drift cancels).
//!
//! Usage: peer_restore [OUT.json] [--total-mib N] [--block-kib N] [--trials N]
//!        [--peer-hash-thread on|off|auto]   (passed to both Managers; default auto)
//!        [--peer-fill-streams N]            (passed to B; default: B's own default)
//!        [--decoy-peer]                     (B also asks an empty Manager C: the probe path)
//!        [--land-in-shm]                    (the baseline copies land in shared memory, as the fill does)
//! Needs the `openssl` command for the TLS rows (skipped with the reason in the JSON otherwise).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use orbitkv_client::Client;
use orbitkv_manager::{Manager, ManagerConfig};

#[path = "common/args.rs"]
mod args;
#[path = "common/json_out.rs"]
mod json_out;
#[path = "common/stats.rs"]
mod stats;
use args::Args;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use stats::{gbps, median};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("port: {e}"))
}

/// Runs `openssl` in `dir` with `args` (space-separated; none contains a space).
fn openssl(dir: &Path, args: &str) -> bool {
    Command::new("openssl")
        .args(args.split(' '))
        .current_dir(dir)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A CA and one certificate (IP 127.0.0.1, client and server use) for both ends.
fn make_pki(dir: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let ext =
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n";
    let ok = openssl(dir, "ecparam -name prime256v1 -genkey -noout -out ca.key")
        && openssl(
            dir,
            "req -x509 -new -key ca.key -subj /CN=bench-ca -days 1 -out ca.crt",
        )
        && std::fs::write(dir.join("ext.cnf"), ext).is_ok()
        && openssl(dir, "ecparam -name prime256v1 -genkey -noout -out m.key")
        && openssl(dir, "pkcs8 -topk8 -nocrypt -in m.key -out m.pk8")
        && openssl(dir, "req -new -key m.key -subj /CN=m -out m.csr")
        && openssl(
            dir,
            "x509 -req -in m.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 -extfile ext.cnf -out m.crt",
        );
    ok && std::fs::set_permissions(dir.join("m.pk8"), std::fs::Permissions::from_mode(0o600)).is_ok()
}

fn manager(dir: &Path, name: &str, arena: usize, extra: &[String]) -> (Manager, std::path::PathBuf) {
    let sock = dir.join(format!("{name}.sock"));
    let mut argv: Vec<String> = vec![
        "bench".into(),
        "--socket".into(),
        sock.display().to_string(),
        "--dram-size".into(),
        arena.to_string(),
        "--metrics-addr".into(),
        "off".into(),
        "--log-level".into(),
        "warn".into(),
    ];
    argv.extend(extra.iter().cloned());
    let cfg = ManagerConfig::from_argv(argv).unwrap_or_else(|e| panic!("config: {e}"));
    (
        Manager::start(cfg).unwrap_or_else(|e| panic!("manager: {e}")),
        sock,
    )
}

fn tls_args(pki: &Path) -> Vec<String> {
    let p = |f: &str| pki.join(f).display().to_string();
    vec![
        "--peer-tls-cert".into(),
        p("m.crt"),
        "--peer-tls-key".into(),
        p("m.pk8"),
        "--peer-tls-ca".into(),
        p("ca.crt"),
    ]
}

fn hash(t: u32, i: u32) -> [u8; 32] {
    let mut h = [0u8; 32];
    h[0..4].copy_from_slice(&t.to_le_bytes());
    h[4..8].copy_from_slice(&i.to_le_bytes());
    h
}

/// Managers A (source) and B (reader) with a client each, and, with
/// `--decoy-peer`, an empty Manager C that B also asks (so B probes both and
/// fetches from the winner, A).
struct Pair {
    a: Manager,
    b: Manager,
    decoy: Option<Manager>,
    ca: Client,
    cb: Client,
    na: orbitkv_client::Namespace,
    nb: orbitkv_client::Namespace,
}

/// What the bench passes to the Managers it starts.
struct Opts<'a> {
    hash_thread: &'a str,
    streams: Option<&'a str>,
    decoy: bool,
}

fn pair(pki: Option<&Path>, bs: usize, total: usize, root: &Path, opts: &Opts<'_>) -> Pair {
    let arena = (total * 3).next_multiple_of(1 << 20).max(64 << 20);
    let port = free_port();
    let mut tls = pki.map(tls_args).unwrap_or_default();
    tls.extend(["--peer-hash-thread".to_string(), opts.hash_thread.to_string()]);
    let streams = opts.streams;
    let mut a_args = vec!["--peer-listen".to_string(), format!("127.0.0.1:{port}")];
    a_args.extend(tls.iter().cloned());
    let mut b_args = vec!["--peer".to_string(), format!("127.0.0.1:{port}")];
    if let Some(n) = streams {
        b_args.extend(["--peer-fill-streams".to_string(), n.to_string()]);
    }
    b_args.extend(tls.iter().cloned());
    let tag = if pki.is_some() { "tls" } else { "plain" };
    let decoy = opts.decoy.then(|| {
        let port = free_port();
        let mut args = vec!["--peer-listen".to_string(), format!("127.0.0.1:{port}")];
        args.extend(tls.iter().cloned());
        b_args.extend(["--peer".to_string(), format!("127.0.0.1:{port}")]);
        manager(root, &format!("c-{tag}"), 64 << 20, &args).0
    });
    let (a, a_sock) = manager(root, &format!("a-{tag}"), arena, &a_args);
    let (b, b_sock) = manager(root, &format!("b-{tag}"), arena, &b_args);
    let ca = Client::connect(&a_sock, None, Duration::from_secs(30)).unwrap_or_else(|e| panic!("A: {e}"));
    let cb = Client::connect(&b_sock, None, Duration::from_secs(30)).unwrap_or_else(|e| panic!("B: {e}"));
    let na = ca
        .register_namespace([9; 32], bs as u64, 0, [0; 32])
        .unwrap_or_else(|e| panic!("ns: {e}"));
    let nb = cb
        .register_namespace([9; 32], bs as u64, 0, [0; 32])
        .unwrap_or_else(|e| panic!("ns: {e}"));
    Pair {
        a,
        b,
        decoy,
        ca,
        cb,
        na,
        nb,
    }
}

impl Pair {
    /// One peer restore through B of `src` saved on A under fresh hashes: GB/s
    /// of the restore (B's lookup with the peer fill + acquire + copy out +
    /// release) and of its fill alone (the lookup: bytes into B's arena).
    fn trial(&self, t: u32, src: &[Vec<u8>]) -> (f64, f64) {
        let total: usize = src.iter().map(Vec::len).sum();
        let srcs: Vec<&[u8]> = src.iter().map(|v| v.as_slice()).collect();
        let hashes: Vec<[u8; 32]> = (0..src.len() as u32).map(|i| hash(t, i)).collect();
        let r = self
            .ca
            .save(&self.na, &hashes, &srcs)
            .unwrap_or_else(|e| panic!("save: {e}"));
        assert_eq!(r.stored as usize, src.len(), "A's arena too small");
        let mut dst: Vec<Vec<u8>> = src.iter().map(|v| vec![1u8; v.len()]).collect();
        let mut dsts: Vec<&mut [u8]> = dst.iter_mut().map(|v| v.as_mut_slice()).collect();
        let t0 = Instant::now();
        let mut lease = self
            .cb
            .lease(&self.nb, &hashes)
            .unwrap_or_else(|e| panic!("lookup: {e}"));
        let filled = t0.elapsed();
        assert_eq!(
            lease.hit_blocks() as usize,
            src.len(),
            "every block through the peer"
        );
        lease
            .copy_out(self.nb.block_bytes, 0, &mut dsts)
            .unwrap_or_else(|e| panic!("copy: {e}"));
        lease.release().unwrap_or_else(|e| panic!("release: {e}"));
        let d = t0.elapsed();
        assert!(dst == src, "restored bytes differ");
        (gbps(total, d), gbps(total, filled))
    }

    fn stop(self) {
        drop(self.ca);
        drop(self.cb);
        self.b.shutdown();
        self.a.shutdown();
        if let Some(c) = self.decoy {
            c.shutdown();
        }
    }
}

/// GB/s of one baseline transfer: the copy alone, and the copy followed by
/// the same copy-out a restore ends with.
#[derive(Clone, Copy)]
struct Copied {
    copy: f64,
    then_served: f64,
}

/// One transport's figures (plain TCP or TLS), GB/s per trial.
#[derive(Default)]
struct Rows {
    /// The copy over one connection.
    one: Vec<f64>,
    /// The copy over as many connections as B's fill uses (when more than one).
    multi: Vec<f64>,
    /// The like-for-like copy: `multi` with a split fill, else `one`.
    like: Vec<f64>,
    /// That copy, then copied out as a restore does.
    served: Vec<f64>,
    /// The peer restore and its fill.
    restore: Vec<f64>,
    fill: Vec<f64>,
}

impl Rows {
    /// One trial: `copy(k)` copies over `k` connections; once over one, once
    /// over `streams` when more, then the peer restore through `pair`.
    fn trial(
        &mut self,
        copy: impl Fn(usize) -> Copied,
        streams: usize,
        pair: &Pair,
        t: u32,
        src: &[Vec<u8>],
    ) {
        let one = copy(1);
        self.one.push(one.copy);
        let like = if streams > 1 {
            let multi = copy(streams);
            self.multi.push(multi.copy);
            multi
        } else {
            one
        };
        self.like.push(like.copy);
        self.served.push(like.then_served);
        let (r, f) = pair.trial(t, src);
        self.restore.push(r);
        self.fill.push(f);
    }
}

/// Copy `src` over `streams` loopback connections, each carrying a contiguous
/// range of the blocks (as a split peer fetch does): `send` writes a range on
/// the accepted socket, `recv` reads it into the reader's own (pre-touched)
/// landing buffers; the copy's clock runs from the first connect until every
/// range arrived. Then the landed blocks are copied once more into other
/// (pre-touched) buffers on as many threads as `Client::copy_out` uses for
/// that many bytes: what the restore does after its fill (B's arena to the
/// caller's buffers), so `then_served` is the restore's like-for-like
/// end-to-end baseline (bytes received into host memory, then into the
/// destination; on a GPU host both would be the host-to-HBM copy).
fn striped_copy<S, R>(src: &[Vec<u8>], streams: usize, landing: Landing, send: S, recv: R) -> Copied
where
    S: Fn(TcpStream, &[Vec<u8>]) + Send + Sync + Clone + 'static,
    R: Fn(TcpStream, &mut [&mut [u8]]) + Send + Sync + Clone,
{
    let total: usize = src.iter().map(Vec::len).sum();
    let per = src.len().div_ceil(streams.max(1));
    let mut senders = Vec::new();
    let mut addrs = Vec::new();
    for range in src.chunks(per) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind: {e}"));
        addrs.push(l.local_addr().unwrap_or_else(|e| panic!("addr: {e}")));
        let data: Vec<Vec<u8>> = range.to_vec();
        let send = send.clone();
        senders.push(std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap_or_else(|e| panic!("accept: {e}"));
            let _ = s.set_nodelay(true);
            send(s, &data);
        }));
    }
    // Touched before the clock starts (as the peer restore's arena is).
    let mut heap: Vec<Vec<u8>>;
    let segment;
    let mut landed: Vec<&mut [u8]> = match landing {
        Landing::Heap => {
            heap = src.iter().map(|v| vec![1u8; v.len()]).collect();
            heap.iter_mut().map(Vec::as_mut_slice).collect()
        }
        Landing::Shm => {
            let size = (total as u64).next_multiple_of(4096);
            segment =
                orbitkv_shm::Segment::create("orbitkv-bench-landing", size, orbitkv_shm::PageSize::Base)
                    .unwrap_or_else(|e| panic!("landing segment: {e}"));
            // SAFETY: the segment is this function's own, never shared with another
            // process or mapped twice; this is the only slice over it and it ends
            // before `segment` is dropped at the end of this function.
            let all =
                unsafe { segment.mapping().slice_mut(0, total) }.unwrap_or_else(|e| panic!("slice: {e}"));
            all.fill(1);
            let mut out = Vec::new();
            let mut rest = all;
            for v in src {
                let (head, tail) = rest.split_at_mut(v.len());
                out.push(head);
                rest = tail;
            }
            out
        }
    };
    let start = std::sync::Barrier::new(addrs.len() + 1);
    let copied = std::thread::scope(|scope| {
        for (addr, dst) in addrs.iter().zip(landed.chunks_mut(per)) {
            let (start, recv) = (&start, recv.clone());
            scope.spawn(move || {
                start.wait();
                let s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect: {e}"));
                let _ = s.set_nodelay(true);
                recv(s, dst);
            });
        }
        let t0 = Instant::now();
        start.wait();
        t0
    });
    let copied = copied.elapsed();
    for s in senders {
        let _ = s.join();
    }
    let got: Vec<&[u8]> = landed.iter().map(|d| &**d).collect();
    let mut dst: Vec<Vec<u8>> = got.iter().map(|v| vec![2u8; v.len()]).collect();
    let served = copy_out_like_a_client(&got, &mut dst);
    assert!(
        got.iter().zip(src).all(|(g, s)| *g == s.as_slice()) && dst == src,
        "copied bytes differ"
    );
    Copied {
        copy: gbps(total, copied),
        then_served: gbps(total, copied + served),
    }
}

/// Where a baseline copy lands: the receiver's own heap buffers (default), or
/// one shared-memory segment of base pages like the Manager's arena
/// (`--land-in-shm`, a diagnostic: the fill lands in such memory).
#[derive(Clone, Copy)]
enum Landing {
    Heap,
    Shm,
}

/// Copy `from` into `to` block by block, split in contiguous runs over
/// `orbitkv_client::copy_threads` threads, as `Client::copy_out` does; the time taken.
fn copy_out_like_a_client(from: &[&[u8]], to: &mut [Vec<u8>]) -> Duration {
    let total: usize = from.iter().map(|b| b.len()).sum();
    let threads = orbitkv_client::copy_threads(total);
    let t0 = Instant::now();
    if threads == 1 {
        for (f, t) in from.iter().zip(to.iter_mut()) {
            t.copy_from_slice(f);
        }
        return t0.elapsed();
    }
    let per = from.len().div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        for (f, t) in from.chunks(per).zip(to.chunks_mut(per)) {
            scope.spawn(move || {
                for (f, t) in f.iter().zip(t.iter_mut()) {
                    t.copy_from_slice(f);
                }
            });
        }
    });
    t0.elapsed()
}

/// Plain TCP copy of the same bytes over `streams` connections.
fn tcp_copy(src: &[Vec<u8>], streams: usize, landing: Landing) -> Copied {
    striped_copy(
        src,
        streams,
        landing,
        |mut s, data| {
            for b in data {
                s.write_all(b).unwrap_or_else(|e| panic!("write: {e}"));
            }
        },
        |mut s, dst| {
            for d in dst.iter_mut() {
                s.read_exact(d).unwrap_or_else(|e| panic!("read: {e}"));
            }
        },
    )
}

/// The same over rustls (TLS 1.3, ring, mutual authentication), handshake included.
fn tls_configs(pki: &Path) -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(pki.join("m.crt"))
        .and_then(|i| i.collect::<Result<_, _>>())
        .unwrap_or_else(|e| panic!("cert: {e}"));
    let key = PrivateKeyDer::from_pem_file(pki.join("m.pk8")).unwrap_or_else(|e| panic!("key: {e}"));
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(pki.join("ca.crt"))
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .unwrap_or_else(|e| panic!("ca: {e}"))
    {
        roots.add(c).unwrap_or_else(|e| panic!("ca: {e}"));
    }
    let roots = Arc::new(roots);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .unwrap_or_else(|e| panic!("verifier: {e}"));
    let server = Arc::new(
        rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map(|b| {
                b.with_client_cert_verifier(verifier)
                    .with_single_cert(certs.clone(), key.clone_key())
            })
            .unwrap_or_else(|e| panic!("server: {e}"))
            .unwrap_or_else(|e| panic!("server: {e}")),
    );
    let client = Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map(|b| b.with_root_certificates(roots).with_client_auth_cert(certs, key))
            .unwrap_or_else(|e| panic!("client: {e}"))
            .unwrap_or_else(|e| panic!("client: {e}")),
    );
    (server, client)
}

fn tls_copy(
    cfg: &(Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>),
    src: &[Vec<u8>],
    streams: usize,
    landing: Landing,
) -> Copied {
    let (server, client) = cfg.clone();
    striped_copy(
        src,
        streams,
        landing,
        move |s, data| {
            let conn = rustls::ServerConnection::new(server.clone()).unwrap_or_else(|e| panic!("tls: {e}"));
            let mut t = rustls::StreamOwned::new(conn, s);
            for b in data {
                t.write_all(b).unwrap_or_else(|e| panic!("write: {e}"));
            }
            t.flush().unwrap_or_else(|e| panic!("flush: {e}"));
            t.conn.send_close_notify();
            let _ = t.conn.complete_io(&mut t.sock);
        },
        move |s, dst| {
            let name = ServerName::try_from("127.0.0.1").unwrap_or_else(|e| panic!("name: {e}"));
            let conn =
                rustls::ClientConnection::new(client.clone(), name).unwrap_or_else(|e| panic!("tls: {e}"));
            let mut t = rustls::StreamOwned::new(conn, s);
            for d in dst.iter_mut() {
                t.read_exact(d).unwrap_or_else(|e| panic!("read: {e}"));
            }
        },
    )
}

/// XXH3-64 over every block, GB/s: the crate's compile-time path and the
/// Manager's (run-time AVX2 dispatch), best of `reps` (the hash each side of a
/// peer transfer takes per block).
fn hash_rates(src: &[Vec<u8>], reps: usize) -> (f64, f64) {
    let total: usize = src.iter().map(Vec::len).sum();
    let mut best = (0.0f64, 0.0f64);
    let mut sink = 0u64;
    for _ in 0..reps {
        let t0 = Instant::now();
        for b in src {
            sink ^= xxhash_rust::xxh3::xxh3_64(b);
        }
        best.0 = best.0.max(gbps(total, t0.elapsed()));
        let t0 = Instant::now();
        for b in src {
            sink ^= orbitkv_manager::checksum::xxh3_64(b);
        }
        best.1 = best.1.max(gbps(total, t0.elapsed()));
    }
    assert_eq!(sink, 0, "both paths agree on every block");
    best
}

fn main() {
    let args = Args::from_env();
    let out = args.out("bench-results/peer_restore.json");
    let total = args.usize("--total-mib", 128) << 20;
    let bs = args.usize("--block-kib", 256) << 10;
    let trials = args.usize("--trials", 5).max(1) as u32;
    let hash_thread = args.value("--peer-hash-thread").unwrap_or("auto");
    let streams = args.value("--peer-fill-streams");
    let n = (total / bs).max(1);
    let src: Vec<Vec<u8>> = (0..n)
        .map(|i| (0..bs).map(|j| (i * 131 + j * 7) as u8).collect())
        .collect();
    let root = std::env::temp_dir().join(format!("orbitkv-peer-bench-{}", std::process::id()));
    std::fs::create_dir_all(&root).unwrap_or_else(|e| panic!("mkdir: {e}"));
    let pki = root.join("pki");
    let _ = std::fs::create_dir_all(&pki);
    let have_tls = make_pki(&pki);

    // Interleaved per trial, so drift on a shared machine hits every row alike.
    let landing = if args.flag("--land-in-shm") {
        Landing::Shm
    } else {
        Landing::Heap
    };
    let opts = Opts {
        hash_thread,
        streams,
        decoy: args.flag("--decoy-peer"),
    };
    let plain_pair = pair(None, bs, n * bs, &root, &opts);
    // What `auto` resolved to (or what was asked), from B's status.
    let b_status = plain_pair
        .cb
        .stats_json()
        .ok()
        .and_then(|j| serde_json::from_str::<serde_json::Value>(&j).ok());
    let hash_thread_on = b_status
        .as_ref()
        .and_then(|v| v["peers"]["hash_thread"].as_bool());
    let fill_streams = b_status
        .as_ref()
        .and_then(|v| v["peers"]["fill_streams"].as_u64());
    let tls_setup = have_tls.then(|| (tls_configs(&pki), pair(Some(&pki), bs, n * bs, &root, &opts)));
    // With a split fetch, also a copy over as many connections: the like-for-like baseline.
    let copy_streams = fill_streams.map_or(1, |k| k as usize).max(1);
    let (mut plain_rows, mut tls_rows) = (Rows::default(), Rows::default());
    for t in 0..trials {
        plain_rows.trial(|k| tcp_copy(&src, k, landing), copy_streams, &plain_pair, t, &src);
        if let Some((cfg, p)) = &tls_setup {
            tls_rows.trial(|k| tls_copy(cfg, &src, k, landing), copy_streams, p, t, &src);
        }
    }
    // Per-trial ratios against the baseline run just before (slow drift of a
    // shared host cancels out), then their median.
    let paired =
        |a: &[f64], b: &[f64]| (!a.is_empty()).then(|| median(a.iter().zip(b).map(|(x, y)| x / y).collect()));
    let paired_plain_e2e = paired(&plain_rows.restore, &plain_rows.served);
    let paired_fill_plain = paired(&plain_rows.fill, &plain_rows.like);
    let paired_tls_e2e = paired(&tls_rows.restore, &tls_rows.served);
    let paired_fill_tls = paired(&tls_rows.fill, &tls_rows.like);
    let per_trial = serde_json::json!({
        "tcp_copy_like": &plain_rows.like,
        "tcp_copy_then_copy_out": &plain_rows.served,
        "peer_restore_plain": &plain_rows.restore,
        "peer_fill_plain": &plain_rows.fill,
        "tls_copy_like": &tls_rows.like,
        "tls_copy_then_copy_out": &tls_rows.served,
        "peer_restore_tls": &tls_rows.restore,
        "peer_fill_tls": &tls_rows.fill,
    });
    let Rows {
        one: tcp,
        multi: tcp_multi,
        served: tcp_served,
        restore: plain,
        fill: plain_fill,
        ..
    } = plain_rows;
    let Rows {
        one: tls,
        multi: tls_multi,
        served: tls_served,
        restore: ptls,
        fill: tls_fill,
        ..
    } = tls_rows;
    plain_pair.stop();
    if let Some((_, p)) = tls_setup {
        p.stop();
    }
    let (hash_crate, hash_manager) = hash_rates(&src, 3);
    let (tcp, peer_plain, fill_plain) = (median(tcp), median(plain), median(plain_fill));
    let tcp_multi = (copy_streams > 1).then(|| median(tcp_multi));
    let tls_multi = (copy_streams > 1 && have_tls).then(|| median(tls_multi));
    let tcp_served = median(tcp_served);
    let tls_served = have_tls.then(|| median(tls_served));
    let (tls, peer_tls, fill_tls, tls_note) = if have_tls {
        (
            Some(median(tls)),
            Some(median(ptls)),
            Some(median(tls_fill)),
            None,
        )
    } else {
        (
            None,
            None,
            None,
            Some("skipped: the openssl command (to make certificates) is not installed"),
        )
    };
    let _ = std::fs::remove_dir_all(&root);
    println!(
        "bytes per trial {} ({} blocks of {} KiB), {trials} trials, checksum helper thread {} ({hash_thread}), fill streams {}, median GB/s:",
        n * bs,
        n,
        bs >> 10,
        match hash_thread_on {
            Some(true) => "on",
            Some(false) => "off",
            None => "?",
        },
        fill_streams.map_or("?".to_string(), |n| n.to_string())
    );
    println!("  plain TCP copy          {tcp:>8.2}");
    println!(
        "  peer restore (plain)    {peer_plain:>8.2}   {:.2}x of the TCP copy",
        peer_plain / tcp
    );
    println!(
        "    of which the fill     {fill_plain:>8.2}   {:.2}x (bytes into B's arena)",
        fill_plain / tcp
    );
    if let Some(m) = tcp_multi {
        println!("  plain TCP copy, {copy_streams} conns {m:>8.2}");
        println!(
            "  peer restore (plain)    {peer_plain:>8.2}   {:.2}x of the {copy_streams}-connection copy (fill {:.2}x)",
            peer_plain / m,
            fill_plain / m
        );
    }
    println!(
        "  plain TCP copy over {copy_streams} conn(s), then copied out as a restore does: {tcp_served:>6.2}"
    );
    println!(
        "  peer restore (plain)    {peer_plain:>8.2}   {:.2}x of that (like for like, end to end)",
        peer_plain / tcp_served
    );
    if let (Some(e), Some(f)) = (paired_plain_e2e, paired_fill_plain) {
        println!(
            "    per-trial ratios, median: restore {e:.2}x of the copy then copied out; fill {f:.2}x of the {copy_streams}-connection copy"
        );
    }
    println!(
        "  xxh3-64 per block       {hash_manager:>8.2}   ({}; xxhash-rust's compile-time path {hash_crate:.2})",
        orbitkv_manager::checksum::long_path()
    );
    if let (Some(t), Some(p)) = (tls, peer_tls) {
        println!("  TLS-only copy           {t:>8.2}");
        println!(
            "  peer restore (mTLS)     {p:>8.2}   {:.2}x of the TLS copy",
            p / t
        );
        if let Some(f) = fill_tls {
            println!("    of which the fill     {f:>8.2}   {:.2}x", f / t);
        }
        if let Some(st) = tls_served {
            println!("  TLS copy over {copy_streams} conn(s), then copied out: {st:>6.2}");
            println!(
                "  peer restore (mTLS)     {p:>8.2}   {:.2}x of that (like for like, end to end)",
                p / st
            );
            if let (Some(e), Some(f)) = (paired_tls_e2e, paired_fill_tls) {
                println!(
                    "    per-trial ratios, median: restore {e:.2}x of the TLS copy then copied out; fill {f:.2}x of the {copy_streams}-connection TLS copy"
                );
            }
        }
        if let Some(m) = tls_multi {
            println!("  TLS copy, {copy_streams} conns      {m:>8.2}");
            println!(
                "  peer restore (mTLS)     {p:>8.2}   {:.2}x of the {copy_streams}-connection TLS copy (fill {:.2}x)",
                p / m,
                fill_tls.map_or(0.0, |f| f / m)
            );
        }
    }
    let landing_name = match landing {
        Landing::Heap => "heap buffers",
        Landing::Shm => "a shared-memory segment of base pages (--land-in-shm)",
    };
    let mut doc = serde_json::json!({
        "bench": "peer_restore",
        "what": "restore through Manager B of blocks saved on Manager A: B's lookup fetches from A over the peer transport into B's arena (checksummed), then acquire + copy out + release as for a local hit; median of interleaved trials, fresh hashes per trial, both Managers in this process on loopback",
        "baselines": "plain TCP copy and TLS-only copy (rustls TLS 1.3, mutual auth, handshake included) of the same blocks, same run, into the reader's own buffers, over one connection and (with a split fill) over as many connections as B's fill uses; and the copy over as many connections as the fill followed by the copy-out the restore ends with (`*_then_copy_out`: the end-to-end like-for-like baseline)",
        "bytes_per_trial": n * bs,
        "block_bytes": bs,
        "trials": trials,
        "tcp_copy_gbps": tcp,
        "tcp_copy_streams": copy_streams,
        "tcp_copy_multi_gbps": tcp_multi,
        "peer_plain_vs_tcp_multi": tcp_multi.map(|m| peer_plain / m),
        "peer_fill_plain_vs_tcp_multi": tcp_multi.map(|m| fill_plain / m),
        "peer_restore_plain_gbps": peer_plain,
        "peer_plain_vs_tcp": peer_plain / tcp,
        "peer_fill_plain_gbps": fill_plain,
        "peer_fill_plain_vs_tcp": fill_plain / tcp,
        "peer_fill_tls_gbps": fill_tls,
        "peer_fill_tls_vs_tls": tls.zip(fill_tls).map(|(t, f)| f / t),
        "tls_copy_gbps": tls,
        "peer_restore_tls_gbps": peer_tls,
        "peer_tls_vs_tls": tls.zip(peer_tls).map(|(t, p)| p / t),
        "tls_copy_multi_gbps": tls_multi,
        "peer_tls_vs_tls_multi": tls_multi.zip(peer_tls).map(|(m, p)| p / m),
        "peer_fill_tls_vs_tls_multi": tls_multi.zip(fill_tls).map(|(m, f)| f / m),
        "tcp_copy_then_copy_out_gbps": tcp_served,
        "peer_plain_vs_tcp_copy_then_copy_out": peer_plain / tcp_served,
        "tls_copy_then_copy_out_gbps": tls_served,
        "peer_tls_vs_tls_copy_then_copy_out": tls_served.zip(peer_tls).map(|(st, p)| p / st),
        "paired_median_restore_plain_vs_tcp_copy_then_copy_out": paired_plain_e2e,
        "paired_median_fill_plain_vs_tcp_copy_like": paired_fill_plain,
        "paired_median_restore_tls_vs_tls_copy_then_copy_out": paired_tls_e2e,
        "paired_median_fill_tls_vs_tls_copy_like": paired_fill_tls,
        "per_trial_gbps": per_trial,
        "tls_note": tls_note,
        "peer_hash_thread": hash_thread,
        "peer_hash_thread_on": hash_thread_on,
        "peer_fill_streams": fill_streams,
        "available_parallelism": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "xxh3_gbps": hash_manager,
        "xxh3_path": orbitkv_manager::checksum::long_path(),
        "xxh3_crate_compile_time_gbps": hash_crate,
    });
    doc["decoy_peer"] = serde_json::json!(opts.decoy);
    doc["baselines_land_in"] = serde_json::json!(landing_name);
    json_out::write_json(&out, &doc).unwrap_or_else(|e| panic!("{e}"));
}
