//! GELU (the exact, erf-based one BERT uses) as a fast CPU op.
//!
//! candle's CPU `gelu_erf` calls a scalar erf per element; this op uses a rational
//! approximation of erf (the one XLA and Eigen use for f32, max error about 1e-7 on the
//! clamped range) that the compiler vectorises, and fuses the bias add of the layer before.

use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

/// The numerator of erf's rational approximation, a polynomial in x^2, highest power first.
pub const ERF_P: [f32; 7] = [
    -2.726_142_3e-10,
    2.770_681_4e-8,
    -2.101_024e-6,
    -5.692_506_4e-5,
    -7.349_906_3e-4,
    -2.954_600_1e-3,
    -1.609_603_3e-2,
];
/// Its denominator, highest power first.
pub const ERF_Q: [f32; 5] = [
    -1.456_607_2e-5,
    -2.133_740_6e-4,
    -1.682_827e-3,
    -7.373_329_5e-3,
    -1.426_474e-2,
];

/// erf(x) for f32, |error| < 2e-7: x * P(x^2) / Q(x^2) on x clamped to [-4, 4]. The vector
/// kernels (`cpu/avx2.rs`, `cpu/avx512.rs`) evaluate the same polynomials.
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let p = ERF_P[1..].iter().fold(ERF_P[0], |p, &c| x2 * p + c);
    let q = ERF_Q[1..].iter().fold(ERF_Q[0], |q, &c| x2 * q + c);
    x * p / q
}

#[inline(always)]
pub fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

#[inline(always)]
fn bias_gelu_rows(out: &mut [f32], x: &[f32], bias: &[f32]) {
    let n = bias.len();
    for (o_row, x_row) in out.chunks_exact_mut(n).zip(x.chunks_exact(n)) {
        for ((o, &v), &b) in o_row.iter_mut().zip(x_row).zip(bias) {
            *o = gelu(v + b);
        }
    }
}

/// [`bias_gelu_rows`] compiled for AVX2 and FMA.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn bias_gelu_rows_avx2(out: &mut [f32], x: &[f32], bias: &[f32]) {
    bias_gelu_rows(out, x, bias)
}

fn bias_gelu_dispatch(out: &mut [f32], x: &[f32], bias: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports the features the function is compiled for.
        unsafe { bias_gelu_rows_avx2(out, x, bias) };
        return;
    }
    bias_gelu_rows(out, x, bias)
}

#[inline(always)]
fn gelu_slice(x: &mut [f32]) {
    for v in x {
        *v = gelu(*v);
    }
}

/// [`gelu_slice`] compiled for AVX2 and FMA.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gelu_slice_avx2(x: &mut [f32]) {
    gelu_slice(x)
}

/// Exact GELU in place, over the rayon pool.
pub fn gelu_in_place(x: &mut [f32]) {
    use rayon::prelude::*;
    x.par_chunks_mut(16384).for_each(|c| {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports the features the function is compiled for.
            unsafe { gelu_slice_avx2(c) };
            return;
        }
        gelu_slice(c)
    });
}

/// `gelu(x + bias)` for a contiguous f32 `x` of shape [.., n] and `bias` of shape [n].
struct BiasGelu;

impl CustomOp2 for BiasGelu {
    fn name(&self) -> &'static str {
        "bias-gelu"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        bs: &CpuStorage,
        bl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (CpuStorage::F32(x), CpuStorage::F32(b)) = (xs, bs) else {
            candle_core::bail!("bias-gelu: f32 only");
        };
        let (Some((x0, x1)), Some((b0, b1))) = (xl.contiguous_offsets(), bl.contiguous_offsets())
        else {
            candle_core::bail!("bias-gelu: contiguous inputs only");
        };
        let (x, b) = (&x[x0..x1], &b[b0..b1]);
        if b.is_empty() || x.len() % b.len() != 0 {
            candle_core::bail!("bias-gelu: bias of {} does not divide {}", b.len(), x.len());
        }
        let mut out = vec![0f32; x.len()];
        // Rows are independent: split them over the rayon pool in large pieces.
        let n = b.len();
        let rows_per_task = (16384 / n).max(1);
        use rayon::prelude::*;
        out.par_chunks_mut(rows_per_task * n)
            .zip(x.par_chunks(rows_per_task * n))
            .for_each(|(o, xi)| bias_gelu_dispatch(o, xi, b));
        Ok((CpuStorage::F32(out), xl.shape().clone()))
    }
}

/// gelu(x + bias), exact (erf) GELU. Uses the fast op on CPU f32, candle's kernels elsewhere.
pub fn bias_gelu(x: &Tensor, bias: &Tensor) -> Result<Tensor> {
    if x.device().is_cpu() && x.dtype() == candle_core::DType::F32 {
        x.contiguous()?.apply_op2_no_bwd(bias, &BiasGelu)
    } else {
        x.broadcast_add(bias)?.gelu_erf()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// erf by its series (small |x|) and continued fraction (large |x|), in f64.
    fn erf_reference(x: f64) -> f64 {
        let (s, ax) = (x.signum(), x.abs());
        if ax < 3.0 {
            let mut term = ax;
            let mut sum = ax;
            let mut n = 0.0;
            loop {
                n += 1.0;
                term *= -ax * ax / n;
                let add = term / (2.0 * n + 1.0);
                sum += add;
                if add.abs() < 1e-17 {
                    break;
                }
            }
            s * sum * 2.0 / std::f64::consts::PI.sqrt()
        } else {
            // erfc continued fraction.
            let mut f = 0.0;
            for k in (1..60).rev() {
                f = (k as f64 / 2.0) / (ax + f);
            }
            let erfc = (-ax * ax).exp() / (std::f64::consts::PI.sqrt() * (ax + f));
            s * (1.0 - erfc)
        }
    }

    #[test]
    fn erf_is_accurate() {
        let mut worst = 0f64;
        for i in -6000..=6000 {
            let x = i as f64 / 1000.0;
            let err = (f64::from(erf(x as f32)) - erf_reference(x)).abs();
            worst = worst.max(err);
        }
        assert!(worst < 5e-7, "max erf error {worst}");
    }

    #[test]
    fn bias_gelu_matches_candle() {
        let dev = candle_core::Device::Cpu;
        let x = Tensor::randn(0f32, 3.0, (7, 33), &dev).unwrap();
        let b = Tensor::randn(0f32, 1.0, 33, &dev).unwrap();
        let ours = bias_gelu(&x, &b).unwrap();
        let reference = x.broadcast_add(&b).unwrap().gelu_erf().unwrap();
        let diff = (ours - reference)
            .unwrap()
            .abs()
            .unwrap()
            .max_keepdim(1)
            .unwrap()
            .max(0)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()[0];
        assert!(diff < 1e-5, "max difference {diff}");
    }
}
