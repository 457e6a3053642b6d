//! A stage that does nothing: for measuring the engine's own overhead.

use super::{Stage, StageError};
use crate::document::Document;

#[derive(Debug, Default)]
pub struct Noop;

impl Stage for Noop {
    fn name(&self) -> &'static str {
        "noop"
    }

    fn process(&mut self, _doc: &mut Document) -> Result<Vec<Document>, StageError> {
        Ok(Vec::new())
    }
}
