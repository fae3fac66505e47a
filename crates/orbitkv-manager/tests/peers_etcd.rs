//! Peer membership in a real etcd (Debian `etcd-server`, started here on
//! loopback): Managers register under a lease and find each other with no
//! static peer list; a cleanly stopped Manager leaves the list; with etcd
//! stopped every Manager keeps serving its own blocks (and the peers it knew).
//! Skipped, with the reason printed, where no `etcd` binary is installed
//! (`scripts/test.sh` installs it where it may).

mod support;

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

use support::*;

const BB: usize = 16 << 10;
const FP: [u8; 32] = [5; 32];

struct Etcd {
    child: Child,
    _dir: tempfile::TempDir,
    port: u16,
}

impl Etcd {
    fn start() -> Option<Etcd> {
        Etcd::start_with(None)
    }

    /// With `pki`: HTTPS with `etcd.crt`/`etcd.key` of `ca.crt`, client certificates required.
    fn start_with(pki: Option<&std::path::Path>) -> Option<Etcd> {
        let bin = ["/usr/bin/etcd", "/usr/local/bin/etcd"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())?;
        let dir = tempfile::tempdir().expect("tempdir");
        let (port, peer) = (free_port(), free_port());
        let scheme = if pki.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{port}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let mut cmd = Command::new(bin);
        if let Some(d) = pki {
            cmd.arg("--cert-file")
                .arg(d.join("etcd.crt"))
                .arg("--key-file")
                .arg(d.join("etcd.key"))
                .arg("--trusted-ca-file")
                .arg(d.join("ca.crt"))
                .arg("--client-cert-auth");
        }
        let child = cmd
            .args(["--name", "t", "--data-dir"])
            .arg(dir.path().join("data"))
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
            ])
            .args(["--initial-cluster", &format!("t={peer_url}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn etcd");
        eventually("etcd listening", || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        Some(Etcd {
            child,
            _dir: dir,
            port,
        })
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}

fn manager(etcd: u16, port: u16) -> ManagerProc {
    let m = ManagerProc::start(&[
        "--peer-listen",
        &format!("127.0.0.1:{port}"),
        "--etcd-endpoints",
        &format!("http://127.0.0.1:{etcd}"),
        "--etcd-ttl-s",
        "3",
        "--peer-timeout-ms",
        "2000",
    ]);
    eventually("peer listener", || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    m
}

fn known_peers(m: &ManagerProc) -> Vec<String> {
    let s = m.stats();
    s["peers"]["peers"]
        .as_array()
        .expect("peers")
        .iter()
        .map(|p| p["addr"].as_str().expect("addr").to_string())
        .collect()
}

fn save(m: &ManagerProc, chain: u8, n: u8) {
    let c = m.client();
    let ns = c.register_namespace(FP, BB as u64, 0, b"").expect("ns");
    let hs: Vec<_> = (0..n).map(|i| hash(chain, i)).collect();
    let data: Vec<Vec<u8>> = (0..n).map(|i| block(chain.wrapping_add(i), BB)).collect();
    let src: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
    c.save(&ns, &hs, &src).expect("save");
    c.close().expect("close");
}

fn restore_ok(m: &ManagerProc, chain: u8, n: u8) -> bool {
    let c = m.client();
    let ns = c.register_namespace(FP, BB as u64, 0, b"").expect("ns");
    let hs: Vec<_> = (0..n).map(|i| hash(chain, i)).collect();
    let mut out = vec![vec![0u8; BB]; n as usize];
    let mut dst: Vec<&mut [u8]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
    let hit = c.restore(&ns, &hs, &mut dst).expect("restore");
    c.close().expect("close");
    let want: Vec<Vec<u8>> = (0..n).map(|i| block(chain.wrapping_add(i), BB)).collect();
    hit == u32::from(n) && out == want
}

#[test]
fn managers_find_each_other_in_etcd_and_survive_its_loss() {
    let Some(mut etcd) = Etcd::start() else {
        eprintln!(
            "SKIPPED: no etcd binary (install the etcd-server package; scripts/test.sh does where it may)"
        );
        return;
    };
    let (pa, pb, pc) = (free_port(), free_port(), free_port());
    let a = manager(etcd.port, pa);
    let b = manager(etcd.port, pb);
    let addr_a = format!("127.0.0.1:{pa}");
    let addr_b = format!("127.0.0.1:{pb}");
    let addr_c = format!("127.0.0.1:{pc}");
    eventually("B discovered A and A discovered B", || {
        known_peers(&b) == [addr_a.clone()] && known_peers(&a) == [addr_b.clone()]
    });
    assert_eq!(b.stats()["peers"]["peers"][0]["source"], "etcd");
    save(&a, 1, 4);
    assert!(restore_ok(&b, 1, 4), "B restored A's blocks, found through etcd");

    // A third Manager joins, then stops cleanly: its lease is revoked at once.
    let mut c = manager(etcd.port, pc);
    eventually("B discovered C", || known_peers(&b).contains(&addr_c));
    Command::new("kill")
        .arg(c.child.id().to_string())
        .status()
        .expect("SIGTERM C");
    let _ = c.child.wait();
    eventually("C left the member list", || !known_peers(&b).contains(&addr_c));

    // etcd stops: each Manager keeps serving its own blocks, and the peers it knew.
    etcd.stop();
    eventually("B noticed etcd is down", || {
        b.stats()["peers"]["etcd"]
            .as_str()
            .is_some_and(|s| s.starts_with("down"))
    });
    save(&b, 2, 3);
    assert!(restore_ok(&b, 2, 3), "B serves its own blocks without etcd");
    save(&a, 3, 3);
    assert!(restore_ok(&a, 3, 3), "A serves its own blocks without etcd");
    assert!(restore_ok(&b, 3, 3), "B still reaches A, the last known member");
}

fn etcd_status(m: &ManagerProc) -> String {
    m.stats()["peers"]["etcd"].as_str().unwrap_or("").to_string()
}

#[test]
fn membership_over_https_with_client_certificates() {
    let pki = support::pki::loopback_pki(&["etcd", "m"]);
    let d = pki.path();
    let Some(etcd) = Etcd::start_with(Some(d)) else {
        eprintln!("SKIPPED: no etcd binary (install the etcd-server package)");
        return;
    };
    let f = |n: &str| d.join(n).display().to_string();
    let endpoint = format!("https://127.0.0.1:{}", etcd.port);
    let start = |port: u16, tls: &[String]| {
        let mut args = vec![
            "--peer-listen".to_string(),
            format!("127.0.0.1:{port}"),
            "--etcd-endpoints".into(),
            endpoint.clone(),
            "--etcd-ttl-s".into(),
            "3".into(),
        ];
        args.extend(tls.iter().cloned());
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let m = ManagerProc::start(&refs);
        eventually("peer listener", || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        m
    };
    let good = [
        "--etcd-tls-ca".to_string(),
        f("ca.crt"),
        "--etcd-tls-cert".into(),
        f("m.crt"),
        "--etcd-tls-key".into(),
        f("m.pk8"),
    ];
    let (pa, pb) = (free_port(), free_port());
    let a = start(pa, &good);
    let b = start(pb, &good);
    eventually("A and B found each other through etcd over HTTPS", || {
        known_peers(&b) == [format!("127.0.0.1:{pa}")] && known_peers(&a) == [format!("127.0.0.1:{pb}")]
    });
    assert!(etcd_status(&a).starts_with("up"), "{}", etcd_status(&a));
    save(&a, 7, 3);
    assert!(
        restore_ok(&b, 7, 3),
        "B restored A's blocks, found through etcd over HTTPS"
    );
    // etcd's certificate from another CA: refused by this Manager.
    let wrong_ca = start(
        free_port(),
        &[
            "--etcd-tls-ca".to_string(),
            f("other.crt"),
            "--etcd-tls-cert".into(),
            f("m.crt"),
            "--etcd-tls-key".into(),
            f("m.pk8"),
        ],
    );
    // No client certificate: refused by etcd (--client-cert-auth).
    let no_client = start(free_port(), &["--etcd-tls-ca".to_string(), f("ca.crt")]);
    for (m, what) in [(&wrong_ca, "wrong CA"), (&no_client, "no client certificate")] {
        eventually(&format!("{what}: etcd down"), || {
            etcd_status(m).starts_with("down")
        });
        assert!(known_peers(m).is_empty(), "{what}: nothing discovered");
    }
    assert!(
        etcd_status(&wrong_ca).contains("UnknownIssuer"),
        "{}",
        etcd_status(&wrong_ca)
    );
    // A missing CA file is refused at start-up, naming the file.
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_orbitkv-manager"))
        .arg("--socket")
        .arg(dir.path().join("m.sock"))
        .args(["--dram-size", "8MiB", "--metrics-addr", "off"])
        .args(["--peer-listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--etcd-endpoints", &endpoint, "--etcd-tls-ca"])
        .arg(d.join("missing.crt"))
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("etcd TLS CA") && err.contains("missing.crt"),
        "{err}"
    );
}
