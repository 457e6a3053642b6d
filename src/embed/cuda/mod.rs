//! What only a GPU run uses: cuBLASLt linear layers, and a batch's vectors read back while the
//! next batches run.

#[cfg(feature = "cuda")]
pub mod lt;
pub mod readback;
