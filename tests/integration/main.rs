//! Integration tests: one binary, one module per area (ripgrep's and qdrant's layout).

mod chunking;
mod embedding;
mod engine;
mod tokenizer;
mod util;
