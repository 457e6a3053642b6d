//! AVX2 + FMA kernels, with `std::arch` intrinsics behind `#[target_feature]`: the f32 GEMM
//! micro-kernel (a 6 x 32 tile of C computed as two 6 x 16 halves, each holding 12 of the 16
//! ymm registers as accumulators, with the fused epilogue of [`super::gemm`]), GELU over whole
//! registers for that epilogue, softmax, layer norm, and the FMA probe of the roofline. Callers check
//! the CPU first ([`super::kernels`]); nothing here is reached otherwise.

use std::arch::x86_64::*;

use crate::embed::gelu::{ERF_P, ERF_Q};

use super::gemm::{row_ptrs, Store};

/// Rows of the micro-kernel's tile: 6 x 2 accumulators + 2 weight registers + 1 broadcast.
pub const MR: usize = 6;

/// Columns of one half of the tile (two ymm registers).
const HALF: usize = 16;

#[inline]
#[target_feature(enable = "avx2,fma")]
fn splat(x: f32) -> __m256 {
    _mm256_set1_ps(x)
}

/// GELU(x) = x/2 (1 + erf(x / sqrt 2)), with the rational erf of [`crate::embed::gelu::erf`]
/// (the AVX-512 kernel's polynomial, eight lanes at a time).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn gelu(x: __m256) -> __m256 {
    let z = _mm256_mul_ps(x, splat(std::f32::consts::FRAC_1_SQRT_2));
    let z = _mm256_max_ps(_mm256_min_ps(z, splat(4.0)), splat(-4.0));
    let z2 = _mm256_mul_ps(z, z);
    let mut p = splat(ERF_P[0]);
    for c in &ERF_P[1..] {
        p = _mm256_fmadd_ps(z2, p, splat(*c));
    }
    let mut q = splat(ERF_Q[0]);
    for c in &ERF_Q[1..] {
        q = _mm256_fmadd_ps(z2, q, splat(*c));
    }
    let erf = _mm256_div_ps(_mm256_mul_ps(z, p), q);
    _mm256_mul_ps(_mm256_mul_ps(splat(0.5), x), _mm256_add_ps(splat(1.0), erf))
}

/// Lane mask of the first `cols` (0..=8) of eight lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn lanes(cols: usize) -> __m256i {
    _mm256_cmpgt_epi32(
        _mm256_set1_epi32(cols as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    )
}

/// 16 values at `p`: two whole registers, or the first `cols` through lane masks.
///
/// # Safety
/// `p` readable for `cols` (at most 16) values, `m` their masks; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load(p: *const f32, cols: usize, m: (__m256i, __m256i)) -> [__m256; 2] {
    if cols == HALF {
        [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))]
    } else {
        [
            _mm256_maskload_ps(p, m.0),
            _mm256_maskload_ps(p.add(8), m.1),
        ]
    }
}

/// Row i of a half tile (columns `c0..c0 + cols` of the tile): the product, plus C unless this
/// is the first K block, plus the bias and the residual and through GELU on the last one.
///
/// # Safety
/// The store's pointers are valid for row i and those columns.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn store_row(st: &Store, i: usize, c0: usize, cols: usize, v: [__m256; 2]) {
    let m = (lanes(cols), lanes(cols.saturating_sub(8)));
    let c = st.c.add(i * st.ldc + c0);
    let [mut a, mut b] = v;
    let add = |a: &mut __m256, b: &mut __m256, x: [__m256; 2]| {
        *a = _mm256_add_ps(*a, x[0]);
        *b = _mm256_add_ps(*b, x[1]);
    };
    if !st.first {
        add(&mut a, &mut b, load(c, cols, m));
    }
    if st.last {
        if !st.bias.is_null() {
            add(&mut a, &mut b, load(st.bias.add(c0), cols, m));
        }
        if !st.residual.is_null() {
            add(
                &mut a,
                &mut b,
                load(st.residual.add(i * st.ldr + c0), cols, m),
            );
        }
        if st.gelu {
            a = gelu(a);
            b = gelu(b);
        }
    }
    if cols == HALF {
        _mm256_storeu_ps(c, a);
        _mm256_storeu_ps(c.add(8), b);
    } else {
        _mm256_maskstore_ps(c, m.0, a);
        _mm256_maskstore_ps(c.add(8), m.1, b);
    }
}

/// f32: tile = A [rows][lda] (kc columns) · B [kc][32] (rows ldb apart), then the store's
/// epilogue; each 16-column half of the panel in its own pass over K.
///
/// # Safety
/// `a` holds `st.rows` (1..=MR) rows of kc values at stride lda, `b` kc rows of 32 values at
/// stride ldb; the store's pointers are valid; the CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn micro_f32(
    kc: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    st: &Store,
) {
    let rp: [*const f32; MR] = row_ptrs(a, lda, st.rows);
    for c0 in (0..st.cols).step_by(HALF) {
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        let mut bp = b.add(c0);
        for kk in 0..kc {
            let b0 = _mm256_loadu_ps(bp);
            let b1 = _mm256_loadu_ps(bp.add(8));
            for (row, p) in acc.iter_mut().zip(&rp) {
                let av = _mm256_broadcast_ss(&*p.add(kk));
                row[0] = _mm256_fmadd_ps(av, b0, row[0]);
                row[1] = _mm256_fmadd_ps(av, b1, row[1]);
            }
            bp = bp.add(ldb);
        }
        let cols = HALF.min(st.cols - c0);
        for (i, row) in acc.iter().enumerate().take(st.rows) {
            store_row(st, i, c0, cols, *row);
        }
    }
}

/// Horizontal sum of eight lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn sum_lanes(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// Largest of eight lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn max_lanes(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
}

/// e^x for x <= 0, the method of [`super::exp_nonpositive`]: 2^n x e^y, |y| <= ln 2 / 2, 2^n
/// built in the exponent bits (n >= -126 after the clamp at -87).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn exp_nonpositive(x: __m256) -> __m256 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = _mm256_max_ps(x, splat(-87.0));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        splat(std::f32::consts::LOG2_E),
    ));
    let y = _mm256_fnmadd_ps(n, splat(LN2_LO), _mm256_fnmadd_ps(n, splat(LN2_HI), x));
    let mut p = _mm256_fmadd_ps(y, splat(1.0 / 5040.0), splat(1.0 / 720.0));
    for coef in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm256_fmadd_ps(y, p, splat(coef));
    }
    let two_n = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    _mm256_mul_ps(p, _mm256_castsi256_ps(two_n))
}

/// Softmax of one row in place.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn softmax(row: &mut [f32]) {
    let full = row.len() - row.len() % 8;
    let p = row.as_mut_ptr();
    let mut vmax = splat(f32::NEG_INFINITY);
    for i in (0..full).step_by(8) {
        vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(p.add(i)));
    }
    let max = row[full..].iter().fold(max_lanes(vmax), |m, &v| m.max(v));
    let mut sum = _mm256_setzero_ps();
    for i in (0..full).step_by(8) {
        let e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), splat(max)));
        _mm256_storeu_ps(p.add(i), e);
        sum = _mm256_add_ps(sum, e);
    }
    let mut total = sum_lanes(sum);
    for v in &mut row[full..] {
        *v = super::exp_nonpositive(*v - max);
        total += *v;
    }
    let inv = 1.0 / total;
    for i in (0..full).step_by(8) {
        _mm256_storeu_ps(
            p.add(i),
            _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), splat(inv)),
        );
    }
    for v in &mut row[full..] {
        *v *= inv;
    }
}

/// Layer norm of rows [.., h] in place: (x - mean) / sqrt(var + eps) * weight + bias.
///
/// # Safety
/// `x.len()` is a multiple of h; weight and bias hold h values; the CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn layer_norm_rows(x: &mut [f32], h: usize, weight: &[f32], bias: &[f32], eps: f32) {
    assert!(weight.len() >= h && bias.len() >= h);
    let full = h - h % 8;
    for row in x.chunks_exact_mut(h) {
        let p = row.as_mut_ptr();
        let mut sum = _mm256_setzero_ps();
        for i in (0..full).step_by(8) {
            sum = _mm256_add_ps(sum, _mm256_loadu_ps(p.add(i)));
        }
        let mean = (sum_lanes(sum) + row[full..].iter().sum::<f32>()) / h as f32;
        let mut var = _mm256_setzero_ps();
        for i in (0..full).step_by(8) {
            let d = _mm256_sub_ps(_mm256_loadu_ps(p.add(i)), splat(mean));
            var = _mm256_fmadd_ps(d, d, var);
        }
        let tail: f32 = row[full..].iter().map(|v| (v - mean) * (v - mean)).sum();
        let inv = 1.0 / ((sum_lanes(var) + tail) / h as f32 + eps).sqrt();
        for i in (0..full).step_by(8) {
            let v = _mm256_mul_ps(
                _mm256_sub_ps(_mm256_loadu_ps(p.add(i)), splat(mean)),
                splat(inv),
            );
            let v = _mm256_fmadd_ps(
                v,
                _mm256_loadu_ps(weight.as_ptr().add(i)),
                _mm256_loadu_ps(bias.as_ptr().add(i)),
            );
            _mm256_storeu_ps(p.add(i), v);
        }
        for j in full..h {
            row[j] = (row[j] - mean) * inv * weight[j] + bias[j];
        }
    }
}

/// Peak-rate probe: `iters` rounds of 12 independent 8-lane FMA chains (enough to cover the
/// FMA latency on two units). Returns a value that depends on every FMA, so none is elided.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn fma_probe(iters: usize) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 12];
    let (a, b) = (splat(0.999_999), splat(1e-7));
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = _mm256_fmadd_ps(*x, a, b);
        }
    }
    let mut sum = _mm256_setzero_ps();
    for x in acc {
        sum = _mm256_add_ps(sum, x);
    }
    sum_lanes(sum)
}

#[cfg(test)]
mod tests {
    use super::super::kernels::KernelPath;

    #[test]
    fn softmax_matches_the_scalar_one() {
        if !KernelPath::Avx2.supported() {
            eprintln!("skipped: this CPU has no AVX2 and FMA");
            return;
        }
        for n in [1, 5, 8, 16, 33, 128, 200] {
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.7 - 40.0 * (i % 3) as f32)
                .collect();
            let mut ours = x.clone();
            // SAFETY: the CPU has AVX2 and FMA (checked above).
            unsafe { super::softmax(&mut ours) };
            let mut want = x;
            crate::embed::cpu::softmax_scalar(&mut want);
            for (o, e) in ours.iter().zip(&want) {
                assert!(
                    (o - e).abs() <= 1e-6 * (1.0 + e.abs()),
                    "softmax n={n}: {o} vs {e}"
                );
            }
        }
    }

    #[test]
    fn layer_norm_matches_the_scalar_one() {
        if !KernelPath::Avx2.supported() {
            eprintln!("skipped: this CPU has no AVX2 and FMA");
            return;
        }
        for h in [1, 5, 8, 33, 384, 390] {
            let x: Vec<f32> = (0..3 * h)
                .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.7)
                .collect();
            let w: Vec<f32> = (0..h).map(|i| 0.5 + (i % 7) as f32 * 0.1).collect();
            let b: Vec<f32> = (0..h).map(|i| (i % 5) as f32 * 0.01 - 0.02).collect();
            let mut ours = x.clone();
            // SAFETY: the CPU has AVX2 and FMA (checked above); the sizes match.
            unsafe { super::layer_norm_rows(&mut ours, h, &w, &b, 1e-12) };
            let mut want = x.clone();
            crate::embed::cpu::layer_norm_scalar(&mut want, h, &w, &b, 1e-12);
            for (o, e) in ours.iter().zip(&want) {
                assert!(
                    (o - e).abs() <= 1e-5 * (1.0 + e.abs()),
                    "layer norm h={h}: {o} vs {e}"
                );
            }
        }
    }
}
