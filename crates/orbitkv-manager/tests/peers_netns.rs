//! Managers in two network namespaces joined by a veth pair, as on two hosts:
//! peers (issue 12): each Manager sees only its own namespace's address, traffic
//! crosses the veth over mutual TLS, and a Manager holding a certificate from
//! another CA is refused; the remote tier (issue 30): a Redis Cluster in one
//! namespace shared by a Manager in each, over mutual TLS. Created by the test;
//! skipped, with the reason printed, where this user may not create network
//! namespaces (not root, or no `ip netns`).

mod support;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use orbitkv_client::Client;
use support::*;

const BB: usize = 64 << 10;
const FP: [u8; 32] = [3; 32];
const PORT: u16 = 7470;

#[path = "../../orbitkv-remote/tests/common/cluster.rs"]
mod cluster;

/// Two namespaces `<tag>a` (10.77.<k>.1) and `<tag>b` (10.77.<k>.2) and the veth
/// between them; removed on drop.
struct Netns {
    a: String,
    b: String,
    ip_a: String,
    ip_b: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Netns {
    /// `t` tells apart the namespaces and veths of tests running at once.
    fn create_tagged(t: &str) -> Result<Netns, String> {
        let k = std::process::id() % 200 + 20;
        let tag = format!("okv{}{t}", std::process::id());
        let n = Netns {
            a: format!("{tag}a"),
            b: format!("{tag}b"),
            ip_a: format!("10.77.{k}.1"),
            ip_b: format!("10.77.{k}.2"),
        };
        ip(&["netns", "add", &n.a])?;
        ip(&["netns", "add", &n.b])?;
        let (va, vb) = (
            format!("va{}{t}", std::process::id()),
            format!("vb{}{t}", std::process::id()),
        );
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
        ip(&["link", "set", &va, "netns", &n.a])?;
        ip(&["link", "set", &vb, "netns", &n.b])?;
        for (ns, dev, addr) in [(&n.a, &va, &n.ip_a), (&n.b, &vb, &n.ip_b)] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(n)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

/// The namespaces of [`Netns::create_tagged`] with tag `t`, or `None` (the
/// reason printed) where the test cannot run here: not root, no openssl
/// command, or no namespaces and veth pairs to be made.
fn netns_or_skip(t: &str) -> Option<Netns> {
    if orbitkv_shm::peer::my_uid() != 0 {
        eprintln!("SKIPPED: creating network namespaces needs root");
        return None;
    }
    if Command::new("openssl").arg("version").output().is_err() {
        eprintln!("SKIPPED: the openssl command (to make test certificates) is not installed");
        return None;
    }
    match Netns::create_tagged(t) {
        Ok(n) => Some(n),
        Err(e) => {
            eprintln!("SKIPPED: cannot create network namespaces and a veth pair here: {e}");
            None
        }
    }
}

/// A Manager process inside network namespace `ns`.
struct InNs {
    child: Child,
    socket: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl InNs {
    fn start(ns: &str, args: &[String]) -> InNs {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("m.sock");
        let child = Command::new("ip")
            .args(["netns", "exec", ns, env!("CARGO_BIN_EXE_orbitkv-manager")])
            .arg("--socket")
            .arg(&socket)
            .args(quiet_flags("8MiB"))
            .args(args)
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn");
        eventually("manager socket", || {
            std::os::unix::net::UnixStream::connect(&socket).is_ok()
        });
        InNs {
            child,
            socket,
            _dir: dir,
        }
    }

    /// [`InNs::start`] with `args` and the TLS files of certificate `cert`
    /// of CA `ca` in `pki`.
    fn start_tls(ns: &str, args: &[&str], pki: &std::path::Path, cert: &str, ca: &str) -> InNs {
        let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        args.extend(pki::tls_flags(pki, cert, ca));
        InNs::start(ns, &args)
    }

    fn client(&self) -> Client {
        Client::connect(&self.socket, None, Duration::from_secs(10)).expect("connect")
    }

    /// Save `data` as the blocks `hs` of namespace `FP` through a fresh client,
    /// every one stored.
    fn save(&self, hs: &[[u8; 32]], data: &[Vec<u8>]) {
        let c = self.client();
        let ns = c.register_namespace(FP, BB as u64, 0, b"").expect("ns");
        let src: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
        assert_eq!(c.save(&ns, hs, &src).expect("save").stored as usize, hs.len());
        c.close().expect("close");
    }

    /// Restore the blocks `hs` of namespace `FP` through a fresh client: the
    /// blocks hit and a buffer for each hash.
    fn restore(&self, hs: &[[u8; 32]]) -> (u32, Vec<Vec<u8>>) {
        let c = self.client();
        let ns = c.register_namespace(FP, BB as u64, 0, b"").expect("ns");
        let mut out = vec![vec![0u8; BB]; hs.len()];
        let mut dst: Vec<&mut [u8]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
        let hit = c.restore(&ns, hs, &mut dst).expect("restore");
        c.close().expect("close");
        (hit, out)
    }

    fn stats(&self) -> serde_json::Value {
        let c = self.client();
        let s = c.stats_json().expect("stats");
        c.close().expect("close");
        serde_json::from_str(&s).expect("json")
    }
}

impl Drop for InNs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Manager in namespace `ns` with `args` and no TLS files must refuse to
/// start (exit code 2) for want of TLS, its error containing `needle`.
fn assert_refused_without_tls(ns: &str, args: &[&str], needle: &str) {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, env!("CARGO_BIN_EXE_orbitkv-manager")])
        .args(["--socket", "/nonexistent/x.sock", "--metrics-addr", "off"])
        .args(args)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(needle), "{err}");
}

#[test]
fn two_network_namespaces_over_mutual_tls() {
    let Some(net) = netns_or_skip("") else { return };
    let pki = tempfile::tempdir().expect("tempdir");
    pki::make_pki(pki.path(), "ca", &[("a", &net.ip_a), ("b", &net.ip_b)]);
    pki::make_pki(pki.path(), "rogue", &[("r", &net.ip_b)]);
    let to_a = format!("{}:{PORT}", net.ip_a);
    let a = InNs::start_tls(&net.a, &["--peer-listen", &to_a], pki.path(), "a", "ca");

    let data: Vec<Vec<u8>> = (0..4).map(|i| block(90 + i, BB)).collect();
    let hs: Vec<[u8; 32]> = (0..4).map(|i| hash(21, i)).collect();
    a.save(&hs, &data);

    // B, in the other namespace, reaches A only across the veth, over mutual TLS.
    {
        let b = InNs::start_tls(&net.b, &["--peer", &to_a], pki.path(), "b", "ca");
        let (hit, out) = b.restore(&hs);
        assert_eq!(hit, 4);
        assert_eq!(out, data, "byte-exact across the veth");
        assert_eq!(b.stats()["peers"]["peers"][0]["health"], "up");
        assert_eq!(a.stats()["peers"]["source"]["blocks_sent"], 4);
    }

    // The same Manager with a certificate from another CA is refused.
    let r = InNs::start_tls(&net.b, &["--peer", &to_a], pki.path(), "r", "rogue");
    assert_eq!(r.restore(&hs).0, 0, "refused: a miss");
    let st = r.stats();
    assert_eq!(st["blocks_committed_total"], 0);
    assert_eq!(st["peers"]["peers"][0]["errors"], 1);
    assert_eq!(a.stats()["peers"]["source"]["refused"], 1);

    // Without TLS files, the non-loopback address is refused at start-up.
    assert_refused_without_tls(
        &net.b,
        &["--peer", &format!("{}:{PORT}", net.ip_a)],
        "requires mutual TLS",
    );
}

#[test]
fn tp_across_two_network_namespaces_over_mutual_tls() {
    let Some(net) = netns_or_skip("t") else { return };
    let pki = tempfile::tempdir().expect("tempdir");
    pki::make_pki(pki.path(), "ca", &[("a", &net.ip_a), ("b", &net.ip_b)]);
    // B holds shard 1 (its rank's worker is B's client); A is the scheduler's
    // Manager with rank 0, and places shard 1 on B across the veth.
    let listen = format!("{}:{PORT}", net.ip_b);
    let b_args = ["--enable-query-control", "--peer-listen", &listen];
    let b = InNs::start_tls(&net.b, &b_args, pki.path(), "b", "ca");
    let shard_1 = format!("1={}:{PORT}", net.ip_b);
    let a_args = ["--enable-query-control", "--tp-shard-peer", &shard_1];
    let a = InNs::start_tls(&net.a, &a_args, pki.path(), "a", "ca");
    let shard_block = |r: u8, i: u8| block(r * 64 + i, BB);
    let rank = |m: &InNs, r: u8, n: u8| {
        let c = m.client();
        let ns = c
            .register_namespace(FP, BB as u64, u32::from(r), b"")
            .expect("ns");
        let hs: Vec<[u8; 32]> = (0..n).map(|i| hash(31, i)).collect();
        let bufs: Vec<Vec<u8>> = (0..n).map(|i| shard_block(r, i)).collect();
        let src: Vec<&[u8]> = bufs.iter().map(|v| v.as_slice()).collect();
        c.save(&ns, &hs, &src).expect("save");
        (c, ns)
    };
    let w0 = rank(&a, 0, 2);
    let w1 = rank(&b, 1, 4);
    let sched = Client::connect_with(
        &a.socket,
        &orbitkv_client::ConnectOptions {
            map_arena: false,
            ..orbitkv_client::ConnectOptions::new(Duration::from_secs(10))
        },
    )
    .expect("control");
    let nss: Vec<_> = (0..2)
        .map(|r| sched.register_namespace(FP, BB as u64, r, b"").expect("ns"))
        .collect();
    let hs: Vec<[u8; 32]> = (0..4).map(|i| hash(31, i)).collect();
    let hit = sched.lookup_tp(&nss, &hs).expect("lookup across the veth");
    assert_eq!(hit.hit_blocks, 2, "rank 0 on A holds 2, rank 1 on B 4");
    let token = hit.token.expect("token");
    assert_eq!(
        b.stats()["dram_pinned_blocks"],
        2,
        "B pinned the common prefix only"
    );
    for (r, (c, ns)) in [(0u8, &w0), (1, &w1)] {
        let lease = c.redeem_tp(token, ns).expect("redeem at its own Manager");
        let slots = c.acquire(lease.lease).expect("acquire");
        let mut out = vec![vec![0u8; BB]; 2];
        let mut dst: Vec<&mut [u8]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
        c.copy_out(&slots, BB as u64, 0, &mut dst).expect("copy");
        assert_eq!(out, vec![shard_block(r, 0), shard_block(r, 1)], "rank {r}");
        c.release(lease.lease).expect("done");
    }
    sched.release_tp(token).expect("release");
    assert_eq!(b.stats()["dram_pinned_blocks"], 0);
    assert_eq!(a.stats()["dram_pinned_blocks"], 0);
    assert_eq!(a.stats()["peers"]["tls"], true);

    // Without TLS files, a shard placed off loopback is refused at start-up.
    assert_refused_without_tls(
        &net.a,
        &[
            "--enable-query-control",
            "--tp-shard-peer",
            &format!("1={}:{PORT}", net.ip_b),
        ],
        "requires mutual TLS",
    );
}

#[test]
fn a_redis_cluster_in_one_namespace_serves_a_manager_in_the_other_over_mutual_tls() {
    let Some(net) = netns_or_skip("r") else { return };
    // The cluster's nodes listen on A's veth address only, TLS on every port.
    let Some(cl) = cluster::Cluster::start_in(Some(&net.a), 21360, &["--tls", "--bind", &net.ip_a]) else {
        return;
    };
    let args = cl.manager_flags(1000);
    let a = InNs::start(&net.a, &args);
    let b = InNs::start(&net.b, &args);

    let data: Vec<Vec<u8>> = (0..6).map(|i| block(60 + i, BB)).collect();
    let hs: Vec<[u8; 32]> = (0..6).map(|i| hash(31, i)).collect();
    a.save(&hs, &data);
    eventually("A wrote the blocks behind", || {
        a.stats()["remote_puts_total"].as_u64() >= Some(6)
    });
    // B, in the other namespace, misses locally and reads the cluster across the veth.
    let (hit, out) = b.restore(&hs);
    assert_eq!(hit, 6);
    assert_eq!(out, data, "byte-exact across the veth");
    let st = b.stats();
    assert_eq!(st["remote_filled_blocks_total"], 6);
    assert_eq!(st["remote_errors_total"], 0);
    assert_eq!(st["remote"]["tls"], true);

    // Without TLS files, a cluster off loopback is refused at start-up.
    let plain: Vec<&str> = args[..4].iter().map(String::as_str).collect();
    assert_refused_without_tls(&net.b, &plain, "--remote-tls-ca");
}
