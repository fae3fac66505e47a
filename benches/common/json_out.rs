//! The JSON result file a bench ends with.

use std::path::Path;

/// Write `doc` to `path` as pretty JSON ending in a newline, creating its parent
/// directory first; an error names the file (and the directory it could not create).
/// Prints nothing.
pub fn save_json(path: &str, doc: &serde_json::Value) -> Result<(), String> {
    if let Some(dir) = Path::new(path).parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("writing {path}: creating {}: {e}", dir.display()))?;
    }
    let text = serde_json::to_string_pretty(doc).map_err(|e| format!("writing {path}: {e}"))?;
    std::fs::write(path, text + "\n").map_err(|e| format!("writing {path}: {e}"))
}

/// [`save_json`], then `wrote PATH` on stdout.
pub fn write_json(path: &str, doc: &serde_json::Value) -> Result<(), String> {
    save_json(path, doc)?;
    println!("wrote {path}");
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn creates_the_directory_and_names_the_path_on_error() {
        let dir = std::env::temp_dir().join(format!("orbitkv-json-out-{}", std::process::id()));
        let path = dir.join("sub/out.json");
        let path = path.to_str().expect("utf-8 temp path");
        super::save_json(path, &serde_json::json!({"a": 1})).expect("write");
        let text = std::fs::read_to_string(path).expect("read back");
        assert_eq!(text, "{\n  \"a\": 1\n}\n");
        let err = super::save_json(&format!("{path}/x.json"), &serde_json::json!(null))
            .expect_err("a file as a directory");
        assert!(err.contains(path), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
