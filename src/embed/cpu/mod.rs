//! The BERT encoder on the CPU, without padding and without per-op allocations.
//!
//! The sequences of a batch are laid end to end ([total tokens, hidden]) so that the dense
//! layers, which are most of the work, compute only real tokens; attention runs per sequence
//! and head, in parallel, straight on the fused QKV buffer through strided GEMMs (no
//! transposes, no copies, no mask). Bias, residual and GELU are applied to each tile of the
//! GEMM in registers ([`gemm`]); layer norm works in place.
//!
//! Three kernel paths ([`kernels::KernelPath`]), chosen at run time, all on our packed GEMM:
//! `avx512` (AVX-512 micro-kernels, vectorised softmax and layer norm; bf16 and int8 dense
//! layers on CPUs that have AVX512-BF16 / VNNI), `avx2` (AVX2 + FMA micro-kernels and layer
//! norm), `portable` (a plain Rust micro-kernel). Results match the candle path (see the tests) and sentence-transformers
//! (tests/integration/embedding.rs).

pub mod gemm;
pub mod kernels;
pub mod pack;

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

use candle_core::{Result, Tensor};
use rayon::prelude::*;

use self::gemm::{row_stride, Epilogue, Operands};
use self::kernels::{KernelPath, Precision};
use self::pack::{PackedBf16, PackedF32, PackedI8};
use super::gelu;

/// A dense layer's weights in the layout its kernel path reads.
enum Weights {
    F32(PackedF32),
    Bf16(PackedBf16),
    Int8(PackedI8),
}

struct Linear {
    weights: Weights,
    bias: Vec<f32>,
    inputs: usize,
    outputs: usize,
    /// Its input is (almost) one-signed, the activation's output: int8 quantises it
    /// asymmetrically.
    one_signed_input: bool,
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

/// A dense layer outside the fused encoder, on candle tensors: the rotary families'
/// projections on the CPU in f32 run on the fused encoder's packed GEMM ([`gemm::f32_gemm`]),
/// about twice candle's CPU matmul on AVX-512 (candle's `gemm` crate runs AVX2 kernels there).
pub struct PackedLinear {
    weights: PackedF32,
    bias: Option<Vec<f32>>,
    inputs: usize,
    outputs: usize,
    path: KernelPath,
}

impl PackedLinear {
    /// From a layer's [out, in] weight and its bias (f32 on the CPU), for kernel `path`.
    pub fn new(weight: &Tensor, bias: Option<&Tensor>, path: KernelPath) -> Result<Self> {
        let (outputs, inputs) = weight.dims2()?;
        let weights = match with_slice(weight, |w| {
            PackedF32::from_strided(w, inputs, outputs, 1, inputs)
        })? {
            Some(packed) => packed,
            None => PackedF32::from_rows(&vec1(&weight.t()?)?, inputs, outputs),
        };
        Ok(PackedLinear {
            weights,
            bias: bias.map(vec1).transpose()?,
            inputs,
            outputs,
            path,
        })
    }

    /// x [.., in] (f32 on the CPU) -> x W^T + b, [.., out].
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (k, n) = (self.inputs, self.outputs);
        let mut dims = x.dims().to_vec();
        match dims.last_mut() {
            Some(last) if *last == k => *last = n,
            _ => candle_core::bail!("a dense layer of {k} inputs given a tensor {:?}", x.dims()),
        }
        let rows = x.elem_count() / k;
        let x = x.contiguous()?;
        let out = with_slice(&x, |a| {
            // A's rows at `row_stride` (an odd number of cache lines apart: see there).
            let lda = row_stride(k);
            let padded: Vec<f32>;
            let a = if lda == k {
                a
            } else {
                let mut p = Vec::with_capacity(rows * lda);
                for row in a.chunks_exact(k) {
                    p.extend_from_slice(row);
                    p.extend(std::iter::repeat_n(0.0, lda - k));
                }
                padded = p;
                &padded
            };
            let mut out: Vec<f32> = Vec::with_capacity(rows * n);
            let ops = Operands {
                a: a.as_ptr(),
                lda,
                m: rows,
                c: out.as_mut_ptr(),
                ldc: n,
            };
            let epi = Epilogue {
                bias: self.bias.as_ref().map_or(std::ptr::null(), |b| b.as_ptr()),
                ..Epilogue::NONE
            };
            // SAFETY: a holds rows x k at stride lda, out has room for rows x n, the bias n
            // values; the path was checked against this CPU when it was chosen. The GEMM
            // writes every value of C (its first K block stores the tile whole), so all
            // rows x n values are initialised when the length is set.
            unsafe {
                gemm::f32_gemm(self.path, ops, self.weights.view(), epi, true);
                out.set_len(rows * n);
            }
            out
        })?;
        match out {
            Some(out) => Tensor::from_vec(out, dims, x.device()),
            None => candle_core::bail!("the packed dense layer runs on f32 CPU tensors"),
        }
    }
}

/// The activation of a gated feed-forward layer: `act(input) * gate`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    GeluErf,
    GeluTanh,
    Silu,
}

/// A gated feed-forward layer's product `act(a) * b` on the CPU in f32, in one pass: `a`
/// and `b` [.., i] tensors, or with `b` None the two halves of `a` [.., 2i] (ModernBERT's
/// fused projection: input, then gate). The exact GELU runs on the `path`'s vector kernel.
pub fn gated(path: KernelPath, a: &Tensor, b: Option<&Tensor>, act: Gate) -> Result<Tensor> {
    let a = a.contiguous()?;
    let b = b.map(Tensor::contiguous).transpose()?;
    let width = a.dim(candle_core::D::Minus1)?;
    let i = if b.is_some() { width } else { width / 2 };
    if i == 0 || (b.is_none() && width % 2 != 0) {
        candle_core::bail!("a gated layer given a tensor {:?}", a.dims());
    }
    let rows = a.elem_count() / width;
    let mut dims = a.dims().to_vec();
    if let Some(last) = dims.last_mut() {
        *last = i;
    }
    let product = |x: &[f32], gate: &[f32], ld_gate: usize, off: usize| -> Vec<f32> {
        let mut out = vec![0f32; rows * i];
        out.par_chunks_mut(i * 64)
            .enumerate()
            .for_each(|(chunk, dst)| {
                for (r, row) in dst.chunks_exact_mut(i).enumerate() {
                    let r = chunk * 64 + r;
                    row.copy_from_slice(&x[r * width..r * width + i]);
                    match act {
                        Gate::GeluErf => activate(path, row, Activation::GeluErf),
                        Gate::GeluTanh => gelu_tanh_in_place(row),
                        Gate::Silu => silu_in_place(row),
                    }
                    let g = &gate[r * ld_gate + off..r * ld_gate + off + i];
                    row.iter_mut().zip(g).for_each(|(v, g)| *v *= g);
                }
            });
        out
    };
    let out = with_slice(&a, |x| match &b {
        None => Some(product(x, x, width, i)),
        Some(b) => with_slice(b, |g| product(x, g, i, 0)).ok().flatten(),
    })?
    .flatten();
    match out {
        Some(out) => Tensor::from_vec(out, dims, a.device()),
        None => candle_core::bail!("the gated product runs on f32 CPU tensors"),
    }
}

/// Which activation the feed-forward layer uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    GeluErf,
    GeluTanh,
    Relu,
}

/// Which hidden states a forward pass gives back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rows {
    /// Every token's, laid end to end: [sum of lengths, hidden].
    All,
    /// Each sequence's first token's only (CLS pooling, a classifier's head): [sequences,
    /// hidden]. The last layer then computes keys and values for every token and the rest
    /// (attention's query, its output projection, the feed-forward layer, the norms) for
    /// one row per sequence: three quarters of that layer's work left out.
    First,
}

pub struct CpuBert {
    word_embeddings: Vec<f32>,
    position_type: Vec<f32>,
    /// Each token type's embedding less type 0's (which `position_type` holds), [types,
    /// hidden]; empty for a family without token types.
    token_types: Vec<f32>,
    embedding_norm: Norm,
    layers: Vec<Layer>,
    heads: usize,
    hidden: usize,
    max_positions: usize,
    act: Activation,
    /// MPNet's relative position bias per head and distance (see [`Relative`]).
    relative: Option<Relative>,
    path: KernelPath,
    precision: Precision,
}

/// A relative position bias: per head, the value added to the score of query `i` and key `j`
/// for every distance `j - i` from `-(max - 1)` to `max - 1`.
struct Relative {
    by_distance: Vec<Vec<f32>>,
    max: usize,
}

impl Relative {
    /// Add head `head`'s bias to the scores [rows, len] (row stride `ld`) of one sequence's
    /// query rows from `first` on.
    fn add(&self, head: usize, scores: &mut [f32], first: usize, len: usize, ld: usize) {
        let table = &self.by_distance[head];
        for (i, row) in scores.chunks_exact_mut(ld).enumerate() {
            let from = self.max - 1 - (first + i);
            for (s, b) in row[..len].iter_mut().zip(&table[from..from + len]) {
                *s += b;
            }
        }
    }
}

fn vec1(t: &Tensor) -> Result<Vec<f32>> {
    t.flatten_all()?
        .to_dtype(candle_core::DType::F32)?
        .to_vec1()
}

/// `f` of the tensor's values in place, when they are contiguous f32 on the CPU; None else.
fn with_slice<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<Option<R>> {
    let (storage, layout) = t.storage_and_layout();
    Ok(match (&*storage, layout.contiguous_offsets()) {
        (candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)), Some((start, end))) => {
            Some(f(&v[start..end]))
        }
        _ => None,
    })
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
    /// Copy the weights out of candle tensors (transposed weights [in, out], biases, norms)
    /// into the layout of the kernel `path` in `precision` (which the caller has checked
    /// with [`Precision::check`]).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        word_embeddings: &Tensor,
        position_type: &Tensor,
        embedding_norm: (&Tensor, &Tensor, f32),
        layers: Vec<LayerWeights<'_>>,
        heads: usize,
        act: Activation,
        relative: Option<Vec<Vec<f32>>>,
        path: KernelPath,
        precision: Precision,
    ) -> Result<Self> {
        if let Err(why) = precision.check(path) {
            candle_core::bail!("{why}");
        }
        let (_, hidden) = word_embeddings.dims2()?;
        let linear = |(w, b): (&Tensor, &Tensor)| -> Result<Linear> {
            let (inputs, outputs) = w.dims2()?;
            let weights = match precision {
                // Packed straight from the layer's [out, in] weight when w is its transposed
                // view: no transposed copy first (bert-base: 0.45 s of a 1.2 s start).
                Precision::F32 => match with_slice(&w.t()?, |w| {
                    PackedF32::from_strided(w, inputs, outputs, 1, inputs)
                })? {
                    Some(packed) => Weights::F32(packed),
                    None => Weights::F32(PackedF32::from_rows(&vec1(w)?, inputs, outputs)),
                },
                Precision::Bf16 => match with_slice(&w.t()?, |w| {
                    PackedBf16::from_strided(w, inputs, outputs, 1, inputs)
                })? {
                    Some(packed) => Weights::Bf16(packed),
                    None => Weights::Bf16(PackedBf16::from_rows(&vec1(w)?, inputs, outputs)),
                },
                Precision::Int8 => Weights::Int8(PackedI8::from_rows(&vec1(w)?, inputs, outputs)),
            };
            Ok(Linear {
                weights,
                bias: vec1(b)?,
                inputs,
                outputs,
                one_signed_input: false,
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
            token_types: Vec::new(),
            embedding_norm: norm(embedding_norm)?,
            layers: layers
                .into_iter()
                .map(|l| {
                    Ok(Layer {
                        qkv: linear(l.qkv)?,
                        attention_out: linear(l.attention_out)?,
                        attention_norm: norm(l.attention_norm)?,
                        intermediate: linear(l.intermediate)?,
                        output: Linear {
                            one_signed_input: true,
                            ..linear(l.output)?
                        },
                        output_norm: norm(l.output_norm)?,
                    })
                })
                .collect::<Result<_>>()?,
            relative: relative.map(|by_distance| Relative {
                max: by_distance.first().map_or(1, Vec::len).div_ceil(2),
                by_distance,
            }),
            heads,
            hidden,
            act,
            path,
            precision,
        })
    }

    /// With the token types' embeddings less type 0's ([types, hidden]; row 0 zeros), for
    /// [`CpuBert::forward_typed`].
    pub fn with_token_types(mut self, table: &Tensor) -> Result<Self> {
        let (_, h) = table.dims2()?;
        if h != self.hidden {
            candle_core::bail!(
                "token type embeddings of {h} values, the model has {}",
                self.hidden
            );
        }
        self.token_types = vec1(table)?;
        Ok(self)
    }

    /// The kernel path the encoder runs.
    pub fn path(&self) -> KernelPath {
        self.path
    }

    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The encoder in words: "fused CPU encoder, f32 on the avx512 kernels", with "(AMX
    /// tiles)" where the bf16 or int8 GEMMs run on them.
    pub fn describe(&self) -> String {
        let f = kernels::features();
        let amx = match self.precision {
            Precision::Bf16 => f.amx_bf16,
            Precision::Int8 => f.amx_int8,
            Precision::F32 => false,
        };
        format!(
            "fused CPU encoder, {} on the {} kernels{}",
            self.precision.name(),
            self.path,
            if amx { " (AMX tiles)" } else { "" }
        )
    }

    /// Floating-point operations (multiply and add counted apart) of a forward pass over
    /// sequences of these lengths: the dense layers per token, attention per sequence.
    pub fn flops(&self, lengths: &[usize], rows: Rows) -> f64 {
        let tokens: usize = lengths.iter().sum();
        let squares: f64 = lengths.iter().map(|&l| (l * l) as f64).sum();
        let h = self.hidden as f64;
        let last = self.layers.len().saturating_sub(1);
        self.layers
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let per_token = |d: &Linear| 2.0 * (d.inputs * d.outputs) as f64;
                let rest: f64 = [&l.attention_out, &l.intermediate, &l.output]
                    .into_iter()
                    .map(per_token)
                    .sum();
                let qkv = per_token(&l.qkv) * tokens as f64;
                if rows == Rows::First && i == last {
                    // One query row per sequence: its scores and context over the whole
                    // sequence, the rest for that row.
                    qkv + rest * lengths.len() as f64 + 4.0 * tokens as f64 * h
                } else {
                    qkv + rest * tokens as f64 + 4.0 * squares * h
                }
            })
            .sum()
    }

    /// Hidden states of every token of every sequence (full token ids, special tokens
    /// included), laid end to end: [sum of lengths, hidden].
    pub fn forward(&self, seqs: &[&[u32]]) -> Result<Vec<f32>> {
        self.forward_typed(seqs, None)
    }

    /// [`CpuBert::forward`] with each token's type (`types[i]` as long as `seqs[i]`: a
    /// pair's second segment is type 1); None: every token is type 0.
    pub fn forward_typed(&self, seqs: &[&[u32]], types: Option<&[&[u32]]>) -> Result<Vec<f32>> {
        self.forward_rows(seqs, types, Rows::All)
    }

    /// The hidden states `rows` asks for ([`Rows::All`]: as [`CpuBert::forward_typed`];
    /// [`Rows::First`]: each sequence's first token's, [sequences, hidden]).
    pub fn forward_rows(
        &self,
        seqs: &[&[u32]],
        types: Option<&[&[u32]]>,
        rows: Rows,
    ) -> Result<Vec<f32>> {
        if rows == Rows::First && seqs.iter().any(|s| s.is_empty()) {
            candle_core::bail!("an empty sequence has no first token");
        }
        let h = self.hidden;
        let kinds = self.token_types.len() / h;
        let total: usize = seqs.iter().map(|s| s.len()).sum();
        let vocab = self.word_embeddings.len() / h;
        let mut starts = Vec::with_capacity(seqs.len());
        // Every activation has rows at gemm::row_stride of its width (a GEMM reads them).
        let ld = row_stride(h);
        let mut x = vec![0f32; total * ld];
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
                let dst = &mut x[(row + pos) * ld..(row + pos) * ld + h];
                let word = &self.word_embeddings[id * h..(id + 1) * h];
                let place = &self.position_type[pos * h..(pos + 1) * h];
                for ((d, w), p) in dst.iter_mut().zip(word).zip(place) {
                    *d = w + p;
                }
            }
            if let Some(types) = types {
                let t = types.get(starts.len() - 1).copied().unwrap_or(&[]);
                if t.len() != s.len() {
                    candle_core::bail!("{} token types for {} tokens", t.len(), s.len());
                }
                for (pos, &ty) in t.iter().enumerate().filter(|(_, &ty)| ty > 0) {
                    let ty = ty as usize;
                    if ty >= kinds.max(1) {
                        candle_core::bail!(
                            "token type {ty} is outside the model's {}",
                            kinds.max(1)
                        );
                    }
                    let dst = &mut x[(row + pos) * ld..(row + pos) * ld + h];
                    let extra = &self.token_types[ty * h..(ty + 1) * h];
                    dst.iter_mut().zip(extra).for_each(|(d, e)| *d += e);
                }
            }
            row += s.len();
        }
        layer_norm(self.path, &mut x, &self.embedding_norm, h);
        let lengths: Vec<usize> = seqs.iter().map(|s| s.len()).collect();
        let last = self.layers.len().saturating_sub(1);
        SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            for (i, layer) in self.layers.iter().enumerate() {
                let rows = if i == last { rows } else { Rows::All };
                self.layer(layer, &mut x, &mut scratch, &starts, &lengths, total, rows);
            }
        });
        let out = match rows {
            Rows::First if self.layers.is_empty() => {
                gather_first(&mut x, &starts, ld);
                starts.len()
            }
            Rows::First => starts.len(),
            Rows::All => total,
        };
        // The hidden states, [out, h], rows packed.
        for r in 1..out {
            x.copy_within(r * ld..r * ld + h, r * h);
        }
        x.truncate(out * h);
        Ok(x)
    }

    /// One encoder layer, x in place; the intermediate results in `s`. With
    /// [`Rows::First`], keys and values of every token and the rest for each sequence's
    /// first row alone: x becomes [sequences, h] (row stride as before).
    #[allow(clippy::too_many_arguments)]
    fn layer(
        &self,
        l: &Layer,
        x: &mut Vec<f32>,
        s: &mut Scratch,
        starts: &[usize],
        lengths: &[usize],
        total: usize,
        rows: Rows,
    ) {
        let (h, path) = (self.hidden, self.path);
        linear(path, &l.qkv, x, total, None, None, &mut s.qkv);
        attention(
            path,
            self.precision == Precision::Bf16,
            &s.qkv,
            starts,
            lengths,
            self.heads,
            h,
            self.relative.as_ref(),
            rows,
            &mut s.context,
        );
        let rows = match rows {
            Rows::All => total,
            Rows::First => {
                // The residual: each sequence's first row of x.
                gather_first(x, starts, row_stride(h));
                starts.len()
            }
        };
        self.rest(l, x, s, rows);
    }

    /// A layer after attention, on `rows` rows: the output projection with x as the
    /// residual, its norm, the feed-forward layer and its norm; the result in x.
    fn rest(&self, l: &Layer, x: &mut Vec<f32>, s: &mut Scratch, rows: usize) {
        let (h, path) = (self.hidden, self.path);
        linear(
            path,
            &l.attention_out,
            &s.context,
            rows,
            Some(x),
            None,
            &mut s.attended,
        );
        layer_norm(path, &mut s.attended, &l.attention_norm, h);
        linear(
            path,
            &l.intermediate,
            &s.attended,
            rows,
            None,
            Some(self.act),
            &mut s.inner,
        );
        linear(path, &l.output, &s.inner, rows, Some(&s.attended), None, x);
        layer_norm(path, x, &l.output_norm, h);
    }
}

/// Keep only each sequence's first row of x (rows `ld` apart, sequences from `starts`),
/// packed to the front.
fn gather_first(x: &mut Vec<f32>, starts: &[usize], ld: usize) {
    // starts ascend from 0, so starts[i] >= i: row i is written after every row it held
    // was read.
    for (i, &start) in starts.iter().enumerate() {
        x.copy_within(start * ld..(start + 1) * ld, i * ld);
    }
    x.truncate(starts.len() * ld);
}

/// The encoder's intermediate buffers, kept per thread between layers and batches: every
/// kernel writes all of its destination, so they are never cleared, and the pages stay
/// mapped (no fresh zeroed pages from the OS per layer).
#[derive(Default)]
struct Scratch {
    qkv: Vec<f32>,
    context: Vec<f32>,
    attended: Vec<f32>,
    inner: Vec<f32>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// Make `v` hold exactly `len` values, writing only those it did not hold before.
fn sized(v: &mut Vec<f32>, len: usize) {
    if v.len() > len {
        v.truncate(len);
    } else {
        v.resize(len, 0.0);
    }
}

/// x [rows, inputs] -> act(x W^T + b (+ residual)), [rows, outputs].
fn linear(
    path: KernelPath,
    l: &Linear,
    x: &[f32],
    rows: usize,
    residual: Option<&[f32]>,
    act: Option<Activation>,
    dst: &mut Vec<f32>,
) {
    let (k, n) = (l.inputs, l.outputs);
    let (lda, ldc) = (row_stride(k), row_stride(n));
    debug_assert_eq!(x.len(), rows * lda);
    debug_assert!(residual.is_none_or(|r| r.len() == rows * ldc));
    // The packed kernels add the bias and the residual and apply the exact GELU to the tile
    // in registers; other activations run after.
    let fused = act == Some(Activation::GeluErf);
    sized(dst, rows * ldc);
    let ops = Operands {
        a: x.as_ptr(),
        lda,
        m: rows,
        c: dst.as_mut_ptr(),
        ldc,
    };
    let epi = Epilogue {
        bias: l.bias.as_ptr(),
        residual: residual.map_or(std::ptr::null(), <[f32]>::as_ptr),
        ldr: ldc,
        gelu: fused,
    };
    // SAFETY: dst is rows x n, x is rows x k, the residual rows x n, the bias n, all
    // row-major at their widths' row_stride; the bf16 and int8 weights exist only where
    // `Precision::check` found the CPU features for them.
    unsafe {
        match &l.weights {
            Weights::F32(w) => gemm::f32_gemm(path, ops, w.view(), epi, true),
            #[cfg(target_arch = "x86_64")]
            Weights::Bf16(w) => gemm::bf16_gemm(ops, w, epi, true),
            #[cfg(target_arch = "x86_64")]
            Weights::Int8(w) => gemm::i8_gemm(ops, w, epi, l.one_signed_input, true),
            #[cfg(not(target_arch = "x86_64"))]
            Weights::Bf16(_) | Weights::Int8(_) => {
                unreachable!("bf16 and int8 weights exist only on x86-64 (this is a bug)")
            }
        }
    }
    if let (Some(act), false) = (act, fused) {
        activate(path, dst, act);
    }
}

/// Query rows per attention block: a sequence's scores take [QUERY_BLOCK, len] floats per
/// task, so attention memory grows with the length, not its square (8,192 tokens: 8 MiB, not
/// 256 MiB, per head in flight). Softmax is over whole rows, so blocking the queries is exact.
const QUERY_BLOCK: usize = 256;

/// Self-attention on our packed GEMM: per sequence and head,
/// K^T and V are packed into the thread's buffers, then scores = Q K^T, softmax, P V.
/// With `bf16` (the encoder's precision), both products take bf16 operands (Q, K, the
/// softmax's weights and V rounded, as the dense layers' inputs are) with f32 sums, on the
/// AMX tiles where the CPU has them; the scores and the softmax stay f32.
#[allow(clippy::too_many_arguments)]
fn attention(
    path: KernelPath,
    bf16: bool,
    qkv: &[f32],
    starts: &[usize],
    lengths: &[usize],
    heads: usize,
    h: usize,
    relative: Option<&Relative>,
    rows: Rows,
    out: &mut Vec<f32>,
) {
    let hs = h / heads;
    let total: usize = lengths.iter().sum();
    let ldo = row_stride(h);
    sized(
        out,
        match rows {
            Rows::All => total,
            Rows::First => starts.len(),
        } * ldo,
    );
    let stride = row_stride(3 * h);
    let out_ptr = SendPtr(out.as_mut_ptr());
    (0..starts.len() * heads).into_par_iter().for_each_init(
        || (Vec::new(), Packed::new(bf16)),
        |(scores, packed), task| {
            let (seq, head) = (task / heads, task % heads);
            let (start, len) = (starts[seq], lengths[seq]);
            let base = start * stride + head * hs;
            packed.fill(&qkv[base + h..], &qkv[base + 2 * h..], hs, len, stride);
            // Query rows go QUERY_BLOCK at a time: scores are [block, len], never [len, len].
            // Score rows are A of P V: at the row stride that spreads them over L1's sets.
            let ls = row_stride(len);
            // The query rows, and the row of `out` the first one's context goes to.
            let (queries, out_row) = match rows {
                Rows::All => (len, start),
                Rows::First => (1, seq),
            };
            for q0 in (0..queries).step_by(QUERY_BLOCK) {
                let block = QUERY_BLOCK.min(queries - q0);
                sized(scores, block * ls);
                // SAFETY: each task reads rows start..start+len of qkv at its head's columns
                // and writes only its own head's columns of its rows of `out` (those rows, or
                // with Rows::First row `seq`); tasks never overlap. The scores hold block rows
                // at stride ls, and K^T and V were packed for this head above.
                unsafe {
                    let q = Operands {
                        a: qkv[base + q0 * stride..].as_ptr(),
                        lda: stride,
                        m: block,
                        c: scores.as_mut_ptr(),
                        ldc: ls,
                    };
                    packed.scores(path, q);
                    if let Some(r) = relative {
                        r.add(head, scores, q0, len, ls);
                    }
                    for row in scores.chunks_exact_mut(ls) {
                        softmax(path, &mut row[..len]);
                    }
                    let p = Operands {
                        a: scores.as_ptr(),
                        lda: ls,
                        m: block,
                        c: out_ptr.get().add((out_row + q0) * ldo + head * hs),
                        ldc: ldo,
                    };
                    packed.context(path, p);
                }
            }
        },
    );
}

/// One attention task's K^T and V, packed for the precision's kernels (f32 panels, or bf16
/// pairs for the bf16 GEMM).
enum Packed {
    F32 {
        kt: PackedF32,
        v: PackedF32,
        /// V read in place from the QKV rows (a head of whole panels), else from `v`.
        v_in_place: Option<pack::F32Panels>,
    },
    #[cfg(target_arch = "x86_64")]
    Bf16 { kt: PackedBf16, v: PackedBf16 },
}

impl Packed {
    fn new(bf16: bool) -> Packed {
        #[cfg(target_arch = "x86_64")]
        if bf16 {
            return Packed::Bf16 {
                kt: PackedBf16::empty(),
                v: PackedBf16::empty(),
            };
        }
        let _ = bf16;
        Packed::F32 {
            kt: PackedF32::new(0, 0),
            v: PackedF32::new(0, 0),
            v_in_place: None,
        }
    }

    /// Pack K^T [hs, len] (element (d, j) is K[j, d]) and V [len, hs] of one sequence's
    /// head, from its K and V columns in rows `stride` apart.
    fn fill(&mut self, k: &[f32], v: &[f32], hs: usize, len: usize, stride: usize) {
        match self {
            Packed::F32 {
                kt,
                v: packed_v,
                v_in_place,
            } => {
                kt.fill(k, hs, len, 1, stride);
                // V is read in place when the head is whole panels, else packed.
                *v_in_place = if hs.is_multiple_of(pack::NR) {
                    Some(pack::F32Panels {
                        ptr: v.as_ptr(),
                        k: len,
                        n: hs,
                        panel_stride: pack::NR,
                        row_stride: stride,
                    })
                } else {
                    packed_v.fill(v, len, hs, stride, 1);
                    None
                };
            }
            #[cfg(target_arch = "x86_64")]
            Packed::Bf16 { kt, v: packed_v } => {
                kt.fill(k, hs, len, 1, stride);
                packed_v.fill(v, len, hs, stride, 1);
            }
        }
    }

    /// scores = Q K^T for the query rows `q` names.
    ///
    /// # Safety
    /// As [`gemm::f32_gemm`], with the K^T of the last [`Packed::fill`].
    unsafe fn scores(&self, path: KernelPath, q: Operands) {
        match self {
            Packed::F32 { kt, .. } => gemm::f32_gemm(path, q, kt.view(), Epilogue::NONE, false),
            // The encoder runs bf16 only where `Precision::check` found AVX512-BF16.
            #[cfg(target_arch = "x86_64")]
            Packed::Bf16 { kt, .. } => gemm::bf16_gemm(q, kt, Epilogue::NONE, false),
        }
    }

    /// context = P V for the softmax rows `p` names.
    ///
    /// # Safety
    /// As [`gemm::f32_gemm`], with the V of the last [`Packed::fill`] (whose rows, when read
    /// in place, are still alive).
    unsafe fn context(&self, path: KernelPath, p: Operands) {
        match self {
            Packed::F32 { v, v_in_place, .. } => {
                let v = v_in_place.unwrap_or_else(|| v.view());
                gemm::f32_gemm(path, p, v, Epilogue::NONE, false)
            }
            #[cfg(target_arch = "x86_64")]
            Packed::Bf16 { v, .. } => gemm::bf16_gemm(p, v, Epilogue::NONE, false),
        }
    }
}

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: the pointer is only used for disjoint writes (see `attention`).
unsafe impl Send for SendPtr {}
// SAFETY: as for Send: the tasks that share it write disjoint parts.
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

/// The logistic function 1 / (1 + e^-z), from [`exp_nonpositive`] of -|z| (no overflow on
/// either side). Branch-free, so the loops around it vectorise.
#[inline(always)]
fn sigmoid(z: f32) -> f32 {
    let e = exp_nonpositive(-z.abs());
    let r = 1.0 / (1.0 + e);
    if z >= 0.0 {
        r
    } else {
        e * r
    }
}

/// GELU's tanh form, 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3), as the
/// equal x sigmoid(2u): vectorised, where the scalar tanh per value cost a fifth of a Gemma
/// forward pass.
fn gelu_tanh_in_place(x: &mut [f32]) {
    for v in x {
        let u = 0.797_884_6 * (*v + 0.044_715 * *v * *v * *v);
        *v *= sigmoid(2.0 * u);
    }
}

/// SiLU, x sigmoid(x), in place.
fn silu_in_place(x: &mut [f32]) {
    for v in x {
        *v *= sigmoid(*v);
    }
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

/// Softmax of one row on the baseline instruction set (and the tests' reference).
#[cfg(test)]
pub(crate) fn softmax_scalar(row: &mut [f32]) {
    softmax_generic(row)
}

fn softmax(path: KernelPath, row: &mut [f32]) {
    match path {
        // SAFETY: the path was checked against the CPU when the encoder was built.
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx512 => unsafe { avx512::softmax(row) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2 => unsafe { avx2::softmax(row) },
        _ => softmax_generic(row),
    }
}

/// Layer norm of rows [.., h] on the baseline instruction set (and the tests' reference).
pub(crate) fn layer_norm_scalar(x: &mut [f32], h: usize, weight: &[f32], bias: &[f32], eps: f32) {
    for row in x.chunks_exact_mut(h) {
        let mean = row.iter().sum::<f32>() / h as f32;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / h as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for ((v, w), b) in row.iter_mut().zip(weight).zip(bias) {
            *v = (*v - mean) * inv * w + b;
        }
    }
}

/// Layer norm of the rows of x, `h` values each at [`row_stride`]`(h)`.
fn layer_norm(path: KernelPath, x: &mut [f32], n: &Norm, h: usize) {
    let ld = row_stride(h);
    x.par_chunks_mut(ld * 64).for_each(|rows| {
        for row in rows.chunks_exact_mut(ld) {
            let row = &mut row[..h];
            match path {
                // SAFETY: the path was checked against the CPU when the encoder was built.
                #[cfg(target_arch = "x86_64")]
                KernelPath::Avx512 => unsafe {
                    avx512::layer_norm_rows(row, h, &n.weight, &n.bias, n.eps)
                },
                // SAFETY: as above.
                #[cfg(target_arch = "x86_64")]
                KernelPath::Avx2 => unsafe {
                    avx2::layer_norm_rows(row, h, &n.weight, &n.bias, n.eps)
                },
                _ => layer_norm_scalar(row, h, &n.weight, &n.bias, n.eps),
            }
        }
    });
}

fn activate(path: KernelPath, x: &mut [f32], act: Activation) {
    match act {
        Activation::GeluErf => x.par_chunks_mut(16384).for_each(|c| match path {
            // SAFETY: the path was checked against the CPU when the encoder was built.
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx512 => unsafe { avx512::gelu_slice(c) },
            KernelPath::Portable => c.iter_mut().for_each(|v| *v = gelu::gelu(*v)),
            _ => gelu::gelu_in_place(c),
        }),
        Activation::GeluTanh => x.par_chunks_mut(16384).for_each(gelu_tanh_in_place),
        Activation::Relu => x.par_chunks_mut(16384).for_each(|c| {
            for v in c {
                *v = v.max(0.0);
            }
        }),
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Module};

    use super::*;

    /// A packed dense layer gives candle's linear layer's output for a 3-D input, with and
    /// without a bias, on every kernel path this CPU supports; a tensor of the wrong width is
    /// refused.
    #[test]
    fn packed_linear_matches_candle_s() {
        let dev = Device::Cpu;
        let mut ran = 0;
        for (k, n) in [(768, 70), (37, 33), (16, 1)] {
            let w = Tensor::randn(0f32, 1.0, (n, k), &dev).unwrap();
            let b = Tensor::randn(0f32, 1.0, n, &dev).unwrap();
            let x = Tensor::randn(0f32, 1.0, (3, 5, k), &dev).unwrap();
            for bias in [None, Some(&b)] {
                let reference = candle_nn::Linear::new(w.clone(), bias.cloned())
                    .forward(&x)
                    .unwrap();
                for path in [KernelPath::Avx512, KernelPath::Avx2, KernelPath::Portable] {
                    if !path.supported() {
                        continue;
                    }
                    ran += 1;
                    let layer = PackedLinear::new(&w, bias, path).unwrap();
                    let ours = layer.forward(&x).unwrap();
                    assert_eq!(ours.dims(), reference.dims(), "{path} {k}x{n}");
                    let diff = (ours - &reference)
                        .unwrap()
                        .abs()
                        .unwrap()
                        .flatten_all()
                        .unwrap()
                        .max(0)
                        .unwrap()
                        .to_scalar::<f32>()
                        .unwrap();
                    let tolerance = 1e-4 * (k as f32).sqrt();
                    assert!(
                        diff <= tolerance,
                        "{path} {k}x{n} bias {}: off by {diff}",
                        bias.is_some()
                    );
                    let narrow = x.narrow(2, 0, k - 1).unwrap();
                    assert!(layer.forward(&narrow).is_err(), "{path}: a narrower input");
                }
            }
        }
        assert!(ran >= 6, "the portable path runs everywhere");
    }

    /// The vectorised tanh-GELU and SiLU agree with their scalar definitions (tanh, exp)
    /// across the range activations take, tails included.
    #[test]
    fn gelu_tanh_and_silu_match_their_definitions() {
        let xs: Vec<f32> = (-20_000..=20_000).map(|i| i as f32 / 1000.0).collect();
        let (mut g, mut s) = (xs.clone(), xs.clone());
        super::gelu_tanh_in_place(&mut g);
        super::silu_in_place(&mut s);
        for ((&x, &g), &s) in xs.iter().zip(&g).zip(&s) {
            let x64 = f64::from(x);
            let u = 0.797_884_560_802_865_4 * (x64 + 0.044_715 * x64 * x64 * x64);
            let want_g = 0.5 * x64 * (1.0 + u.tanh());
            let want_s = x64 / (1.0 + (-x64).exp());
            let close =
                |got: f32, want: f64| (f64::from(got) - want).abs() <= 1e-6 * (1.0 + want.abs());
            assert!(close(g, want_g), "gelu_tanh({x}) = {g}, want {want_g}");
            assert!(close(s, want_s), "silu({x}) = {s}, want {want_s}");
        }
    }

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
