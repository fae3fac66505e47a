//! The Manager's top-level modules depend on each other without a circle (ARCHITECTURE.md:
//! `latency` and `parts` at the bottom, `shared` composing the rest, the session path on
//! top). Checked against the source text: every `crate::<module>` a module's files name
//! outside their `#[cfg(test)]` parts is an edge, and the graph must have no cycle. A
//! failure names one cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The top-level module a file under `src/` belongs to (`None`: the crate root, `bin/`).
fn module_of(rel: &Path) -> Option<String> {
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    let name = first.strip_suffix(".rs").unwrap_or(&first).to_string();
    (name != "lib" && name != "bin").then_some(name)
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `crate::<name>` references in `text`, test sections left out.
fn references(text: &str) -> BTreeSet<String> {
    let code = text.split("#[cfg(test)]").next().unwrap_or("");
    let mut out = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let before = code[..at].chars().last();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `orbitkv_crate::`-like names
        }
        let name: String = code[at + 7..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        if !name.is_empty() {
            out.insert(name);
        }
    }
    out
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let root = src();
    let mut all = Vec::new();
    files(&root, &mut all);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let modules: BTreeSet<String> = all
        .iter()
        .filter_map(|p| module_of(p.strip_prefix(&root).expect("under src")))
        .collect();
    for path in &all {
        let Some(me) = module_of(path.strip_prefix(&root).expect("under src")) else {
            continue;
        };
        let text = std::fs::read_to_string(path).expect("read source");
        let deps = g.entry(me.clone()).or_default();
        for r in references(&text) {
            if r != me && modules.contains(&r) {
                deps.insert(r);
            }
        }
    }
    g
}

/// One cycle of `g`, if any (depth-first search with the path on a stack).
fn cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        g: &BTreeMap<String, BTreeSet<String>>,
        v: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == v) {
            let mut c = path[i..].to_vec();
            c.push(v.to_string());
            return Some(c);
        }
        if done.contains(v) {
            return None;
        }
        path.push(v.to_string());
        for w in g.get(v).into_iter().flatten() {
            if let Some(c) = visit(g, w, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(v.to_string());
        None
    }
    let mut done = BTreeSet::new();
    g.keys().find_map(|v| visit(g, v, &mut Vec::new(), &mut done))
}

#[test]
fn the_manager_modules_form_no_circle() {
    let g = graph();
    assert!(
        g.len() > 10,
        "expected the Manager's modules, found {:?}",
        g.keys()
    );
    assert!(
        g["shared"].contains("peer"),
        "the reader misses edges: {:?}",
        g["shared"]
    );
    if let Some(c) = cycle(&g) {
        panic!("import circle between the Manager's modules: {}", c.join(" -> "));
    }
}

#[test]
fn the_cycle_finder_finds_one() {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    g.entry("a".into()).or_default().insert("b".into());
    g.entry("b".into()).or_default().insert("c".into());
    g.entry("c".into()).or_default().insert("a".into());
    assert_eq!(cycle(&g).expect("a cycle"), ["a", "b", "c", "a"]);
    g.get_mut("c").expect("c").clear();
    assert!(cycle(&g).is_none());
}
