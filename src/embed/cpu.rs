//! The BERT encoder on the CPU in f32, without padding and without per-op allocations.
//!
//! The sequences of a batch are laid end to end ([total tokens, hidden]) so that the dense
//! layers, which are most of the work, compute only real tokens; attention runs per sequence
//! and head, in parallel, straight on the fused QKV buffer through strided GEMMs (no
//! transposes, no copies, no mask). Bias and residual adds are folded into the GEMMs (the
//! destination is pre-filled and accumulated into), GELU and layer norm work in place. The
//! GEMMs are the `gemm` crate's, which candle itself uses. Results match the candle path (see
//! the tests) and sentence-transformers (tests/integration/embedding.rs).

use candle_core::{Result, Tensor};
use gemm::{gemm, Parallelism};
use rayon::prelude::*;

use super::gelu;

struct Linear {
    /// [inputs, outputs], row-major.
    weight_t: Vec<f32>,
    bias: Vec<f32>,
    inputs: usize,
    outputs: usize,
}

struct Norm {
    weight: Vec<f32>,
    bias: Vec<f32>,
    eps: f32,
}

struct Layer {
    qkv: Linear,
    attention_out: Linear,
    attention_norm: Norm,
    intermediate: Linear,
    output: Linear,
    output_norm: Norm,
}

/// Which activation the feed-forward layer uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    GeluErf,
    GeluTanh,
    Relu,
}

pub struct CpuBert {
    word_embeddings: Vec<f32>,
    position_type: Vec<f32>,
    embedding_norm: Norm,
    layers: Vec<Layer>,
    heads: usize,
    hidden: usize,
    max_positions: usize,
    act: Activation,
}

fn vec1(t: &Tensor) -> Result<Vec<f32>> {
    t.flatten_all()?
        .to_dtype(candle_core::DType::F32)?
        .to_vec1()
}

/// The weights of one layer, as the candle encoder holds them.
pub struct LayerWeights<'a> {
    pub qkv: (&'a Tensor, &'a Tensor),
    pub attention_out: (&'a Tensor, &'a Tensor),
    pub attention_norm: (&'a Tensor, &'a Tensor, f32),
    pub intermediate: (&'a Tensor, &'a Tensor),
    pub output: (&'a Tensor, &'a Tensor),
    pub output_norm: (&'a Tensor, &'a Tensor, f32),
}

impl CpuBert {
    /// Copy the weights out of candle tensors (transposed weights [in, out], biases, norms).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        word_embeddings: &Tensor,
        position_type: &Tensor,
        embedding_norm: (&Tensor, &Tensor, f32),
        layers: Vec<LayerWeights<'_>>,
        heads: usize,
        act: Activation,
    ) -> Result<Self> {
        let (_, hidden) = word_embeddings.dims2()?;
        let linear = |(w, b): (&Tensor, &Tensor)| -> Result<Linear> {
            let (inputs, outputs) = w.dims2()?;
            Ok(Linear {
                weight_t: vec1(w)?,
                bias: vec1(b)?,
                inputs,
                outputs,
            })
        };
        let norm = |(w, b, eps): (&Tensor, &Tensor, f32)| -> Result<Norm> {
            Ok(Norm {
                weight: vec1(w)?,
                bias: vec1(b)?,
                eps,
            })
        };
        Ok(CpuBert {
            word_embeddings: vec1(word_embeddings)?,
            max_positions: position_type.dims2()?.0,
            position_type: vec1(position_type)?,
            embedding_norm: norm(embedding_norm)?,
            layers: layers
                .into_iter()
                .map(|l| {
                    Ok(Layer {
                        qkv: linear(l.qkv)?,
                        attention_out: linear(l.attention_out)?,
                        attention_norm: norm(l.attention_norm)?,
                        intermediate: linear(l.intermediate)?,
                        output: linear(l.output)?,
                        output_norm: norm(l.output_norm)?,
                    })
                })
                .collect::<Result<_>>()?,
            heads,
            hidden,
            act,
        })
    }

    /// Hidden states of every token of every sequence (full token ids, special tokens
    /// included), laid end to end: [sum of lengths, hidden].
    pub fn forward(&self, seqs: &[&[u32]]) -> Result<Vec<f32>> {
        let h = self.hidden;
        let total: usize = seqs.iter().map(|s| s.len()).sum();
        let vocab = self.word_embeddings.len() / h;
        let mut starts = Vec::with_capacity(seqs.len());
        let mut x = vec![0f32; total * h];
        let mut row = 0;
        for s in seqs {
            if s.len() > self.max_positions {
                candle_core::bail!(
                    "sequence of {} tokens exceeds the model's {} positions",
                    s.len(),
                    self.max_positions
                );
            }
            starts.push(row);
            for (pos, &id) in s.iter().enumerate() {
                let id = id as usize;
                if id >= vocab {
                    candle_core::bail!("token id {id} is outside the vocabulary of {vocab}");
                }
                let dst = &mut x[(row + pos) * h..(row + pos + 1) * h];
                let word = &self.word_embeddings[id * h..(id + 1) * h];
                let place = &self.position_type[pos * h..(pos + 1) * h];
                for ((d, w), p) in dst.iter_mut().zip(word).zip(place) {
                    *d = w + p;
                }
            }
            row += s.len();
        }
        layer_norm(&mut x, &self.embedding_norm, h);
        let lengths: Vec<usize> = seqs.iter().map(|s| s.len()).collect();
        for layer in &self.layers {
            x = self.layer(layer, &x, &starts, &lengths, total)?;
        }
        Ok(x)
    }

    fn layer(
        &self,
        l: &Layer,
        x: &[f32],
        starts: &[usize],
        lengths: &[usize],
        total: usize,
    ) -> Result<Vec<f32>> {
        let h = self.hidden;
        let qkv = linear(&l.qkv, x, total, None);
        let context = attention(&qkv, starts, lengths, self.heads, h);
        let mut attended = linear(&l.attention_out, &context, total, Some(x));
        layer_norm(&mut attended, &l.attention_norm, h);
        let mut inner = linear(&l.intermediate, &attended, total, None);
        activate(&mut inner, self.act);
        let mut out = linear(&l.output, &inner, total, Some(&attended));
        layer_norm(&mut out, &l.output_norm, h);
        Ok(out)
    }
}

fn threads() -> Parallelism {
    match rayon::current_num_threads() {
        0 | 1 => Parallelism::None,
        n => Parallelism::Rayon(n),
    }
}

/// x [rows, inputs] -> x W^T + b (+ residual), [rows, outputs].
fn linear(l: &Linear, x: &[f32], rows: usize, residual: Option<&[f32]>) -> Vec<f32> {
    let (k, n) = (l.inputs, l.outputs);
    debug_assert_eq!(x.len(), rows * k);
    let mut dst = Vec::with_capacity(rows * n);
    match residual {
        Some(r) => {
            for row in r.chunks_exact(n) {
                dst.extend(row.iter().zip(&l.bias).map(|(a, b)| a + b));
            }
        }
        None => {
            for _ in 0..rows {
                dst.extend_from_slice(&l.bias);
            }
        }
    }
    // SAFETY: dst is rows x n, x is rows x k, weight_t is k x n, all row-major with the
    // strides given; gemm reads and writes within those bounds.
    unsafe {
        gemm(
            rows,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            true,
            x.as_ptr(),
            1,
            k as isize,
            l.weight_t.as_ptr(),
            1,
            n as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            threads(),
        );
    }
    dst
}

/// Self-attention per sequence and head over the fused QKV rows [total, 3h] (the query part
/// already scaled by 1/sqrt(head size)); returns the context [total, h].
fn attention(qkv: &[f32], starts: &[usize], lengths: &[usize], heads: usize, h: usize) -> Vec<f32> {
    let hs = h / heads;
    let total: usize = lengths.iter().sum();
    let mut out = vec![0f32; total * h];
    let stride = 3 * h;
    let out_ptr = SendPtr(out.as_mut_ptr());
    (0..starts.len() * heads)
        .into_par_iter()
        .for_each_init(Vec::new, |scores, task| {
            let (seq, head) = (task / heads, task % heads);
            let (start, len) = (starts[seq], lengths[seq]);
            scores.clear();
            scores.resize(len * len, 0f32);
            let base = start * stride + head * hs;
            let q = qkv[base..].as_ptr();
            let k = qkv[base + h..].as_ptr();
            let v = qkv[base + 2 * h..].as_ptr();
            // SAFETY: each task reads rows start..start+len of qkv at its head's columns and
            // writes only its own head's columns of those rows of `out`; tasks never overlap.
            unsafe {
                // scores = Q K^T: [len, hs] x [hs, len].
                gemm(
                    len,
                    len,
                    hs,
                    scores.as_mut_ptr(),
                    1,
                    len as isize,
                    false,
                    q,
                    1,
                    stride as isize,
                    k,
                    stride as isize,
                    1,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    Parallelism::None,
                );
                for row in scores.chunks_exact_mut(len) {
                    softmax(row);
                }
                // context = P V: [len, len] x [len, hs], into out[start.., head*hs..].
                let dst = out_ptr.get().add(start * h + head * hs);
                gemm(
                    len,
                    hs,
                    len,
                    dst,
                    1,
                    h as isize,
                    false,
                    scores.as_ptr(),
                    1,
                    len as isize,
                    v,
                    1,
                    stride as isize,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    Parallelism::None,
                );
            }
        });
    out
}

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: the pointer is only used for disjoint writes (see `attention`).
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}
impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// exp(x) for x <= 0 (softmax after subtracting the row's max), relative error below 2e-7:
/// 2^n by the exponent bits times e^y for |y| <= ln(2)/2 by its Taylor series. Branch-free, so
/// the loops around it vectorise.
#[inline(always)]
fn exp_nonpositive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in two (Cody-Waite) so that n * LN2_HI is exact.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Round to nearest by the 1.5 * 2^23 trick (valid for |t| < 2^22).
    const MAGIC: f32 = 12_582_912.0;
    let x = x.max(-87.0);
    let n = (x * LOG2E + MAGIC) - MAGIC;
    let y = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + y * (1.0
            + y * (0.5
                + y * (1.0 / 6.0
                    + y * (1.0 / 24.0 + y * (1.0 / 120.0 + y * (1.0 / 720.0 + y / 5040.0))))));
    f32::from_bits(((n as i32 + 127) as u32) << 23) * p
}

#[inline(always)]
fn softmax_generic(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in row.iter_mut() {
        *v = exp_nonpositive(*v - max);
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in row.iter_mut() {
        *v *= inv;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_avx2(row: &mut [f32]) {
    softmax_generic(row)
}

fn softmax(row: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports the features the function is compiled for.
        unsafe { softmax_avx2(row) };
        return;
    }
    softmax_generic(row)
}

fn layer_norm(x: &mut [f32], n: &Norm, h: usize) {
    x.par_chunks_mut(h * 64).for_each(|rows| {
        for row in rows.chunks_exact_mut(h) {
            let mean = row.iter().sum::<f32>() / h as f32;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / h as f32;
            let inv = 1.0 / (var + n.eps).sqrt();
            for ((v, w), b) in row.iter_mut().zip(&n.weight).zip(&n.bias) {
                *v = (*v - mean) * inv * w + b;
            }
        }
    });
}

fn activate(x: &mut [f32], act: Activation) {
    match act {
        Activation::GeluErf => gelu::gelu_in_place(x),
        Activation::GeluTanh => x.par_chunks_mut(16384).for_each(|c| {
            for v in c {
                let u = 0.797_884_6 * (*v + 0.044_715 * *v * *v * *v);
                *v = 0.5 * *v * (1.0 + u.tanh());
            }
        }),
        Activation::Relu => x.par_chunks_mut(16384).for_each(|c| {
            for v in c {
                *v = v.max(0.0);
            }
        }),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn exp_is_accurate() {
        let mut worst = 0f64;
        for i in 0..=87_000 {
            let x = -(i as f32) / 1000.0;
            let (a, b) = (f64::from(super::exp_nonpositive(x)), f64::from(x).exp());
            worst = worst.max(((a - b) / b).abs());
        }
        assert!(worst < 5e-7, "max relative error {worst}");
    }
}
