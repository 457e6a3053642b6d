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
    /// Why a text could not be tokenized (the implementation's own error).
    type Error: std::error::Error + Send + Sync + 'static;

    /// Token ids of `text` with byte offsets, no special tokens.
    fn tokenize(&self, text: &str) -> Result<Tokens, Self::Error>;
}

/// Token ids as an index stores them (the chunker's ids of a chunk waiting for its vector):
/// little-endian u32s.
pub fn ids_to_bytes(ids: &[u32]) -> Vec<u8> {
    ids.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The ids [`ids_to_bytes`] stored.
pub fn ids_from_bytes(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]))
        .collect()
}
