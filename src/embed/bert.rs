//! The BERT encoder (BERT, MiniLM, BGE, E5, GTE...), written for inference speed on top of
//! candle ops. Same weights and results as candle-transformers' `BertModel` (a test holds the
//! two together), with what costs time on CPU removed:
//! - Q, K and V are one matmul against a fused weight, and the 1/sqrt(head) scale is folded
//!   into the query weights at load;
//! - weights are stored transposed once, so each linear layer is one plain GEMM;
//! - softmax over the last dimension and layer norm use candle's fused kernels;
//! - GELU is fused with the bias add (see [`super::gelu`]);
//! - token-type and position embeddings are pre-added (token type 0 is the only one used).

use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;

use super::cpu::kernels::{KernelPath, Precision};
use super::cpu::{Activation, CpuBert, LayerWeights};
use super::gelu::bias_gelu;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HiddenAct {
    Gelu,
    #[serde(alias = "gelu_new", alias = "gelu_pytorch_tanh")]
    GeluApproximate,
    Relu,
}

/// The fields of config.json that the encoder needs.
#[derive(Clone, Debug, Deserialize)]
pub struct BertConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
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
}

fn default_type_vocab() -> usize {
    2
}

fn default_eps() -> f64 {
    1e-12
}

/// The model types this encoder runs.
pub const SUPPORTED_MODEL_TYPES: &[&str] = &["bert"];

struct Linear {
    /// [in, out], contiguous.
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
            weight_t: weight.t()?.contiguous()?,
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
    embedding_norm: LayerNorm,
    layers: Vec<Layer>,
    heads: usize,
    head_size: usize,
    hidden: usize,
    act: HiddenAct,
    max_positions: usize,
    device: Device,
    /// The dtype of the matrix products.
    dtype: DType,
    /// The dtype of everything else: the hidden states between layers, residual adds, layer
    /// norms, softmax. f32 when the products run in bf16, whose 8-bit mantissa loses too much
    /// over six residual layers (cosine 0.998 against 0.99999 with f32 activations); the
    /// products' dtype otherwise.
    act_dtype: DType,
}

impl Bert {
    pub fn load(vb: VarBuilder, config: &BertConfig) -> Result<Self> {
        let compute = vb.dtype();
        let act = if compute == DType::BF16 {
            DType::F32
        } else {
            compute
        };
        // Everything is read in f32 (the fused QKV weights are scaled there), then cast.
        let vb = vb.to_dtype(DType::F32);
        let vb = if vb.contains_tensor("bert.embeddings.word_embeddings.weight") {
            vb.pp("bert")
        } else if let Some(t) = config
            .model_type
            .as_deref()
            .filter(|t| vb.contains_tensor(&format!("{t}.embeddings.word_embeddings.weight")))
        {
            vb.pp(t)
        } else {
            vb
        };
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
        let head_size = h / config.num_attention_heads;
        let e = vb.pp("embeddings");
        let word_embeddings = e.get((config.vocab_size, h), "word_embeddings.weight")?;
        let positions = e.get(
            (config.max_position_embeddings, h),
            "position_embeddings.weight",
        )?;
        let types = e.get((config.type_vocab_size, h), "token_type_embeddings.weight")?;
        let position_type = positions.broadcast_add(&types.narrow(0, 0, 1)?)?;
        let embedding_norm = LayerNorm::load(&e.pp("LayerNorm"), h, config.layer_norm_eps)?;

        let scale = 1.0 / (head_size as f64).sqrt();
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let l = vb.pp(format!("encoder.layer.{i}"));
            let a = l.pp("attention.self");
            let (q, k, v) = (a.pp("query"), a.pp("key"), a.pp("value"));
            let qw = (q.get((h, h), "weight")? * scale)?;
            let qb = (q.get(h, "bias")? * scale)?;
            let weight = Tensor::cat(&[qw, k.get((h, h), "weight")?, v.get((h, h), "weight")?], 0)?;
            let bias = Tensor::cat(&[qb, k.get(h, "bias")?, v.get(h, "bias")?], 0)?;
            let ao = l.pp("attention.output");
            let out = l.pp("output");
            let eps = config.layer_norm_eps;
            layers.push(Layer {
                qkv: Linear::from_parts(&weight, bias)?.cast(compute, act)?,
                attention_out: Linear::load(&ao.pp("dense"), h, h)?.cast(compute, act)?,
                attention_norm: LayerNorm::load(&ao.pp("LayerNorm"), h, eps)?.cast(act)?,
                intermediate: Linear::load(
                    &l.pp("intermediate.dense"),
                    h,
                    config.intermediate_size,
                )?
                .cast(compute, act)?,
                output: Linear::load(&out.pp("dense"), config.intermediate_size, h)?
                    .cast(compute, act)?,
                output_norm: LayerNorm::load(&out.pp("LayerNorm"), h, eps)?.cast(act)?,
            });
        }
        Ok(Bert {
            word_embeddings: word_embeddings.to_dtype(act)?,
            position_type: position_type.to_dtype(act)?,
            embedding_norm: embedding_norm.cast(act)?,
            layers,
            heads: config.num_attention_heads,
            head_size,
            hidden: h,
            act: config.hidden_act,
            max_positions: config.max_position_embeddings,
            device: vb.device().clone(),
            dtype: compute,
            act_dtype: act,
        })
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
        CpuBert::new(
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
            path,
            precision,
        )
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
        let mut x = self.embedding_norm.forward(&x.reshape((n, self.hidden))?)?;

        // Additive mask [b, 1, 1, len]: 0 for tokens, a large negative number for padding.
        let negative = match self.act_dtype {
            DType::F16 => -65504.0,
            _ => -3.0e38,
        };
        let mask = mask.to_dtype(self.act_dtype)?;
        let bias = ((mask.ones_like()? - &mask)? * negative)?.reshape((b, 1, 1, len))?;

        for layer in &self.layers {
            x = self.layer(layer, &x, &bias, b, len)?;
        }
        x.reshape((b, len, self.hidden))
    }

    fn layer(&self, l: &Layer, x: &Tensor, bias: &Tensor, b: usize, len: usize) -> Result<Tensor> {
        let (heads, hs, h) = (self.heads, self.head_size, self.hidden);
        let qkv = l.qkv.forward(x)?.reshape((b, len, 3, heads, hs))?;
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
        let attention = (l.attention_out.forward(&context)? + x)?;
        let attention = l.attention_norm.forward(&attention)?;
        let inner = l.intermediate.matmul(&attention)?;
        let inner = match self.act {
            HiddenAct::Gelu => bias_gelu(&inner, &l.intermediate.bias)?,
            HiddenAct::GeluApproximate => inner.broadcast_add(&l.intermediate.bias)?.gelu()?,
            HiddenAct::Relu => inner.broadcast_add(&l.intermediate.bias)?.relu()?,
        };
        let out = (l.output.forward(&inner)? + attention)?;
        l.output_norm.forward(&out)
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

    /// A tiny BERT with random weights, as candle-transformers names them.
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

    /// Our encoder and candle-transformers' agree, padding included.
    #[test]
    fn matches_candle_transformers_bert() {
        let dev = Device::Cpu;
        let (tensors, config) = tiny(3);
        let vb = VarBuilder::from_tensors(tensors.clone(), DType::F32, &dev);
        let ours = Bert::load(vb, &config).unwrap();
        let vb = VarBuilder::from_tensors(tensors, DType::F32, &dev);
        let reference_config: candle_transformers::models::bert::Config =
            serde_json::from_value(serde_json::json!({
                "vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 2,
                "num_attention_heads": 4, "intermediate_size": 40, "hidden_act": "gelu",
                "hidden_dropout_prob": 0.0, "max_position_embeddings": 32,
                "type_vocab_size": 2, "initializer_range": 0.02, "layer_norm_eps": 1e-12,
                "pad_token_id": 0, "classifier_dropout": null, "model_type": "bert"
            }))
            .unwrap();
        let reference =
            candle_transformers::models::bert::BertModel::load(vb, &reference_config).unwrap();

        let ids = Tensor::new(&[[1u32, 7, 9, 4, 2], [1, 30, 2, 0, 0]], &dev).unwrap();
        let mask = Tensor::new(&[[1f32, 1., 1., 1., 1.], [1., 1., 1., 0., 0.]], &dev).unwrap();
        let a = ours.forward(&ids, &mask).unwrap();
        let b = reference
            .forward(
                &ids,
                &ids.zeros_like().unwrap(),
                Some(&mask.to_dtype(DType::U32).unwrap()),
            )
            .unwrap();
        // Compare the real tokens only: padded positions are never used.
        for (row, real) in [(0usize, 5usize), (1, 3)] {
            let x = a.get(row).unwrap().narrow(0, 0, real).unwrap();
            let y = b.get(row).unwrap().narrow(0, 0, real).unwrap();
            let diff = (x - y)
                .unwrap()
                .abs()
                .unwrap()
                .flatten_all()
                .unwrap()
                .max(0)
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert!(diff < 1e-4, "row {row}: max difference {diff}");
        }
    }
}
