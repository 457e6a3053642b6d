//! Random-weight models in the Hugging Face layout, for tests, parity scripts and benchmarks
//! (`ragline random-model`): compiled with `cfg(test)` or the `test-hooks` feature only.

pub mod random;
pub mod random_heads;
