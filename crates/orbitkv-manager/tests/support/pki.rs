//! Test certificates made with the openssl command: a CA and certificates
//! for IP addresses, and the Manager flags that name them.

use std::path::Path;
use std::process::{Command, Stdio};

fn openssl(dir: &Path, args: &[&str]) {
    let st = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stderr(Stdio::null())
        .status()
        .expect("openssl");
    assert!(st.success(), "openssl {args:?}");
}

/// A new P-256 private key in `dir`/`out`.
fn gen_key(dir: &Path, out: &str) {
    openssl(
        dir,
        &["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", out],
    );
}

/// CA `ca` and one certificate per (name, IP) in `dir` (`NAME.crt`, `NAME.pk8`).
pub fn make_pki(dir: &Path, ca: &str, certs: &[(&str, &str)]) {
    let (ca_key, ca_crt) = (format!("{ca}.key"), format!("{ca}.crt"));
    gen_key(dir, &ca_key);
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-new",
            "-key",
            &ca_key,
            "-subj",
            &format!("/CN={ca}"),
            "-days",
            "2",
            "-out",
            &ca_crt,
        ],
    );
    for (n, addr) in certs {
        let ext = format!("{n}.cnf");
        std::fs::write(
            dir.join(&ext),
            format!("subjectAltName=IP:{addr}\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n"),
        )
        .expect("ext");
        let key = format!("{n}.key");
        gen_key(dir, &key);
        openssl(
            dir,
            &[
                "pkcs8",
                "-topk8",
                "-nocrypt",
                "-in",
                &key,
                "-out",
                &format!("{n}.pk8"),
            ],
        );
        openssl(
            dir,
            &[
                "req",
                "-new",
                "-key",
                &key,
                "-subj",
                &format!("/CN={n}"),
                "-out",
                &format!("{n}.csr"),
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{n}.csr"),
                "-CA",
                &ca_crt,
                "-CAkey",
                &ca_key,
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &ext,
                "-out",
                &format!("{n}.crt"),
            ],
        );
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            dir.join(format!("{n}.pk8")),
            std::fs::Permissions::from_mode(0o600),
        )
        .expect("chmod");
    }
}

/// A new directory holding CA `ca` with a certificate for each of `names` on
/// 127.0.0.1, and CA `other` with one for `x` there (a foreign certificate).
pub fn loopback_pki(names: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("pki dir");
    let certs: Vec<(&str, &str)> = names.iter().map(|&n| (n, "127.0.0.1")).collect();
    make_pki(dir.path(), "ca", &certs);
    make_pki(dir.path(), "other", &[("x", "127.0.0.1")]);
    dir
}

/// `--peer-tls-cert/-key/-ca` for certificate `name` of CA `ca` in `dir`.
pub fn tls_flags(dir: &Path, name: &str, ca: &str) -> Vec<String> {
    let p = |f: String| dir.join(f).display().to_string();
    vec![
        "--peer-tls-cert".into(),
        p(format!("{name}.crt")),
        "--peer-tls-key".into(),
        p(format!("{name}.pk8")),
        "--peer-tls-ca".into(),
        p(format!("{ca}.crt")),
    ]
}
