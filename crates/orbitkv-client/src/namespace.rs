//! Namespaces (contract K1): [`Namespace`], registering one under the one
//! tenant-salt encoding ([`namespace_salt`]), generation resets, and the
//! message-free presence probe (`Client::probably_present`).

use std::sync::atomic::Ordering;

use orbitkv_proto::{Request, Response};

use crate::{Client, ClientError, Hash};

/// A registered namespace (contract K1).
#[derive(Debug, Clone)]
pub struct Namespace {
    pub id: u32,
    pub generation: u64,
    pub block_bytes: u64,
    pub fingerprint: [u8; 32],
    pub shard: u32,
    /// This namespace's key into the Manager's presence table (see
    /// [`Client::probably_present`]); from the Manager that registered it.
    pub presence_key: [u8; orbitkv_proto::PRESENCE_KEY_BYTES],
}

impl Client {
    /// Register (or find) the namespace of `fingerprint`, `shard` and the
    /// tenant `salt` (any bytes; empty = no salt), encoded by
    /// [`namespace_salt`], the one encoding every caller goes through.
    pub fn register_namespace(
        &self,
        fingerprint: [u8; 32],
        block_bytes: u64,
        shard: u32,
        salt: impl AsRef<[u8]>,
    ) -> Result<Namespace, ClientError> {
        match self.call(&Request::RegisterNamespace {
            fingerprint,
            shard,
            salt: namespace_salt(salt.as_ref()),
            block_bytes,
        })? {
            Response::Namespace {
                ns,
                generation,
                presence_key,
            } => Ok(Namespace {
                id: ns,
                generation,
                block_bytes,
                fingerprint,
                shard,
                presence_key,
            }),
            r => Err(Self::unexpected(r)),
        }
    }

    /// How many of `hashes`, from the first, may be present in `ns`: the
    /// prefix before the first block the Manager's presence table says is
    /// certainly absent. Sends no message: it reads the shared table (and
    /// polls the socket once, so a Manager that closed or died is reported
    /// as [`ClientError::Unavailable`] instead of answering from a dead
    /// table). A prefix > 0 promises nothing: only [`Client::lookup`] takes a
    /// lease on blocks that are there. Without a table (`--presence-slots
    /// off`) every block may be present: returns `hashes.len()`.
    pub fn probably_present(&self, ns: &Namespace, hashes: &[Hash]) -> Result<usize, ClientError> {
        self.probably_present_iter(ns, hashes.iter().copied(), hashes.len())
    }

    /// [`Client::probably_present`] over hashes produced lazily (a binding
    /// converts only those it needs: a miss stops at the first). `len` is the
    /// answer when no table is published.
    pub fn probably_present_iter(
        &self,
        ns: &Namespace,
        hashes: impl IntoIterator<Item = Hash>,
        len: usize,
    ) -> Result<usize, ClientError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(ClientError::Closed);
        }
        let Some(table) = &self.presence else {
            return Ok(len);
        };
        let gone = || {
            self.conn.mark_broken();
            ClientError::Unavailable("the Manager closed the connection".into())
        };
        if self.conn.hung_up() {
            return Err(gone());
        }
        table
            .present_prefix(
                hashes
                    .into_iter()
                    .map(|h| orbitkv_shm::presence::fingerprint(&ns.presence_key, &h)),
            )
            .map_err(|_| gone())
    }

    /// Whether the Manager published a presence table to this client.
    pub fn has_presence(&self) -> bool {
        self.presence.is_some()
    }

    pub fn reset_generation(&self, ns: &Namespace) -> Result<u64, ClientError> {
        match self.call(&Request::ResetGeneration { ns: ns.id })? {
            Response::Generation { generation } => Ok(generation),
            r => Err(Self::unexpected(r)),
        }
    }
}

/// Domain of the tenant-salt hash; part of the namespace key, so changing it
/// moves every salted namespace.
const SALT_DOMAIN: &[u8] = b"orbitkv-namespace-salt-v1\0";

/// The one encoding of a tenant salt (any length) into the 32 bytes the
/// Manager keys namespaces by: all zeros for no salt, else SHA-256 over a
/// domain tag and the salt. Collision resistant, so no tenant can pick a
/// salt that lands in another tenant's namespace (contract K3). The Rust and
/// Python clients both go through it.
pub fn namespace_salt(salt: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    if salt.is_empty() {
        return [0; 32];
    }
    let mut h = Sha256::new();
    h.update(SALT_DOMAIN);
    h.update(salt);
    h.finalize().into()
}
