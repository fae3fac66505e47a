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

// Its test is in lookup_threads.rs (one of the benches that include this file), so it
// runs once rather than once per bench.
