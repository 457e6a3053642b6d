//! The reuse stage: a chunk whose model input (its token ids) the index already holds a
//! vector for takes that vector, and skips the embedder. An edited page re-embeds only the
//! chunks whose text changed; a renamed or moved file, a changed `--chunk-overlap` that leaves
//! most chunks alike, or a page that repeats another's text re-embed nothing they share.
//!
//! Sound because an index holds the vectors of one model only (a run with another model is
//! refused before it starts), and a vector depends on nothing but the model and its input.

use super::{Stage, StageError};
use crate::document::Document;
use crate::lifecycle::StoredVectors;

pub struct ReuseVectors {
    store: Box<dyn StoredVectors>,
    /// After a lookup error the stage stops looking (and says so once): chunks are embedded,
    /// which is always correct, only slower.
    broken: bool,
}

impl ReuseVectors {
    pub fn new(store: Box<dyn StoredVectors>) -> Self {
        ReuseVectors {
            store,
            broken: false,
        }
    }
}

impl Stage for ReuseVectors {
    fn name(&self) -> &'static str {
        "reuse"
    }

    fn process(&mut self, doc: &mut Document) -> Result<Vec<Document>, StageError> {
        if self.broken {
            return Ok(Vec::new());
        }
        let Some(chunk) = doc.chunk.as_deref_mut() else {
            return Ok(Vec::new());
        };
        let Some(key) = chunk.input_key.filter(|_| chunk.vector.is_none()) else {
            return Ok(Vec::new());
        };
        match self.store.vector_for(&key) {
            Ok(Some(vector)) => {
                chunk.vector = Some(vector);
                chunk.token_ids = Vec::new();
            }
            Ok(None) => {}
            Err(err) => {
                tracing::warn!("cannot read stored vectors ({err}); embedding every chunk");
                self.broken = true;
            }
        }
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::document::{Chunk, InputKey};
    use crate::lifecycle::StoreError;

    struct Stored(HashMap<InputKey, Vec<f32>>, usize);
    impl StoredVectors for Stored {
        fn vector_for(&mut self, key: &InputKey) -> Result<Option<Vec<f32>>, StoreError> {
            self.1 += 1;
            Ok(self.0.get(key).cloned())
        }
    }

    fn chunk_with(ids: &[u32]) -> Document {
        let parent = Document::new("p", "text");
        let mut c = parent.child("p#0", "text");
        c.chunk = Some(Box::new(Chunk {
            token_ids: ids.to_vec(),
            input_key: Some(Chunk::input_key_of(ids)),
            ..Chunk::default()
        }));
        c
    }

    #[test]
    fn takes_the_vector_of_an_identical_input_only() {
        let known = Chunk::input_key_of(&[1, 2, 3]);
        let mut stage = ReuseVectors::new(Box::new(Stored(
            HashMap::from([(known, vec![0.6, 0.8])]),
            0,
        )));
        let mut same = chunk_with(&[1, 2, 3]);
        stage.process(&mut same).unwrap();
        let c = same.chunk.as_deref().unwrap();
        assert_eq!(c.vector.as_deref(), Some(&[0.6, 0.8][..]));
        assert!(c.token_ids.is_empty(), "a reused chunk frees its token ids");

        // Same tokens in another order, or one more token: another input.
        for ids in [&[3, 2, 1][..], &[1, 2, 3, 4][..]] {
            let mut other = chunk_with(ids);
            stage.process(&mut other).unwrap();
            let c = other.chunk.as_deref().unwrap();
            assert_eq!(c.vector, None);
            assert_eq!(c.token_ids, ids);
        }
    }
}
