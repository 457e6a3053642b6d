//! What the chunker needs of a tokenizer, so that `stages` does not depend on `embed`: the
//! model's tokenizer implements [`Tokenize`] (in `embed::tokenizer`), and the chunk stage
//! takes any implementation.

/// Token ids of a text with the byte range each came from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tokens {
    pub ids: Vec<u32>,
    pub offsets: Vec<(usize, usize)>,
}

/// A tokenizer the chunker can cut by.
pub trait Tokenize: Clone + Send + 'static {
    /// Token ids of `text` with byte offsets, no special tokens.
    fn tokenize(&self, text: &str) -> Result<Tokens, String>;
}
