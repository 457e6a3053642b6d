//! The encoder trait: what the embedder pool and `enrich` need of a model (TEI's backend
//! trait plays this part). [`EmbeddingModel`] implements it; tests use a fake that is exact
//! and instant, so batching and de-duplication are tested without a model.

use super::model::EmbeddingModel;
use super::EmbedError;

pub trait Encoder: Send {
    /// Content tokens a sequence may have (special tokens excluded, prompt included).
    fn max_content_len(&self) -> usize;

    /// The ids put before every passage (a model's "passage: " prompt; usually none).
    fn passage_prompt_ids(&self) -> &[u32];

    /// Batches for sequences of `lengths` tokens within `budget` tokens computed.
    fn plan_batches(&self, lengths: &[usize], budget: usize) -> Vec<Vec<usize>>;

    /// Tokens computed for `batch`, padding included.
    fn computed_tokens(&self, lengths: &[usize], batch: &[usize]) -> usize;

    /// One vector per sequence of content ids, each preceded by `prompt`.
    fn embed_ids(&self, seqs: &[&[u32]], prompt: &[u32]) -> Result<Vec<Vec<f32>>, EmbedError>;

    /// [`Encoder::embed_ids`] of each of `batches` in order, each result handed to `each` with
    /// the batch's index (false from it: stop). A GPU model overlaps one batch's device work
    /// with the copy back of the one before.
    fn embed_batches(
        &self,
        batches: &[Vec<&[u32]>],
        prompt: &[u32],
        each: &mut dyn FnMut(usize, Result<Vec<Vec<f32>>, EmbedError>) -> bool,
    ) {
        for (i, seqs) in batches.iter().enumerate() {
            if !each(i, self.embed_ids(seqs, prompt)) {
                return;
            }
        }
    }

    /// The model's content ids of a text (no special tokens), for texts that come without
    /// the chunker's ids (a vector set of another model).
    fn content_ids(&self, text: &str) -> Result<Vec<u32>, EmbedError>;

    /// Whether this encoder embeds texts (a service, which tokenizes for itself) rather
    /// than the chunker's token ids; [`Encoder::embed_texts`] is then what runs.
    fn embeds_text(&self) -> bool {
        false
    }

    /// One result per text (`tokens`: each text's size, for the service's limits), for an
    /// encoder that [`Encoder::embeds_text`]: a service may refuse one input and not its
    /// neighbours.
    fn embed_texts(
        &self,
        texts: &[&str],
        tokens: &[usize],
    ) -> Vec<Result<Vec<f32>, crate::http::Unanswered>> {
        let _ = tokens;
        texts
            .iter()
            .map(|_| Err("this encoder embeds token ids, not texts: a bug".into()))
            .collect()
    }
}

impl Encoder for EmbeddingModel {
    fn max_content_len(&self) -> usize {
        self.tokenizer.max_content_len()
    }

    fn passage_prompt_ids(&self) -> &[u32] {
        self.tokenizer.passage_prompt_ids()
    }

    fn plan_batches(&self, lengths: &[usize], budget: usize) -> Vec<Vec<usize>> {
        EmbeddingModel::plan_batches(self, lengths, budget)
    }

    fn computed_tokens(&self, lengths: &[usize], batch: &[usize]) -> usize {
        EmbeddingModel::computed_tokens(self, lengths, batch)
    }

    fn embed_ids(&self, seqs: &[&[u32]], prompt: &[u32]) -> Result<Vec<Vec<f32>>, EmbedError> {
        EmbeddingModel::embed_ids(self, seqs, prompt)
    }

    fn embed_batches(
        &self,
        batches: &[Vec<&[u32]>],
        prompt: &[u32],
        each: &mut dyn FnMut(usize, Result<Vec<Vec<f32>>, EmbedError>) -> bool,
    ) {
        EmbeddingModel::embed_batches(self, batches, prompt, each)
    }

    fn content_ids(&self, text: &str) -> Result<Vec<u32>, EmbedError> {
        self.tokenizer.content_ids(text)
    }
}
