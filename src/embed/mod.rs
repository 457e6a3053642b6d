//! Embedding: loading a sentence-transformers model, running it on a device, and the embedder
//! pool that batches chunks across documents by a token budget.

pub mod batch;
pub mod bert;
pub mod classify;
pub mod cpu;
pub mod cross_encoder;
pub mod device;
pub mod encoder;
pub mod files;
pub mod gelu;
pub mod head;
pub mod kernel_choice;
#[cfg(feature = "cuda")]
pub mod lt;
pub mod model;
pub mod ner;
pub mod npy;
pub mod pool;
pub mod profile;
// Random-weight models in the Hugging Face layout, for tests, parity scripts and benchmarks
// (`ragline random-model`): never in a release build.
#[cfg(any(test, feature = "test-hooks"))]
pub mod random;
#[cfg(any(test, feature = "test-hooks"))]
pub mod random_heads;
pub mod readback;
pub mod rotary;
pub mod service;
pub mod splade;
pub mod texts;
pub mod tokenizer;
pub mod window;
pub mod wordpiece;

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
