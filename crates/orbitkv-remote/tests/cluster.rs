//! The remote store against a real Redis Cluster on loopback (3 masters + 3 replicas,
//! ACL on; `scripts/redis-cluster.sh`): byte-exact round trips, every integrity case a
//! miss, ACL refusals, and a cluster that goes away and comes back.
//!
//! Needs Debian's redis-server and redis-tools (`tests/common/cluster.rs` says what
//! happens without them).

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

use orbitkv_remote::store::{Miss, RemoteConfig, RemoteError, RemoteStore};
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
            tls: None,
            key_prefix: prefix.into(),
            deadline: Duration::from_millis(500),
            breaker_failures: 3,
            breaker_cooldown: Duration::from_millis(300),
        }
    }

    /// `redis-cli` as the ACL user, against the node serving `key`.
    fn cli(&self, args: &[&str]) -> String {
        let pass = std::fs::read_to_string(self.dir.join("password")).expect("password");
        let out = Command::new("redis-cli")
            .env("REDISCLI_AUTH", pass.trim())
            .args(["--user", "orbitkv", "-c", "-p", &self.base.to_string()])
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
