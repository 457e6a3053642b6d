//! AVX-512 kernels (F/BW/VL, and BF16 or VNNI where the precision asks for them), with
//! `std::arch` intrinsics behind `#[target_feature]`: the GEMM micro-kernels (f32 FMA, bf16
//! `vdpbf16ps`, int8 `vpdpbusd`), each holding a 14 x 32 tile of C in 28 of the 32 zmm
//! registers with fused epilogues, and softmax, GELU and layer norm over whole registers.
//! Callers check the CPU first ([`super::kernels`]); nothing here is reached otherwise.

use std::arch::x86_64::*;

use crate::embed::gelu::{ERF_P, ERF_Q};

use super::gemm::{row_ptrs, I8Scales, Store};
use super::pack::NR;

/// Rows of the micro-kernels' tile: 14 x 2 accumulators + 2 weight registers + 1 broadcast.
pub const MR: usize = 14;

#[inline]
#[target_feature(enable = "avx512f")]
fn splat(x: f32) -> __m512 {
    _mm512_set1_ps(x)
}

/// GELU(x) = x/2 (1 + erf(x / sqrt 2)), with the rational erf of [`crate::embed::gelu::erf`].
#[inline]
#[target_feature(enable = "avx512f")]
fn gelu(x: __m512) -> __m512 {
    let z = _mm512_mul_ps(x, splat(std::f32::consts::FRAC_1_SQRT_2));
    let z = _mm512_max_ps(_mm512_min_ps(z, splat(4.0)), splat(-4.0));
    let z2 = _mm512_mul_ps(z, z);
    let mut p = splat(ERF_P[0]);
    for c in &ERF_P[1..] {
        p = _mm512_fmadd_ps(z2, p, splat(*c));
    }
    let mut q = splat(ERF_Q[0]);
    for c in &ERF_Q[1..] {
        q = _mm512_fmadd_ps(z2, q, splat(*c));
    }
    let erf = _mm512_div_ps(_mm512_mul_ps(z, p), q);
    _mm512_mul_ps(_mm512_mul_ps(splat(0.5), x), _mm512_add_ps(splat(1.0), erf))
}

/// Lane masks for the first `cols` of 32 columns.
#[inline(always)]
fn masks(cols: usize) -> (__mmask16, __mmask16) {
    let bits = if cols >= 32 {
        u32::MAX
    } else {
        (1u32 << cols) - 1
    };
    (bits as u16, (bits >> 16) as u16)
}

/// Row i of the tile: the product (v0, v1), plus C unless this is the first K block, plus the
/// bias and the residual and through GELU on the last one, stored through the column masks.
///
/// # Safety
/// The store's pointers are valid for row i and the masked columns.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn store_row(st: &Store, i: usize, v: [__m512; 2], m: (__mmask16, __mmask16)) {
    let c = st.c.add(i * st.ldc);
    let (mut a, mut b) = (v[0], v[1]);
    if !st.first {
        a = _mm512_add_ps(a, _mm512_maskz_loadu_ps(m.0, c));
        b = _mm512_add_ps(b, _mm512_maskz_loadu_ps(m.1, c.add(16)));
    }
    if st.last {
        if !st.bias.is_null() {
            a = _mm512_add_ps(a, _mm512_maskz_loadu_ps(m.0, st.bias));
            b = _mm512_add_ps(b, _mm512_maskz_loadu_ps(m.1, st.bias.add(16)));
        }
        if !st.residual.is_null() {
            let r = st.residual.add(i * st.ldr);
            a = _mm512_add_ps(a, _mm512_maskz_loadu_ps(m.0, r));
            b = _mm512_add_ps(b, _mm512_maskz_loadu_ps(m.1, r.add(16)));
        }
        if st.gelu {
            a = gelu(a);
            b = gelu(b);
        }
    }
    _mm512_mask_storeu_ps(c, m.0, a);
    _mm512_mask_storeu_ps(c.add(16), m.1, b);
}

/// f32: tile = A [rows][lda] (kc columns) · B [kc][32] (rows ldb apart), then the store's
/// epilogue.
///
/// # Safety
/// `a` holds `st.rows` (1..=MR) rows of kc values at stride lda, `b` kc rows of 32 values at
/// stride ldb; the store's pointers are valid; the CPU has AVX-512F.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn micro_f32(
    kc: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    st: &Store,
) {
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    let rp: [_; MR] = row_ptrs(a, lda, st.rows);
    let mut bp = b;
    for kk in 0..kc {
        let b0 = _mm512_loadu_ps(bp);
        let b1 = _mm512_loadu_ps(bp.add(16));
        for (row, p) in acc.iter_mut().zip(&rp) {
            let av = _mm512_set1_ps(*p.add(kk));
            row[0] = _mm512_fmadd_ps(av, b0, row[0]);
            row[1] = _mm512_fmadd_ps(av, b1, row[1]);
        }
        bp = bp.add(ldb);
    }
    let m = masks(st.cols);
    for (i, row) in acc.iter().enumerate().take(st.rows) {
        store_row(st, i, *row, m);
    }
}

/// bf16: tile = A [rows][lda] (`pairs` lanes of two bf16) · B [pairs][32], then the epilogue.
///
/// # Safety
/// As [`micro_f32`], in 32-bit lanes; the CPU has AVX512-BF16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub unsafe fn micro_bf16(pairs: usize, a: *const u32, lda: usize, b: *const u32, st: &Store) {
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    let rp: [_; MR] = row_ptrs(a, lda, st.rows);
    let mut bp = b;
    for q in 0..pairs {
        let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(bp.cast()));
        let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(bp.add(16).cast()));
        for (row, p) in acc.iter_mut().zip(&rp) {
            let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(*p.add(q) as i32));
            row[0] = _mm512_dpbf16_ps(row[0], av, b0);
            row[1] = _mm512_dpbf16_ps(row[1], av, b1);
        }
        bp = bp.add(NR);
    }
    let m = masks(st.cols);
    for (i, row) in acc.iter().enumerate().take(st.rows) {
        store_row(st, i, *row, m);
    }
}

/// int8: i32 sums of A [rows][lda] (`quads` lanes of four u8 with the row's zero point z)
/// · B [quads][32] (i8), then tile = row scale x column scale x (sum - z x column sum),
/// then the epilogue.
///
/// # Safety
/// As [`micro_f32`], in 32-bit lanes, with `s` valid for the tile's rows and 32 columns; the
/// CPU has AVX512-VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn micro_i8(
    quads: usize,
    a: *const u32,
    lda: usize,
    b: *const u32,
    st: &Store,
    s: &I8Scales,
) {
    let mut acc = [[_mm512_setzero_si512(); 2]; MR];
    let rp: [_; MR] = row_ptrs(a, lda, st.rows);
    let mut bp = b;
    for q in 0..quads {
        let b0 = _mm512_loadu_si512(bp.cast());
        let b1 = _mm512_loadu_si512(bp.add(16).cast());
        for (row, p) in acc.iter_mut().zip(&rp) {
            let av = _mm512_set1_epi32(*p.add(q) as i32);
            row[0] = _mm512_dpbusd_epi32(row[0], av, b0);
            row[1] = _mm512_dpbusd_epi32(row[1], av, b1);
        }
        bp = bp.add(NR);
    }
    let m = masks(st.cols);
    for (i, row) in acc.iter().enumerate().take(st.rows) {
        store_i8_row(st, i, *row, s, m);
    }
}

/// Row i of an int8 tile: row scale x column scale x (sum - zero point x column sum), then
/// the epilogue.
///
/// # Safety
/// As [`store_row`], with `s` valid for row i and 32 columns; the CPU has AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn store_i8_row(
    st: &Store,
    i: usize,
    row: [__m512i; 2],
    s: &I8Scales,
    m: (__mmask16, __mmask16),
) {
    let (sum0, sum1) = (
        _mm512_loadu_si512(s.sums.cast()),
        _mm512_loadu_si512(s.sums.add(16).cast()),
    );
    let (cs0, cs1) = (_mm512_loadu_ps(s.cols), _mm512_loadu_ps(s.cols.add(16)));
    let z = _mm512_set1_epi32(*s.zeros.add(i));
    let (sh0, sh1) = (_mm512_mullo_epi32(z, sum0), _mm512_mullo_epi32(z, sum1));
    let rs = _mm512_set1_ps(*s.rows.add(i));
    let v0 = _mm512_mul_ps(
        _mm512_cvtepi32_ps(_mm512_sub_epi32(row[0], sh0)),
        _mm512_mul_ps(rs, cs0),
    );
    let v1 = _mm512_mul_ps(
        _mm512_cvtepi32_ps(_mm512_sub_epi32(row[1], sh1)),
        _mm512_mul_ps(rs, cs1),
    );
    store_row(st, i, [v0, v1], m);
}

/// The store's rows of a block of f32 sums (32 to a row, as the AMX kernels leave them),
/// through the epilogue.
///
/// # Safety
/// `block` holds `st.rows` rows of 32 values; the store's pointers are valid; the CPU has
/// AVX-512F.
#[target_feature(enable = "avx512f")]
pub unsafe fn store_block_f32(st: &Store, block: *const f32) {
    let m = masks(st.cols);
    for i in 0..st.rows {
        let r = block.add(i * NR);
        store_row(st, i, [_mm512_loadu_ps(r), _mm512_loadu_ps(r.add(16))], m);
    }
}

/// As [`store_block_f32`] for a block of int8 i32 sums, scaled as [`micro_i8`] does.
///
/// # Safety
/// As [`store_block_f32`], with `s` valid for the tile's rows and 32 columns.
#[target_feature(enable = "avx512f")]
pub unsafe fn store_block_i8(st: &Store, block: *const i32, s: &I8Scales) {
    let m = masks(st.cols);
    for i in 0..st.rows {
        let r = block.add(i * NR);
        let row = [
            _mm512_loadu_si512(r.cast()),
            _mm512_loadu_si512(r.add(16).cast()),
        ];
        store_i8_row(st, i, row, s, m);
    }
}

/// The load mask of 16 lanes starting `at` values into a run of which `left` remain.
#[inline(always)]
fn lanes_left(left: usize, at: usize) -> u16 {
    if left >= at + 16 {
        0xFFFF
    } else if left > at {
        ((1u32 << (left - at)) - 1) as u16
    } else {
        0
    }
}

/// A row of f32 as bf16 pairs (round to nearest even): lane q = (x[2q], x[2q+1]), a zero
/// high half past the end of an odd row.
///
/// # Safety
/// `out` holds ceil(len / 2) lanes; the CPU has AVX512-BF16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub unsafe fn to_bf16_pairs(row: &[f32], out: &mut [u32]) {
    let n = row.len();
    let (src, dst) = (row.as_ptr(), out.as_mut_ptr());
    let mut i = 0;
    while i < n {
        let left = n - i;
        let m = |from: usize| lanes_left(left, from);
        let lo = _mm512_maskz_loadu_ps(m(0), src.add(i));
        let hi = _mm512_maskz_loadu_ps(m(16), src.add(i + 16));
        let packed: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
        let lanes = left.min(32).div_ceil(2);
        let lane_mask = if lanes >= 16 {
            0xFFFF
        } else {
            ((1u32 << lanes) - 1) as u16
        };
        _mm512_mask_storeu_epi32(dst.add(i / 2).cast(), lane_mask, packed);
        i += 32;
    }
}

/// Row `i` (of 32) of a block of A in AMX tiles ([`super::amx::tiled`]): the row's k values
/// as bf16 pairs, 16 lanes a step at that step's tile row, zeros past k to `steps` x 16 lanes.
///
/// # Safety
/// `block` holds [`super::amx::tiled`]`(steps)` lanes; k <= steps x 32; i < 32; the CPU has
/// AVX512-BF16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub unsafe fn to_bf16_tile_row(row: &[f32], steps: usize, block: &mut [u32], i: usize) {
    let k = row.len();
    debug_assert!(k <= steps * 32 && i < 32 && block.len() >= super::amx::tiled(steps));
    let dst = block.as_mut_ptr().add((i / 16) * 256 + (i % 16) * 16);
    for s in 0..steps {
        let from = s * 32;
        let left = k.saturating_sub(from).min(32);
        let mask = |at: usize| lanes_left(left, at);
        // Masked loads read nothing past the row; lanes past it are zero pairs.
        let lo = _mm512_maskz_loadu_ps(mask(0), row.as_ptr().add(from.min(k)));
        let hi = _mm512_maskz_loadu_ps(mask(16), row.as_ptr().add((from + 16).min(k)));
        let packed: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
        _mm512_storeu_si512(dst.add(s * 512).cast(), packed);
    }
}

/// Column j of a bf16 B panel from k values contiguous in memory (a key's row of K, for
/// K^T): lane (q, j) = (x[2q], x[2q + 1]), lane rows [`NR`] lanes apart; a zero high half past
/// an odd k.
///
/// # Safety
/// `panel` holds ceil(k / 2) lane rows of NR lanes; j < NR; the CPU has AVX512-BF16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub unsafe fn bf16_panel_column(x: &[f32], panel: &mut [u32], j: usize) {
    let k = x.len();
    debug_assert!(j < NR && panel.len() >= k.div_ceil(2) * NR);
    // Lane q of a 16-lane group goes to lane row q: NR lanes apart.
    let rows = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(NR as i32),
    );
    let mut from = 0;
    while from < k {
        let left = (k - from).min(32);
        let mask = |at: usize| lanes_left(left, at);
        let lo = _mm512_maskz_loadu_ps(mask(0), x.as_ptr().add(from));
        let hi = _mm512_maskz_loadu_ps(mask(16), x.as_ptr().add((from + 16).min(k)));
        let packed: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
        let lanes = left.div_ceil(2);
        let keep = if lanes >= 16 {
            0xFFFF
        } else {
            ((1u32 << lanes) - 1) as u16
        };
        let base = panel.as_mut_ptr().add((from / 2) * NR + j);
        _mm512_mask_i32scatter_epi32::<4>(base.cast(), keep, rows, packed);
        from += 32;
    }
}

/// A row quantised to u8 with a zero point, four per lane (the zero point past the end):
/// symmetric (x ~ (q - 128) s, s = max |x| / 127) or asymmetric (x ~ (q - z) s over
/// [min(x, 0), max(x, 0)] in 255 steps: twice the resolution for one-signed data such as
/// GELU's output). Input channels whose `keep` is 0 are quantised as 0 (they are computed
/// apart, in f32). Returns (s, z).
///
/// # Safety
/// `out` holds ceil(len / 4) lanes, `keep` (if any) len values; the CPU has AVX-512 F/BW/VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn quantize_row(
    row: &[f32],
    keep: Option<&[f32]>,
    asymmetric: bool,
    out: &mut [u32],
) -> (f32, i32) {
    let n = row.len();
    let src = row.as_ptr();
    let tail = |i: usize| -> __mmask16 {
        if n - i >= 16 {
            0xFFFF
        } else {
            ((1u32 << (n - i)) - 1) as u16
        }
    };
    let load = |i: usize| {
        let x = _mm512_maskz_loadu_ps(tail(i), src.add(i));
        match keep {
            Some(k) => _mm512_mul_ps(x, _mm512_maskz_loadu_ps(tail(i), k.as_ptr().add(i))),
            None => x,
        }
    };
    let (mut vmax, mut vmin) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    for i in (0..n).step_by(16) {
        let x = load(i);
        vmax = _mm512_max_ps(vmax, x);
        vmin = _mm512_min_ps(vmin, x);
    }
    let (hi, lo) = (_mm512_reduce_max_ps(vmax), _mm512_reduce_min_ps(vmin));
    let (scale, zero) = if asymmetric {
        let s = if hi > lo { (hi - lo) / 255.0 } else { 1.0 };
        (s, (-lo / s).round().clamp(0.0, 255.0) as i32)
    } else {
        let max = hi.max(-lo);
        (if max > 0.0 { max / 127.0 } else { 1.0 }, 128)
    };
    let inv = splat(1.0 / scale);
    let (z, top) = (_mm512_set1_epi32(zero), _mm512_set1_epi32(255));
    let dst = out.as_mut_ptr().cast::<u8>();
    let bytes = out.len() * 4;
    for i in (0..bytes).step_by(16) {
        let x = if i < n { load(i) } else { _mm512_setzero_ps() };
        let q = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x, inv)), z);
        let q = _mm512_min_epi32(_mm512_max_epi32(q, _mm512_setzero_si512()), top);
        let left = bytes - i;
        let m = if left >= 16 {
            0xFFFF
        } else {
            ((1u32 << left) - 1) as u16
        };
        _mm_mask_storeu_epi8(dst.add(i).cast(), m, _mm512_cvtepi32_epi8(q));
    }
    (scale, zero)
}

/// The largest |x| of each column over `rows` ([.., k]), folded into `max` (k values).
///
/// # Safety
/// The CPU has AVX-512F; `max` holds k values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn column_abs_max(rows: &[f32], k: usize, max: &mut [f32]) {
    let full = k / 16 * 16;
    for row in rows.chunks_exact(k) {
        for i in (0..full).step_by(16) {
            let m = _mm512_max_ps(
                _mm512_loadu_ps(max.as_ptr().add(i)),
                _mm512_abs_ps(_mm512_loadu_ps(row.as_ptr().add(i))),
            );
            _mm512_storeu_ps(max.as_mut_ptr().add(i), m);
        }
        for i in full..k {
            max[i] = max[i].max(row[i].abs());
        }
    }
}

/// e^x for x <= 0, the method of [`super::exp_nonpositive`]: 2^n x e^y, |y| <= ln 2 / 2.
#[inline]
#[target_feature(enable = "avx512f")]
fn exp_nonpositive(x: __m512) -> __m512 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = _mm512_max_ps(x, splat(-87.0));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, splat(std::f32::consts::LOG2_E)),
    );
    let y = _mm512_fnmadd_ps(n, splat(LN2_LO), _mm512_fnmadd_ps(n, splat(LN2_HI), x));
    let mut p = _mm512_fmadd_ps(y, splat(1.0 / 5040.0), splat(1.0 / 720.0));
    for coef in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm512_fmadd_ps(y, p, splat(coef));
    }
    _mm512_scalef_ps(p, n)
}

/// Softmax of one row in place.
///
/// # Safety
/// The CPU has AVX-512F.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn softmax(row: &mut [f32]) {
    let n = row.len();
    let p = row.as_mut_ptr();
    let tail = (1u32 << (n % 16)) as u16 - 1;
    let full = n / 16 * 16;
    let mut vmax = splat(f32::NEG_INFINITY);
    for i in (0..full).step_by(16) {
        vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(p.add(i)));
    }
    if tail != 0 {
        vmax = _mm512_mask_max_ps(vmax, tail, vmax, _mm512_maskz_loadu_ps(tail, p.add(full)));
    }
    let max = splat(_mm512_reduce_max_ps(vmax));
    let mut sum = _mm512_setzero_ps();
    for i in (0..full).step_by(16) {
        let e = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(p.add(i)), max));
        _mm512_storeu_ps(p.add(i), e);
        sum = _mm512_add_ps(sum, e);
    }
    if tail != 0 {
        let e = exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, p.add(full)), max));
        _mm512_mask_storeu_ps(p.add(full), tail, e);
        sum = _mm512_mask_add_ps(sum, tail, sum, e);
    }
    let inv = splat(1.0 / _mm512_reduce_add_ps(sum));
    for i in (0..full).step_by(16) {
        _mm512_storeu_ps(p.add(i), _mm512_mul_ps(_mm512_loadu_ps(p.add(i)), inv));
    }
    if tail != 0 {
        let v = _mm512_maskz_loadu_ps(tail, p.add(full));
        _mm512_mask_storeu_ps(p.add(full), tail, _mm512_mul_ps(v, inv));
    }
}

/// Layer norm of each row of `x` ([rows, h]) in place.
///
/// # Safety
/// The CPU has AVX-512F; weight and bias hold h values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn layer_norm_rows(x: &mut [f32], h: usize, weight: &[f32], bias: &[f32], eps: f32) {
    let full = h / 16 * 16;
    let tail = (1u32 << (h % 16)) as u16 - 1;
    let (w, b) = (weight.as_ptr(), bias.as_ptr());
    for row in x.chunks_exact_mut(h) {
        let p = row.as_mut_ptr();
        let mut sum = _mm512_setzero_ps();
        for i in (0..full).step_by(16) {
            sum = _mm512_add_ps(sum, _mm512_loadu_ps(p.add(i)));
        }
        sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps(tail, p.add(full)));
        let mean = splat(_mm512_reduce_add_ps(sum) / h as f32);
        let mut var = _mm512_setzero_ps();
        for i in (0..full).step_by(16) {
            let d = _mm512_sub_ps(_mm512_loadu_ps(p.add(i)), mean);
            var = _mm512_fmadd_ps(d, d, var);
        }
        let d = _mm512_maskz_sub_ps(tail, _mm512_maskz_loadu_ps(tail, p.add(full)), mean);
        var = _mm512_fmadd_ps(d, d, var);
        let inv = splat(1.0 / (_mm512_reduce_add_ps(var) / h as f32 + eps).sqrt());
        for i in (0..full).step_by(16) {
            let v = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(p.add(i)), mean), inv);
            let v = _mm512_fmadd_ps(v, _mm512_loadu_ps(w.add(i)), _mm512_loadu_ps(b.add(i)));
            _mm512_storeu_ps(p.add(i), v);
        }
        if tail != 0 {
            let v = _mm512_mul_ps(
                _mm512_sub_ps(_mm512_maskz_loadu_ps(tail, p.add(full)), mean),
                inv,
            );
            let v = _mm512_fmadd_ps(
                v,
                _mm512_maskz_loadu_ps(tail, w.add(full)),
                _mm512_maskz_loadu_ps(tail, b.add(full)),
            );
            _mm512_mask_storeu_ps(p.add(full), tail, v);
        }
    }
}

/// Exact GELU in place.
///
/// # Safety
/// The CPU has AVX-512F.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn gelu_slice(x: &mut [f32]) {
    let mut chunks = x.chunks_exact_mut(16);
    for c in &mut chunks {
        _mm512_storeu_ps(c.as_mut_ptr(), gelu(_mm512_loadu_ps(c.as_ptr())));
    }
    for v in chunks.into_remainder() {
        *v = _mm512_cvtss_f32(gelu(splat(*v)));
    }
}

/// Peak-rate probe: `iters` rounds of 24 independent 16-lane FMA chains (enough to cover the
/// FMA latency on two units). Returns a value that depends on every FMA, so none is elided.
///
/// # Safety
/// The CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
pub unsafe fn fma_probe(iters: usize) -> f32 {
    let mut acc = [_mm512_setzero_ps(); 24];
    let (a, b) = (splat(0.999_999), splat(1e-7));
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = _mm512_fmadd_ps(*x, a, b);
        }
    }
    let mut sum = _mm512_setzero_ps();
    for x in acc {
        sum = _mm512_add_ps(sum, x);
    }
    _mm512_reduce_add_ps(sum)
}

#[cfg(test)]
mod tests {
    use super::super::kernels::KernelPath;

    #[test]
    fn softmax_layer_norm_and_gelu_match_the_scalar_ones() {
        if !KernelPath::Avx512.supported() {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        for n in [1, 5, 16, 33, 128, 200] {
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.7)
                .collect();
            let mut ours = x.clone();
            let mut scalar = x.clone();
            // SAFETY: the CPU has AVX-512 (checked above).
            unsafe { super::softmax(&mut ours) };
            super::super::softmax_scalar(&mut scalar);
            for (a, b) in ours.iter().zip(&scalar) {
                assert!((a - b).abs() < 1e-6, "softmax of {n}: {a} vs {b}");
            }
            let w: Vec<f32> = (0..n).map(|i| 1.0 + i as f32 * 0.01).collect();
            let b: Vec<f32> = (0..n).map(|i| i as f32 * -0.02).collect();
            let mut ours = x.repeat(3);
            let mut scalar = ours.clone();
            // SAFETY: as above.
            unsafe { super::layer_norm_rows(&mut ours, n, &w, &b, 1e-12) };
            super::super::layer_norm_scalar(&mut scalar, n, &w, &b, 1e-12);
            for (a, b) in ours.iter().zip(&scalar) {
                assert!((a - b).abs() < 1e-4, "layer norm of {n}: {a} vs {b}");
            }
            let mut ours = x.clone();
            // SAFETY: as above.
            unsafe { super::gelu_slice(&mut ours) };
            for (a, v) in ours.iter().zip(&x) {
                let b = crate::embed::gelu::gelu(*v);
                assert!((a - b).abs() < 1e-6, "gelu({v}): {a} vs {b}");
            }
        }
    }
}
