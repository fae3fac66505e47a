//! A size-limited tmpfs mounted for a test, for the disk-full tests of this
//! crate and of orbitkv-manager (which includes this file by its path).

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

/// A size-limited tmpfs, unmounted on drop.
pub struct SmallFs {
    _base: tempfile::TempDir,
    pub mnt: PathBuf,
}

impl SmallFs {
    /// A tmpfs of `size` mounted on `base`/mnt; `None`, with the reason
    /// printed, where mounting is not permitted.
    pub fn mount_in(base: tempfile::TempDir, size: &str) -> Option<SmallFs> {
        let mnt = base.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mkdir");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs"])
            .arg(&mnt)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(SmallFs { _base: base, mnt }),
            Ok(o) => {
                eprintln!(
                    "skipped: cannot mount a small tmpfs (needs root): {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("skipped: cannot run mount: {e}");
                None
            }
        }
    }

    pub fn filler(&self) -> PathBuf {
        self.mnt.join("filler")
    }

    /// Write a filler file until a write fails: that write's error.
    pub fn write_filler_until_error(&self) -> std::io::Error {
        let mut f = std::fs::File::create(self.filler()).expect("filler");
        let chunk = vec![0x5au8; 4096];
        loop {
            if let Err(e) = f.write_all(&chunk) {
                return e;
            }
        }
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
    }
}
