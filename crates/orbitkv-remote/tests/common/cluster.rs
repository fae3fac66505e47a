//! A real Redis Cluster for one test (3 masters + 3 replicas on loopback, ACL on,
//! `scripts/redis-cluster.sh`), stopped when dropped. Shared by the remote store's
//! tests and the Manager's (`crates/orbitkv-manager/tests/remote_tier.rs`, by path).
//!
//! Its nodes listen on BASE..BASE+5 and their cluster bus on +10000: both below the
//! kernel's ephemeral ports (32768 and up), which other tests' connections may hold.
//! Without Debian's redis-server a test prints why it did not run, unless
//! ORBITKV_REQUIRE_REDIS is set (`scripts/test.sh` sets it once the server is installed):
//! then it fails.

// Each test binary that includes this file uses a part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Cluster {
    pub dir: PathBuf,
    pub base: u16,
    /// `redis-cluster.sh start` options (`--tls`, `--maxmemory SIZE`, `--bind IP`), kept
    /// for restarts.
    opts: Vec<String>,
    /// The network namespace the nodes run in (`ip netns exec`), if not this one.
    netns: Option<String>,
    _tmp: tempfile::TempDir,
}

impl Cluster {
    pub fn start(base: u16) -> Option<Cluster> {
        Self::start_with(base, &[])
    }

    /// A cluster started with `redis-cluster.sh` options (`--tls`, `--maxmemory 8mb`).
    pub fn start_with(base: u16, opts: &[&str]) -> Option<Cluster> {
        Self::start_in(None, base, opts)
    }

    /// [`Cluster::start_with`] inside network namespace `netns`.
    pub fn start_in(netns: Option<&str>, base: u16, opts: &[&str]) -> Option<Cluster> {
        if Command::new("redis-server").arg("--version").output().is_err() {
            assert!(
                std::env::var_os("ORBITKV_REQUIRE_REDIS").is_none(),
                "ORBITKV_REQUIRE_REDIS is set but redis-server is not installed"
            );
            eprintln!("SKIPPED: redis-server is not installed (Debian: redis-server redis-tools)");
            return None;
        }
        let tmp = tempfile::tempdir().expect("tempdir");
        let c = Cluster {
            dir: tmp.path().join("cluster"),
            base,
            opts: opts.iter().map(|o| o.to_string()).collect(),
            netns: netns.map(String::from),
            _tmp: tmp,
        };
        c.up();
        Some(c)
    }

    fn script(&self, args: &[&str]) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/redis-cluster.sh");
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "bash"]);
                c
            }
            None => Command::new("bash"),
        };
        let out = cmd.arg(script).args(args).output().expect("run redis-cluster.sh");
        assert!(
            out.status.success(),
            "redis-cluster.sh {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Start (or restart, empty) every node.
    pub fn up(&self) {
        let base = self.base.to_string();
        let mut args = vec!["start", self.dir.to_str().expect("utf-8"), &base];
        args.extend(self.opts.iter().map(String::as_str));
        self.script(&args);
    }

    /// Stop every node.
    pub fn down(&self) {
        self.script(&["stop", self.dir.to_str().expect("utf-8")]);
    }

    /// Every node as a seed: a reconnect must not depend on one node being up.
    pub fn seeds(&self) -> Vec<String> {
        (0..6)
            .map(|i| format!("{}:{}", self.host(), self.base + i))
            .collect()
    }

    /// The address the nodes listen on (`--bind`, else 127.0.0.1).
    pub fn host(&self) -> &str {
        self.opts
            .iter()
            .position(|o| o == "--bind")
            .and_then(|i| self.opts.get(i + 1))
            .map_or("127.0.0.1", String::as_str)
    }

    /// Whether every node speaks TLS only (mutual: clients present a certificate).
    pub fn tls(&self) -> bool {
        self.opts.iter().any(|o| o == "--tls")
    }

    /// A file of the cluster's private CA (`ca.crt`, `client.crt`, `client.key`, ...).
    pub fn tls_file(&self, name: &str) -> PathBuf {
        self.dir.join("tls").join(name)
    }

    /// The `orbitkv serve` flags that make this cluster a Manager's remote tier, with
    /// `deadline_ms` and, when the cluster speaks only TLS, its CA and client certificate.
    pub fn manager_flags(&self, deadline_ms: u32) -> Vec<String> {
        let mut flags = vec![
            "--remote-nodes".to_string(),
            self.seeds().join(","),
            "--remote-password-file".into(),
            self.password_file().display().to_string(),
            "--remote-deadline-ms".into(),
            deadline_ms.to_string(),
        ];
        if self.tls() {
            for (flag, file) in [
                ("--remote-tls-ca", "ca.crt"),
                ("--remote-tls-cert", "client.crt"),
                ("--remote-tls-key", "client.key"),
            ] {
                flags.extend([flag.to_string(), self.tls_file(file).display().to_string()]);
            }
        }
        flags
    }

    /// The ACL user `orbitkv`'s password file (mode 0600).
    pub fn password_file(&self) -> PathBuf {
        self.dir.join("password")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.down();
    }
}
