//! Peer membership in a real etcd (Debian `etcd-server`, started here on
//! loopback): Managers register under a lease and find each other with no
//! static peer list; a cleanly stopped Manager leaves the list; with etcd
//! stopped every Manager keeps serving its own blocks (and the peers it knew).
//! Skipped, with the reason printed, where no `etcd` binary is installed
//! (`scripts/test.sh` installs it where it may).

mod support;

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};

use support::*;

const BB: usize = 16 << 10;
const FP: [u8; 32] = [5; 32];

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

struct Etcd {
    child: Child,
    _dir: tempfile::TempDir,
    port: u16,
}

impl Etcd {
    fn start() -> Option<Etcd> {
        let bin = ["/usr/bin/etcd", "/usr/local/bin/etcd"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())?;
        let dir = tempfile::tempdir().expect("tempdir");
        let (port, peer) = (free_port(), free_port());
        let client = format!("http://127.0.0.1:{port}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new(bin)
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
