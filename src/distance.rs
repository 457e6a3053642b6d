//! Cosine distances between f32 vectors, on the CPU's widest SIMD (AVX-512 F, AVX2 + FMA, or
//! plain Rust the compiler vectorises), chosen once at run time like the embedder's kernels:
//! the ANN's re-scoring and selective-filter scans score thousands of vectors a query.
//!
//! Two precisions: [`Cosine::rank`] (f32 lanes, for choosing among many) and
//! [`Cosine::exact`] (f64, for the scores a search returns, equal to the exact scan's to the
//! last bits f32 inputs carry).

/// A query prepared for many distances: its norm computed once.
pub struct Cosine<'a> {
    query: &'a [f32],
    /// |q| in f64 (for exact scores) and f32.
    norm: f64,
    norm_f32: f32,
    kernel: Kernel,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    Avx512,
    Avx2,
    Portable,
}

impl Kernel {
    /// The widest this CPU has.
    pub fn best() -> Kernel {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") {
                return Kernel::Avx512;
            }
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                return Kernel::Avx2;
            }
        }
        Kernel::Portable
    }

    /// Every kernel this CPU can run (for tests).
    pub fn available() -> Vec<Kernel> {
        let mut out = vec![Kernel::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                out.push(Kernel::Avx2);
            }
            if std::is_x86_feature_detected!("avx512f") {
                out.push(Kernel::Avx512);
            }
        }
        out
    }

    /// (q.v, v.v) in f32.
    fn dot_norm(self, q: &[f32], v: &[f32]) -> (f32, f32) {
        let n = q.len().min(v.len());
        let (q, v) = (&q[..n], &v[..n]);
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: chosen only where the CPU has the features (`best`, `available`).
            Kernel::Avx512 => unsafe { x86::dot_norm_avx512(q, v) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Kernel::Avx2 => unsafe { x86::dot_norm_avx2(q, v) },
            _ => dot_norm_portable(q, v),
        }
    }
}

fn kernel() -> Kernel {
    static KERNEL: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
    *KERNEL.get_or_init(Kernel::best)
}

impl<'a> Cosine<'a> {
    pub fn new(query: &'a [f32]) -> Self {
        Self::with_kernel(query, kernel())
    }

    pub fn with_kernel(query: &'a [f32], kernel: Kernel) -> Self {
        let norm = exact_dot(query, query).sqrt();
        Cosine {
            query,
            norm,
            norm_f32: norm as f32,
            kernel,
        }
    }

    /// 1 - cosine similarity in f32 lanes: for ranking many vectors (within ~1e-6 of
    /// [`Cosine::exact`]).
    pub fn rank(&self, v: &[f32]) -> f32 {
        let (dot, vv) = self.kernel.dot_norm(self.query, v);
        let d = self.norm_f32 * vv.sqrt();
        if d == 0.0 {
            1.0
        } else {
            1.0 - dot / d
        }
    }

    /// 1 - cosine similarity, accumulated in f64, as sqlite-vec's `distance_metric=cosine`
    /// reports it (1 for a zero vector).
    pub fn exact(&self, v: &[f32]) -> f64 {
        let dot = exact_dot(self.query, v);
        let d = self.norm * exact_dot(v, v).sqrt();
        if d == 0.0 {
            1.0
        } else {
            1.0 - dot / d
        }
    }
}

/// q.v in f64, eight independent sums (so the compiler vectorises it).
fn exact_dot(q: &[f32], v: &[f32]) -> f64 {
    let mut acc = [0f64; 8];
    let (qc, vc) = (q.chunks_exact(8), v.chunks_exact(8));
    let (qr, vr) = (qc.remainder(), vc.remainder());
    for (a, b) in qc.zip(vc) {
        for i in 0..8 {
            acc[i] += a[i] as f64 * b[i] as f64;
        }
    }
    let tail: f64 = qr.iter().zip(vr).map(|(a, b)| *a as f64 * *b as f64).sum();
    acc.iter().sum::<f64>() + tail
}

/// (q.v, v.v) in f32, sixteen independent sums.
fn dot_norm_portable(q: &[f32], v: &[f32]) -> (f32, f32) {
    let mut dot = [0f32; 16];
    let mut vv = [0f32; 16];
    let (qc, vc) = (q.chunks_exact(16), v.chunks_exact(16));
    let (qr, vr) = (qc.remainder(), vc.remainder());
    for (a, b) in qc.zip(vc) {
        for i in 0..16 {
            dot[i] += a[i] * b[i];
            vv[i] += b[i] * b[i];
        }
    }
    let mut d: f32 = dot.iter().sum();
    let mut n: f32 = vv.iter().sum();
    for (a, b) in qr.iter().zip(vr) {
        d += a * b;
        n += b * b;
    }
    (d, n)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// The main loop of both kernels: two registers of `$w` lanes at a time, dot products
    /// and norms by fused multiply-add. Gives `(i, d0, d1, n0, n1)`: where the loop stopped
    /// and the four accumulators.
    macro_rules! two_registers {
        ($q:expr, $v:expr, $w:expr, $zero:ident, $load:ident, $fma:ident) => {{
            let (q, v) = ($q, $v);
            let (mut d0, mut d1) = ($zero(), $zero());
            let (mut n0, mut n1) = ($zero(), $zero());
            let mut i = 0;
            while i + 2 * $w <= q.len() {
                let (a0, b0) = ($load(q.as_ptr().add(i)), $load(v.as_ptr().add(i)));
                let (a1, b1) = ($load(q.as_ptr().add(i + $w)), $load(v.as_ptr().add(i + $w)));
                d0 = $fma(a0, b0, d0);
                n0 = $fma(b0, b0, n0);
                d1 = $fma(a1, b1, d1);
                n1 = $fma(b1, b1, n1);
                i += 2 * $w;
            }
            (i, d0, d1, n0, n1)
        }};
    }

    /// # Safety
    /// The CPU must have AVX-512 F; `q` and `v` the same length.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn dot_norm_avx512(q: &[f32], v: &[f32]) -> (f32, f32) {
        let n = q.len();
        let (mut i, mut d0, d1, mut n0, n1) = two_registers!(
            q,
            v,
            16,
            _mm512_setzero_ps,
            _mm512_loadu_ps,
            _mm512_fmadd_ps
        );
        while i < n {
            let left = (n - i).min(16);
            let m: __mmask16 = if left == 16 {
                0xffff
            } else {
                (1u16 << left) - 1
            };
            let a = _mm512_maskz_loadu_ps(m, q.as_ptr().add(i));
            let b = _mm512_maskz_loadu_ps(m, v.as_ptr().add(i));
            d0 = _mm512_fmadd_ps(a, b, d0);
            n0 = _mm512_fmadd_ps(b, b, n0);
            i += left;
        }
        (
            _mm512_reduce_add_ps(_mm512_add_ps(d0, d1)),
            _mm512_reduce_add_ps(_mm512_add_ps(n0, n1)),
        )
    }

    /// # Safety
    /// The CPU must have AVX2 and FMA; `q` and `v` the same length.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_norm_avx2(q: &[f32], v: &[f32]) -> (f32, f32) {
        let (mut i, d0, d1, n0, n1) =
            two_registers!(q, v, 8, _mm256_setzero_ps, _mm256_loadu_ps, _mm256_fmadd_ps);
        let mut lanes = [0f32; 8];
        let mut norms = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), _mm256_add_ps(d0, d1));
        _mm256_storeu_ps(norms.as_mut_ptr(), _mm256_add_ps(n0, n1));
        let (mut d, mut nn): (f32, f32) = (lanes.iter().sum(), norms.iter().sum());
        while i < q.len() {
            d += q[i] * v[i];
            nn += v[i] * v[i];
            i += 1;
        }
        (d, nn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vector(seed: u64, n: usize) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn every_kernel_agrees_with_the_f64_score_at_every_length() {
        for n in [0usize, 1, 7, 15, 16, 17, 31, 33, 384, 385, 768, 1000] {
            let (q, v) = (vector(1, n), vector(2, n));
            let exact = Cosine::new(&q).exact(&v);
            let dot: f64 = q.iter().zip(&v).map(|(a, b)| *a as f64 * *b as f64).sum();
            let qn: f64 = q.iter().map(|a| (*a as f64).powi(2)).sum::<f64>().sqrt();
            let vn: f64 = v.iter().map(|a| (*a as f64).powi(2)).sum::<f64>().sqrt();
            let want = if qn * vn == 0.0 {
                1.0
            } else {
                1.0 - dot / (qn * vn)
            };
            assert!((exact - want).abs() < 1e-12, "n {n}: {exact} vs {want}");
            for k in Kernel::available() {
                let got = Cosine::with_kernel(&q, k).rank(&v) as f64;
                assert!((got - want).abs() < 1e-5, "{k:?} n {n}: {got} vs {want}");
            }
        }
    }

    #[test]
    fn a_vector_is_at_distance_zero_from_itself_and_two_from_its_opposite() {
        let q = vector(3, 384);
        let neg: Vec<f32> = q.iter().map(|x| -x).collect();
        for k in Kernel::available() {
            let c = Cosine::with_kernel(&q, k);
            assert!(c.rank(&q).abs() < 1e-6, "{k:?}");
            assert!((c.rank(&neg) - 2.0).abs() < 1e-6, "{k:?}");
        }
        assert_eq!(Cosine::new(&q).exact(&vec![0.0; 384]), 1.0);
    }
}
