//! The BERT-like encoders (BERT, MiniLM, BGE, E5, GTE; RoBERTa and XLM-RoBERTa: bge-m3,
//! multilingual-e5; DistilBERT; MPNet: all-mpnet-base-v2), written for inference speed on top
//! of candle ops. The families differ only in their weights' names, where positions start
//! (RoBERTa and MPNet count from the padding id + 1), token types, and MPNet's relative
//! position bias; the layer is the same post-norm transformer layer. Same results as
//! sentence-transformers for MiniLM (tests/integration/embedding.rs) and as transformers
//! for the other families (tests/integration/families.rs), with what costs time on CPU
//! removed:
//! - Q, K and V are one matmul against a fused weight, and the 1/sqrt(head) scale is folded
//!   into the query weights at load;
//! - weights are stored transposed once, so each linear layer is one plain GEMM;
//! - softmax over the last dimension and layer norm use candle's fused kernels;
//! - GELU is fused with the bias add (see [`crate::embed::gelu`]);
//! - token-type and position embeddings are pre-added (token type 0 is the only one used).

use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;

use crate::embed::cpu::kernels::{KernelPath, Precision};
use crate::embed::cpu::{Activation, CpuBert, LayerWeights};
use crate::embed::gelu::bias_gelu;
use crate::embed::profile::Parts;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HiddenAct {
    Gelu,
    #[serde(alias = "gelu_new", alias = "gelu_pytorch_tanh")]
    GeluApproximate,
    Relu,
}

/// The fields of config.json that the encoder needs (DistilBERT's names are aliases).
#[derive(Clone, Debug, Deserialize)]
pub struct BertConfig {
    pub vocab_size: usize,
    #[serde(alias = "dim")]
    pub hidden_size: usize,
    #[serde(alias = "n_layers")]
    pub num_hidden_layers: usize,
    #[serde(alias = "n_heads")]
    pub num_attention_heads: usize,
    #[serde(alias = "hidden_dim")]
    pub intermediate_size: usize,
    #[serde(alias = "activation")]
    pub hidden_act: HiddenAct,
    pub max_position_embeddings: usize,
    #[serde(default = "default_type_vocab")]
    pub type_vocab_size: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default)]
    pub model_type: Option<String>,
    #[serde(default)]
    pub position_embedding_type: Option<String>,
    #[serde(default)]
    pub pad_token_id: Option<u32>,
    /// MPNet's relative position buckets.
    #[serde(default)]
    pub relative_attention_num_buckets: Option<usize>,
}

fn default_type_vocab() -> usize {
    2
}

fn default_eps() -> f64 {
    1e-12
}

/// A family of BERT-like encoders, from config.json's `model_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Bert,
    /// RoBERTa and XLM-RoBERTa: BERT's layer, positions from the padding id + 1.
    Roberta,
    DistilBert,
    /// MPNet: positions from the padding id + 1, a relative position bias in attention.
    MpNet,
}

impl Family {
    pub fn from_model_type(model_type: &str) -> Option<Family> {
        Some(match model_type {
            "bert" => Family::Bert,
            "roberta" | "xlm-roberta" | "camembert" => Family::Roberta,
            "distilbert" => Family::DistilBert,
            "mpnet" => Family::MpNet,
            _ => return None,
        })
    }

    /// The prefixes its weights may carry (a task model's base, or none).
    fn prefixes(self) -> &'static [&'static str] {
        match self {
            Family::Bert => &["bert", "model"],
            Family::Roberta => &["roberta", "xlm-roberta", "model"],
            Family::DistilBert => &["distilbert", "model"],
            Family::MpNet => &["mpnet", "model"],
        }
    }

    /// Where position ids start.
    fn first_position(self, config: &BertConfig) -> usize {
        match self {
            Family::Roberta => config.pad_token_id.unwrap_or(1) as usize + 1,
            // transformers' MPNet counts from a padding id of 1 whatever the config says.
            Family::MpNet => 2,
            Family::Bert | Family::DistilBert => 0,
        }
    }
}

/// The model types the BERT-like encoder runs.
pub const SUPPORTED_MODEL_TYPES: &[&str] = &[
    "bert",
    "camembert",
    "distilbert",
    "mpnet",
    "roberta",
    "xlm-roberta",
];

/// MPNet's bucket of a relative position (`memory - context`), as transformers computes it:
/// exact below `buckets / 4`, logarithmic up to `max_distance`, one side per half; in f32,
/// as torch does, so the bucket edges agree.
pub fn relative_bucket(relative: i64, buckets: usize, max_distance: usize) -> usize {
    let n = -relative;
    let half = (buckets / 2) as i64;
    let mut ret = if n < 0 { half } else { 0 };
    let n = n.abs();
    let max_exact = half / 2;
    if n < max_exact {
        ret += n;
    } else {
        let ratio = (n as f32 / max_exact as f32).ln()
            / ((max_distance as f64 / max_exact as f64).ln() as f32)
            * (half - max_exact) as f32;
        ret += (max_exact + ratio as i64).min(half - 1);
    }
    ret as usize
}

/// MPNet's relative position bias: one value per head and bucket.
pub struct RelativeBias {
    /// [buckets, heads].
    weight: Tensor,
    buckets: usize,
}

impl RelativeBias {
    /// The bucket of every (query, key) pair of a `len`-token sequence, row-major.
    fn buckets(&self, len: usize) -> Vec<u32> {
        let mut out = Vec::with_capacity(len * len);
        for i in 0..len {
            for j in 0..len {
                out.push(relative_bucket(j as i64 - i as i64, self.buckets, 128) as u32);
            }
        }
        out
    }

    /// The bias [heads, len, len] of a `len`-token sequence, in `dtype`.
    fn for_length(&self, len: usize, dtype: DType) -> Result<Tensor> {
        let heads = self.weight.dim(1)?;
        let idx = Tensor::from_vec(self.buckets(len), len * len, self.weight.device())?;
        self.weight
            .index_select(&idx, 0)?
            .t()?
            .contiguous()?
            .reshape((heads, len, len))?
            .to_dtype(dtype)
    }

    /// Per head, the bias of every distance `j - i` from `-(max - 1)` to `max - 1`:
    /// [heads, 2 max - 1] (the fused CPU encoder's layout).
    fn by_distance(&self, max: usize) -> Result<Vec<Vec<f32>>> {
        let w = self.weight.to_dtype(DType::F32)?.to_vec2::<f32>()?;
        let heads = self.weight.dim(1)?;
        Ok((0..heads)
            .map(|h| {
                (0..2 * max - 1)
                    .map(|d| w[relative_bucket(d as i64 - (max as i64 - 1), self.buckets, 128)][h])
                    .collect()
            })
            .collect())
    }
}

/// The names of one layer's weights in a family's checkpoints.
struct LayerNames {
    q: &'static str,
    k: &'static str,
    v: &'static str,
    attention_out: &'static str,
    attention_norm: &'static str,
    intermediate: &'static str,
    output: &'static str,
    output_norm: &'static str,
    layers: &'static str,
}

impl LayerNames {
    fn of(family: Family) -> Self {
        match family {
            Family::Bert | Family::Roberta => LayerNames {
                q: "attention.self.query",
                k: "attention.self.key",
                v: "attention.self.value",
                attention_out: "attention.output.dense",
                attention_norm: "attention.output.LayerNorm",
                intermediate: "intermediate.dense",
                output: "output.dense",
                output_norm: "output.LayerNorm",
                layers: "encoder.layer",
            },
            Family::MpNet => LayerNames {
                q: "attention.attn.q",
                k: "attention.attn.k",
                v: "attention.attn.v",
                attention_out: "attention.attn.o",
                attention_norm: "attention.LayerNorm",
                intermediate: "intermediate.dense",
                output: "output.dense",
                output_norm: "output.LayerNorm",
                layers: "encoder.layer",
            },
            Family::DistilBert => LayerNames {
                q: "attention.q_lin",
                k: "attention.k_lin",
                v: "attention.v_lin",
                attention_out: "attention.out_lin",
                attention_norm: "sa_layer_norm",
                intermediate: "ffn.lin1",
                output: "ffn.lin2",
                output_norm: "output_layer_norm",
                layers: "transformer.layer",
            },
        }
    }
}

struct Linear {
    /// [in, out]: contiguous on a GPU (cuBLASLt reads it so); on the CPU the transposed view
    /// of the [out, in] weight (candle's matmul takes it as it is, and the fused encoder packs
    /// from the weight itself: no transposed copy at load).
    weight_t: Tensor,
    bias: Tensor,
}

impl Linear {
    fn load(vb: &VarBuilder, inputs: usize, outputs: usize) -> Result<Self> {
        let weight = vb.get((outputs, inputs), "weight")?;
        let bias = vb.get(outputs, "bias")?;
        Self::from_parts(&weight, bias)
    }

    fn from_parts(weight: &Tensor, bias: Tensor) -> Result<Self> {
        Ok(Linear {
            weight_t: if weight.device().is_cpu() {
                weight.t()?
            } else {
                weight.t()?.contiguous()?
            },
            bias,
        })
    }

    /// x [n, in] -> [n, out], without the bias; the product runs in the weights' dtype and
    /// comes back in x's.
    fn matmul(&self, x: &Tensor) -> Result<Tensor> {
        x.to_dtype(self.weight_t.dtype())?
            .matmul(&self.weight_t)?
            .to_dtype(x.dtype())
    }

    /// Weights to `compute` (the matmul dtype), bias to `act` (the activations').
    fn cast(self, compute: DType, act: DType) -> Result<Self> {
        Ok(Linear {
            weight_t: self.weight_t.to_dtype(compute)?,
            bias: self.bias.to_dtype(act)?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.matmul(x)?.broadcast_add(&self.bias)
    }
}

struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
    eps: f32,
}

impl LayerNorm {
    fn load(vb: &VarBuilder, size: usize, eps: f64) -> Result<Self> {
        // Old TensorFlow-converted checkpoints name them gamma and beta.
        let (weight, bias) = match (vb.get(size, "weight"), vb.get(size, "bias")) {
            (Ok(w), Ok(b)) => (w, b),
            _ => (vb.get(size, "gamma")?, vb.get(size, "beta")?),
        };
        Ok(LayerNorm {
            weight,
            bias,
            eps: eps as f32,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        candle_nn::ops::layer_norm(x, &self.weight, &self.bias, self.eps)
    }

    fn cast(self, dtype: DType) -> Result<Self> {
        Ok(LayerNorm {
            weight: self.weight.to_dtype(dtype)?,
            bias: self.bias.to_dtype(dtype)?,
            eps: self.eps,
        })
    }
}

struct Layer {
    qkv: Linear,
    attention_out: Linear,
    attention_norm: LayerNorm,
    intermediate: Linear,
    output: Linear,
    output_norm: LayerNorm,
}

/// The encoder: token ids in, one hidden state per token out.
pub struct Bert {
    word_embeddings: Tensor,
    /// Position embeddings plus the token-type-0 embedding, [max_positions, hidden].
    position_type: Tensor,
    /// Each token type's embedding less type 0's, [types, hidden] (row 0 zeros), where the
    /// family has several: what a pair's second segment adds (cross-encoders).
    token_types: Option<Tensor>,
    embedding_norm: LayerNorm,
    layers: Vec<Layer>,
    heads: usize,
    head_size: usize,
    hidden: usize,
    act: HiddenAct,
    max_positions: usize,
    relative: Option<RelativeBias>,
    family: Family,
    device: Device,
    /// The dtype of the matrix products.
    dtype: DType,
    /// The dtype of everything else: the hidden states between layers, residual adds, layer
    /// norms, softmax. f32 when the products run in bf16, whose 8-bit mantissa loses too much
    /// over six residual layers (cosine 0.998 against 0.99999 with f32 activations); the
    /// products' dtype otherwise.
    act_dtype: DType,
    /// The cuBLASLt linear layers (f16 on CUDA; see [`crate::embed::lt`]).
    #[cfg(feature = "cuda")]
    lt: Option<crate::embed::lt::Lt>,
}

/// Refuse a config whose hidden size does not split into its heads, or whose position
/// embeddings are not absolute.
fn check_shape(config: &BertConfig) -> Result<()> {
    let h = config.hidden_size;
    if !h.is_multiple_of(config.num_attention_heads) {
        candle_core::bail!(
            "hidden_size {h} is not a multiple of num_attention_heads {}",
            config.num_attention_heads
        );
    }
    if config
        .position_embedding_type
        .as_deref()
        .is_some_and(|t| t != "absolute")
    {
        candle_core::bail!(
            "position_embedding_type {:?} is not supported; supported: absolute",
            config.position_embedding_type
        );
    }
    Ok(())
}

/// The word embeddings, the position embeddings (from the family's first position, with the
/// token type 0 added where the family has token types) and the embeddings' LayerNorm, in f32.
fn load_embeddings(
    e: &VarBuilder,
    config: &BertConfig,
    family: Family,
) -> Result<(Tensor, Tensor, Option<Tensor>, LayerNorm)> {
    let h = config.hidden_size;
    let word_embeddings = e.get((config.vocab_size, h), "word_embeddings.weight")?;
    let positions = e.get(
        (config.max_position_embeddings, h),
        "position_embeddings.weight",
    )?;
    let first = family.first_position(config);
    if first >= config.max_position_embeddings {
        candle_core::bail!(
            "pad_token_id {:?} leaves no positions of {}",
            config.pad_token_id,
            config.max_position_embeddings
        );
    }
    let positions = positions.narrow(0, first, config.max_position_embeddings - first)?;
    let (position_type, token_types) = match family {
        Family::Bert | Family::Roberta => {
            let types = e.get((config.type_vocab_size, h), "token_type_embeddings.weight")?;
            let first = types.narrow(0, 0, 1)?;
            let others = (config.type_vocab_size > 1)
                .then(|| types.broadcast_sub(&first))
                .transpose()?;
            (positions.broadcast_add(&first)?, others)
        }
        Family::DistilBert | Family::MpNet => (positions, None),
    };
    let embedding_norm = LayerNorm::load(&e.pp("LayerNorm"), h, config.layer_norm_eps)?;
    Ok((word_embeddings, position_type, token_types, embedding_norm))
}

/// MPNet's relative attention bias; `None` for the other families.
fn load_relative(
    vb: &VarBuilder,
    config: &BertConfig,
    family: Family,
) -> Result<Option<RelativeBias>> {
    Ok(match family {
        Family::MpNet => {
            let buckets = config.relative_attention_num_buckets.unwrap_or(32);
            Some(RelativeBias {
                weight: vb.get(
                    (buckets, config.num_attention_heads),
                    "encoder.relative_attention_bias.weight",
                )?,
                buckets,
            })
        }
        _ => None,
    })
}

/// One encoder layer from `l`: the query, key and value projections fused into one (the
/// query's scaled by `scale`), each part cast to `(compute, act)` dtypes.
fn load_layer(
    l: &VarBuilder,
    names: &LayerNames,
    config: &BertConfig,
    scale: f64,
    (compute, act): (DType, DType),
) -> Result<Layer> {
    let h = config.hidden_size;
    let (q, k, v) = (l.pp(names.q), l.pp(names.k), l.pp(names.v));
    let qw = (q.get((h, h), "weight")? * scale)?;
    let qb = (q.get(h, "bias")? * scale)?;
    let weight = Tensor::cat(&[qw, k.get((h, h), "weight")?, v.get((h, h), "weight")?], 0)?;
    let bias = Tensor::cat(&[qb, k.get(h, "bias")?, v.get(h, "bias")?], 0)?;
    let eps = config.layer_norm_eps;
    Ok(Layer {
        qkv: Linear::from_parts(&weight, bias)?.cast(compute, act)?,
        attention_out: Linear::load(&l.pp(names.attention_out), h, h)?.cast(compute, act)?,
        attention_norm: LayerNorm::load(&l.pp(names.attention_norm), h, eps)?.cast(act)?,
        intermediate: Linear::load(&l.pp(names.intermediate), h, config.intermediate_size)?
            .cast(compute, act)?,
        output: Linear::load(&l.pp(names.output), config.intermediate_size, h)?
            .cast(compute, act)?,
        output_norm: LayerNorm::load(&l.pp(names.output_norm), h, eps)?.cast(act)?,
    })
}

impl Bert {
    /// A BERT (the family of `config.model_type`, BERT when it names none).
    pub fn load(vb: VarBuilder, config: &BertConfig) -> Result<Self> {
        let family = match config.model_type.as_deref() {
            None => Family::Bert,
            Some(t) => Family::from_model_type(t).ok_or_else(|| {
                candle_core::Error::Msg(format!(
                    "model_type `{t}` is not a BERT-like encoder; supported: {}",
                    SUPPORTED_MODEL_TYPES.join(", ")
                ))
            })?,
        };
        Self::load_family(vb, config, family)
    }

    pub fn load_family(vb: VarBuilder, config: &BertConfig, family: Family) -> Result<Self> {
        let compute = vb.dtype();
        let act = if compute == DType::BF16 {
            DType::F32
        } else {
            compute
        };
        // Everything is read in f32 (the fused QKV weights are scaled there), then cast.
        let vb = vb.to_dtype(DType::F32);
        let vb = match family
            .prefixes()
            .iter()
            .find(|p| vb.contains_tensor(&format!("{p}.embeddings.word_embeddings.weight")))
        {
            Some(p) => vb.pp(p),
            None => vb,
        };
        check_shape(config)?;
        let h = config.hidden_size;
        let head_size = h / config.num_attention_heads;
        let (word_embeddings, position_type, token_types, embedding_norm) =
            load_embeddings(&vb.pp("embeddings"), config, family)?;
        let relative = load_relative(&vb, config, family)?;

        let names = LayerNames::of(family);
        let scale = 1.0 / (head_size as f64).sqrt();
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let l = vb.pp(format!("{}.{i}", names.layers));
            layers.push(load_layer(&l, &names, config, scale, (compute, act))?);
        }
        Ok(Bert {
            word_embeddings: word_embeddings.to_dtype(act)?,
            max_positions: position_type.dim(0)?,
            position_type: position_type.to_dtype(act)?,
            token_types: token_types.map(|t| t.to_dtype(act)).transpose()?,
            embedding_norm: embedding_norm.cast(act)?,
            layers,
            heads: config.num_attention_heads,
            head_size,
            hidden: h,
            act: config.hidden_act,
            relative,
            family,
            device: vb.device().clone(),
            dtype: compute,
            act_dtype: act,
            #[cfg(feature = "cuda")]
            lt: if crate::embed::lt::applies(compute, act) {
                crate::embed::lt::Lt::for_device(vb.device())?
            } else {
                None
            },
        })
    }

    pub fn family(&self) -> Family {
        self.family
    }

    /// The same encoder as a [`CpuBert`]: unpadded, fused (the fast CPU path), on the kernel
    /// `path` with its dense layers in `precision`.
    pub fn to_cpu(&self, path: KernelPath, precision: Precision) -> Result<CpuBert> {
        let act = match self.act {
            HiddenAct::Gelu => Activation::GeluErf,
            HiddenAct::GeluApproximate => Activation::GeluTanh,
            HiddenAct::Relu => Activation::Relu,
        };
        let norm = |n: &LayerNorm| (n.weight.clone(), n.bias.clone(), n.eps);
        let layers: Vec<_> = self
            .layers
            .iter()
            .map(|l| (l, norm(&l.attention_norm), norm(&l.output_norm)))
            .collect();
        let weights = layers
            .iter()
            .map(|(l, an, on)| LayerWeights {
                qkv: (&l.qkv.weight_t, &l.qkv.bias),
                attention_out: (&l.attention_out.weight_t, &l.attention_out.bias),
                attention_norm: (&an.0, &an.1, an.2),
                intermediate: (&l.intermediate.weight_t, &l.intermediate.bias),
                output: (&l.output.weight_t, &l.output.bias),
                output_norm: (&on.0, &on.1, on.2),
            })
            .collect();
        let relative = match &self.relative {
            Some(r) => Some(r.by_distance(self.max_positions)?),
            None => None,
        };
        let cpu = CpuBert::new(
            &self.word_embeddings,
            &self.position_type,
            (
                &self.embedding_norm.weight,
                &self.embedding_norm.bias,
                self.embedding_norm.eps,
            ),
            weights,
            self.heads,
            act,
            relative,
            path,
            precision,
        )?;
        match &self.token_types {
            Some(t) => cpu.with_token_types(t),
            None => Ok(cpu),
        }
    }

    pub fn hidden_size(&self) -> usize {
        self.hidden
    }

    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The dtype of the hidden states (and of the mask `forward` takes).
    pub fn activation_dtype(&self) -> DType {
        self.act_dtype
    }

    /// `ids` [batch, len] (u32) and `mask` [batch, len] (1 for tokens, 0 for padding, in the
    /// activation dtype) -> hidden states [batch, len, hidden].
    pub fn forward(&self, ids: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let mut parts = Parts::start(ids.device())?;
        self.forward_timed(ids, mask, &mut parts)
    }

    /// [`Bert::forward`], charging each part's time to `parts` (see [`crate::embed::profile`]).
    pub fn forward_timed(&self, ids: &Tensor, mask: &Tensor, parts: &mut Parts) -> Result<Tensor> {
        self.forward_typed(ids, None, mask, parts)
    }

    /// [`Bert::forward_timed`] with each token's type ([batch, len], u32: a pair's second
    /// segment is type 1); None: every token is type 0. A family without token types refuses
    /// any other than 0.
    pub fn forward_typed(
        &self,
        ids: &Tensor,
        types: Option<&Tensor>,
        mask: &Tensor,
        parts: &mut Parts,
    ) -> Result<Tensor> {
        let (b, len) = ids.dims2()?;
        if len > self.max_positions {
            candle_core::bail!(
                "sequence of {len} tokens exceeds the model's {} positions",
                self.max_positions
            );
        }
        let n = b * len;
        let words = self.word_embeddings.index_select(&ids.flatten_all()?, 0)?;
        let x = words
            .reshape((b, len, self.hidden))?
            .broadcast_add(&self.position_type.narrow(0, 0, len)?)?;
        let x = match (types, &self.token_types) {
            (None, _) => x,
            (Some(t), Some(table)) => {
                let extra = table.index_select(&t.flatten_all()?, 0)?;
                (x + extra.reshape((b, len, self.hidden))?)?
            }
            (Some(t), None) => {
                if t.flatten_all()?.max(0)?.to_scalar::<u32>()? > 0 {
                    candle_core::bail!("this model has one token type; a pair's types must be 0");
                }
                x
            }
        };
        let mut x = self.embedding_norm.forward(&x.reshape((n, self.hidden))?)?;
        parts.mark("embeddings")?;

        // Additive mask [b, 1, 1, len]: 0 for tokens, a large negative number for padding.
        let negative = match self.act_dtype {
            DType::F16 => -65504.0,
            _ => -3.0e38,
        };
        let mask = mask.to_dtype(self.act_dtype)?;
        let bias = ((mask.ones_like()? - &mask)? * negative)?.reshape((b, 1, 1, len))?;
        // MPNet: the relative position bias [1, heads, len, len] joins the mask's.
        let bias = match &self.relative {
            Some(r) => r
                .for_length(len, self.act_dtype)?
                .unsqueeze(0)?
                .broadcast_add(&bias)?,
            None => bias,
        };
        parts.mark("attention")?;

        for layer in &self.layers {
            x = self.layer(layer, &x, &bias, b, len, parts)?;
        }
        x.reshape((b, len, self.hidden))
    }

    fn layer(
        &self,
        l: &Layer,
        x: &Tensor,
        bias: &Tensor,
        b: usize,
        len: usize,
        parts: &mut Parts,
    ) -> Result<Tensor> {
        let (heads, hs, h) = (self.heads, self.head_size, self.hidden);
        let qkv = self
            .linear(&l.qkv, x, false, None)?
            .reshape((b, len, 3, heads, hs))?;
        parts.mark("qkv")?;
        // [b, heads, len, hs] each.
        let q = qkv
            .narrow(2, 0, 1)?
            .squeeze(2)?
            .transpose(1, 2)?
            .contiguous()?;
        let k = qkv
            .narrow(2, 1, 1)?
            .squeeze(2)?
            .transpose(1, 2)?
            .contiguous()?;
        let v = qkv
            .narrow(2, 2, 1)?
            .squeeze(2)?
            .transpose(1, 2)?
            .contiguous()?;
        let dt = self.dtype;
        let scores = q
            .to_dtype(dt)?
            .matmul(&k.to_dtype(dt)?.t()?)?
            .to_dtype(self.act_dtype)?
            .broadcast_add(bias)?;
        let probs = candle_nn::ops::softmax_last_dim(&scores)?;
        let context = probs
            .to_dtype(dt)?
            .matmul(&v.to_dtype(dt)?)?
            .to_dtype(self.act_dtype)?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b * len, h))?;
        parts.mark("attention")?;
        let attention = self.linear(&l.attention_out, &context, false, Some(x))?;
        parts.mark("attention_out")?;
        let attention = l.attention_norm.forward(&attention)?;
        parts.mark("norms")?;
        let inner = self.intermediate(&l.intermediate, &attention)?;
        let out = self.linear(&l.output, &inner, false, Some(&attention))?;
        parts.mark("ffn")?;
        let out = l.output_norm.forward(&out)?;
        parts.mark("norms")?;
        Ok(out)
    }
}

impl Bert {
    /// `x @ weight + bias` (`gelu`: then GELU), plus `residual`: one cuBLASLt call where it
    /// applies, candle's product and elementwise kernels otherwise.
    fn linear(
        &self,
        l: &Linear,
        x: &Tensor,
        gelu: bool,
        residual: Option<&Tensor>,
    ) -> Result<Tensor> {
        #[cfg(feature = "cuda")]
        if let Some(lt) = &self.lt {
            return lt.linear(x, &l.weight_t, &l.bias, gelu, residual);
        }
        let y = l.forward(x)?;
        let y = if gelu { y.gelu()? } else { y };
        match residual {
            Some(r) => y + r,
            None => Ok(y),
        }
    }

    /// The intermediate product with its bias and activation.
    fn intermediate(&self, l: &Linear, x: &Tensor) -> Result<Tensor> {
        #[cfg(feature = "cuda")]
        if self.lt.is_some() && self.act != HiddenAct::Relu {
            return self.linear(l, x, true, None);
        }
        let inner = l.matmul(x)?;
        match self.act {
            HiddenAct::Gelu => bias_gelu(&inner, &l.bias),
            HiddenAct::GeluApproximate => inner.broadcast_add(&l.bias)?.gelu(),
            HiddenAct::Relu => inner.broadcast_add(&l.bias)?.relu(),
        }
    }
}

impl Module for Bert {
    /// Unpadded input: every position is a token.
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let mask = Tensor::ones(ids.dims(), self.act_dtype, ids.device())?;
        Bert::forward(self, ids, &mask)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::embed::cpu::Rows;

    /// A tiny BERT with random weights, named as Hugging Face's BERT checkpoints name them.
    pub fn tiny(seed: u64) -> (HashMap<String, Tensor>, BertConfig) {
        let shape = crate::embed::random::RandomBert {
            vocab: 50,
            hidden: 16,
            layers: 2,
            heads: 4,
            intermediate: 40,
            positions: 32,
            seed,
        };
        let config: BertConfig = serde_json::from_value(shape.config()).unwrap();
        (shape.weights(), config)
    }

    /// The fused CPU encoder gives the candle encoder's hidden states, without padding, on
    /// every kernel path this CPU supports (f32 to 1e-4; bf16 and int8 to their rounding).
    #[test]
    fn cpu_path_matches_candle_path() {
        let dev = Device::Cpu;
        let (tensors, config) = tiny(5);
        let bert =
            Bert::load(VarBuilder::from_tensors(tensors, DType::F32, &dev), &config).unwrap();
        let seqs: Vec<&[u32]> = vec![&[1, 7, 9, 4, 2], &[1, 30, 2], &[1, 3, 3, 3, 3, 3, 3, 2]];
        let mut ran = 0;
        for path in [KernelPath::Avx512, KernelPath::Avx2, KernelPath::Portable] {
            for (precision, tolerance) in [
                (Precision::F32, 1e-4),
                (Precision::Bf16, 0.1),
                (Precision::Int8, 0.15),
            ] {
                if !path.supported() || precision.check(path).is_err() {
                    continue;
                }
                ran += 1;
                let what = format!("{} {}", path, precision.name());
                let cpu = bert.to_cpu(path, precision).unwrap();
                let fused = cpu.forward(&seqs).unwrap();
                let mut row = 0;
                for s in &seqs {
                    let ids = Tensor::new(*s, &dev).unwrap().unsqueeze(0).unwrap();
                    let mask = Tensor::ones((1, s.len()), DType::F32, &dev).unwrap();
                    let reference = bert
                        .forward(&ids, &mask)
                        .unwrap()
                        .flatten_all()
                        .unwrap()
                        .to_vec1::<f32>()
                        .unwrap();
                    let ours = &fused[row * 16..(row + s.len()) * 16];
                    let diff = ours
                        .iter()
                        .zip(&reference)
                        .map(|(a, b)| (a - b).abs())
                        .fold(0f32, f32::max);
                    assert!(
                        diff < tolerance,
                        "{what}, sequence {s:?}: max difference {diff}"
                    );
                    row += s.len();
                }
                assert_eq!(row * 16, fused.len(), "{what}");
            }
        }
        assert!(ran >= 1, "the portable path runs everywhere");
    }

    /// `Rows::First` gives each sequence's first row of a full forward pass, with token types,
    /// on every kernel path and precision this CPU supports; and refuses an empty sequence.
    #[test]
    fn first_rows_are_the_full_pass_s_first_rows() {
        let dev = Device::Cpu;
        let (tensors, config) = tiny(9);
        let bert =
            Bert::load(VarBuilder::from_tensors(tensors, DType::F32, &dev), &config).unwrap();
        let seqs: Vec<&[u32]> = vec![&[1, 7, 9, 4, 2], &[1, 30, 2], &[1], &[1, 3, 3, 8, 3, 2]];
        let types: Vec<&[u32]> = vec![&[0, 0, 0, 1, 1], &[0, 0, 1], &[0], &[0, 0, 0, 0, 1, 1]];
        let mut ran = 0;
        for path in [KernelPath::Avx512, KernelPath::Avx2, KernelPath::Portable] {
            // int8 quantises per batch (its outlier channels are the batch's), so it is held
            // to its rounding; f32 and bf16 round each row alike whatever the batch.
            for (precision, tolerance) in [
                (Precision::F32, 1e-5),
                (Precision::Bf16, 1e-5),
                (Precision::Int8, 0.15),
            ] {
                if !path.supported() || precision.check(path).is_err() {
                    continue;
                }
                ran += 1;
                let what = format!("{} {}", path, precision.name());
                let cpu = bert.to_cpu(path, precision).unwrap();
                let all = cpu.forward_typed(&seqs, Some(&types)).unwrap();
                let first = cpu.forward_rows(&seqs, Some(&types), Rows::First).unwrap();
                assert_eq!(first.len(), seqs.len() * 16, "{what}");
                let mut row = 0;
                for (i, s) in seqs.iter().enumerate() {
                    let want = &all[row * 16..(row + 1) * 16];
                    let diff = first[i * 16..(i + 1) * 16]
                        .iter()
                        .zip(want)
                        .map(|(a, b)| (a - b).abs())
                        .fold(0f32, f32::max);
                    assert!(diff <= tolerance, "{what}, sequence {i}: off by {diff}");
                    row += s.len();
                }
                let empty: Vec<&[u32]> = vec![&[1, 2], &[]];
                let err = cpu.forward_rows(&empty, None, Rows::First).unwrap_err();
                assert!(err.to_string().contains("empty sequence"), "{what}: {err}");
            }
        }
        assert!(ran >= 1, "the portable path runs everywhere");
    }

    /// MPNet's buckets, from transformers' formula: exact below 8, logarithmic to 128 (the
    /// last bucket from there on), the other direction in the upper half.
    #[test]
    fn relative_buckets_follow_transformers() {
        let b = |rel: i64| relative_bucket(rel, 32, 128);
        assert_eq!((b(0), b(-1), b(-7)), (0, 1, 7));
        assert_eq!((b(1), b(7)), (17, 23));
        // n = 8: 8 + log(1) = 8; n = 16: 8 + floor(8 log 2 / log 16) = 10.
        assert_eq!((b(-8), b(-16), b(16)), (8, 10, 26));
        assert_eq!((b(-127), b(-128), b(-5000), b(5000)), (15, 15, 15, 31));
        // Monotonic in distance on each side.
        for n in 1..600i64 {
            assert!(b(-n) >= b(-(n - 1)) && b(n) >= b(n - 1), "at {n}");
        }
    }
}
