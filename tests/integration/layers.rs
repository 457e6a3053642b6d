//! The library's layers: every `crate::` path points down (ARCHITECTURE.md, "Layers"). A
//! module may use its own layer's module only if it is itself, and any module of a lower
//! layer; so a bottom layer never depends on what is built on it.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use crate::util::root;

/// Top-level modules of the library, lowest layer first.
const LAYERS: &[&[&str]] = &[
    &[
        "distance", "document", "memory", "panics", "secret", "signal", "stats", "tokens",
    ],
    &["event", "lifecycle"],
    // Above `event`: a broker's queue encodes events (`queue/wire.rs`).
    &["queue"],
    // `http`: the clients of services (limits, retries, circuit), below the embedder that
    // uses them.
    &["publisher", "http"],
    &["connectors", "stages", "embed", "indexers"],
    &["run", "search"],
    // `serve` searches an index (`--index`) as well as embedding.
    &["serve"],
    &["eval", "jobs"],
    // The fuzz targets call the decoders of every layer.
    &["fuzz"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The top-level modules `text` names through `crate::`.
fn uses(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("crate::") {
        let rest = &text[i + "crate::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            out.insert(name);
        }
        // `use crate::{a, b::c}`
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            for part in group.split(',') {
                let name: String = part
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        }
    }
    out
}

fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_module_uses_only_lower_layers() {
    let src = root().join("src");
    let mut bad = Vec::new();
    let mut seen = BTreeSet::new();
    for e in fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_stem().unwrap().to_string_lossy().to_string();
        if matches!(name.as_str(), "lib" | "main" | "cli" | "bin") {
            continue;
        }
        let layer = layer_of(&name).unwrap_or_else(|| {
            panic!("src/{name} is in no layer: add it to LAYERS and ARCHITECTURE.md")
        });
        seen.insert(name.clone());
        let mut list = Vec::new();
        if p.is_dir() {
            files(&p, &mut list);
        } else {
            list.push(p.clone());
        }
        for f in list {
            let text = fs::read_to_string(&f).unwrap();
            for used in uses(&text) {
                if used == name {
                    continue;
                }
                match layer_of(&used) {
                    Some(l) if l < layer => {}
                    Some(l) => bad.push(format!(
                        "{} (layer {layer}) uses crate::{used} (layer {l})",
                        f.strip_prefix(root()).unwrap().display()
                    )),
                    None => {}
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "arrows pointing up or sideways:\n{}",
        bad.join("\n")
    );
    for layer in LAYERS {
        for m in *layer {
            assert!(
                seen.contains(*m),
                "LAYERS names `{m}`, which src/ does not have"
            );
        }
    }
}

#[test]
fn the_layer_check_sees_upward_uses() {
    let text = "use crate::run::signal::RunSignal;\nuse crate::{document::Document, embed};";
    let got: Vec<String> = uses(text).into_iter().collect();
    assert_eq!(got, ["document", "embed", "run"]);
}

/// The index backends, each a folder of `src/indexers/`, beside each other.
const BACKENDS: &[&str] = &["sqlite", "postgres", "parquet", "jsonl", "kafka", "null"];

/// Which other backend `text`, a file of backend `own`, names: through `indexers::X` or
/// `super::super::X` (from the backend's own folder) or a `use` group of `indexers::{..}`.
fn other_backends(own: &str, text: &str) -> Vec<&'static str> {
    let mut out = Vec::new();
    for other in BACKENDS.iter().filter(|b| **b != own) {
        let named = [
            format!("indexers::{other}::"),
            format!("super::super::{other}::"),
        ]
        .iter()
        .any(|p| text.contains(p.as_str()))
            || text.match_indices("indexers::{").any(|(i, _)| {
                let group = &text[i..];
                let group = &group[..group.find('}').unwrap_or(group.len())];
                group
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .any(|w| w == *other)
            });
        if named {
            out.push(*other);
        }
    }
    out
}

/// A backend imports only the neutral files of `src/indexers/` (the contract below it), never
/// another backend: their shared rules live once, in the neutral files (STYLE.md, "Contracts
/// at the bottom, one dispatch on top").
#[test]
fn backends_name_no_other_backend() {
    let indexers = root().join("src").join("indexers");
    let mut bad = Vec::new();
    for own in BACKENDS {
        let dir = indexers.join(own);
        if !dir.is_dir() {
            continue;
        }
        let mut list = Vec::new();
        files(&dir, &mut list);
        for f in list {
            let text = fs::read_to_string(&f).unwrap();
            for other in other_backends(own, &text) {
                bad.push(format!(
                    "{} names the {other} backend",
                    f.strip_prefix(root()).unwrap().display()
                ));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "backends importing each other:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_backend_check_sees_a_backend_named() {
    let text = "let m = crate::indexers::sqlite::reader::metadata_of(None);";
    assert_eq!(other_backends("postgres", text), ["sqlite"]);
    assert_eq!(
        other_backends("sqlite", "use crate::indexers::{meta, postgres::PgReader};"),
        ["postgres"]
    );
    assert!(other_backends("sqlite", "use crate::indexers::meta::ChunkRow;").is_empty());
    assert!(other_backends("sqlite", "use super::super::sqlite::x;").is_empty());
}

/// The files of `src/indexers/` allowed to name a backend: the dispatch above them (the URI
/// and what it opens).
const DISPATCH: &[&str] = &["uri.rs", "open.rs"];

/// The neutral files of `src/indexers/` (the contract every backend implements and the rules
/// they share) name no backend: they sit below all of them.
#[test]
fn neutral_index_files_name_no_backend() {
    let indexers = root().join("src").join("indexers");
    let mut bad = Vec::new();
    for e in fs::read_dir(&indexers).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if p.is_dir() || !name.ends_with(".rs") || DISPATCH.contains(&name.as_str()) {
            continue;
        }
        let text = code_of(&fs::read_to_string(&p).unwrap());
        for b in BACKENDS {
            if text.contains(&format!("{b}::")) && !text.contains(&format!("mod {b};")) {
                bad.push(format!("src/indexers/{name} names the {b} backend"));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "neutral files naming a backend (move the code to the backend, or to open.rs):\n{}",
        bad.join("\n")
    );
}

/// The folders whose modules must not import each other in a circle.
const NO_CIRCLES: &[&str] = &["indexers", "embed", "connectors"];

/// A file's code: no comment lines, no `#[cfg(test)]` module (tests may reach anywhere).
fn code_of(text: &str) -> String {
    let end = text.find("#[cfg(test)]\nmod ").unwrap_or(text.len());
    text[..end]
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The names a path group or a path names first: `{a, b::c}` gives a and b; `a` gives a.
fn first_segments(rest: &str) -> Vec<String> {
    let word = |s: &str| -> String {
        s.trim()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    match rest.strip_prefix('{') {
        Some(group) => group[..group.find('}').unwrap_or(group.len())]
            .split(',')
            .map(word)
            .filter(|w| !w.is_empty())
            .collect(),
        None => vec![word(rest)],
    }
}

/// The child modules of `dir` (files and folders beside its mod.rs), each with the other
/// children it names: by `super::`(from the child's own depth) or `crate::TOP::` paths, or
/// through an item the parent's mod.rs re-exports from a child (`pub use child::Item`).
fn child_graph(dir: &Path, top: &str) -> std::collections::BTreeMap<String, BTreeSet<String>> {
    let mut kids = std::collections::BTreeMap::new();
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_stem().unwrap().to_string_lossy().to_string();
        if name == "mod"
            || name == "tests"
            || (p.is_file() && p.extension().is_none_or(|x| x != "rs"))
        {
            continue;
        }
        kids.insert(name, p);
    }
    // Items mod.rs re-exports, by the child they come from.
    let mut from = std::collections::BTreeMap::new();
    if let Ok(text) = fs::read_to_string(dir.join("mod.rs")) {
        for line in code_of(&text).lines() {
            let line = line.trim();
            let Some(rest) = line.strip_prefix("pub use ").or_else(|| {
                line.strip_prefix("pub(crate) use ")
                    .or_else(|| line.strip_prefix("pub(super) use "))
            }) else {
                continue;
            };
            let Some((child, items)) = rest.split_once("::") else {
                continue;
            };
            if kids.contains_key(child) {
                for item in first_segments(items) {
                    from.insert(item, child.to_string());
                }
            }
        }
    }
    let mut graph = std::collections::BTreeMap::new();
    for (kid, path) in &kids {
        let mut list = Vec::new();
        if path.is_dir() {
            files(path, &mut list);
        } else {
            list.push(path.clone());
        }
        let mut named = BTreeSet::new();
        for f in list {
            let rel = f.strip_prefix(dir).unwrap();
            if rel.components().any(|c| c.as_os_str() == "tests") {
                continue;
            }
            // A file directly in the child (kid.rs, kid/mod.rs) reaches its siblings through
            // one `super::`; each folder deeper adds one.
            let mut depth = rel.components().count();
            if f.file_name().is_some_and(|n| n == "mod.rs") {
                depth -= 1;
            }
            let text = code_of(&fs::read_to_string(&f).unwrap());
            let prefixes = ["super::".repeat(depth), format!("crate::{top}::")];
            for prefix in &prefixes {
                for (i, _) in text.match_indices(prefix.as_str()) {
                    // `super::super::x` seen from one level down is not `super::` + `super`.
                    if prefix.starts_with("super") && text[..i].ends_with("super::") {
                        continue;
                    }
                    for name in first_segments(&text[i + prefix.len()..]) {
                        let target = if kids.contains_key(&name) {
                            Some(name)
                        } else {
                            from.get(&name).cloned()
                        };
                        if let Some(t) = target.filter(|t| t != kid) {
                            named.insert(t);
                        }
                    }
                }
            }
        }
        graph.insert(kid.clone(), named);
    }
    graph
}

/// A circle in `graph`, as the modules along it, or None.
fn circle(graph: &std::collections::BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &std::collections::BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut c = path[at..].to_vec();
            c.push(node.to_string());
            return Some(c);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

/// Inside `indexers/`, `embed/` and `connectors/`, no module reaches back to one that reaches
/// it: each folder reads bottom to top.
#[test]
fn no_import_circles_inside_a_component() {
    let mut bad = Vec::new();
    for top in NO_CIRCLES {
        let graph = child_graph(&root().join("src").join(top), top);
        assert!(graph.len() > 3, "src/{top} has modules");
        if let Some(c) = circle(&graph) {
            bad.push(format!("src/{top}: {}", c.join(" -> ")));
        }
    }
    assert!(
        bad.is_empty(),
        "modules importing each other in a circle:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_circle_check_sees_a_circle() {
    let graph = |edges: &[(&str, &str)]| {
        let mut g = std::collections::BTreeMap::<String, BTreeSet<String>>::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
            g.entry(b.to_string()).or_default();
        }
        g
    };
    assert_eq!(
        circle(&graph(&[("a", "b"), ("b", "c"), ("c", "a")])),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    assert_eq!(circle(&graph(&[("a", "b"), ("b", "c"), ("a", "c")])), None);
    assert_eq!(
        first_segments("{meta::ChunkRow, store, IndexMeta}"),
        ["meta", "store", "IndexMeta"]
    );
    // The real graph: the dispatch names the backends, and no backend names it back.
    let g = child_graph(&root().join("src").join("indexers"), "indexers");
    assert!(g["open"].contains("sqlite") && g["open"].contains("jsonl"));
    assert!(g["sqlite"].contains("meta") && !g["sqlite"].contains("open"));
}
