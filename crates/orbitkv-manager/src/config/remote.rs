//! Remote-tier settings (`--remote-*`): the Redis Cluster's seed nodes, its ACL
//! user and password file, TLS, the key prefix, the per-request deadline, the
//! write queue and the admission by hits, checked at start-up (`RemoteConfig::validate`: loopback or TLS).

use std::path::PathBuf;
use std::time::Duration;

use orbitkv_remote::store::{RemoteConfig, TlsFiles};

use super::args::Args;
use super::{ConfigError, check};

/// Validated remote-tier settings.
#[derive(Debug, Clone)]
pub struct RemoteSettings {
    /// What the store is opened with.
    pub store: RemoteConfig,
    /// Blocks waiting to be written; beyond it new ones are dropped (counted).
    pub write_queue: usize,
    /// Write a block at its `admit_hits`-th hit; 0: every committed block.
    pub admit_hits: u32,
}

/// The remote tier's settings, or `None` without `--remote-nodes`. Any other
/// `remote_*` setting without it is an error (it would silently do nothing).
pub(super) fn remote_settings(a: &mut Args, file: &mut Args) -> Result<Option<RemoteSettings>, ConfigError> {
    let nodes = a.remote_nodes.take().or(file.remote_nodes.take());
    let user = a.remote_user.take().or(file.remote_user.take());
    let password_file = a.remote_password_file.take().or(file.remote_password_file.take());
    let ca = a.remote_tls_ca.take().or(file.remote_tls_ca.take());
    let cert = a.remote_tls_cert.take().or(file.remote_tls_cert.take());
    let key = a.remote_tls_key.take().or(file.remote_tls_key.take());
    let prefix = a.remote_prefix.take().or(file.remote_prefix.take());
    let deadline_ms = a.remote_deadline_ms.take().or(file.remote_deadline_ms.take());
    let write_queue = a.remote_write_queue.take().or(file.remote_write_queue.take());
    let admit_hits = a.remote_admit_hits.take().or(file.remote_admit_hits.take());
    let Some(nodes) = nodes else {
        let others = [
            ("remote_user", user.is_some()),
            ("remote_password_file", password_file.is_some()),
            ("remote_tls_ca", ca.is_some()),
            ("remote_tls_cert", cert.is_some()),
            ("remote_tls_key", key.is_some()),
            ("remote_prefix", prefix.is_some()),
            ("remote_deadline_ms", deadline_ms.is_some()),
            ("remote_write_queue", write_queue.is_some()),
            ("remote_admit_hits", admit_hits.is_some()),
        ];
        check::refuse_orphans(&others, "remote_nodes", "there is no remote tier to apply it to")?;
        return Ok(None);
    };
    let password_file: PathBuf = password_file.ok_or_else(|| {
        ConfigError::Invalid(
            "remote_nodes needs remote_password_file (the ACL user's password, mode 0600)".into(),
        )
    })?;
    let client = check::cert_and_key(cert, key, "remote_tls_cert and remote_tls_key go together")?;
    let tls = match (ca, client) {
        (Some(ca), client) => Some(TlsFiles { ca, client }),
        (None, Some(_)) => {
            return Err(ConfigError::Invalid(
                "remote_tls_cert needs remote_tls_ca (TLS to the cluster)".into(),
            ));
        }
        (None, None) => None,
    };
    let deadline_ms = check::bounded(
        "remote_deadline_ms",
        deadline_ms.unwrap_or(200),
        2..=60_000,
        "milliseconds",
    )?;
    let write_queue = write_queue.unwrap_or(4096);
    if write_queue == 0 {
        return Err(ConfigError::Invalid(
            "remote_write_queue must be at least 1".into(),
        ));
    }
    let store = RemoteConfig {
        nodes: nodes
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(String::from)
            .collect(),
        username: user.unwrap_or_else(|| "orbitkv".into()),
        password_file,
        tls,
        key_prefix: prefix.unwrap_or_else(|| "okv:".into()),
        deadline: Duration::from_millis(deadline_ms),
        breaker_failures: 3,
        breaker_cooldown: Duration::from_secs(1),
    };
    store
        .validate()
        .map_err(|e| ConfigError::Invalid(e.to_string()))?;
    Ok(Some(RemoteSettings {
        store,
        write_queue,
        admit_hits: admit_hits.unwrap_or(0),
    }))
}
