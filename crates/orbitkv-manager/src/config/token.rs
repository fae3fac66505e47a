//! The shared-token file (`--token-file`): read only if private to its owner.

use super::ConfigError;

/// Read a token file, refusing one that group or others may access (as ssh
/// refuses a private key with open permissions). The mode is checked on the
/// opened file, so it is the file that was read.
pub(super) fn read_token_file(p: &std::path::Path) -> Result<Vec<u8>, ConfigError> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let read_err = |err| ConfigError::Read {
        path: p.to_path_buf(),
        err,
    };
    let f = std::fs::File::open(p).map_err(read_err)?;
    let mode = f.metadata().map_err(read_err)?.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(ConfigError::Invalid(format!(
            "token file {} is accessible by group/others (mode {mode:04o}), so they may read the \
             token; run `chmod 600 {}`",
            p.display(),
            p.display()
        )));
    }
    let mut raw = Vec::new();
    // More than a token can hold is refused below; never read an unbounded file.
    f.take(1 << 16).read_to_end(&mut raw).map_err(read_err)?;
    Ok(raw)
}

#[cfg(test)]
mod tests {
    use super::super::ManagerConfig;

    #[test]
    fn token_file_open_to_others_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("token");
        std::fs::write(&p, "0123456789abcdef-secret\n").expect("write");
        let ps = p.to_string_lossy().to_string();
        for mode in [0o644, 0o640, 0o604, 0o620] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
            let e = ManagerConfig::from_argv(["x", "--token-file", &ps]).expect_err("open token file");
            let msg = e.to_string();
            assert!(
                msg.contains(&ps) && msg.contains(&format!("mode {mode:04o}")),
                "{msg}"
            );
            assert!(msg.contains(&format!("chmod 600 {ps}")), "{msg}");
        }
        for mode in [0o600, 0o400] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
            let c = ManagerConfig::from_argv(["x", "--token-file", &ps]).expect("private token file");
            assert_eq!(c.token.as_deref(), Some(&b"0123456789abcdef-secret"[..]));
        }
    }
}
