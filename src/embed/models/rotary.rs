//! The rotary-position encoders, on candle ops (any device): ModernBERT (gte-modernbert,
//! modernbert-embed: bidirectional, global attention every few layers and a local window in
//! the others), Qwen3 (Qwen3-Embedding: a causal decoder pooled at its last token) and Gemma3
//! with bidirectional attention (EmbeddingGemma). Same results as transformers' modelling code
//! (tests/integration/families.rs holds them to sentence-transformers on random weights).
//!
//! The three share one layer shape: a pre-norm transformer whose queries and keys turn by
//! their position (RoPE, "rotate half"), a gated MLP, and a final norm; they differ in their
//! norms (LayerNorm without bias; RMSNorm; Gemma's RMSNorm scaled by 1 + w, with a second
//! norm after attention and after the MLP), in which layers see a window, and in whether
//! attention is causal.
//!
//! Attention runs a block of query rows at a time ([`SCORE_BUDGET`] scores in flight), so a
//! 8,192-token input needs memory that grows with its length, not its square; a windowed
//! layer reads only the keys its window can reach, so it costs the length times the window.
//! Batches are padded on the right: a causal model's tokens never see the padding after them,
//! and RoPE depends only on the distance between tokens, so this equals the left padding
//! sentence-transformers uses for decoders.

use candle_core::{DType, Device, Module, Result, Tensor, D};
use candle_nn::{Embedding, Linear, VarBuilder};

use crate::embed::cpu::kernels::KernelPath;
use crate::embed::cpu::{gated, Gate, PackedLinear};
use serde::Deserialize;
use serde_json::Value;

/// The model types these encoders run.
pub const ROTARY_MODEL_TYPES: &[&str] = &["gemma3_text", "modernbert", "qwen3"];

/// Scores one attention block may hold (floats): 32 Mi, 128 MiB in f32.
const SCORE_BUDGET: usize = 32 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    ModernBert,
    Qwen3,
    Gemma3,
}

impl Arch {
    pub fn from_model_type(model_type: &str) -> Option<Arch> {
        Some(match model_type {
            "modernbert" => Arch::ModernBert,
            "qwen3" => Arch::Qwen3,
            "gemma3_text" => Arch::Gemma3,
            _ => return None,
        })
    }

    /// config.json's `model_type` of the family.
    pub fn model_type(self) -> &'static str {
        match self {
            Arch::ModernBert => "modernbert",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3_text",
        }
    }
}

/// config.json's fields, under every name the three families' configs use.
#[derive(Deserialize)]
struct RawConfig {
    vocab_size: usize,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    intermediate_size: usize,
    hidden_activation: Option<String>,
    hidden_act: Option<String>,
    max_position_embeddings: usize,
    norm_eps: Option<f64>,
    rms_norm_eps: Option<f64>,
    local_attention: Option<usize>,
    global_attn_every_n_layers: Option<usize>,
    global_rope_theta: Option<f64>,
    local_rope_theta: Option<f64>,
    layer_types: Option<Vec<String>>,
    rope_theta: Option<f64>,
    rope_local_base_freq: Option<f64>,
    rope_parameters: Option<Value>,
    rope_scaling: Option<Value>,
    sliding_window: Option<usize>,
    #[serde(default)]
    use_sliding_window: bool,
    sliding_window_pattern: Option<usize>,
    query_pre_attn_scalar: Option<f64>,
    #[serde(default)]
    use_bidirectional_attention: bool,
    attn_logit_softcapping: Option<f64>,
}

/// What the encoder needs, resolved from [`RawConfig`] per family.
#[derive(Clone, Debug)]
pub struct RotaryConfig {
    pub arch: Arch,
    pub vocab: usize,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub activation: Activation,
    pub eps: f64,
    pub max_positions: usize,
    pub causal: bool,
    /// Per layer: `Some(w)` when the layer attends only to keys within `w` positions.
    pub windows: Vec<Option<usize>>,
    /// RoPE base per layer.
    pub thetas: Vec<f64>,
    /// Multiplies the queries (1/sqrt(head_dim), or Gemma's query_pre_attn_scalar^-0.5).
    pub query_scale: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    GeluErf,
    GeluTanh,
    Silu,
}

fn activation(name: &str) -> Result<Activation> {
    Ok(match name {
        "gelu" => Activation::GeluErf,
        "gelu_pytorch_tanh" | "gelu_new" | "gelu_fast" => Activation::GeluTanh,
        "silu" | "swish" => Activation::Silu,
        other => candle_core::bail!("activation `{other}` is not supported"),
    })
}

/// The per-family part of [`RotaryConfig`], before it is spread over the layers.
struct FamilyParams<'a> {
    activation: &'a str,
    eps: f64,
    causal: bool,
    /// Per layer: whether it attends through a window.
    sliding: Vec<bool>,
    window: usize,
    global_theta: f64,
    local_theta: f64,
    query_scale: f64,
}

impl RawConfig {
    /// Refuse what ragline cannot run exactly: rope scaling and logit soft-capping.
    fn check_supported(&self) -> Result<()> {
        if self.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
            candle_core::bail!("rope_scaling is not supported");
        }
        if self.attn_logit_softcapping.is_some() {
            candle_core::bail!("attn_logit_softcapping is not supported");
        }
        Ok(())
    }

    /// The attention heads, key/value heads and head size, checked to fit together.
    fn head_shape(&self) -> Result<(usize, usize, usize)> {
        let heads = self.num_attention_heads;
        let head_dim = self.head_dim.unwrap_or(self.hidden_size / heads.max(1));
        let kv_heads = self.num_key_value_heads.unwrap_or(heads);
        if heads == 0
            || kv_heads == 0
            || !heads.is_multiple_of(kv_heads)
            || !head_dim.is_multiple_of(2)
        {
            candle_core::bail!(
                "{heads} attention heads, {kv_heads} key/value heads and head size {head_dim} \
                 do not fit together"
            );
        }
        Ok((heads, kv_heads, head_dim))
    }

    /// The RoPE base of the `kind` layers: `rope_parameters` first, then the legacy field,
    /// then the family's default; a rope_type other than "default" is refused.
    fn theta(&self, kind: &str, legacy: Option<f64>, default: f64) -> Result<f64> {
        let params = self.rope_parameters.as_ref();
        let own = params.and_then(|p| p.get(kind)).or(params);
        if let Some(t) = own.and_then(|p| p.get("rope_type")).and_then(Value::as_str) {
            if t != "default" {
                candle_core::bail!("rope_type `{t}` is not supported");
            }
        }
        Ok(own
            .and_then(|p| p.get("rope_theta"))
            .and_then(Value::as_f64)
            .or(legacy)
            .unwrap_or(default))
    }

    /// Per layer, whether it slides: from `layer_types`, else the family's `default` pattern.
    fn sliding_layers(&self, default: &dyn Fn(usize) -> bool) -> Vec<bool> {
        match &self.layer_types {
            Some(t) => t.iter().map(|s| s == "sliding_attention").collect(),
            None => (0..self.num_hidden_layers).map(default).collect(),
        }
    }

    /// ModernBERT: bidirectional, global attention every few layers, a local window elsewhere.
    fn modernbert(&self, head_dim: usize) -> Result<FamilyParams<'_>> {
        let every = self.global_attn_every_n_layers.unwrap_or(3).max(1);
        Ok(FamilyParams {
            activation: self.hidden_activation.as_deref().unwrap_or("gelu"),
            eps: self.norm_eps.unwrap_or(1e-5),
            causal: false,
            sliding: self.sliding_layers(&|i| i % every != 0),
            window: self.local_attention.unwrap_or(128) / 2,
            global_theta: self.theta("full_attention", self.global_rope_theta, 160_000.0)?,
            local_theta: self.theta("sliding_attention", self.local_rope_theta, 10_000.0)?,
            query_scale: (head_dim as f64).powf(-0.5),
        })
    }

    /// Qwen3: causal, global attention in every layer (its sliding window is refused).
    fn qwen3(&self, head_dim: usize) -> Result<FamilyParams<'_>> {
        if self.use_sliding_window {
            candle_core::bail!("use_sliding_window is not supported for qwen3");
        }
        let t = self.theta("full_attention", self.rope_theta, 10_000.0)?;
        Ok(FamilyParams {
            activation: self.hidden_act.as_deref().unwrap_or("silu"),
            eps: self.rms_norm_eps.unwrap_or(1e-6),
            causal: true,
            sliding: vec![false; self.num_hidden_layers],
            window: 0,
            global_theta: t,
            local_theta: t,
            query_scale: (head_dim as f64).powf(-0.5),
        })
    }

    /// Gemma3: causal or bidirectional, a sliding window in all but every `pattern`-th layer.
    fn gemma3(&self) -> Result<FamilyParams<'_>> {
        let pattern = self.sliding_window_pattern.unwrap_or(6).max(1);
        let w = self.sliding_window.unwrap_or(4096).max(1);
        let bidirectional = self.use_bidirectional_attention;
        Ok(FamilyParams {
            activation: self
                .hidden_activation
                .as_deref()
                .unwrap_or("gelu_pytorch_tanh"),
            eps: self.rms_norm_eps.unwrap_or(1e-6),
            causal: !bidirectional,
            sliding: self.sliding_layers(&|i| !(i + 1).is_multiple_of(pattern)),
            // transformers: |i - j| <= w/2 both ways when bidirectional, else
            // j > i - w.
            window: if bidirectional { w / 2 } else { w - 1 },
            global_theta: self.theta("full_attention", self.rope_theta, 1_000_000.0)?,
            local_theta: self.theta("sliding_attention", self.rope_local_base_freq, 10_000.0)?,
            query_scale: self.query_pre_attn_scalar.unwrap_or(256.0).powf(-0.5),
        })
    }
}

impl RotaryConfig {
    /// Read config.json for `arch`; what ragline cannot run exactly (rope scaling, logit
    /// soft-capping, Qwen3's sliding window) is refused, naming the field.
    pub fn from_json(raw: &[u8], arch: Arch) -> Result<Self> {
        let c: RawConfig = serde_json::from_slice(raw)
            .map_err(|e| candle_core::Error::Msg(format!("not a {arch:?} config: {e}")))?;
        c.check_supported()?;
        let (heads, kv_heads, head_dim) = c.head_shape()?;
        let layers = c.num_hidden_layers;
        let family = match arch {
            Arch::ModernBert => c.modernbert(head_dim)?,
            Arch::Qwen3 => c.qwen3(head_dim)?,
            Arch::Gemma3 => c.gemma3()?,
        };
        let sliding = &family.sliding;
        if sliding.len() != layers {
            candle_core::bail!(
                "layer_types names {} layers, the model has {layers}",
                sliding.len()
            );
        }
        Ok(RotaryConfig {
            arch,
            vocab: c.vocab_size,
            hidden: c.hidden_size,
            layers,
            heads,
            kv_heads,
            head_dim,
            intermediate: c.intermediate_size,
            activation: activation(family.activation)?,
            eps: family.eps,
            max_positions: c.max_position_embeddings,
            causal: family.causal,
            windows: sliding
                .iter()
                .map(|&s| s.then_some(family.window))
                .collect(),
            thetas: sliding
                .iter()
                .map(|&s| {
                    if s {
                        family.local_theta
                    } else {
                        family.global_theta
                    }
                })
                .collect(),
            query_scale: family.query_scale,
        })
    }
}

/// LayerNorm (ModernBERT: no bias unless `norm_bias`) or RMSNorm (Qwen3; Gemma's 1 + w is
/// added at load).
struct Norm {
    weight: Tensor,
    bias: Option<Tensor>,
    eps: f32,
}

impl Norm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match &self.bias {
            Some(b) => candle_nn::ops::layer_norm(x, &self.weight, b, self.eps),
            None => candle_nn::ops::rms_norm(x, &self.weight, self.eps),
        }
    }
}

struct Layer {
    /// ModernBERT's first layer has none (its embeddings are normed already).
    attn_norm: Option<Norm>,
    /// Fused [3 * heads * head_dim, hidden] (ModernBERT) or separate projections.
    qkv: Qkv,
    /// Qwen3's and Gemma's per-head norms of queries and keys.
    qk_norm: Option<(Norm, Norm)>,
    out: Dense,
    /// Gemma: a norm of the attention output before the residual, and of the MLP's.
    post_attn_norm: Option<Norm>,
    mlp_norm: Norm,
    post_mlp_norm: Option<Norm>,
    /// ModernBERT: Wi [2 * inter, hidden] (input then gate); others gate and up.
    mlp_in: MlpIn,
    mlp_out: Dense,
    window: Option<usize>,
    /// Which of the model's RoPE tables turns this layer's queries and keys.
    rope: usize,
}

enum Qkv {
    Fused(Dense),
    Split(Dense, Dense, Dense),
}

enum MlpIn {
    Fused(Dense),
    GateUp(Dense, Dense),
}

pub struct RotaryModel {
    config: RotaryConfig,
    embeddings: Embedding,
    /// ModernBERT's norm of the embeddings.
    embedding_norm: Option<Norm>,
    /// Gemma multiplies the embeddings by sqrt(hidden).
    embedding_scale: Option<f64>,
    layers: Vec<Layer>,
    final_norm: Norm,
    /// RoPE inverse frequencies [head_dim / 2] (f32) per distinct base.
    ropes: Vec<Vec<f32>>,
    device: Device,
    dtype: DType,
    /// The kernel path its projections run on (ragline's packed GEMM), where they do.
    packed: Option<KernelPath>,
}

/// How a family's norms load: RMS norms (Gemma3 stores `weight - 1`) and layer norms (a
/// missing bias is zero).
#[derive(Clone, Copy)]
struct Norms {
    eps: f64,
    gemma: bool,
}

impl Norms {
    fn rms(self, vb: VarBuilder, size: usize) -> Result<Norm> {
        let w = vb.get(size, "weight")?;
        let w = if self.gemma {
            (w.to_dtype(DType::F32)? + 1.0)?.to_dtype(w.dtype())?
        } else {
            w
        };
        Ok(Norm {
            weight: w,
            bias: None,
            eps: self.eps as f32,
        })
    }

    fn layer(self, vb: VarBuilder, size: usize) -> Result<Norm> {
        let weight = vb.get(size, "weight")?;
        let bias = if vb.contains_tensor("bias") {
            vb.get(size, "bias")?
        } else {
            weight.zeros_like()?
        };
        Ok(Norm {
            weight,
            bias: Some(bias),
            eps: self.eps as f32,
        })
    }
}

/// A linear layer, with its bias when the weights have one.
fn linear(vb: VarBuilder, i: usize, o: usize, packed: Option<KernelPath>) -> Result<Dense> {
    let bias = vb.contains_tensor("bias");
    let layer = candle_nn::linear_b(i, o, bias, vb)?;
    Ok(match packed {
        Some(path) => Dense::Packed(Box::new(PackedLinear::new(
            layer.weight(),
            layer.bias(),
            path,
        )?)),
        None => Dense::Candle(layer),
    })
}

/// The kernel path the projections of a model on `device` in `dtype` run on: on the CPU in
/// f32 the fused encoder's avx512 or avx2 kernels; None (candle's matmul) elsewhere, and for
/// the portable kernels, which are no faster than candle's.
fn packed_path(device: &Device, dtype: DType) -> Result<Option<KernelPath>> {
    if !device.is_cpu() || dtype != DType::F32 {
        return Ok(None);
    }
    let path = KernelPath::chosen().map_err(|e| candle_core::Error::Msg(e.to_string()))?;
    Ok((path != KernelPath::Portable).then_some(path))
}

/// A projection: on the CPU in f32 on ragline's packed GEMM (the fused BERT encoder's
/// kernels), elsewhere candle's linear layer.
enum Dense {
    Candle(Linear),
    Packed(Box<PackedLinear>),
}

impl Dense {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Dense::Candle(l) => l.forward(x),
            Dense::Packed(p) => p.forward(x),
        }
    }
}

/// Layer `l` of a ModernBERT: fused QKV and gated MLP, pre-norms (none before the first
/// layer's attention).
fn modernbert_layer(
    v: VarBuilder,
    c: &RotaryConfig,
    n: Norms,
    l: usize,
    rope: usize,
    packed: Option<KernelPath>,
) -> Result<Layer> {
    let (h, hd) = (c.hidden, c.head_dim);
    Ok(Layer {
        attn_norm: if l == 0 {
            None
        } else {
            Some(n.layer(v.pp("attn_norm"), h)?)
        },
        qkv: Qkv::Fused(linear(v.pp("attn.Wqkv"), h, 3 * c.heads * hd, packed)?),
        qk_norm: None,
        out: linear(v.pp("attn.Wo"), c.heads * hd, h, packed)?,
        post_attn_norm: None,
        mlp_norm: n.layer(v.pp("mlp_norm"), h)?,
        post_mlp_norm: None,
        mlp_in: MlpIn::Fused(linear(v.pp("mlp.Wi"), h, 2 * c.intermediate, packed)?),
        mlp_out: linear(v.pp("mlp.Wo"), c.intermediate, h, packed)?,
        window: c.windows[l],
        rope,
    })
}

/// Layer `l` of a Qwen3 or Gemma3: split projections with grouped key/value heads, RMS
/// norms on queries and keys, and Gemma3's norms after attention and MLP too.
fn decoder_layer(
    v: VarBuilder,
    c: &RotaryConfig,
    n: Norms,
    l: usize,
    rope: usize,
    packed: Option<KernelPath>,
) -> Result<Layer> {
    let (h, hd) = (c.hidden, c.head_dim);
    let a = v.pp("self_attn");
    let m = v.pp("mlp");
    let gemma_only =
        |name: &str| -> Result<Option<Norm>> { n.gemma.then(|| n.rms(v.pp(name), h)).transpose() };
    Ok(Layer {
        attn_norm: Some(n.rms(v.pp("input_layernorm"), h)?),
        qkv: Qkv::Split(
            linear(a.pp("q_proj"), h, c.heads * hd, packed)?,
            linear(a.pp("k_proj"), h, c.kv_heads * hd, packed)?,
            linear(a.pp("v_proj"), h, c.kv_heads * hd, packed)?,
        ),
        qk_norm: Some((n.rms(a.pp("q_norm"), hd)?, n.rms(a.pp("k_norm"), hd)?)),
        out: linear(a.pp("o_proj"), c.heads * hd, h, packed)?,
        post_attn_norm: gemma_only("post_attention_layernorm")?,
        mlp_norm: if n.gemma {
            n.rms(v.pp("pre_feedforward_layernorm"), h)?
        } else {
            n.rms(v.pp("post_attention_layernorm"), h)?
        },
        post_mlp_norm: gemma_only("post_feedforward_layernorm")?,
        mlp_in: MlpIn::GateUp(
            linear(m.pp("gate_proj"), h, c.intermediate, packed)?,
            linear(m.pp("up_proj"), h, c.intermediate, packed)?,
        ),
        mlp_out: linear(m.pp("down_proj"), c.intermediate, h, packed)?,
        window: c.windows[l],
        rope,
    })
}

impl RotaryModel {
    /// Load from a VarBuilder over the model's weights, with or without a `model.` prefix.
    pub fn load(vb: VarBuilder, config: RotaryConfig) -> Result<Self> {
        let c = &config;
        let vb = match c.arch {
            Arch::ModernBert if vb.contains_tensor("model.embeddings.tok_embeddings.weight") => {
                vb.pp("model")
            }
            Arch::Qwen3 | Arch::Gemma3 if vb.contains_tensor("model.embed_tokens.weight") => {
                vb.pp("model")
            }
            _ => vb,
        };
        let (h, hd) = (c.hidden, c.head_dim);
        let n = Norms {
            eps: c.eps,
            gemma: c.arch == Arch::Gemma3,
        };
        let inv_freq = |theta: f64| -> Vec<f32> {
            (0..hd / 2)
                .map(|i| 1.0 / (theta as f32).powf((2 * i) as f32 / hd as f32))
                .collect()
        };
        // The distinct RoPE bases (global and local), each one's inverse frequencies.
        let mut bases: Vec<f64> = Vec::new();
        for &t in &c.thetas {
            if !bases.contains(&t) {
                bases.push(t);
            }
        }
        let rope_index = |t: f64| bases.iter().position(|&b| b == t).unwrap_or(0);
        let packed = packed_path(vb.device(), vb.dtype())?;
        let ropes: Vec<Vec<f32>> = bases.iter().map(|&t| inv_freq(t)).collect();
        let mut layers = Vec::with_capacity(c.layers);
        let (embeddings, embedding_norm, embedding_scale, final_norm) = match c.arch {
            Arch::ModernBert => {
                let embeddings =
                    candle_nn::embedding(c.vocab, h, vb.pp("embeddings.tok_embeddings"))?;
                let embedding_norm = Some(n.layer(vb.pp("embeddings.norm"), h)?);
                for l in 0..c.layers {
                    let v = vb.pp(format!("layers.{l}"));
                    layers.push(modernbert_layer(
                        v,
                        c,
                        n,
                        l,
                        rope_index(c.thetas[l]),
                        packed,
                    )?);
                }
                let final_norm = n.layer(vb.pp("final_norm"), h)?;
                (embeddings, embedding_norm, None, final_norm)
            }
            Arch::Qwen3 | Arch::Gemma3 => {
                let embeddings = candle_nn::embedding(c.vocab, h, vb.pp("embed_tokens"))?;
                for l in 0..c.layers {
                    let v = vb.pp(format!("layers.{l}"));
                    layers.push(decoder_layer(v, c, n, l, rope_index(c.thetas[l]), packed)?);
                }
                let final_norm = n.rms(vb.pp("norm"), h)?;
                // transformers multiplies by sqrt(hidden) held in the weights' dtype.
                let scale = Tensor::new((h as f64).sqrt() as f32, &Device::Cpu)?
                    .to_dtype(vb.dtype())?
                    .to_dtype(DType::F64)?
                    .to_scalar::<f64>()?;
                (embeddings, None, n.gemma.then_some(scale), final_norm)
            }
        };
        Ok(RotaryModel {
            embeddings,
            embedding_norm,
            embedding_scale,
            layers,
            final_norm,
            ropes,
            device: vb.device().clone(),
            dtype: vb.dtype(),
            packed,
            config,
        })
    }

    /// Which encoder runs, in words: "candle modernbert encoder, f32, its projections on the
    /// avx512 kernels".
    pub fn describe(&self) -> String {
        let base = format!(
            "candle {} encoder, {:?}",
            self.config.arch.model_type(),
            self.dtype
        )
        .to_lowercase();
        match self.packed {
            Some(path) => format!("{base}, its projections on the {path} kernels"),
            None => base,
        }
    }

    pub fn arch(&self) -> Arch {
        self.config.arch
    }

    pub fn hidden_size(&self) -> usize {
        self.config.hidden
    }

    pub fn max_positions(&self) -> usize {
        self.config.max_positions
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Hidden states [batch, len, hidden] of `ids` ([batch * len], right-padded; row `r`'s
    /// tokens are its first `lengths[r]`).
    pub fn forward(&self, ids: Vec<u32>, lengths: &[usize]) -> Result<Tensor> {
        let c = &self.config;
        let b = lengths.len();
        let len = ids.len().checked_div(b).unwrap_or(0);
        if len > c.max_positions {
            candle_core::bail!(
                "sequence of {len} tokens exceeds the model's {} positions",
                c.max_positions
            );
        }
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= c.vocab) {
            candle_core::bail!("token id {id} is outside the vocabulary of {}", c.vocab);
        }
        // On the CPU (the projections on the packed GEMM) every per-token step runs on the
        // real tokens alone, [tokens, hidden]; attention alone sees the padded batch.
        let layout = Layout {
            b,
            len,
            real: match self.packed {
                Some(_) if lengths.iter().any(|&n| n < len) => {
                    let real: Vec<u32> = lengths
                        .iter()
                        .enumerate()
                        .flat_map(|(r, &n)| (0..n.min(len)).map(move |p| (r * len + p) as u32))
                        .collect();
                    let n = real.len();
                    Some(Tensor::from_vec(real, n, &self.device)?)
                }
                _ => None,
            },
        };
        let ids = Tensor::from_vec(ids, (b, len), &self.device)?;
        let ids = match &layout.real {
            Some(real) => ids.flatten_all()?.index_select(real, 0)?,
            None => ids,
        };
        let mut x = self.embeddings.forward(&ids)?;
        if let Some(scale) = self.embedding_scale {
            x = (x * scale)?;
        }
        if let Some(n) = &self.embedding_norm {
            x = n.forward(&x)?;
        }
        let mut masks = Masks::new(lengths, len, c.causal, self.dtype, &self.device);
        let tables = self
            .ropes
            .iter()
            .map(|f| self.rope_tables(f, len))
            .collect::<Result<Vec<_>>>()?;
        for layer in &self.layers {
            let (cos, sin) = &tables[layer.rope];
            x = self.layer(layer, &x, &layout, cos, sin, &mut masks)?;
        }
        let x = self.final_norm.forward(&x)?;
        layout.padded(&x)?.reshape((b, len, c.hidden))
    }

    /// cos and sin [len, head_dim / 2] of positions 0..len, computed in f32 as transformers
    /// does, in the model's dtype.
    fn rope_tables(&self, inv_freq: &[f32], len: usize) -> Result<(Tensor, Tensor)> {
        let half = inv_freq.len();
        let mut cos = Vec::with_capacity(len * half);
        let mut sin = Vec::with_capacity(len * half);
        for p in 0..len {
            for &f in inv_freq {
                let a = p as f32 * f;
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        let cos = Tensor::from_vec(cos, (len, half), &self.device)?.to_dtype(self.dtype)?;
        let sin = Tensor::from_vec(sin, (len, half), &self.device)?.to_dtype(self.dtype)?;
        Ok((cos, sin))
    }

    fn layer(
        &self,
        l: &Layer,
        x: &Tensor,
        layout: &Layout,
        cos: &Tensor,
        sin: &Tensor,
        masks: &mut Masks,
    ) -> Result<Tensor> {
        let c = &self.config;
        let (b, len) = (layout.b, layout.len);
        let (nh, nkv, hd) = (c.heads, c.kv_heads, c.head_dim);
        let normed = match &l.attn_norm {
            Some(n) => n.forward(x)?,
            None => x.clone(),
        };
        let (q, k, v) = match &l.qkv {
            Qkv::Fused(w) => {
                let qkv = layout
                    .padded(&w.forward(&normed)?)?
                    .reshape((b, len, 3, nh, hd))?;
                (
                    qkv.narrow(2, 0, 1)?.squeeze(2)?,
                    qkv.narrow(2, 1, 1)?.squeeze(2)?,
                    qkv.narrow(2, 2, 1)?.squeeze(2)?,
                )
            }
            Qkv::Split(wq, wk, wv) => (
                layout
                    .padded(&wq.forward(&normed)?)?
                    .reshape((b, len, nh, hd))?,
                layout
                    .padded(&wk.forward(&normed)?)?
                    .reshape((b, len, nkv, hd))?,
                layout
                    .padded(&wv.forward(&normed)?)?
                    .reshape((b, len, nkv, hd))?,
            ),
        };
        let (q, k) = match &l.qk_norm {
            Some((nq, nk)) => (nq.forward(&q.contiguous()?)?, nk.forward(&k.contiguous()?)?),
            None => (q, k),
        };
        // [b, heads, len, hd], turned by position.
        let q = q.transpose(1, 2)?.contiguous()?;
        let k = k.transpose(1, 2)?.contiguous()?;
        let v = v.transpose(1, 2)?.contiguous()?;
        let q = (candle_nn::rotary_emb::rope(&q, cos, sin)? * c.query_scale)?;
        let k = candle_nn::rotary_emb::rope(&k, cos, sin)?;
        let (k, v) = if nkv == nh {
            (k, v)
        } else {
            let rep = nh / nkv;
            let repeat = |t: Tensor| -> Result<Tensor> {
                t.unsqueeze(2)?
                    .expand((b, nkv, rep, len, hd))?
                    .reshape((b, nh, len, hd))
            };
            (repeat(k)?, repeat(v)?)
        };
        let context = attend(&q, &k, &v, l.window, masks)?;
        let context = match &layout.real {
            Some(real) => context
                .transpose(1, 2)?
                .reshape((b * len, nh * hd))?
                .index_select(real, 0)?,
            None => context.transpose(1, 2)?.reshape((b, len, nh * hd))?,
        };
        let mut attended = l.out.forward(&context)?;
        if let Some(n) = &l.post_attn_norm {
            attended = n.forward(&attended)?;
        }
        let x = (x + attended)?;
        let inner = l.mlp_norm.forward(&x)?;
        if let Some(path) = self.packed {
            // On the CPU in f32: act(input) * gate in one pass, the GELU vectorised.
            let act = match c.activation {
                Activation::GeluErf => Gate::GeluErf,
                Activation::GeluTanh => Gate::GeluTanh,
                Activation::Silu => Gate::Silu,
            };
            let product = match &l.mlp_in {
                MlpIn::Fused(w) => gated(path, &w.forward(&inner)?, None, act)?,
                MlpIn::GateUp(g, u) => {
                    gated(path, &g.forward(&inner)?, Some(&u.forward(&inner)?), act)?
                }
            };
            let mut out = l.mlp_out.forward(&product)?;
            if let Some(n) = &l.post_mlp_norm {
                out = n.forward(&out)?;
            }
            return x + out;
        }
        let (input, gate) = match &l.mlp_in {
            MlpIn::Fused(w) => {
                let both = w.forward(&inner)?;
                let i = c.intermediate;
                // ModernBERT: act(input) * gate.
                (both.narrow(D::Minus1, 0, i)?, both.narrow(D::Minus1, i, i)?)
            }
            // Qwen3 and Gemma: act(gate) * up.
            MlpIn::GateUp(g, u) => (g.forward(&inner)?, u.forward(&inner)?),
        };
        let activated = match c.activation {
            Activation::GeluErf => input.gelu_erf()?,
            Activation::GeluTanh => input.gelu()?,
            Activation::Silu => candle_nn::ops::silu(&input)?,
        };
        let mut out = l.mlp_out.forward(&(activated * gate)?)?;
        if let Some(n) = &l.post_mlp_norm {
            out = n.forward(&out)?;
        }
        x + out
    }
}

/// A batch's shape, and where it keeps only its real tokens: the flat index (row x len +
/// position) of each, in order; the per-token steps then run on [tokens, ..] rows.
struct Layout {
    b: usize,
    len: usize,
    real: Option<Tensor>,
}

impl Layout {
    /// Per-token rows [tokens, w] (or already padded) as the padded batch's [b * len, w],
    /// the padding rows zeros (attention gives them no weight; pooling masks them).
    fn padded(&self, t: &Tensor) -> Result<Tensor> {
        match &self.real {
            Some(real) => {
                let w = t.dim(D::Minus1)?;
                Tensor::zeros((self.b * self.len, w), t.dtype(), t.device())?.index_add(
                    real,
                    &t.contiguous()?,
                    0,
                )
            }
            None => Ok(t.clone()),
        }
    }
}

/// A mask's block: first query row, rows, first key, window.
type MaskKey = (usize, usize, usize, Option<usize>);

/// Additive masks (0 or -inf) for blocks of query rows, made as needed and kept while the
/// whole sequence is one block (then every layer of a kind reuses one).
struct Masks {
    lengths: Vec<usize>,
    len: usize,
    causal: bool,
    dtype: DType,
    device: Device,
    kept: Vec<(MaskKey, Option<Tensor>)>,
}

impl Masks {
    fn new(lengths: &[usize], len: usize, causal: bool, dtype: DType, device: &Device) -> Self {
        Masks {
            lengths: lengths.to_vec(),
            len,
            causal,
            dtype,
            device: device.clone(),
            kept: Vec::new(),
        }
    }

    /// The mask [b, 1, rows, k1 - k0] for queries q0..q0+rows and keys k0..k1, or None when
    /// every pair may attend. Padding queries see every key (their rows are never pooled;
    /// this keeps each row's softmax finite).
    fn get(
        &mut self,
        q0: usize,
        rows: usize,
        k0: usize,
        k1: usize,
        window: Option<usize>,
    ) -> Result<Option<Tensor>> {
        let key = (q0, rows, k0, window);
        if let Some((_, m)) = self.kept.iter().find(|(k, _)| *k == key) {
            return Ok(m.clone());
        }
        let b = self.lengths.len();
        let kn = k1 - k0;
        let whole = self.lengths.iter().all(|&n| n == self.len);
        if whole && !self.causal && window.is_none() {
            return Ok(None);
        }
        let mut m = vec![0f32; b * rows * kn];
        let mut any = false;
        for (r, &n) in self.lengths.iter().enumerate() {
            for i in 0..rows {
                let qp = q0 + i;
                if qp >= n {
                    continue;
                }
                let row = &mut m[(r * rows + i) * kn..(r * rows + i + 1) * kn];
                for (j, slot) in row.iter_mut().enumerate() {
                    let kp = k0 + j;
                    let allowed = kp < n
                        && (!self.causal || kp <= qp)
                        && window.is_none_or(|w| qp.abs_diff(kp) <= w);
                    if !allowed {
                        *slot = f32::NEG_INFINITY;
                        any = true;
                    }
                }
            }
        }
        let mask = if any {
            Some(Tensor::from_vec(m, (b, 1, rows, kn), &self.device)?.to_dtype(self.dtype)?)
        } else {
            None
        };
        if rows == self.len {
            self.kept.push((key, mask.clone()));
        }
        Ok(mask)
    }
}

/// softmax(q k^T + mask) v over [b, heads, len, hd], a block of query rows at a time; a
/// windowed layer reads only the keys the block's window reaches, a causal one only those
/// up to the block's last row.
fn attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    window: Option<usize>,
    masks: &mut Masks,
) -> Result<Tensor> {
    let (b, nh, len, _) = q.dims4()?;
    let rows_fit = (SCORE_BUDGET / (b * nh * len).max(1)).max(16);
    let block = rows_fit.min(len).max(1);
    let mut parts = Vec::with_capacity(len.div_ceil(block));
    for q0 in (0..len).step_by(block) {
        let rows = block.min(len - q0);
        let (mut k0, mut k1) = (0, len);
        if let Some(w) = window {
            k0 = q0.saturating_sub(w);
            k1 = (q0 + rows + w).min(len);
        }
        if masks.causal {
            k1 = k1.min(q0 + rows);
        }
        let qb = if rows == len {
            q.clone()
        } else {
            q.narrow(2, q0, rows)?.contiguous()?
        };
        let (kb, vb) = if k0 == 0 && k1 == len {
            (k.clone(), v.clone())
        } else {
            (
                k.narrow(2, k0, k1 - k0)?.contiguous()?,
                v.narrow(2, k0, k1 - k0)?.contiguous()?,
            )
        };
        let scores = qb.matmul(&kb.t()?)?;
        let scores = match masks.get(q0, rows, k0, k1, window)? {
            Some(m) => scores.broadcast_add(&m)?,
            None => scores,
        };
        let p = candle_nn::ops::softmax_last_dim(&scores)?;
        parts.push(p.matmul(&vb)?);
    }
    if parts.len() == 1 {
        Ok(parts.pop().expect("one part"))
    } else {
        Tensor::cat(&parts, 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_resolve_windows_layers_and_rope_bases_as_transformers_does() {
        let modern = br#"{"vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 4,
            "num_attention_heads": 2, "intermediate_size": 8, "max_position_embeddings": 64,
            "local_attention": 128, "global_attn_every_n_layers": 3}"#;
        let c = RotaryConfig::from_json(modern, Arch::ModernBert).unwrap();
        assert_eq!(c.windows, vec![None, Some(64), Some(64), None]);
        assert_eq!(c.thetas, vec![160_000.0, 10_000.0, 10_000.0, 160_000.0]);
        assert!(!c.causal);
        let gemma = br#"{"vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 6,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
            "intermediate_size": 8, "max_position_embeddings": 64, "sliding_window": 512,
            "use_bidirectional_attention": true, "query_pre_attn_scalar": 16,
            "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 5.0},
                                "sliding_attention": {"rope_type": "default", "rope_theta": 3.0}}}"#;
        let c = RotaryConfig::from_json(gemma, Arch::Gemma3).unwrap();
        // Bidirectional: |i - j| < 512 / 2 + 1; every sixth layer full.
        assert_eq!(c.windows[0], Some(256));
        assert_eq!(c.windows[5], None);
        assert_eq!((c.thetas[0], c.thetas[5]), (3.0, 5.0));
        assert!(!c.causal);
        assert!((c.query_scale - 0.25).abs() < 1e-12);
        let scaled = br#"{"vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 2, "intermediate_size": 8, "max_position_embeddings": 64,
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}"#;
        let err = RotaryConfig::from_json(scaled, Arch::Qwen3)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("rope_scaling"), "{err}");
    }

    #[test]
    fn masks_follow_padding_causality_and_windows() {
        let mut m = Masks::new(&[3, 5], 5, true, DType::F32, &Device::Cpu);
        let mask = m.get(0, 5, 0, 5, Some(1)).unwrap().unwrap();
        let v = mask.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let open = |r: usize, i: usize, j: usize| v[(r * 5 + i) * 5 + j] == 0.0;
        // Row 0 has 3 tokens: query 2 sees keys 1 and 2 (causal, window 1), not 3 or 0.
        assert!(open(0, 2, 1) && open(0, 2, 2) && !open(0, 2, 3) && !open(0, 2, 0));
        // A padding query sees every key (its row is never pooled; softmax stays finite).
        assert!((0..5).all(|j| open(0, 4, j)));
        // Row 1, query 4: keys 3 and 4.
        assert!(open(1, 4, 3) && open(1, 4, 4) && !open(1, 4, 2));
        // Whole rows, bidirectional, no window: no mask at all.
        let mut whole = Masks::new(&[4, 4], 4, false, DType::F32, &Device::Cpu);
        assert!(whole.get(0, 4, 0, 4, None).unwrap().is_none());
    }
}
