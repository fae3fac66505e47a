//! The PEM files behind the peer links' and etcd's TLS: certificate chains,
//! private keys (owner-only) and CA roots, read at start-up. Every problem is
//! an error naming the file, after `what` ("peer TLS", "etcd TLS").

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The certificates of `path` (`what` names them: "peer TLS certificate").
fn certificates(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{what} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{what} {}: no certificate in the file", path.display()));
    }
    Ok(certs)
}

/// A certificate chain: at least one certificate.
pub(super) fn chain(path: &Path, tls: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    certificates(path, &format!("{tls} certificate"))
}

/// A private key, refused when group or others may read it.
pub(super) fn private_key(path: &Path, tls: &str) -> Result<PrivateKeyDer<'static>, String> {
    let md = std::fs::metadata(path).map_err(|e| format!("{tls} key {}: {e}", path.display()))?;
    if md.mode() & 0o077 != 0 {
        return Err(format!(
            "{tls} key {} is accessible by group/others (mode {:04o}); run `chmod 600 {}`",
            path.display(),
            md.mode() & 0o7777,
            path.display()
        ));
    }
    PrivateKeyDer::from_pem_file(path).map_err(|e| format!("{tls} key {}: {e}", path.display()))
}

/// The CA certificates of `path` as trust roots: at least one.
pub(super) fn roots(path: &Path, tls: &str) -> Result<RootCertStore, String> {
    let what = format!("{tls} CA");
    let mut roots = RootCertStore::empty();
    for ca in certificates(path, &what)? {
        roots
            .add(ca)
            .map_err(|e| format!("{what} {}: {e}", path.display()))?;
    }
    Ok(roots)
}
