//! Embedding: loading a sentence-transformers model, running it on a device, and the embedder
//! pool that batches chunks across documents by a token budget.
//!
//! Rooms: `load/` (a model's files, tokenizer, device), `models/` (the architectures and task
//! models), `cpu/` (the fused CPU encoder and its kernels), `cuda/` (what a GPU run adds),
//! `testing/` (random models, test builds only); beside them the encoder, pooling and head
//! (`model.rs`), the `Encoder` trait, the window, the pool and the service encoder.

pub mod batch;
pub mod cpu;
pub mod cuda;
pub mod encoder;
pub mod gelu;
pub mod kernel_choice;
pub mod load;
pub mod model;
pub mod models;
pub mod npy;
pub mod pool;
pub mod profile;
pub mod service;
// Random-weight models, for tests, parity scripts and benchmarks: never in a release build.
#[cfg(any(test, feature = "test-hooks"))]
pub mod testing;
pub mod texts;
pub mod window;

// Each room's modules under their names of before the rooms: `embed::bert`, `embed::files`...
#[cfg(feature = "cuda")]
pub use cuda::lt;
pub use cuda::readback;
pub use load::{device, files, tokenizer, wordpiece};
pub use models::{bert, classify, cross_encoder, head, ner, rotary, splade};
#[cfg(any(test, feature = "test-hooks"))]
pub use testing::{random, random_heads};

use std::path::PathBuf;

use thiserror::Error;

pub use device::{DTypeChoice, DeviceChoice};
pub use files::{ModelFiles, DEFAULT_MODEL};
pub use model::EmbeddingModel;

#[derive(Debug, Error)]
pub enum EmbedError {
    /// A file of the model is missing or unreadable.
    #[error("model file `{path}`: {reason}")]
    ModelFile { path: PathBuf, reason: String },
    /// The model is of a kind ragline cannot run.
    #[error("{0}")]
    Unsupported(String),
    /// The model could not be found locally or on the hub.
    #[error("{0}")]
    NotFound(String),
    /// The requested device cannot be used.
    #[error("{0}")]
    Device(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("model: {0}")]
    Candle(#[from] candle_core::Error),
    /// The CPU kernels asked for cannot run on this CPU.
    #[error(transparent)]
    Kernel(#[from] cpu::kernels::KernelError),
}
