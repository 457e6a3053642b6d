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
        "document", "memory", "panics", "secret", "signal", "stats", "tokens",
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
const BACKENDS: &[&str] = &["sqlite", "postgres", "parquet", "jsonl", "null"];

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
