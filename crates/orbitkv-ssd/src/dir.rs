//! The tier directory's privacy and hygiene. KV bytes reveal prompts, so the directory is
//! created 0700 and its files 0600; a directory that another user could write, or that
//! another uid owns, is refused. Files left group/other-readable by an older version are
//! tightened to 0600 (and reported); temporary files left by an interrupted rewrite are
//! removed at open.

use std::fs::{DirBuilder, Permissions};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Result, SsdError};

/// Mode of the tier directory.
pub(crate) const DIR_MODE: u32 = 0o700;
/// Mode of every file the tier (or the Manager) creates in it.
pub const FILE_MODE: u32 = 0o600;
/// Suffix of temporary files (journal and generation rewrites); stale ones are removed at open.
pub const TEMP_SUFFIX: &str = ".tmp";

fn io_err(what: &str, path: &Path, e: std::io::Error) -> SsdError {
    SsdError::io(format!("{what} {}", path.display()), e)
}

/// Create `dir` 0700 if missing (its parents with the default mode), refuse it if
/// another uid owns it or group/others can write it, and tighten it to 0700 if group or
/// others can read or enter it. Returns the paths whose modes were tightened.
pub(crate) fn secure_dir(dir: &Path) -> Result<Vec<PathBuf>> {
    if !dir.exists() {
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| io_err("creating", parent, e))?;
        }
        match DirBuilder::new().mode(DIR_MODE).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err("creating", dir, e)),
        }
    }
    let md = std::fs::metadata(dir).map_err(|e| io_err("stat", dir, e))?;
    if !md.is_dir() {
        return Err(io_err(
            "opening",
            dir,
            std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a directory"),
        ));
    }
    check_owner(dir, md.uid())?;
    let mode = md.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(SsdError::InsecureDir {
            path: dir.to_path_buf(),
            reason: format!("it is writable by group or others (mode {mode:04o})"),
            fix: format!("run `chmod 700 {}` or choose another directory", dir.display()),
        });
    }
    let mut tightened = Vec::new();
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, Permissions::from_mode(DIR_MODE))
            .map_err(|e| io_err("chmod 700", dir, e))?;
        tightened.push(dir.to_path_buf());
    }
    Ok(tightened)
}

fn check_owner(path: &Path, uid: u32) -> Result<()> {
    let me = rustix::process::geteuid().as_raw();
    if uid == me {
        return Ok(());
    }
    Err(SsdError::InsecureDir {
        path: path.to_path_buf(),
        reason: format!("it is owned by uid {uid}, not by this process's uid {me}"),
        fix: format!(
            "run `chown -R {me} {}` or choose a directory this user owns",
            path.display()
        ),
    })
}

/// What [`tidy_files`] changed.
#[derive(Default)]
pub(crate) struct Tidied {
    pub(crate) tightened: Vec<PathBuf>,
    pub(crate) removed_temp: Vec<PathBuf>,
}

/// With the directory locked: remove stale `*.tmp` files, refuse files owned by another
/// uid, and chmod 0600 regular files that group or others could read or write.
pub(crate) fn tidy_files(dir: &Path) -> Result<Tidied> {
    let mut out = Tidied::default();
    let rd = std::fs::read_dir(dir).map_err(|e| io_err("listing", dir, e))?;
    for ent in rd {
        let ent = ent.map_err(|e| io_err("listing", dir, e))?;
        let path = ent.path();
        let md = std::fs::symlink_metadata(&path).map_err(|e| io_err("stat", &path, e))?;
        if !md.is_file() {
            continue;
        }
        check_owner(&path, md.uid())?;
        if ent.file_name().to_string_lossy().ends_with(TEMP_SUFFIX) {
            std::fs::remove_file(&path).map_err(|e| io_err("removing stale", &path, e))?;
            out.removed_temp.push(path);
        } else if md.mode() & 0o077 != 0 {
            std::fs::set_permissions(&path, Permissions::from_mode(FILE_MODE))
                .map_err(|e| io_err("chmod 600", &path, e))?;
            out.tightened.push(path);
        }
    }
    Ok(out)
}
