//! Linear layers through cuBLASLt on CUDA (f16): the product, its bias, GELU and the residual add
//! of a BERT layer in one library call (cuBLASLt's BIAS and GELU_BIAS epilogues; the residual as
//! the product's C operand with beta = 1), where candle runs a GEMM and then one kernel per
//! elementwise step, each a full pass over the activations.
//!
//! Used by [`crate::embed::bert::Bert`] on a CUDA device when the products and activations are both f16
//! and `RAGLINE_CUBLASLT=1`. cuBLASLt's GELU is the tanh approximation; BERT's is the
//! erf one: the difference (under 1e-3 per activation) is far inside the parity bound, which the
//! GPU check measures (scripts/gpu-check.sh).

use candle_core::cuda_backend::cudarc::cublaslt::{Activation, CudaBlasLT, Matmul, MatmulConfig};
use candle_core::cuda_backend::cudarc::driver::CudaSlice;
use candle_core::{
    CpuStorage, CudaStorage, CustomOp1, CustomOp2, DType, Device, Layout, Result, Shape, Storage,
    Tensor,
};
use half::f16;

/// A cuBLASLt handle on a device's stream.
pub struct Lt {
    handle: CudaBlasLT,
}

fn cuda_error(what: &str, e: impl std::fmt::Display) -> candle_core::Error {
    candle_core::Error::Msg(format!("cuBLASLt {what}: {e}"))
}

/// Whether the process's kernels take the cuBLASLt path (`kernels.cublaslt`,
/// `RAGLINE_CUBLASLT=1`).
pub fn enabled() -> bool {
    crate::embed::kernel_choice::chosen().cublaslt
}

impl Lt {
    /// A handle for `device` when it is a CUDA device and the path is on.
    pub fn for_device(device: &Device) -> Result<Option<Lt>> {
        match device {
            Device::Cuda(d) if enabled() => Ok(Some(Lt {
                handle: CudaBlasLT::new(d.cuda_stream()).map_err(|e| cuda_error("handle", e))?,
            })),
            _ => Ok(None),
        }
    }

    /// `x [n, in] @ weight_t [in, out] + bias`, then GELU when `gelu`, then `+ residual`.
    /// All f16 and contiguous.
    pub fn linear(
        &self,
        x: &Tensor,
        weight_t: &Tensor,
        bias: &Tensor,
        gelu: bool,
        residual: Option<&Tensor>,
    ) -> Result<Tensor> {
        let op = LinearOp {
            lt: &self.handle,
            weight_t,
            bias,
            gelu,
        };
        let x = x.contiguous()?;
        match residual {
            Some(r) => x.apply_op2_no_bwd(&r.contiguous()?, &op),
            None => x.apply_op1_no_bwd(&op),
        }
    }
}

struct LinearOp<'a> {
    lt: &'a CudaBlasLT,
    weight_t: &'a Tensor,
    bias: &'a Tensor,
    gelu: bool,
}

/// The f16 slice a contiguous tensor's layout covers.
fn view<'s>(
    storage: &'s CudaStorage,
    layout: &Layout,
    len: usize,
) -> Result<candle_core::cuda_backend::cudarc::driver::CudaView<'s, f16>> {
    if !layout.is_contiguous() {
        candle_core::bail!("cuBLASLt linear: a strided operand");
    }
    let start = layout.start_offset();
    Ok(storage.as_cuda_slice::<f16>()?.slice(start..start + len))
}

impl LinearOp<'_> {
    fn run(
        &self,
        x: &CudaStorage,
        lx: &Layout,
        residual: Option<(&CudaStorage, &Layout)>,
    ) -> Result<(CudaStorage, Shape)> {
        let (n, k) = lx.shape().dims2()?;
        let (k2, m) = self.weight_t.dims2()?;
        if k != k2 || self.bias.dims1()? != m {
            candle_core::bail!("cuBLASLt linear: [{n}, {k}] by [{k2}, {m}]");
        }
        let (ws, wl) = self.weight_t.storage_and_layout();
        let (bs, bl) = self.bias.storage_and_layout();
        let (Storage::Cuda(ws), Storage::Cuda(bs)) = (&*ws, &*bs) else {
            candle_core::bail!("cuBLASLt linear: weights not on the CUDA device");
        };
        let w = view(ws, wl, k * m)?;
        let b = view(bs, bl, m)?;
        let xs = view(x, lx, n * k)?;
        let dev = &x.device;
        let mut out: CudaSlice<f16> = match residual {
            Some((rs, rl)) => {
                if rl.shape().dims() != [n, m] {
                    candle_core::bail!(
                        "cuBLASLt linear: residual {:?}, not [{n}, {m}]",
                        rl.shape()
                    );
                }
                let r = view(rs, rl, n * m)?;
                // SAFETY: every element is written by the copy that follows.
                let mut out = unsafe { dev.alloc::<f16>(n * m)? };
                dev.memcpy_dtod(&r, &mut out)?;
                out
            }
            // SAFETY: beta = 0: cuBLASLt writes every element and reads none.
            None => unsafe { dev.alloc::<f16>(n * m)? },
        };
        // Column-major view: out^T [m, n] = weight_t^T [m, k] (weight_t row-major [k, m] is
        // column-major [m, k], ld m) times x^T [k, n] (x row-major [n, k], ld k).
        let cfg = MatmulConfig {
            transa: false,
            transb: false,
            transc: false,
            m: m as u64,
            n: n as u64,
            k: k as u64,
            alpha: 1.0,
            lda: m as i64,
            ldb: k as i64,
            beta: if residual.is_some() { 1.0 } else { 0.0 },
            ldc: m as i64,
            stride_a: None,
            stride_b: None,
            stride_c: None,
            stride_bias: None,
            batch_size: None,
        };
        let act = self.gelu.then_some(Activation::Gelu);
        // SAFETY: the shapes and leading dimensions above describe the three slices exactly.
        unsafe {
            self.lt
                .matmul(cfg, &w, &xs, &mut out, Some(&b), act.as_ref())
                .map_err(|e| cuda_error("matmul", e))?;
        }
        Ok((
            CudaStorage::wrap_cuda_slice(out, dev.clone()),
            Shape::from((n, m)),
        ))
    }
}

fn cpu_refused() -> candle_core::Error {
    candle_core::Error::Msg("the cuBLASLt linear layer runs on CUDA only".into())
}

impl CustomOp1 for LinearOp<'_> {
    fn name(&self) -> &'static str {
        "cublaslt-linear"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        Err(cpu_refused())
    }

    fn cuda_fwd(&self, x: &CudaStorage, lx: &Layout) -> Result<(CudaStorage, Shape)> {
        self.run(x, lx, None)
    }
}

impl CustomOp2 for LinearOp<'_> {
    fn name(&self) -> &'static str {
        "cublaslt-linear-residual"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        Err(cpu_refused())
    }

    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        lx: &Layout,
        r: &CudaStorage,
        lr: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        self.run(x, lx, Some((r, lr)))
    }
}

/// Whether a layer of these dtypes can take the cuBLASLt path.
pub fn applies(compute: DType, act: DType) -> bool {
    compute == DType::F16 && act == DType::F16
}
