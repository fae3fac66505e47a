//! The remote store: a Redis Cluster (or Valkey) reached through the `redis` crate's
//! synchronous cluster client, behind a [`Breaker`] and a deadline per request.
//!
//! Every value is verified on the way in ([`crate::value::verify`]): a value that is not
//! exactly the block asked for is a miss with its reason, like an absent one, an error
//! or a skipped request. Nothing here panics on what the store returns, and a store
//! that is down costs a lookup a clock read once the breaker is open.
//!
//! Security: the ACL user's password and the TLS client key come from files that must
//! not be readable by group or others; without TLS every node must be a literal loopback address (anything
//! else is refused when the store is opened, naming the setting).

use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use orbitkv_ssd::SsdKey;
use redis::cluster::{ClusterClient, ClusterConnection};

use crate::breaker::{Admission, Breaker};
use crate::value::{self, Mismatch};

/// TLS to the cluster: the CA that signs the nodes' certificates, and optionally this
/// client's certificate and key (PEM files).
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// CA certificate(s), PEM.
    pub ca: PathBuf,
    /// Client certificate and private key, PEM, when the cluster asks for them.
    pub client: Option<(PathBuf, PathBuf)>,
}

/// How to reach the store.
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    /// Seed nodes, `host:port` (the rest of the cluster is discovered).
    pub nodes: Vec<String>,
    /// ACL user.
    pub username: String,
    /// File holding the ACL user's password (mode 0600 or tighter).
    pub password_file: PathBuf,
    /// TLS to every node; `None` only for nodes on literal loopback addresses.
    pub tls: Option<TlsFiles>,
    /// Prefix of every key written (the ACL user's key pattern).
    pub key_prefix: String,
    /// Longest wait for one request: it makes at most two attempts (one retry, e.g.
    /// after a connection broke or a slot moved), each bounded by half of this for
    /// connecting and half for the response.
    pub deadline: Duration,
    /// Failures in a row that open the breaker.
    pub breaker_failures: u32,
    /// First cool-down of an open breaker (doubles per failed probe, up to 30 s).
    pub breaker_cooldown: Duration,
}

/// Why the store cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// A setting is invalid; the message names it.
    #[error("remote tier: {0}")]
    Config(String),
    /// A file could not be read.
    #[error("remote tier: cannot read {path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The client refused the settings.
    #[error("remote tier: {0}")]
    Client(#[from] redis::RedisError),
}

/// Why a read served nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    /// The store has no value under the block's key (never written, or evicted).
    Absent,
    /// A value is there, but not this block's, or damaged.
    Invalid(Mismatch),
    /// The breaker is open: the store was not asked.
    Skipped,
    /// The request failed or missed its deadline.
    Failed,
}

/// A block read from the store: the value, of which [`Hit::payload`] is the block.
#[derive(Debug)]
pub struct Hit {
    value: Vec<u8>,
}

impl Hit {
    /// The block's bytes (verified).
    pub fn payload(&self) -> &[u8] {
        &self.value[value::HEADER_BYTES..]
    }
}

/// Counters since the store was opened.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StoreStats {
    /// Reads that served a block.
    pub hits: u64,
    /// Reads of an absent key.
    pub absent: u64,
    /// Reads of a value that was not the block (another key, length, damage).
    pub invalid: u64,
    /// Reads and writes not sent because the breaker was open.
    pub skipped: u64,
    /// Requests that failed or missed their deadline.
    pub errors: u64,
    /// Blocks written.
    pub puts: u64,
    /// Payload bytes read (served) and written.
    pub bytes_read: u64,
    /// Payload bytes written.
    pub bytes_written: u64,
    /// Times the breaker opened.
    pub breaker_opened: u64,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    absent: AtomicU64,
    invalid: AtomicU64,
    skipped: AtomicU64,
    errors: AtomicU64,
    puts: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
}

/// The remote store (see the module documentation).
pub struct RemoteStore {
    client: ClusterClient,
    conn: Mutex<Option<ClusterConnection>>,
    breaker: Mutex<Breaker>,
    prefix: String,
    counters: Counters,
}

impl std::fmt::Debug for RemoteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

fn loopback(node: &str) -> bool {
    let host = match node.rsplit_once(':') {
        Some((h, _)) => h.trim_start_matches('[').trim_end_matches(']'),
        None => node,
    };
    host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The bytes of a secret file (`what` names it in errors), refused when group or
/// others may read it.
fn read_private(path: &Path, what: &str) -> Result<Vec<u8>, RemoteError> {
    let file = |source| RemoteError::File {
        path: path.to_path_buf(),
        source,
    };
    let mode = std::fs::metadata(path).map_err(file)?.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(RemoteError::Config(format!(
            "the {what} {} is readable by group or others (mode {:o}); chmod 600 it",
            path.display(),
            mode & 0o777
        )));
    }
    std::fs::read(path).map_err(file)
}

impl RemoteConfig {
    /// Check the settings without contacting the store.
    pub fn validate(&self) -> Result<(), RemoteError> {
        if self.nodes.is_empty() {
            return Err(RemoteError::Config("no seed node given (--remote-nodes)".into()));
        }
        for n in &self.nodes {
            if n.rsplit_once(':')
                .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
            {
                return Err(RemoteError::Config(format!("seed node {n:?} is not host:port")));
            }
            if self.tls.is_none() && !loopback(n) {
                return Err(RemoteError::Config(format!(
                    "seed node {n} is not a literal loopback address and TLS is off: configure TLS \
                     to the cluster (--remote-tls-ca) or use 127.0.0.1 / ::1"
                )));
            }
        }
        if self.username.is_empty() {
            return Err(RemoteError::Config("no ACL user given".into()));
        }
        if self.key_prefix.is_empty() {
            return Err(RemoteError::Config("the key prefix is empty".into()));
        }
        if self.deadline.is_zero() {
            return Err(RemoteError::Config("the deadline is zero".into()));
        }
        Ok(())
    }
}

impl RemoteStore {
    /// Check `cfg` and build the client. Nothing is sent: a cluster that is down now is
    /// asked again at the first request (and the breaker keeps it cheap meanwhile).
    pub fn open(cfg: &RemoteConfig) -> Result<RemoteStore, RemoteError> {
        cfg.validate()?;
        let password = String::from_utf8_lossy(&read_private(&cfg.password_file, "password file")?)
            .trim_end()
            .to_string();
        let scheme = if cfg.tls.is_some() { "rediss" } else { "redis" };
        let urls: Vec<String> = cfg.nodes.iter().map(|n| format!("{scheme}://{n}")).collect();
        let mut b = ClusterClient::builder(urls)
            .username(&cfg.username)
            .password(password)
            .connection_timeout(cfg.deadline / 2)
            .response_timeout(cfg.deadline / 2)
            .retries(1);
        if let Some(tls) = &cfg.tls {
            // The client's TLS takes the process's default crypto provider; make it ring
            // (what the peer tier uses) unless one is installed already.
            let _ = rustls::crypto::ring::default_provider().install_default();
            let read = |p: &PathBuf| {
                std::fs::read(p).map_err(|source| RemoteError::File {
                    path: p.clone(),
                    source,
                })
            };
            let client_tls = match &tls.client {
                Some((cert, key)) => Some(redis::ClientTlsConfig {
                    client_cert: read(cert)?,
                    client_key: read_private(key, "TLS client key")?,
                }),
                None => None,
            };
            b = b.certs(redis::TlsCertificates {
                client_tls,
                root_cert: Some(read(&tls.ca)?),
            });
        }
        Ok(RemoteStore {
            client: b.build()?,
            conn: Mutex::new(None),
            breaker: Mutex::new(Breaker::new(
                cfg.breaker_failures,
                cfg.breaker_cooldown,
                Duration::from_secs(30).max(cfg.breaker_cooldown),
            )),
            prefix: cfg.key_prefix.clone(),
            counters: Counters::default(),
        })
    }

    fn admit(&self) -> Admission {
        let mut b = self.breaker.lock().unwrap_or_else(|e| e.into_inner());
        b.admit(Instant::now())
    }

    fn record(&self, ok: bool) {
        let mut b = self.breaker.lock().unwrap_or_else(|e| e.into_inner());
        b.record(ok, Instant::now());
    }

    /// Run `f` on the connection (made on first use); a failure drops the connection,
    /// so the next request reconnects (and rediscovers the slots).
    fn with_conn<T>(&self, f: impl FnOnce(&mut ClusterConnection) -> redis::RedisResult<T>) -> Option<T> {
        let mut guard = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            match self.client.get_connection() {
                Ok(c) => *guard = Some(c),
                Err(_) => return None,
            }
        }
        let conn = guard.as_mut()?;
        match f(conn) {
            Ok(v) => Some(v),
            Err(_) => {
                *guard = None;
                None
            }
        }
    }

    /// Block `key` of `block_bytes` bytes, verified; or why not.
    pub fn get(&self, key: &SsdKey, block_bytes: u64) -> Result<Hit, Miss> {
        if self.admit() == Admission::Skip {
            self.counters.skipped.fetch_add(1, Ordering::Relaxed);
            return Err(Miss::Skipped);
        }
        let k = value::store_key(&self.prefix, key);
        let got = self.with_conn(|conn| redis::cmd("GET").arg(&k).query::<Option<Vec<u8>>>(conn));
        self.record(got.is_some());
        self.verdict(got, key, block_bytes)
    }

    /// [`Self::get`] of every key of `keys`, in one pipeline: the requests for each node
    /// are sent together before any reply is read, so the nodes serve them at once and no
    /// round trip waits between blocks. One failed request fails the whole pipeline (every
    /// key `Failed`); the deadline bounds each reply.
    pub fn get_many(&self, keys: &[SsdKey], block_bytes: u64) -> Vec<Result<Hit, Miss>> {
        if keys.is_empty() {
            return Vec::new();
        }
        if self.admit() == Admission::Skip {
            self.counters
                .skipped
                .fetch_add(keys.len() as u64, Ordering::Relaxed);
            return keys.iter().map(|_| Err(Miss::Skipped)).collect();
        }
        let mut pipe = redis::cluster::cluster_pipe();
        for key in keys {
            pipe.cmd("GET").arg(value::store_key(&self.prefix, key));
        }
        let got = self.with_conn(|conn| pipe.query::<Vec<Option<Vec<u8>>>>(conn));
        self.record(got.is_some());
        match got {
            Some(values) if values.len() == keys.len() => values
                .into_iter()
                .zip(keys)
                .map(|(v, key)| self.verdict(Some(v), key, block_bytes))
                .collect(),
            _ => keys
                .iter()
                .map(|key| self.verdict(None, key, block_bytes))
                .collect(),
        }
    }

    /// What one reply (`None`: the request failed) serves for `key`, counted.
    fn verdict(&self, got: Option<Option<Vec<u8>>>, key: &SsdKey, block_bytes: u64) -> Result<Hit, Miss> {
        let c = &self.counters;
        match got {
            None => {
                c.errors.fetch_add(1, Ordering::Relaxed);
                Err(Miss::Failed)
            }
            Some(None) => {
                c.absent.fetch_add(1, Ordering::Relaxed);
                Err(Miss::Absent)
            }
            Some(Some(v)) => match value::verify(&v, key, block_bytes) {
                Ok(p) => {
                    c.hits.fetch_add(1, Ordering::Relaxed);
                    c.bytes_read.fetch_add(p.len() as u64, Ordering::Relaxed);
                    Ok(Hit { value: v })
                }
                Err(m) => {
                    c.invalid.fetch_add(1, Ordering::Relaxed);
                    Err(Miss::Invalid(m))
                }
            },
        }
    }

    /// Write block `key` (`payload`); `false` when it was not written (skipped or failed).
    pub fn put(&self, key: &SsdKey, payload: &[u8]) -> bool {
        let c = &self.counters;
        if self.admit() == Admission::Skip {
            c.skipped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let k = value::store_key(&self.prefix, key);
        let v = value::encode(key, payload);
        let ok = self
            .with_conn(|conn| redis::cmd("SET").arg(&k).arg(&v).query::<()>(conn))
            .is_some();
        self.record(ok);
        if ok {
            c.puts.fetch_add(1, Ordering::Relaxed);
            c.bytes_written.fetch_add(payload.len() as u64, Ordering::Relaxed);
        } else {
            c.errors.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    /// Counters since the store was opened.
    pub fn stats(&self) -> StoreStats {
        let c = &self.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let opened = self
            .breaker
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .times_opened();
        StoreStats {
            hits: g(&c.hits),
            absent: g(&c.absent),
            invalid: g(&c.invalid),
            skipped: g(&c.skipped),
            errors: g(&c.errors),
            puts: g(&c.puts),
            bytes_read: g(&c.bytes_read),
            bytes_written: g(&c.bytes_written),
            breaker_opened: opened,
        }
    }
}
