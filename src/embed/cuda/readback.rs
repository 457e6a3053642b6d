//! A batch whose work is enqueued on the device, and copying its pooled vectors back without
//! waiting for the batches enqueued after it (`RAGLINE_PIPELINE=1`; see
//! [`crate::embed::EmbeddingModel::embed_batches`]).

/// Whether the process's kernels overlap GPU batches (`kernels.pipeline`,
/// `RAGLINE_PIPELINE=1`).
pub fn pipeline_enabled() -> bool {
    crate::embed::kernel_choice::chosen().pipeline
}

/// A batch whose work is enqueued: its pooled vectors, or their copy back under way.
pub enum Launched {
    /// Pooled vectors on the host (before the head).
    Ready(Vec<Vec<f32>>),
    #[cfg(feature = "cuda")]
    Copying(cuda::Copy),
}

/// Start copying pooled vectors ([rows, cols] f32) back without waiting: None when they are
/// not on a CUDA device.
#[cfg(feature = "cuda")]
pub fn start_copy(t: &candle_core::Tensor) -> candle_core::Result<Option<cuda::Copy>> {
    cuda::Copy::start(t)
}

impl Launched {
    /// Wait for the pooled vectors.
    // Without the cuda feature there is one variant.
    #[allow(clippy::infallible_destructuring_match)]
    pub fn wait(self) -> candle_core::Result<Vec<Vec<f32>>> {
        let pooled = match self {
            Launched::Ready(rows) => rows,
            #[cfg(feature = "cuda")]
            Launched::Copying(copy) => copy.wait()?,
        };
        Ok(pooled)
    }
}

/// Copying pooled vectors back from a CUDA device without waiting: into page-locked host memory,
/// on the device's one stream, behind the batch's work; waiting for the copy's event waits for
/// that batch only, not for the batches enqueued after it.
#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda_backend::cudarc::driver::PinnedHostSlice;
    use candle_core::{Storage, Tensor};

    pub struct Copy {
        host: PinnedHostSlice<f32>,
        cols: usize,
    }

    fn driver(e: impl std::fmt::Display) -> candle_core::Error {
        candle_core::Error::Msg(format!("copying vectors back: {e}"))
    }

    impl Copy {
        /// Start copying `t` ([rows, cols] f32) back; None when it is not on a CUDA device.
        pub fn start(t: &Tensor) -> candle_core::Result<Option<Copy>> {
            let t = t.contiguous()?;
            let (rows, cols) = t.dims2()?;
            let (storage, layout) = t.storage_and_layout();
            let Storage::Cuda(cuda) = &*storage else {
                return Ok(None);
            };
            let start = layout.start_offset();
            let slice = cuda
                .as_cuda_slice::<f32>()?
                .slice(start..start + rows * cols);
            let stream = cuda.device.cuda_stream();
            // Flags 0: cached page-locked memory (the default write-combined kind is slow for
            // the host to read).
            // SAFETY: the memory is written by the copy below before anything reads it
            // (`wait` waits for the copy's event).
            let mut host = unsafe {
                stream
                    .context()
                    .alloc_pinned_with_flags::<f32>(rows * cols, 0)
            }
            .map_err(driver)?;
            stream.memcpy_dtoh(&slice, &mut host).map_err(driver)?;
            Ok(Some(Copy { host, cols }))
        }

        /// Wait for the copy; the rows.
        pub fn wait(self) -> candle_core::Result<Vec<Vec<f32>>> {
            let rows = self.host.as_slice().map_err(driver)?;
            Ok(rows.chunks(self.cols).map(<[f32]>::to_vec).collect())
        }
    }
}
