//! The structural claims of `src/cache/mod.rs` and ARCHITECTURE.md, checked
//! against the source text (a grep, not a parser: each check names the line
//! it disagrees with).
//!
//! - ARCHITECTURE.md names every caller of `free_slot` and `end_lease` (that they
//!   are the only places a slot is freed and a lease ends is enforced by the
//!   compiler: `Slots::free` and `LeaseTable::remove` / `take_if` are visible to
//!   their owning module alone).
//! - Calls between the `cache` submodules only go down the layer list.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Layer of each file under `src/cache/`: a method may call methods defined in
/// its own file or in a file of a strictly higher layer number.
const LAYERS: &[(&str, u32)] = &[
    ("mod.rs", 0),
    ("tp.rs", 1),
    ("leases.rs", 2),
    ("saves.rs", 2),
    ("spill.rs", 3),
    ("tiers.rs", 4),
    ("ssd_capacity.rs", 4),
    ("adopt.rs", 5),
    ("entries.rs", 6),
    ("registry.rs", 6),
];

struct Source {
    file: String,
    /// (line number, enclosing fn, text), test modules left out.
    lines: Vec<(usize, String, String)>,
}

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The name of the fn a line declares, if any.
fn declared_fn(line: &str) -> Option<String> {
    let rest = line.trim_start();
    let at = rest.find("fn ")?;
    let prefix = &rest[..at];
    if !prefix
        .split_whitespace()
        .all(|w| w.starts_with("pub") || w == "const")
    {
        return None;
    }
    let name: String = rest[at + 3..]
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

fn load(path: &Path) -> Source {
    let text = read(path);
    let mut lines = Vec::new();
    let mut current = String::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("#[cfg(test)]") {
            break;
        }
        if let Some(name) = declared_fn(line) {
            current = name;
        }
        lines.push((i + 1, current.clone(), line.to_string()));
    }
    Source {
        file: path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default(),
        lines,
    }
}

fn cache_sources() -> Vec<Source> {
    LAYERS
        .iter()
        .map(|(f, _)| load(&crate_dir().join("src/cache").join(f)))
        .collect()
}

/// (file:line, enclosing fn) of every occurrence of `needle`.
fn occurrences<'a>(sources: &'a [Source], needle: &str) -> Vec<(String, &'a str)> {
    let mut out = Vec::new();
    for s in sources {
        for (n, f, text) in &s.lines {
            if text.contains(needle) && !text.trim_start().starts_with("//") {
                out.push((format!("{}:{n}", s.file), f.as_str()));
            }
        }
    }
    out
}

/// The backquoted names in the ARCHITECTURE.md paragraph that starts with `lead`.
fn doc_names(lead: &str) -> Vec<String> {
    let doc = read(&crate_dir().join("../../ARCHITECTURE.md"));
    let start = doc
        .find(lead)
        .unwrap_or_else(|| panic!("ARCHITECTURE.md has no paragraph starting {lead:?}"));
    let para = doc[start..].split("\n\n").next().unwrap_or_default();
    para.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

#[test]
fn architecture_names_every_caller() {
    let sources = cache_sources();
    for (callee, lead) in [
        ("free_slot", "*Who frees a block's slot?*"),
        ("end_lease", "*Where does a lease end?*"),
    ] {
        let named = doc_names(lead);
        let mut callers: Vec<&str> = occurrences(&sources, &format!("self.{callee}("))
            .into_iter()
            .map(|(_, f)| f)
            .collect();
        callers.sort_unstable();
        callers.dedup();
        assert!(!callers.is_empty(), "no caller of {callee}");
        for c in &callers {
            assert!(
                named.iter().any(|n| n == c),
                "ARCHITECTURE.md ({lead}) does not name `{c}`, which calls `{callee}`"
            );
        }
        // Every snake_case name in the paragraph is a function that calls `callee`
        // (file names, types and variants are not snake_case identifiers).
        let is_fn_name = |n: &str| n.chars().all(|c| c.is_ascii_lowercase() || c == '_');
        for n in named.iter().filter(|n| is_fn_name(n) && n.as_str() != callee) {
            assert!(
                callers.contains(&n.as_str()),
                "ARCHITECTURE.md ({lead}) names `{n}`, which does not call `{callee}`"
            );
        }
    }
}

#[test]
fn cache_modules_only_call_down() {
    let sources = cache_sources();
    let layer: HashMap<&str, u32> = LAYERS.iter().copied().collect();
    let mut defined_in: HashMap<String, &str> = HashMap::new();
    for s in &sources {
        for (n, _, text) in &s.lines {
            if let Some(name) = declared_fn(text)
                && let Some(other) = defined_in.insert(name.clone(), &s.file)
                && other != s.file
            {
                panic!("{}:{n}: fn {name} also defined in {other}", s.file);
            }
        }
    }
    for s in &sources {
        for (n, _, text) in &s.lines {
            for piece in text.split("self.").skip(1) {
                let name: String = piece
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !piece[name.len()..].starts_with('(') {
                    continue; // a field
                }
                let Some(&home) = defined_in.get(&name) else {
                    continue; // a method of a field's type
                };
                assert!(
                    home == s.file || layer[home] > layer[s.file.as_str()],
                    "{}:{n}: calls `{name}` of {home}, which is not below it",
                    s.file
                );
            }
        }
    }
}
