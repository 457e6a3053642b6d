//! Integration tests: one binary, one module per area (ripgrep's and qdrant's layout).

mod chunking;
mod documents;
mod embedding;
mod engine;
mod index;
mod layers;
mod lifecycle;
mod pipeline;
mod tokenizer;
mod util;
