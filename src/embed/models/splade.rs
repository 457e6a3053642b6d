//! Sparse embeddings (SPLADE): a BERT with its masked-language-model head scores every
//! vocabulary entry at every token; the sparse vector is, per entry, the max (or sum) over
//! the tokens of log(1 + relu(logit)), as sentence-transformers' `SparseEncoder` with
//! `SpladePooling` computes it. Most entries are zero: the vector is kept as its non-zero
//! (index, value) pairs.
//!
//! The encoder is the embedding models' (the fused CPU engine in f32, candle otherwise). The
//! head's vocabulary-wide product runs in slices of tokens, so memory stays bounded by the
//! slice, not by the batch times the vocabulary.

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;

use crate::embed::bert::{Bert, BertConfig, Family, HiddenAct};
use crate::embed::cpu::kernels::{KernelPath, Precision};
use crate::embed::cpu::CpuBert;
use crate::embed::device::DTypeChoice;
use crate::embed::files::ModelFiles;
use crate::embed::profile::Parts;
use crate::embed::tokenizer::TextTokenizer;
use crate::embed::EmbedError;

/// The architectures (config.json's `architectures`) ragline runs as SPLADE models.
pub const SPARSE_ARCHITECTURES: &[&str] = &["BertForMaskedLM"];

/// Tokens whose vocabulary-wide logits are held at once (4,096 x 30,522 f32: 500 MB would be
/// too many; 256 x 30,522: 31 MB).
const LOGIT_ROWS: usize = 256;

/// A sparse vector: vocabulary indices, ascending, and their (positive) values.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SparseVector {
    pub indices: Vec<u32>,
    pub values: Vec<f32>,
}

impl SparseVector {
    /// The dot product with `other` (both ascending).
    pub fn dot(&self, other: &SparseVector) -> f32 {
        let (mut i, mut j, mut sum) = (0, 0, 0.0);
        while i < self.indices.len() && j < other.indices.len() {
            match self.indices[i].cmp(&other.indices[j]) {
                std::cmp::Ordering::Less => i += 1,
                std::cmp::Ordering::Greater => j += 1,
                std::cmp::Ordering::Equal => {
                    sum += self.values[i] * other.values[j];
                    i += 1;
                    j += 1;
                }
            }
        }
        sum
    }
}

/// How token scores become one vector (`1_SpladePooling/config.json`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpladePooling {
    /// Sum over the tokens rather than max.
    pub sum: bool,
    /// `log1p_relu`: log(1 + log(1 + relu(x))) (OpenSearch's SPLADE models).
    pub double_log: bool,
}

#[derive(Deserialize)]
struct PoolingConfig {
    #[serde(default)]
    pooling_strategy: Option<String>,
    #[serde(default)]
    activation_function: Option<String>,
}

#[derive(Deserialize)]
struct MlmConfig {
    #[serde(default)]
    architectures: Vec<String>,
    #[serde(default)]
    model_type: Option<String>,
    #[serde(default = "tied")]
    tie_word_embeddings: bool,
}

fn tied() -> bool {
    true
}

enum Body {
    Cpu(Box<CpuBert>),
    Candle(Bert),
}

/// The masked-language-model head: transform (dense, activation, LayerNorm), then the
/// decoder (the word embeddings, tied) plus a bias per vocabulary entry.
struct MlmHead {
    /// [h, h] transposed: x @ dense_t.
    dense_t: Tensor,
    dense_bias: Tensor,
    act: HiddenAct,
    norm_weight: Tensor,
    norm_bias: Tensor,
    eps: f32,
    /// [h, vocab].
    decoder_t: Tensor,
    decoder_bias: Tensor,
}

impl MlmHead {
    /// Logits [rows, vocab] of hidden states [rows, h] (f32, on the head's device).
    fn logits(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let y = x.matmul(&self.dense_t)?.broadcast_add(&self.dense_bias)?;
        let y = match self.act {
            HiddenAct::Gelu => y.gelu_erf()?,
            HiddenAct::GeluApproximate => y.gelu()?,
            HiddenAct::Relu => y.relu()?,
        };
        let y = candle_nn::ops::layer_norm(&y, &self.norm_weight, &self.norm_bias, self.eps)?;
        y.matmul(&self.decoder_t)?.broadcast_add(&self.decoder_bias)
    }
}

pub struct SparseModel {
    pub files: ModelFiles,
    pub tokenizer: TextTokenizer,
    body: Body,
    head: MlmHead,
    pooling: SpladePooling,
    hidden: usize,
    vocab: usize,
    device: Device,
}

impl SparseModel {
    /// Load a SPLADE model named as `--model` names embedding models onto `device` (f32 on
    /// the CPU, the fused engine; f16/bf16 on a GPU through candle).
    pub fn load(spec: &str, device: &Device, choice: DTypeChoice) -> Result<Self, EmbedError> {
        Self::load_files(ModelFiles::resolve(spec)?, device, choice)
    }

    pub fn load_files(
        files: ModelFiles,
        device: &Device,
        choice: DTypeChoice,
    ) -> Result<Self, EmbedError> {
        let dtype = choice.f32_on_cpu(device, "a sparse (SPLADE) model")?;
        let bad_config = |reason: String| files.bad_config(reason);
        let raw = files.read_config()?;
        let mlm: MlmConfig = serde_json::from_slice(&raw)
            .map_err(|e| bad_config(format!("not the expected JSON: {e}")))?;
        if !mlm
            .architectures
            .iter()
            .any(|a| SPARSE_ARCHITECTURES.contains(&a.as_str()))
        {
            return Err(EmbedError::Unsupported(format!(
                "model `{}` is not a SPLADE model ragline runs: config.json's architectures are \
                 {:?}; sparse models must be one of {}",
                files.name,
                mlm.architectures,
                SPARSE_ARCHITECTURES.join(", ")
            )));
        }
        let config: BertConfig = serde_json::from_slice(&raw)
            .map_err(|e| bad_config(format!("not a BERT config: {e}")))?;
        let pooling = read_pooling(&files)?;
        let vb = files.var_builder(dtype, device)?;
        let misfit = |e: candle_core::Error| files.misfit(e);
        let family = mlm
            .model_type
            .as_deref()
            .and_then(Family::from_model_type)
            .unwrap_or(Family::Bert);
        let bert = Bert::load_family(vb.clone(), &config, family).map_err(misfit)?;
        let head = load_head(&vb, &config, mlm.tie_word_embeddings).map_err(misfit)?;
        let positions = bert.max_positions();
        let hidden = bert.hidden_size();
        let body = if device.is_cpu() && dtype == DType::F32 {
            Body::Cpu(Box::new(
                bert.to_cpu(KernelPath::chosen()?, Precision::F32)?,
            ))
        } else {
            Body::Candle(bert)
        };
        let max_len = files.sequence_limit(positions);
        let tokenizer = TextTokenizer::from_file(&files.tokenizer, max_len)?;
        Ok(SparseModel {
            files,
            tokenizer,
            body,
            hidden,
            vocab: config.vocab_size,
            head,
            pooling,
            device: device.clone(),
        })
    }

    /// A string that changes whenever the vectors would: the bytes of the config, tokenizer
    /// and weights, the pooling and the length limit (the `sparse` stage's fingerprint).
    pub fn fingerprint(&self) -> Result<String, EmbedError> {
        self.files.fingerprint(&format!(
            "|sparse|{:?}|{}",
            self.pooling,
            self.tokenizer.max_len()
        ))
    }

    /// The vocabulary size: the sparse vectors' dimension.
    pub fn dimension(&self) -> usize {
        self.vocab
    }

    pub fn pooling(&self) -> SpladePooling {
        self.pooling
    }

    /// Which encoder runs, in words.
    pub fn encoder_kind(&self) -> String {
        match &self.body {
            Body::Cpu(c) => c.describe(),
            Body::Candle(b) => format!("candle encoder, {:?}", b.dtype()).to_lowercase(),
        }
    }

    /// The sparse vector of each text (truncated to the model's length, as
    /// sentence-transformers truncates it).
    pub fn embed_texts(&self, texts: &[&str]) -> Result<Vec<SparseVector>, EmbedError> {
        let ids = texts
            .iter()
            .map(|t| self.tokenizer.ids_for_embedding(t, &[]))
            .collect::<Result<Vec<_>, _>>()?;
        let refs: Vec<&[u32]> = ids.iter().map(Vec::as_slice).collect();
        self.embed_ids(&refs)
    }

    /// The sparse vector of each sequence of content ids (no special tokens; at most
    /// `tokenizer.max_content_len()` each).
    pub fn embed_ids(&self, seqs: &[&[u32]]) -> Result<Vec<SparseVector>, EmbedError> {
        if seqs.is_empty() {
            return Ok(Vec::new());
        }
        let limit = self.tokenizer.max_content_len();
        if let Some(s) = seqs.iter().find(|s| s.len() > limit) {
            return Err(EmbedError::Tokenizer(format!(
                "a sequence of {} tokens exceeds the model's limit of {limit} content tokens",
                s.len()
            )));
        }
        let (before, after) = self.tokenizer.specials();
        let full: Vec<Vec<u32>> = seqs.iter().map(|s| [before, s, after].concat()).collect();
        let h = self.hidden;
        // Hidden states of every token, laid end to end [sum of lengths, h].
        let hidden: Tensor = match &self.body {
            Body::Cpu(cpu) => {
                let refs: Vec<&[u32]> = full.iter().map(Vec::as_slice).collect();
                let rows = cpu.forward(&refs)?;
                let n = rows.len() / h;
                Tensor::from_vec(rows, (n, h), &Device::Cpu)?
            }
            Body::Candle(bert) => {
                let b = full.len();
                let len = full.iter().map(Vec::len).max().unwrap_or(0);
                let mut ids = vec![self.tokenizer.pad_id(); b * len];
                let mut mask = vec![0f32; b * len];
                for (row, s) in full.iter().enumerate() {
                    ids[row * len..row * len + s.len()].copy_from_slice(s);
                    mask[row * len..row * len + s.len()].fill(1.0);
                }
                let ids_t = Tensor::from_vec(ids, (b, len), &self.device)?;
                let mask_t = Tensor::from_vec(mask, (b, len), &self.device)?
                    .to_dtype(bert.activation_dtype())?;
                let mut parts = Parts::start(&self.device)?;
                let states = bert
                    .forward_typed(&ids_t, None, &mask_t, &mut parts)?
                    .to_dtype(DType::F32)?;
                let rows = full
                    .iter()
                    .enumerate()
                    .map(|(i, s)| states.get(i)?.narrow(0, 0, s.len()))
                    .collect::<candle_core::Result<Vec<_>>>()?;
                Tensor::cat(&rows, 0)?
            }
        };
        let hidden = hidden
            .to_device(self.head.decoder_t.device())?
            .to_dtype(DType::F32)?;
        let mut out = Vec::with_capacity(full.len());
        let mut row = 0;
        let activate = |l: f32| {
            let v = l.max(0.0).ln_1p();
            if self.pooling.double_log {
                v.ln_1p()
            } else {
                v
            }
        };
        for s in &full {
            // Max pooling keeps each term's largest logit and activates it once: relu and
            // log1p only grow, so the largest activation is the activation of the largest
            // logit (the same float). Sum pooling adds the activations of the positive ones.
            let mut pooled = vec![
                if self.pooling.sum {
                    0f32
                } else {
                    f32::NEG_INFINITY
                };
                self.vocab
            ];
            let mut at = 0;
            while at < s.len() {
                let n = LOGIT_ROWS.min(s.len() - at);
                let logits = self
                    .head
                    .logits(&hidden.narrow(0, row + at, n)?)?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                for token in logits.chunks_exact(self.vocab) {
                    if self.pooling.sum {
                        for (p, &l) in pooled.iter_mut().zip(token) {
                            if l > 0.0 {
                                *p += activate(l);
                            }
                        }
                    } else {
                        for (p, &l) in pooled.iter_mut().zip(token) {
                            *p = p.max(l);
                        }
                    }
                }
                at += n;
            }
            row += s.len();
            let mut v = SparseVector::default();
            for (i, &x) in pooled.iter().enumerate() {
                let x = if self.pooling.sum { x } else { activate(x) };
                if x > 0.0 {
                    v.indices.push(i as u32);
                    v.values.push(x);
                }
            }
            out.push(v);
        }
        Ok(out)
    }
}

/// The MLM head of a `BertForMaskedLM` checkpoint, in f32 on the CPU when the model runs
/// there (on its device otherwise).
fn load_head(vb: &VarBuilder, config: &BertConfig, tied: bool) -> candle_core::Result<MlmHead> {
    let (h, vocab) = (config.hidden_size, config.vocab_size);
    let vb32 = vb.to_dtype(DType::F32);
    let p = vb32.pp("cls.predictions");
    let t = p.pp("transform");
    let norm = t.pp("LayerNorm");
    let (norm_weight, norm_bias) = match (norm.get(h, "weight"), norm.get(h, "bias")) {
        (Ok(w), Ok(b)) => (w, b),
        _ => (norm.get(h, "gamma")?, norm.get(h, "beta")?),
    };
    let word = if !tied && p.contains_tensor("decoder.weight") {
        p.get((vocab, h), "decoder.weight")?
    } else {
        let base = ["bert.", ""]
            .iter()
            .find(|b| vb32.contains_tensor(&format!("{b}embeddings.word_embeddings.weight")))
            .copied()
            .unwrap_or("bert.");
        vb32.get(
            (vocab, h),
            &format!("{base}embeddings.word_embeddings.weight"),
        )?
    };
    let decoder_bias = if p.contains_tensor("bias") {
        p.get(vocab, "bias")?
    } else {
        p.get(vocab, "decoder.bias")?
    };
    Ok(MlmHead {
        dense_t: t.get((h, h), "dense.weight")?.t()?.contiguous()?,
        dense_bias: t.get(h, "dense.bias")?,
        act: config.hidden_act,
        norm_weight,
        norm_bias,
        eps: config.layer_norm_eps as f32,
        decoder_t: word.t()?.contiguous()?,
        decoder_bias,
    })
}

/// The SpladePooling module's settings (max and relu without one).
fn read_pooling(files: &ModelFiles) -> Result<SpladePooling, EmbedError> {
    let mut pooling = SpladePooling {
        sum: false,
        double_log: false,
    };
    let Some(folder) = &files.splade else {
        return Ok(pooling);
    };
    let path = folder.join("config.json");
    let bad = |reason: String| EmbedError::ModelFile {
        path: path.clone(),
        reason,
    };
    let Ok(bytes) = std::fs::read(&path) else {
        return Ok(pooling);
    };
    let c: PoolingConfig =
        serde_json::from_slice(&bytes).map_err(|e| bad(format!("not the expected JSON: {e}")))?;
    pooling.sum = match c.pooling_strategy.as_deref().unwrap_or("max") {
        "max" => false,
        "sum" => true,
        other => {
            return Err(bad(format!(
                "pooling_strategy `{other}`: supported: max, sum"
            )))
        }
    };
    pooling.double_log = match c.activation_function.as_deref().unwrap_or("relu") {
        "relu" => false,
        "log1p_relu" => true,
        other => {
            return Err(bad(format!(
                "activation_function `{other}`: supported: relu, log1p_relu"
            )))
        }
    };
    Ok(pooling)
}
