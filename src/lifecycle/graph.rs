//! The stage graph: which stages a stage waits for. Every stage depends on `chunk` (it reads
//! the document's chunks); a config adds more with `depends_on` (`[stages.summary] depends_on =
//! ["entities"]`). The graph is checked before anything runs (unknown names, cycles, with the
//! path of the cycle) and recorded in the index, where the claim reads it: work of a stage is
//! claimed for a document only when its dependencies are done for the document's current
//! version, and a dependency's new output makes its dependents pending again.

use std::collections::BTreeMap;

use super::{CHUNK, EMBED};

/// A stage graph that cannot run: what is wrong and how to fix it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GraphError {
    #[error(
        "stage `{stage}` depends on `{missing}`, which is not a stage of this config; stages: \
         {known}"
    )]
    Unknown {
        stage: String,
        missing: String,
        known: String,
    },
    #[error("the stages depend on each other in a cycle: {}; remove one of these depends_on", .0.join(" -> "))]
    Cycle(Vec<String>),
    #[error(
        "stage `{0}` cannot wait for other stages: it runs inside `ingest` as the chunks are \
         made; make the stage that needs it depend on it instead"
    )]
    NotDeferrable(String),
}

/// The stages of a config and what each depends on beyond `chunk`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StageGraph {
    deps: BTreeMap<String, Vec<String>>,
}

impl StageGraph {
    /// A graph of `stages` (name, depends_on), checked: every name a stage of the graph (or
    /// `chunk`, which everything depends on anyway), no cycle, `embed` waiting for nothing
    /// but `chunk`.
    pub fn new(stages: Vec<(String, Vec<String>)>) -> Result<StageGraph, GraphError> {
        let mut deps: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, on) in stages {
            let entry = deps.entry(name).or_default();
            for d in on {
                if d != CHUNK && !entry.contains(&d) {
                    entry.push(d);
                }
            }
        }
        for (stage, on) in &deps {
            if stage == EMBED && !on.is_empty() {
                return Err(GraphError::NotDeferrable(EMBED.into()));
            }
            if let Some(missing) = on.iter().find(|d| !deps.contains_key(*d)) {
                let mut known: Vec<&str> = deps.keys().map(String::as_str).collect();
                known.insert(0, CHUNK);
                return Err(GraphError::Unknown {
                    stage: stage.clone(),
                    missing: missing.clone(),
                    known: known.join(", "),
                });
            }
        }
        let graph = StageGraph { deps };
        if let Some(cycle) = graph.cycle() {
            return Err(GraphError::Cycle(cycle));
        }
        Ok(graph)
    }

    /// The first cycle found, as a path that ends where it starts.
    fn cycle(&self) -> Option<Vec<String>> {
        // Depth-first, with the path on a stack: 0 unseen, 1 on the path, 2 finished.
        let mut state: BTreeMap<&str, u8> = BTreeMap::new();
        for start in self.deps.keys() {
            if state.get(start.as_str()).copied().unwrap_or(0) != 0 {
                continue;
            }
            let mut path: Vec<(&str, usize)> = vec![(start, 0)];
            state.insert(start, 1);
            while let Some((node, next)) = path.last_mut() {
                let on = &self.deps[*node];
                if *next == on.len() {
                    state.insert(node, 2);
                    path.pop();
                    continue;
                }
                let d = on[*next].as_str();
                *next += 1;
                match state.get(d).copied().unwrap_or(0) {
                    0 => {
                        state.insert(d, 1);
                        path.push((d, 0));
                    }
                    1 => {
                        let from = path.iter().position(|(n, _)| *n == d).unwrap_or(0);
                        let mut cycle: Vec<String> =
                            path[from..].iter().map(|(n, _)| n.to_string()).collect();
                        cycle.push(d.to_string());
                        return Some(cycle);
                    }
                    _ => {}
                }
            }
        }
        None
    }

    /// What `stage` waits for beyond `chunk`.
    pub fn dependencies(&self, stage: &str) -> &[String] {
        self.deps.get(stage).map_or(&[], Vec::as_slice)
    }

    /// The stages of the graph, by name.
    pub fn stages(&self) -> impl Iterator<Item = &str> {
        self.deps.keys().map(String::as_str)
    }

    /// Every (stage, dependency) pair beyond `chunk`: what the index records.
    pub fn edges(&self) -> Vec<(String, String)> {
        self.deps
            .iter()
            .flat_map(|(s, on)| on.iter().map(move |d| (s.clone(), d.clone())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(stages: &[(&str, &[&str])]) -> Result<StageGraph, GraphError> {
        StageGraph::new(
            stages
                .iter()
                .map(|(s, on)| (s.to_string(), on.iter().map(|d| d.to_string()).collect()))
                .collect(),
        )
    }

    #[test]
    fn chains_are_kept_and_chunk_is_implied() {
        let g = graph(&[
            ("embed", &["chunk"]),
            ("entities", &[]),
            ("summary", &["entities", "chunk"]),
            ("tags", &["summary", "entities"]),
        ])
        .unwrap();
        assert_eq!(g.dependencies("summary"), ["entities"]);
        assert!(g.dependencies("embed").is_empty() && g.dependencies("nothing").is_empty());
        assert_eq!(
            g.edges(),
            [
                ("summary".to_string(), "entities".to_string()),
                ("tags".into(), "summary".into()),
                ("tags".into(), "entities".into())
            ]
        );
    }

    #[test]
    fn cycles_are_refused_with_their_path_and_unknown_names_by_name() {
        let e = graph(&[
            ("entities", &[]),
            ("a", &["entities", "c"]),
            ("b", &["a"]),
            ("c", &["b"]),
        ])
        .unwrap_err();
        assert_eq!(
            e,
            GraphError::Cycle(vec!["a".into(), "c".into(), "b".into(), "a".into()])
        );
        assert!(e.to_string().contains("a -> c -> b -> a"), "{e}");
        let own = graph(&[("summary", &["summary"])]).unwrap_err();
        assert_eq!(
            own,
            GraphError::Cycle(vec!["summary".into(), "summary".into()])
        );
        let unknown = graph(&[("summary", &["entites"])]).unwrap_err().to_string();
        assert!(
            unknown.contains("`entites`") && unknown.contains("chunk, summary"),
            "{unknown}"
        );
        assert!(matches!(
            graph(&[("embed", &["summary"]), ("summary", &[])]),
            Err(GraphError::NotDeferrable(_))
        ));
    }
}
