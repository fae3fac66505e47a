//! The remote store against a real Redis Cluster on loopback (3 masters + 3 replicas,
//! ACL on; `scripts/redis-cluster.sh`): byte-exact round trips, every integrity case a
//! miss, ACL refusals, and a cluster that goes away and comes back.
//!
//! Needs Debian's redis-server and redis-tools (`tests/common/cluster.rs` says what
//! happens without them).

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

use orbitkv_remote::store::{Miss, RemoteConfig, RemoteError, RemoteStore, TlsFiles};
use orbitkv_remote::value::{self, Mismatch};
use orbitkv_ssd::SsdKey;

mod common;

use common::cluster::Cluster;

impl Cluster {
    fn config(&self, prefix: &str) -> RemoteConfig {
        RemoteConfig {
            // Every node as a seed: a reconnect must not depend on one node being up.
            nodes: self.seeds(),
            username: "orbitkv".into(),
            password_file: self.password_file(),
            tls: self.tls().then(|| TlsFiles {
                ca: self.tls_file("ca.crt"),
                client: Some((self.tls_file("client.crt"), self.tls_file("client.key"))),
            }),
            key_prefix: prefix.into(),
            deadline: Duration::from_millis(500),
            breaker_failures: 3,
            breaker_cooldown: Duration::from_millis(300),
        }
    }

    /// `redis-cli` as the ACL user, against the node serving `key`.
    fn cli(&self, args: &[&str]) -> String {
        let port = self.base.to_string();
        let mut all = vec!["--user", "orbitkv", "-c", "-p", &port];
        all.extend_from_slice(args);
        self.redis_cli("password", &all)
    }

    /// `redis-cli` with the password in file `password` (of the cluster's directory),
    /// over TLS when the cluster speaks only TLS; its output, trimmed.
    fn redis_cli(&self, password: &str, args: &[&str]) -> String {
        let pass = std::fs::read_to_string(self.dir.join(password)).expect("password");
        let mut cmd = Command::new("redis-cli");
        if self.tls() {
            cmd.arg("--tls").arg("--cacert").arg(self.tls_file("ca.crt"));
            cmd.arg("--cert").arg(self.tls_file("client.crt"));
            cmd.arg("--key").arg(self.tls_file("client.key"));
        }
        let out = cmd
            .env("REDISCLI_AUTH", pass.trim())
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

fn key(i: u32, generation: u64) -> SsdKey {
    let mut hash = [0u8; 32];
    hash[..4].copy_from_slice(&i.to_le_bytes());
    SsdKey {
        fingerprint: [3; 32],
        shard: 0,
        salt: [0; 32],
        generation,
        hash,
    }
}

fn block(i: u32, n: usize) -> Vec<u8> {
    (0..n)
        .map(|j| (j as u32).wrapping_mul(2_654_435_761).wrapping_add(i) as u8)
        .collect()
}

#[test]
fn blocks_round_trip_byte_exact_across_the_cluster() {
    let Some(c) = Cluster::start(21200) else { return };
    let s = RemoteStore::open(&c.config("okv:")).expect("open");
    let sizes = [(64u32, 256 * 1024), (4, 4 * 1024 * 1024)];
    for &(n, bytes) in &sizes {
        for i in 0..n {
            assert!(s.put(&key(i, bytes as u64), &block(i, bytes)), "put {i}");
        }
    }
    for &(n, bytes) in &sizes {
        for i in 0..n {
            let hit = s.get(&key(i, bytes as u64), bytes as u64).expect("hit");
            assert!(hit.payload() == &block(i, bytes)[..], "block {i} of {bytes} B");
        }
    }
    let st = s.stats();
    assert_eq!((st.puts, st.hits, st.errors, st.invalid), (68, 68, 0, 0));
    assert_eq!(st.bytes_read, 64 * 256 * 1024 + 4 * 4 * 1024 * 1024);
    // One pipeline over keys on every master: each key's own verdict, in order.
    let mut keys: Vec<SsdKey> = (0..70).map(|i| key(i, 256 * 1024)).collect();
    keys.push(key(1, 4 << 20)); // a 4 MiB block asked at 256 KiB: another length
    let got = s.get_many(&keys, 256 * 1024);
    assert!(matches!(
        got.last(),
        Some(Err(Miss::Invalid(Mismatch::Length { .. })))
    ));
    keys.pop();
    let got = s.get_many(&keys, 256 * 1024);
    assert_eq!(got.len(), 70);
    for (i, g) in got.iter().enumerate() {
        match (i, g) {
            (0..64, Ok(h)) => assert!(h.payload() == &block(i as u32, 256 * 1024)[..], "block {i}"),
            (64.., Err(Miss::Absent)) => {}
            _ => panic!("block {i}: {:?}", g.as_ref().map(|_| ())),
        }
    }
    let hit_4m = s.get_many(&[key(1, 4 << 20), key(2, 4 << 20)], 4 << 20);
    assert!(hit_4m.iter().enumerate().all(|(i, h)| {
        h.as_ref()
            .is_ok_and(|h| h.payload() == &block(i as u32 + 1, 4 << 20)[..])
    }));
}

#[test]
fn anything_but_exactly_the_block_is_a_miss_with_its_reason() {
    let Some(c) = Cluster::start(21210) else { return };
    let s = RemoteStore::open(&c.config("okv:")).expect("open");
    assert_eq!(s.get(&key(1, 0), 4096).map(|_| ()), Err(Miss::Absent));
    // Another writer's bytes under the block's key.
    let k = value::store_key("okv:", &key(2, 0));
    assert_eq!(
        c.cli(&["set", &k, "not an orbitkv value, long enough to hold a header?"]),
        "OK"
    );
    assert_eq!(
        s.get(&key(2, 0), 4096).map(|_| ()),
        Err(Miss::Invalid(Mismatch::Truncated))
    );
    assert_eq!(c.cli(&["set", &k, &"x".repeat(400)]), "OK");
    assert_eq!(
        s.get(&key(2, 0), 4096).map(|_| ()),
        Err(Miss::Invalid(Mismatch::Magic))
    );
    // The block written with another size (another namespace's block bytes).
    assert!(s.put(&key(3, 0), &block(3, 8192)));
    assert_eq!(
        s.get(&key(3, 0), 4096).map(|_| ()),
        Err(Miss::Invalid(Mismatch::Length {
            stored: 8192,
            expected: 4096
        }))
    );
    // Another generation of the same hash is another store key: absent, not served.
    assert_eq!(s.get(&key(3, 1), 8192).map(|_| ()), Err(Miss::Absent));
    assert!(s.get(&key(3, 0), 8192).is_ok());
    let st = s.stats();
    assert_eq!((st.absent, st.invalid, st.hits), (2, 3, 1));
    // Large blocks: the same verdicts.
    const BIG: usize = 4 << 20;
    assert_eq!(s.get(&key(4, 0), BIG as u64).map(|_| ()), Err(Miss::Absent));
    assert!(s.put(&key(4, 0), &block(4, BIG + 4096)));
    assert_eq!(
        s.get(&key(4, 0), BIG as u64).map(|_| ()),
        Err(Miss::Invalid(Mismatch::Length {
            stored: (BIG + 4096) as u64,
            expected: BIG as u64
        })),
        "a longer value is named"
    );
    assert!(s.put(&key(5, 0), &block(5, BIG)));
    let got = s.get(&key(5, 0), BIG as u64).expect("a large block");
    assert!(got.payload() == &block(5, BIG)[..]);
    // The same length, one payload byte changed deep inside: never served.
    let k5 = value::store_key("okv:", &key(5, 0));
    let whole = (value::HEADER_BYTES + BIG).to_string();
    assert_eq!(c.cli(&["setrange", &k5, &(3 << 20).to_string(), "Z"]), whole);
    assert_eq!(
        s.get(&key(5, 0), BIG as u64).map(|_| ()),
        Err(Miss::Invalid(Mismatch::PayloadSum))
    );
}

#[test]
fn the_acl_confines_the_tier_and_bad_settings_are_refused_at_open() {
    let Some(c) = Cluster::start(21220) else { return };
    // Keys outside the ACL user's pattern are refused by the cluster: nothing written.
    let s = RemoteStore::open(&c.config("elsewhere:")).expect("open");
    assert!(!s.put(&key(1, 0), &block(1, 4096)));
    assert_eq!(s.stats().errors, 1);
    // A wrong password: every request fails, the local side carries on.
    let bad = c.dir.join("bad-password");
    std::fs::write(&bad, "wrong").expect("write");
    std::fs::set_permissions(&bad, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let mut cfg = c.config("okv:");
    cfg.password_file = bad.clone();
    let s = RemoteStore::open(&cfg).expect("open");
    assert_eq!(s.get(&key(1, 0), 4096).map(|_| ()), Err(Miss::Failed));
    // A password file others can read is refused, naming the fix.
    std::fs::set_permissions(&bad, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let e = RemoteStore::open(&cfg).expect_err("0644 password file");
    assert!(
        matches!(e, RemoteError::Config(ref m) if m.contains("chmod 600")),
        "{e}"
    );
    // No TLS to a node that is not a literal loopback address.
    let mut cfg = c.config("okv:");
    cfg.nodes = vec!["redis.example:6379".into()];
    let e = RemoteStore::open(&cfg).expect_err("plain TCP off loopback");
    assert!(
        matches!(e, RemoteError::Config(ref m) if m.contains("TLS")),
        "{e}"
    );
}

#[test]
fn a_cluster_that_goes_away_costs_nothing_once_the_breaker_opens_and_is_used_again_when_back() {
    let Some(c) = Cluster::start(21230) else { return };
    let s = RemoteStore::open(&c.config("okv:")).expect("open");
    assert!(s.put(&key(1, 0), &block(1, 4096)));
    c.down();
    for _ in 0..3 {
        assert_eq!(s.get(&key(1, 0), 4096).map(|_| ()), Err(Miss::Failed));
    }
    // Open: not asked at all, each lookup a clock read.
    let t0 = Instant::now();
    for _ in 0..1000 {
        assert_eq!(s.get(&key(1, 0), 4096).map(|_| ()), Err(Miss::Skipped));
    }
    let per = t0.elapsed() / 1000;
    assert!(per < Duration::from_millis(1), "{per:?} per skipped lookup");
    assert!(!s.put(&key(2, 0), &block(2, 4096)), "writes are skipped too");
    assert_eq!(s.stats().breaker_opened, 1);
    // Back (empty: no persistence). After the cool-down one probe reconnects.
    c.up();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match s.get(&key(1, 0), 4096) {
            Err(Miss::Absent) => break,
            Err(Miss::Skipped | Miss::Failed) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50))
            }
            other => panic!("after the restart: {:?}", other.map(|_| ())),
        }
    }
    assert!(s.put(&key(1, 0), &block(1, 4096)));
    assert!(
        s.get(&key(1, 0), 4096)
            .is_ok_and(|h| h.payload() == &block(1, 4096)[..])
    );
}

#[test]
fn a_master_killed_mid_run_fails_over_and_nothing_wrong_is_served() {
    let Some(c) = Cluster::start(21240) else { return };
    let s = RemoteStore::open(&c.config("okv:")).expect("open");
    for i in 0..64 {
        assert!(s.put(&key(i, 0), &block(i, 65_536)));
    }
    // Kill the first master (SIGKILL): its slots fail until its replica is promoted.
    let pid = std::fs::read_to_string(c.dir.join(c.base.to_string()).join("redis.pid")).expect("pid");
    assert!(
        Command::new("kill")
            .args(["-9", pid.trim()])
            .status()
            .expect("kill")
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut served = 0;
    loop {
        let mut all = true;
        for i in 0..64 {
            let t0 = Instant::now();
            match s.get(&key(i, 0), 65_536) {
                Ok(h) => {
                    assert!(
                        h.payload() == &block(i, 65_536)[..],
                        "block {i}: wrong bytes served"
                    );
                    served += 1;
                }
                // Not replicated before the kill, or the slot not yet failed over.
                Err(Miss::Absent | Miss::Failed | Miss::Skipped) => all = false,
                Err(m) => panic!("block {i}: {m:?}"),
            }
            assert!(
                t0.elapsed() < Duration::from_secs(3),
                "a request outlived its deadline"
            );
        }
        if all || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(served > 0);
    // After the failover, the store takes writes and serves them on every slot again.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(0..64).all(|i| s.put(&key(i, 1), &block(i, 4096))) {
        assert!(Instant::now() < deadline, "no failover within 30 s");
        std::thread::sleep(Duration::from_millis(200));
    }
    for i in 0..64 {
        assert!(
            s.get(&key(i, 1), 4096)
                .is_ok_and(|h| h.payload() == &block(i, 4096)[..])
        );
    }
}

impl Cluster {
    /// `redis-cli` as the admin (`default`) user against one node, outside cluster mode.
    fn admin(&self, port: u16, args: &[&str]) -> String {
        let port = port.to_string();
        let mut all = vec!["-p", &port];
        all.extend_from_slice(args);
        self.redis_cli("admin-password", &all)
    }

    /// Keys held by every node, masters and replicas together.
    fn keys_everywhere(&self) -> u64 {
        (0..6)
            .map(|i| self.admin(self.base + i, &["dbsize"]).parse::<u64>().unwrap_or(0))
            .sum()
    }

    /// Waits until each of `n` keys is on its master and its replica.
    fn replicated(&self, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.keys_everywhere() < 2 * n {
            assert!(Instant::now() < deadline, "keys not replicated within 20 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `(node id, port)` of each master serving slots.
    fn masters(&self) -> Vec<(String, u16)> {
        let nodes = self.admin(self.base, &["cluster", "nodes"]);
        nodes
            .lines()
            .filter(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                f.len() > 8 && f[2].contains("master") && !f[2].contains("fail")
            })
            .filter_map(|l| {
                let mut f = l.split(' ');
                let id = f.next()?.to_string();
                let port = f.next()?.split(['@', ':']).nth(1)?.parse().ok()?;
                Some((id, port))
            })
            .collect()
    }

    fn pid(&self, port: u16) -> String {
        std::fs::read_to_string(self.dir.join(port.to_string()).join("redis.pid"))
            .expect("pid")
            .trim()
            .to_string()
    }
}

/// What a reader saw while the cluster changed under it.
#[derive(Default, Debug)]
struct Seen {
    hits: u64,
    failed: u64,
    absent: u64,
    wrong: u64,
    slowest: Duration,
}

/// Reads blocks `0..n` of `bytes` over and over until `stop`, checking every byte.
fn read_loop(s: &RemoteStore, n: u32, bytes: usize, stop: &std::sync::atomic::AtomicBool) -> Seen {
    let mut seen = Seen::default();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        seen.read_all(s, n, bytes);
    }
    seen
}

impl Seen {
    /// Read blocks `0..n` of `bytes` once, counting what each read served.
    fn read_all(&mut self, s: &RemoteStore, n: u32, bytes: usize) {
        for i in 0..n {
            let t0 = Instant::now();
            let got = s.get(&key(i, 7), bytes as u64);
            self.slowest = self.slowest.max(t0.elapsed());
            match got {
                Ok(h) if h.payload() == &block(i, bytes)[..] => self.hits += 1,
                Ok(_) | Err(Miss::Invalid(_)) => self.wrong += 1,
                Err(Miss::Absent) => self.absent += 1,
                Err(Miss::Failed | Miss::Skipped) => self.failed += 1,
            }
        }
    }
}

#[test]
fn mutual_tls_to_the_cluster_round_trips_and_a_client_it_cannot_verify_is_refused() {
    let Some(c) = Cluster::start_with(21290, &["--tls"]) else {
        return;
    };
    let s = RemoteStore::open(&c.config("okv:")).expect("open");
    for (i, bytes) in [(0u32, 256 << 10), (1, 4 << 20)] {
        assert!(s.put(&key(i, 0), &block(i, bytes)), "put over TLS");
        let hit = s.get(&key(i, 0), bytes as u64).expect("hit over TLS");
        assert!(hit.payload() == &block(i, bytes)[..]);
    }
    // The nodes ask for a client certificate: without one, nothing is served.
    let mut cfg = c.config("okv:");
    cfg.tls = Some(TlsFiles {
        ca: c.tls_file("ca.crt"),
        client: None,
    });
    let no_cert = RemoteStore::open(&cfg).expect("open");
    assert_eq!(no_cert.get(&key(0, 0), 256 << 10).map(|_| ()), Err(Miss::Failed));
    // A root that did not sign the nodes' certificates: the client refuses them.
    cfg.tls = Some(TlsFiles {
        ca: c.tls_file("client.crt"),
        client: Some((c.tls_file("client.crt"), c.tls_file("client.key"))),
    });
    let other_root = RemoteStore::open(&cfg).expect("open");
    assert_eq!(
        other_root.get(&key(0, 0), 256 << 10).map(|_| ()),
        Err(Miss::Failed)
    );
    // A client key others may read is refused when the store is opened.
    let loose = c.dir.join("loose.key");
    std::fs::copy(c.tls_file("client.key"), &loose).expect("copy");
    std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    cfg.tls = Some(TlsFiles {
        ca: c.tls_file("ca.crt"),
        client: Some((c.tls_file("client.crt"), loose)),
    });
    let e = RemoteStore::open(&cfg).expect_err("a 0644 client key");
    assert!(
        matches!(e, RemoteError::Config(ref m) if m.contains("TLS client key") && m.contains("chmod 600")),
        "{e}"
    );
    // Plain TCP to TLS-only ports (allowed on loopback, but nobody answers in plain text).
    cfg.tls = None;
    let plain = RemoteStore::open(&cfg).expect("open");
    assert_eq!(plain.get(&key(0, 0), 256 << 10).map(|_| ()), Err(Miss::Failed));
    assert_eq!(s.stats().errors, 0);
}

#[test]
fn slots_migrating_under_reads_serve_each_block_exactly_or_miss_and_all_of_it_after() {
    let Some(c) = Cluster::start(21310) else { return };
    let s = RemoteStore::open(&c.config("okv:")).expect("open");
    const N: u32 = 300;
    const BYTES: usize = 16 << 10;
    for i in 0..N {
        assert!(s.put(&key(i, 7), &block(i, BYTES)));
    }
    let masters = c.masters();
    assert_eq!(
        masters.len(),
        3,
        "{masters:?}\n{}",
        c.admin(c.base, &["cluster", "nodes"])
    );
    let stop = std::sync::atomic::AtomicBool::new(false);
    let seen = std::thread::scope(|sc| {
        let reader = sc.spawn(|| read_loop(&s, N, BYTES, &stop));
        // Move 3,000 slots (and their keys, MIGRATE) from the first master to the second.
        let pass = std::fs::read_to_string(c.dir.join("admin-password")).expect("admin password");
        let out = Command::new("redis-cli")
            .env("REDISCLI_AUTH", pass.trim())
            .args(["--cluster", "reshard", &format!("127.0.0.1:{}", c.base)])
            .args(["--cluster-from", &masters[0].0, "--cluster-to", &masters[1].0])
            .args(["--cluster-slots", "3000", "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster reshard");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(
            out.status.success(),
            "reshard: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        reader.join().expect("reader")
    });
    eprintln!("during the migration: {seen:?}");
    assert_eq!(seen.wrong, 0, "{seen:?}");
    assert!(seen.hits > 0, "{seen:?}");
    assert!(seen.slowest < Duration::from_secs(3), "{seen:?}");
    // Every block is served from its slot's new owner.
    for i in 0..N {
        let hit = s.get(&key(i, 7), BYTES as u64).expect("hit after the migration");
        assert!(hit.payload() == &block(i, BYTES)[..], "block {i}");
    }
    let nodes = c.admin(c.base, &["cluster", "nodes"]);
    assert!(
        c.masters().iter().any(|(id, _)| id == &masters[1].0) && nodes.contains("connected"),
        "{nodes}"
    );
}

#[test]
fn a_master_frozen_mid_4mib_reads_then_killed_costs_bounded_misses_never_wrong_bytes() {
    let Some(c) = Cluster::start(21320) else { return };
    let mut cfg = c.config("okv:");
    cfg.deadline = Duration::from_secs(1);
    let s = RemoteStore::open(&cfg).expect("open");
    const N: u32 = 9;
    const BYTES: usize = 4 << 20;
    for i in 0..N {
        assert!(s.put(&key(i, 7), &block(i, BYTES)));
    }
    c.replicated(u64::from(N));
    // The master holding block 0 (its other keys may be on the other masters).
    let k0 = value::store_key("okv:", &key(0, 7));
    let victim = c
        .masters()
        .into_iter()
        .map(|(_, port)| port)
        .find(|&port| c.admin(port, &["exists", &k0]) == "1")
        .expect("a master holds block 0");
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (during, after) = std::thread::scope(|sc| {
        let reader = sc.spawn(|| read_loop(&s, N, BYTES, &stop));
        std::thread::sleep(Duration::from_millis(300));
        // Frozen mid-stream: requests to it hang until the deadline.
        let pid = c.pid(victim);
        let signal = |sig: &str| {
            let ok = Command::new("kill").args([sig, &pid]).status().expect("kill");
            assert!(ok.success(), "kill {sig} {pid}");
        };
        signal("-STOP");
        std::thread::sleep(Duration::from_millis(1500));
        signal("-9");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let during = reader.join().expect("reader");
        // After the failover, every block again (each was replicated before the kill).
        let deadline = Instant::now() + Duration::from_secs(30);
        let after = loop {
            let mut one_pass = Seen::default();
            one_pass.read_all(&s, N, BYTES);
            if one_pass.hits == u64::from(N) || one_pass.wrong > 0 || Instant::now() > deadline {
                break one_pass;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        (during, after)
    });
    eprintln!("frozen then killed: {during:?}; after the failover: {after:?}");
    assert_eq!(during.wrong, 0, "{during:?}");
    assert!(during.failed > 0, "the frozen master was never asked: {during:?}");
    // The deadline covers the retry: a request to the frozen node gives up after about
    // 1 s (two attempts of 0.5 s), not 1 s per attempt.
    assert!(
        during.slowest < Duration::from_millis(1600),
        "a read outlived its deadline: {during:?}"
    );
    assert_eq!((after.hits, after.wrong), (u64::from(N), 0), "{after:?}");
}

#[test]
fn blocks_the_store_evicted_under_maxmemory_are_misses_and_the_rest_exact() {
    let Some(c) = Cluster::start_with(21330, &["--maxmemory", "8mb"]) else {
        return;
    };
    let s = RemoteStore::open(&c.config("okv:")).expect("open");
    const N: u32 = 60;
    const BYTES: usize = 1 << 20;
    for i in 0..N {
        assert!(
            s.put(&key(i, 7), &block(i, BYTES)),
            "put {i}: the store evicts to make room"
        );
    }
    let (mut hits, mut absent) = (0, 0);
    for i in 0..N {
        match s.get(&key(i, 7), BYTES as u64) {
            Ok(h) => {
                assert!(h.payload() == &block(i, BYTES)[..], "block {i}");
                hits += 1;
            }
            Err(Miss::Absent) => absent += 1,
            Err(m) => panic!("block {i}: {m:?}"),
        }
    }
    // 60 MiB written, 3 x 8 MiB held: most evicted, the most recent kept.
    assert!(absent >= 30 && hits >= 3, "{hits} hits, {absent} absent");
    assert!(
        s.get(&key(N - 1, 7), BYTES as u64).is_ok(),
        "the last written is kept"
    );
    let st = s.stats();
    assert_eq!((st.invalid, st.errors), (0, 0));
}
