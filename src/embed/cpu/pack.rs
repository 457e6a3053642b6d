//! Weights packed once, at load time, into the layout the GEMM micro-kernels stream: panels
//! of [`NR`] output columns, k-major within a panel, zero-padded, 64-byte aligned. In bf16,
//! two consecutive k share a 32-bit lane (`vdpbf16ps` pairs); in int8, four do (`vpdpbusd`
//! quads), with a scale and a column sum per output channel.

/// Output columns per panel: two AVX-512 registers of f32.
pub const NR: usize = 32;

/// A 64-byte aligned buffer of `T` (a cache line, the width of an AVX-512 load).
pub struct Aligned<T: Copy + Default> {
    raw: Vec<T>,
    offset: usize,
    len: usize,
}

impl<T: Copy + Default> Aligned<T> {
    pub fn zeroed(len: usize) -> Self {
        let pad = 64 / std::mem::size_of::<T>();
        let raw = vec![T::default(); len + pad];
        let misalign = raw.as_ptr() as usize % 64;
        let offset = if misalign == 0 {
            0
        } else {
            (64 - misalign) / std::mem::size_of::<T>()
        };
        Aligned { raw, offset, len }
    }

    pub fn as_slice(&self) -> &[T] {
        &self.raw[self.offset..self.offset + self.len]
    }

    pub fn as_mut_slice(&mut self) -> &mut [T] {
        &mut self.raw[self.offset..self.offset + self.len]
    }
}

/// Round half to even to bf16 (finite inputs; the encoder's weights and activations are).
#[inline(always)]
pub fn bf16_bits(x: f32) -> u32 {
    let b = x.to_bits();
    (b.wrapping_add(0x7FFF + ((b >> 16) & 1))) >> 16
}

/// The f32 a bf16 stands for.
#[inline(always)]
pub fn bf16_value(bits: u32) -> f32 {
    f32::from_bits(bits << 16)
}

/// Fill `data`'s panels of `len` values each, `fill(p, panel)` on the rayon pool.
fn in_parallel<T: Copy + Default + Send>(
    data: &mut Aligned<T>,
    len: usize,
    fill: impl Fn(usize, &mut [T]) + Sync,
) {
    use rayon::prelude::*;
    if len > 0 {
        data.as_mut_slice()
            .par_chunks_mut(len)
            .enumerate()
            .for_each(|(p, panel)| fill(p, panel));
    }
}

/// Panel `p` ([k][NR]) of B [k, n], element (r, c) at `src[r * row_stride + c * col_stride]`;
/// columns past n zero.
fn fill_panel(
    panel: &mut [f32],
    p: usize,
    src: &[f32],
    k: usize,
    n: usize,
    row_stride: usize,
    col_stride: usize,
) {
    let cols = (n - p * NR).min(NR);
    for r in 0..k {
        let dst = &mut panel[r * NR..(r + 1) * NR];
        for (j, d) in dst[..cols].iter_mut().enumerate() {
            *d = src[r * row_stride + (p * NR + j) * col_stride];
        }
        dst[cols..].fill(0.0);
    }
}

/// B [k, n], element (r, c) at `src[r * row_stride + c * col_stride]`, in f32 panels.
pub struct PackedF32 {
    pub data: Aligned<f32>,
    pub k: usize,
    pub n: usize,
}

impl PackedF32 {
    pub fn new(k: usize, n: usize) -> Self {
        PackedF32 {
            data: Aligned::zeroed(n.div_ceil(NR) * NR * k),
            k,
            n,
        }
    }

    /// Pack a row-major [k, n] matrix.
    pub fn from_rows(b: &[f32], k: usize, n: usize) -> Self {
        let mut p = PackedF32::new(k, n);
        p.fill(b, k, n, n, 1);
        p
    }

    /// Pack a matrix given by strides, its panels in parallel: the weights at load time
    /// (a linear layer's [out, in] weight is B = W^T at row stride 1, column stride `in`).
    pub fn from_strided(
        src: &[f32],
        k: usize,
        n: usize,
        row_stride: usize,
        col_stride: usize,
    ) -> Self {
        let mut p = PackedF32::new(k, n);
        in_parallel(&mut p.data, k * NR, |i, panel| {
            fill_panel(panel, i, src, k, n, row_stride, col_stride)
        });
        p
    }

    /// Refill with another matrix of at most the capacity packed so far (attention packs K
    /// and V of each head into one buffer per thread).
    pub fn fill(&mut self, src: &[f32], k: usize, n: usize, row_stride: usize, col_stride: usize) {
        let need = n.div_ceil(NR) * NR * k;
        if self.data.len < need {
            self.data = Aligned::zeroed(need);
        }
        self.k = k;
        self.n = n;
        let data = self.data.as_mut_slice();
        for p in 0..n.div_ceil(NR) {
            let panel = &mut data[p * k * NR..(p + 1) * k * NR];
            fill_panel(panel, p, src, k, n, row_stride, col_stride);
        }
    }

    pub fn panels(&self) -> usize {
        self.n.div_ceil(NR)
    }

    /// The panels as the micro-kernels read them.
    pub fn view(&self) -> F32Panels {
        F32Panels {
            ptr: self.data.as_slice().as_ptr(),
            k: self.k,
            n: self.n,
            panel_stride: self.k * NR,
            row_stride: NR,
        }
    }
}

/// Where the f32 micro-kernels read B: panels of [`NR`] columns, `panel_stride` values apart,
/// each k row of a panel `row_stride` values after the previous one. A [`PackedF32`] is one
/// (row stride NR); so is a head's slice of V in the fused QKV rows when the head size is a
/// multiple of NR (row stride 3h), which attention then reads without a copy.
#[derive(Clone, Copy)]
pub struct F32Panels {
    pub ptr: *const f32,
    pub k: usize,
    pub n: usize,
    pub panel_stride: usize,
    pub row_stride: usize,
}

// SAFETY: a read-only view of data the caller keeps alive for the GEMM.
unsafe impl Send for F32Panels {}
// SAFETY: as for Send: shared between the GEMM's tasks, only read.
unsafe impl Sync for F32Panels {}

impl F32Panels {
    pub fn panels(&self) -> usize {
        self.n.div_ceil(NR)
    }

    /// Panel `p` from row `k0` on.
    ///
    /// # Safety
    /// p < panels, k0 <= k.
    #[inline(always)]
    pub unsafe fn panel(&self, p: usize, k0: usize) -> *const f32 {
        self.ptr.add(p * self.panel_stride + k0 * self.row_stride)
    }
}

/// Lane rows a low-precision panel holds: its pairs (quads) rounded up to the 16 rows of an
/// AMX tile, zero past the last, so the tile kernels read whole tiles inside the panel.
pub fn tile_rows(lanes: usize) -> usize {
    lanes.div_ceil(16) * 16
}

/// B [k, n] in bf16, two k per 32-bit lane: lane j of pair row q holds (B[2q, j], B[2q+1, j]).
/// A panel's pair rows are 128 bytes apart: two AMX B tiles (16 columns of pairs each) side
/// by side, as `tdpbf16ps` reads them.
pub struct PackedBf16 {
    pub data: Aligned<u32>,
    /// k rounded up to pairs.
    pub pairs: usize,
    /// Pair rows per panel: [`tile_rows`] of `pairs`.
    pub panel_pairs: usize,
    pub k: usize,
    pub n: usize,
}

impl PackedBf16 {
    /// Pack a row-major [k, n] matrix.
    pub fn from_rows(b: &[f32], k: usize, n: usize) -> Self {
        PackedBf16::from_strided(b, k, n, n, 1)
    }

    /// Pack a matrix given by strides, its panels in parallel (as [`PackedF32::from_strided`]:
    /// a linear layer's [out, in] weight at row stride 1, column stride `in`).
    pub fn from_strided(
        src: &[f32],
        k: usize,
        n: usize,
        row_stride: usize,
        col_stride: usize,
    ) -> Self {
        let pairs = k.div_ceil(2);
        let panel_pairs = tile_rows(pairs);
        let mut data = Aligned::zeroed(n.div_ceil(NR) * panel_pairs * NR);
        in_parallel(&mut data, panel_pairs * NR, |p, panel| {
            fill_bf16_panel(panel, p, src, k, n, row_stride, col_stride);
        });
        PackedBf16 {
            data,
            pairs,
            panel_pairs,
            k,
            n,
        }
    }

    /// Nothing packed yet: a buffer for [`PackedBf16::fill`].
    pub fn empty() -> Self {
        PackedBf16 {
            data: Aligned::zeroed(0),
            pairs: 0,
            panel_pairs: 0,
            k: 0,
            n: 0,
        }
    }

    /// Pack a matrix given by strides into this buffer on this thread, reusing its memory
    /// (attention's K^T and V per sequence and head, inside a task of the pool).
    pub fn fill(&mut self, src: &[f32], k: usize, n: usize, row_stride: usize, col_stride: usize) {
        let pairs = k.div_ceil(2);
        let panel_pairs = tile_rows(pairs);
        let len = panel_pairs * NR;
        let need = n.div_ceil(NR) * len;
        if self.data.len < need {
            self.data = Aligned::zeroed(need);
        }
        (self.pairs, self.panel_pairs, self.k, self.n) = (pairs, panel_pairs, k, n);
        let data = self.data.as_mut_slice();
        for p in 0..n.div_ceil(NR) {
            fill_bf16_panel(
                &mut data[p * len..(p + 1) * len],
                p,
                src,
                k,
                n,
                row_stride,
                col_stride,
            );
        }
    }

    pub fn panels(&self) -> usize {
        self.n.div_ceil(NR)
    }

    #[inline(always)]
    pub fn panel(&self, p: usize, q0: usize) -> *const u32 {
        self.data.as_slice()[(p * self.panel_pairs + q0) * NR..].as_ptr()
    }
}

/// Write panel p of B [k, n] (given by strides) in bf16 pairs: every lane of the panel,
/// zeros past k and past n, so a reused buffer holds nothing stale. The two layouts the
/// encoder packs read their source in order: rows contiguous (V: a pair row's lanes are two
/// source rows side by side) or columns contiguous (K^T and a linear layer's [out, in]
/// weight: a column's pairs are consecutive values); any other is read value by value.
fn fill_bf16_panel(
    panel: &mut [u32],
    p: usize,
    src: &[f32],
    k: usize,
    n: usize,
    row_stride: usize,
    col_stride: usize,
) {
    let (pairs, whole) = (k.div_ceil(2), k / 2);
    let (c0, cols) = (p * NR, NR.min(n - p * NR));
    let pair = |a: f32, b: f32| bf16_bits(a) | bf16_bits(b) << 16;
    if cols < NR {
        panel.fill(0);
    } else {
        panel[pairs * NR..].fill(0);
    }
    if col_stride == 1 {
        for q in 0..pairs {
            let dst = &mut panel[q * NR..q * NR + cols];
            let even = &src[2 * q * row_stride + c0..][..cols];
            if q < whole {
                let odd = &src[(2 * q + 1) * row_stride + c0..][..cols];
                for ((d, &a), &b) in dst.iter_mut().zip(even).zip(odd) {
                    *d = pair(a, b);
                }
            } else {
                for (d, &a) in dst.iter_mut().zip(even) {
                    *d = pair(a, 0.0);
                }
            }
        }
    } else if row_stride == 1 {
        #[cfg(target_arch = "x86_64")]
        if super::kernels::features().avx512_bf16 {
            for j in 0..cols {
                let column = &src[(c0 + j) * col_stride..][..k];
                // SAFETY: the panel holds `pairs` lane rows of NR lanes, j < NR; the CPU has
                // AVX512-BF16 (checked above).
                unsafe { super::avx512::bf16_panel_column(column, panel, j) };
            }
            return;
        }
        for j in 0..cols {
            let column = &src[(c0 + j) * col_stride..][..k];
            for (q, two) in column.chunks_exact(2).enumerate() {
                panel[q * NR + j] = pair(two[0], two[1]);
            }
            if whole < pairs {
                panel[whole * NR + j] = pair(column[k - 1], 0.0);
            }
        }
    } else {
        let at = |r: usize, c: usize| {
            if r < k {
                src[r * row_stride + c * col_stride]
            } else {
                0.0
            }
        };
        for j in 0..cols {
            for q in 0..pairs {
                panel[q * NR + j] = pair(at(2 * q, c0 + j), at(2 * q + 1, c0 + j));
            }
        }
    }
}

/// B [k, n] in int8, symmetric per output channel: B[r, c] ~ q[r, c] * scale[c]. Four k per
/// 32-bit lane; `sums[c]` = sum over r of q[r, c] (to undo the +128 shift of the activations).
/// Quad rows 128 bytes apart, as AMX's `tdpbusd` reads two B tiles side by side.
pub struct PackedI8 {
    pub data: Aligned<u32>,
    pub quads: usize,
    /// Quad rows per panel: [`tile_rows`] of `quads`.
    pub panel_quads: usize,
    pub k: usize,
    pub n: usize,
    pub scale: Vec<f32>,
    pub sums: Vec<i32>,
    /// The f32 weights [k, n], for the rows that outlier input channels multiply (computed
    /// in f32, see `gemm::i8_gemm`).
    pub rows: Vec<f32>,
}

impl PackedI8 {
    pub fn from_rows(b: &[f32], k: usize, n: usize) -> Self {
        let quads = k.div_ceil(4);
        let panel_quads = tile_rows(quads);
        let panels = n.div_ceil(NR);
        let padded = panels * NR;
        let mut scale = vec![0f32; padded];
        let mut sums = vec![0i32; padded];
        let mut q = vec![0i8; k * padded];
        for c in 0..n {
            let max = (0..k).map(|r| b[r * n + c].abs()).fold(0f32, f32::max);
            let s = if max > 0.0 { max / 127.0 } else { 1.0 };
            scale[c] = s;
            for r in 0..k {
                let v = (b[r * n + c] / s).round().clamp(-127.0, 127.0) as i8;
                q[r * padded + c] = v;
                sums[c] += i32::from(v);
            }
        }
        let mut data = Aligned::zeroed(panels * panel_quads * NR);
        let d = data.as_mut_slice();
        for p in 0..panels {
            for g in 0..quads {
                for j in 0..NR {
                    let c = p * NR + j;
                    let mut lane = 0u32;
                    for t in 0..4 {
                        let r = 4 * g + t;
                        if r < k {
                            lane |= u32::from(q[r * padded + c] as u8) << (8 * t);
                        }
                    }
                    d[(p * panel_quads + g) * NR + j] = lane;
                }
            }
        }
        PackedI8 {
            data,
            quads,
            panel_quads,
            k,
            n,
            scale,
            sums,
            rows: b.to_vec(),
        }
    }

    pub fn panels(&self) -> usize {
        self.n.div_ceil(NR)
    }

    #[inline(always)]
    pub fn panel(&self, p: usize) -> *const u32 {
        self.data.as_slice()[p * self.panel_quads * NR..].as_ptr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        for x in [1.0f32, -2.5, 3.25, 1e-3, 65504.0, 0.0] {
            let back = bf16_value(bf16_bits(x));
            assert!((back - x).abs() <= x.abs() / 256.0, "{x} -> {back}");
        }
        // 1 + 2^-8 is half way between two bf16 values: it rounds to the even one (1.0).
        assert_eq!(bf16_value(bf16_bits(1.0 + 1.0 / 256.0)), 1.0);
        assert_eq!(bf16_value(bf16_bits(1.0 + 3.0 / 256.0)), 1.0 + 4.0 / 256.0);
    }

    #[test]
    fn a_weight_packs_from_its_transpose_as_from_its_rows() {
        // W [n, k] as a linear layer stores it; B = W^T [k, n].
        let (k, n) = (7, 70);
        let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..k * n).map(|i| w[(i % n) * k + i / n]).collect();
        let from_rows = PackedF32::from_rows(&b, k, n);
        let strided = PackedF32::from_strided(&w, k, n, 1, k);
        assert_eq!(strided.panels(), 3);
        assert_eq!(from_rows.data.as_slice(), strided.data.as_slice());
        let from_rows = PackedBf16::from_rows(&b, k, n);
        let strided = PackedBf16::from_strided(&w, k, n, 1, k);
        assert_eq!(strided.panel_pairs, 16, "4 pairs padded to a whole tile");
        assert_eq!(from_rows.data.as_slice(), strided.data.as_slice());
        // Lane (pair q, column c) of panel p holds B[2q, c] and B[2q + 1, c].
        let d = strided.data.as_slice();
        let lane = d[(strided.panel_pairs + 1) * NR + 5];
        assert_eq!(
            bf16_value(lane & 0xFFFF),
            bf16_value(bf16_bits(b[2 * n + 37]))
        );
        assert_eq!(bf16_value(lane >> 16), bf16_value(bf16_bits(b[3 * n + 37])));
        assert!(
            d[4 * NR..16 * NR].iter().all(|&x| x == 0),
            "pad rows are zero"
        );
    }

    #[test]
    fn a_reused_bf16_buffer_packs_as_a_fresh_one() {
        // Attention packs K^T (columns contiguous) and V (rows contiguous) of every head into
        // the same buffers: a larger matrix first, so stale lanes would show in the padding.
        let src: Vec<f32> = (0..4000).map(|i| (i as f32 * 0.11).cos() * 3.0).collect();
        let mut reused = PackedBf16::empty();
        for (k, n, rs, cs) in [
            (64, 70, 1, 48),
            (9, 33, 48, 1),
            (64, 17, 1, 40),
            (5, 3, 7, 2),
        ] {
            reused.fill(&src, k, n, rs, cs);
            let fresh = PackedBf16::from_strided(&src, k, n, rs, cs);
            let len = fresh.data.as_slice().len();
            assert_eq!(
                (reused.pairs, reused.panel_pairs),
                (fresh.pairs, fresh.panel_pairs)
            );
            assert_eq!(
                &reused.data.as_slice()[..len],
                fresh.data.as_slice(),
                "{k} x {n} at strides ({rs}, {cs})"
            );
            // And what it holds is B: lane (q, c) = (B[2q, c], B[2q + 1, c]), whichever way
            // (vector or scalar) the layout was packed.
            let at = |r: usize, c: usize| if r < k { src[r * rs + c * cs] } else { 0.0 };
            for c in 0..n {
                for q in 0..fresh.panel_pairs {
                    let want = bf16_bits(at(2 * q, c)) | bf16_bits(at(2 * q + 1, c)) << 16;
                    let got = fresh.data.as_slice()[(c / NR * fresh.panel_pairs + q) * NR + c % NR];
                    assert_eq!(got, want, "lane ({q}, {c}) of {k} x {n}");
                }
            }
        }
    }

    #[test]
    fn panels_hold_every_element_once_and_pad_with_zeros() {
        let (k, n) = (5, 37);
        let b: Vec<f32> = (0..k * n).map(|i| i as f32 + 1.0).collect();
        let p = PackedF32::from_rows(&b, k, n);
        assert_eq!(p.panels(), 2);
        assert_eq!(p.data.as_slice().as_ptr() as usize % 64, 0);
        let d = p.data.as_slice();
        for r in 0..k {
            for c in 0..64 {
                let got = d[((c / NR) * k + r) * NR + c % NR];
                let want = if c < n { b[r * n + c] } else { 0.0 };
                assert_eq!(got, want, "({r}, {c})");
            }
        }
    }

    #[test]
    fn int8_weights_round_trip_within_half_a_step() {
        let (k, n) = (6, 3);
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.37).sin()).collect();
        let p = PackedI8::from_rows(&b, k, n);
        let d = p.data.as_slice();
        for c in 0..n {
            let mut sum = 0;
            for r in 0..k {
                let lane = d[(r / 4) * NR + c];
                let q = (lane >> (8 * (r % 4))) as u8 as i8;
                sum += i32::from(q);
                let err = (f32::from(q) * p.scale[c] - b[r * n + c]).abs();
                assert!(err <= p.scale[c] / 2.0 + 1e-6, "({r}, {c}) off by {err}");
            }
            assert_eq!(sum, p.sums[c]);
        }
    }
}
