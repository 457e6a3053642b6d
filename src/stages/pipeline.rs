//! Runs a document through a worker's stages, catching errors and panics per document.

use std::panic::{catch_unwind, AssertUnwindSafe};

use super::{Stage, StageError};
use crate::document::Document;

/// What became of one document that went into the pipeline: the document itself first, then
/// its children (each followed by its own children), in order.
#[derive(Debug)]
pub enum PipelineOutput {
    /// Went through every stage: ready for the embedder or the indexer.
    Done(Document),
    /// Stage `stage` dropped it (`doc.dropped` holds the reason).
    Dropped { doc: Document, stage: &'static str },
    /// Stage `stage` failed on it. Children it made before failing are discarded (they were
    /// never announced).
    Failed {
        doc: Document,
        stage: &'static str,
        reason: String,
    },
}

impl PipelineOutput {
    pub fn doc(&self) -> &Document {
        match self {
            PipelineOutput::Done(doc)
            | PipelineOutput::Dropped { doc, .. }
            | PipelineOutput::Failed { doc, .. } => doc,
        }
    }

    pub fn doc_mut(&mut self) -> &mut Document {
        match self {
            PipelineOutput::Done(doc)
            | PipelineOutput::Dropped { doc, .. }
            | PipelineOutput::Failed { doc, .. } => doc,
        }
    }
}

/// A worker's stages, in order.
pub struct Pipeline {
    stages: Vec<Box<dyn Stage>>,
}

impl Pipeline {
    pub fn new(stages: Vec<Box<dyn Stage>>) -> Self {
        Pipeline { stages }
    }

    pub fn stage_names(&self) -> Vec<&'static str> {
        self.stages.iter().map(|s| s.name()).collect()
    }

    /// Run `doc` through every stage; children start at the stage after the one that made
    /// them. A stage error or panic fails that document only.
    pub fn run(&mut self, doc: Document, out: &mut Vec<PipelineOutput>) {
        self.run_from(0, doc, out);
    }

    fn run_from(&mut self, first: usize, mut doc: Document, out: &mut Vec<PipelineOutput>) {
        let mut children: Vec<(usize, Document)> = Vec::new();
        let mut dropped_by = None;
        for index in first..self.stages.len() {
            let stage = &mut self.stages[index];
            let name = stage.name();
            let result = catch_unwind(AssertUnwindSafe(|| stage.process(&mut doc)));
            let failure = match result {
                Ok(Ok(made)) => {
                    children.extend(made.into_iter().map(|c| (index + 1, c)));
                    if doc.dropped.is_some() {
                        dropped_by = Some(name);
                        break;
                    }
                    if doc.unchanged {
                        // The index already holds it: nothing more to do here.
                        break;
                    }
                    continue;
                }
                Ok(Err(StageError::BadDocument(msg))) => msg,
                Ok(Err(StageError::Internal(msg))) => msg,
                Err(panic) => format!("stage panicked: {}", crate::panics::message(&*panic)),
            };
            doc.children = 0;
            out.push(PipelineOutput::Failed {
                doc,
                stage: name,
                reason: failure,
            });
            return;
        }
        doc.children = u32::try_from(children.len()).expect("over 4 billion children: a bug");
        out.push(match dropped_by {
            Some(stage) => PipelineOutput::Dropped { doc, stage },
            None => PipelineOutput::Done(doc),
        });
        for (next, child) in children {
            self.run_from(next, child, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Split;
    impl Stage for Split {
        fn name(&self) -> &'static str {
            "split"
        }
        fn process(&mut self, doc: &mut Document) -> Result<Vec<Document>, StageError> {
            if doc.is_child() {
                return Ok(vec![]);
            }
            Ok((0..3)
                .map(|i| doc.child(format!("{}#{i}", doc.id), format!("part {i}")))
                .collect())
        }
    }

    struct PanicOn(&'static str);
    impl Stage for PanicOn {
        fn name(&self) -> &'static str {
            "picky"
        }
        fn process(&mut self, doc: &mut Document) -> Result<Vec<Document>, StageError> {
            if doc.id == self.0 {
                panic!("cannot stand {}", doc.id);
            }
            Ok(vec![])
        }
    }

    #[test]
    fn children_run_through_later_stages_and_a_panic_fails_one_document() {
        let mut p = Pipeline::new(vec![Box::new(Split), Box::new(PanicOn("a#1"))]);
        let mut out = Vec::new();
        p.run(Document::new("a", "text"), &mut out);
        let summary: Vec<(String, bool)> = out
            .iter()
            .map(|o| (o.doc().id.clone(), matches!(o, PipelineOutput::Done(_))))
            .collect();
        assert_eq!(
            summary,
            vec![
                ("a".to_string(), true),
                ("a#0".to_string(), true),
                ("a#1".to_string(), false),
                ("a#2".to_string(), true),
            ]
        );
        assert_eq!(out[0].doc().children, 3);
        match &out[2] {
            PipelineOutput::Failed { stage, reason, .. } => {
                assert_eq!(*stage, "picky");
                assert!(reason.contains("cannot stand a#1"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_parent_that_fails_after_making_children_takes_them_with_it() {
        let mut p = Pipeline::new(vec![Box::new(Split), Box::new(PanicOn("a"))]);
        let mut out = Vec::new();
        p.run(Document::new("a", "text"), &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].doc().children, 0);
        assert!(matches!(out[0], PipelineOutput::Failed { .. }));
    }
}
