//! Cross-encoders (rerankers): a query and a passage read together as one sequence, one
//! relevance score out, as sentence-transformers' `CrossEncoder.predict` computes it.
//!
//! The families: `BertForSequenceClassification` (BERT's pooler, tanh, then the classifier),
//! `XLMRobertaForSequenceClassification` (bge-reranker-v2-m3: a dense layer with tanh on the
//! first token, then `out_proj`) and `ModernBertForSequenceClassification`
//! (gte-reranker-modernbert-base: CLS or mean pooling, dense, activation, LayerNorm, then the
//! classifier). The encoder is the one the embedding models run (the fused CPU engine for the
//! BERT-like families in f32, candle otherwise); the heads, a few small products per pair,
//! run on the CPU in f32. One label: the raw score is the logit, the score its activation
//! (sigmoid unless the model's config names another, as sentence-transformers decides).

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;
use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

use super::bert::{Bert, BertConfig, Family};
use super::cpu::kernels::{KernelPath, Precision};
use super::cpu::{CpuBert, Rows};
use super::device::DTypeChoice;
use super::files::ModelFiles;
use super::gelu;
use super::profile::Parts;
use super::rotary::{Arch, RotaryConfig, RotaryModel};
use super::EmbedError;

/// Tokens a batch of pairs may hold (padding included where the encoder pads).
pub const DEFAULT_BATCH_TOKENS: usize = 16_384;

/// The architectures (config.json's `architectures`) ragline reranks with.
pub const CROSS_ENCODER_ARCHITECTURES: &[&str] = &[
    "BertForSequenceClassification",
    "XLMRobertaForSequenceClassification",
    "ModernBertForSequenceClassification",
];

/// A query and a passage as the model reads them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PairIds {
    pub ids: Vec<u32>,
    /// 0 for the query's segment, 1 for the passage's (BERT); all 0 where the model has one
    /// token type.
    pub types: Vec<u32>,
    /// Tokens were cut to fit the model's length.
    pub truncated: bool,
}

/// A pair's score: the model's logit and its activation (what `CrossEncoder.predict` gives).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct PairScore {
    pub raw: f32,
    pub score: f32,
}

/// What turns the logit into the score.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScoreActivation {
    Sigmoid,
    Identity,
    Tanh,
    Relu,
}

impl ScoreActivation {
    /// From sentence-transformers' recorded path (`torch.nn.modules.activation.Sigmoid`).
    fn from_path(path: &str) -> Option<Self> {
        Some(match path.rsplit('.').next().unwrap_or(path) {
            "Sigmoid" => Self::Sigmoid,
            "Identity" => Self::Identity,
            "Tanh" => Self::Tanh,
            "ReLU" => Self::Relu,
            _ => return None,
        })
    }

    pub fn apply(self, x: f32) -> f32 {
        match self {
            Self::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            Self::Identity => x,
            Self::Tanh => x.tanh(),
            Self::Relu => x.max(0.0),
        }
    }
}

/// The parts of config.json a cross-encoder adds to its encoder's.
#[derive(Deserialize)]
struct HeadConfig {
    #[serde(default)]
    architectures: Vec<String>,
    model_type: Option<String>,
    hidden_size: Option<usize>,
    dim: Option<usize>,
    #[serde(default)]
    num_labels: Option<usize>,
    #[serde(default)]
    id2label: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    sentence_transformers: Option<StSection>,
    #[serde(default)]
    sbert_ce_default_activation_function: Option<String>,
    max_position_embeddings: Option<usize>,
    // ModernBERT's head.
    #[serde(default)]
    classifier_pooling: Option<String>,
    #[serde(default)]
    classifier_activation: Option<String>,
    #[serde(default)]
    classifier_bias: bool,
    #[serde(default)]
    norm_bias: bool,
    #[serde(default)]
    norm_eps: Option<f64>,
}

#[derive(Deserialize)]
struct StSection {
    #[serde(default)]
    activation_fn: Option<String>,
}

/// A dense layer of a head, [out, in] row-major.
struct Dense {
    weight: Vec<f32>,
    bias: Option<Vec<f32>>,
    inputs: usize,
    outputs: usize,
}

impl Dense {
    fn load(
        vb: &VarBuilder,
        inputs: usize,
        outputs: usize,
        bias: bool,
    ) -> Result<Self, candle_core::Error> {
        let weight = vb.get((outputs, inputs), "weight")?;
        let bias = if bias {
            Some(vb.get(outputs, "bias")?.to_dtype(DType::F32)?.to_vec1()?)
        } else {
            None
        };
        Ok(Dense {
            weight: weight.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?,
            bias,
            inputs,
            outputs,
        })
    }

    fn forward(&self, x: &[f32]) -> Vec<f32> {
        (0..self.outputs)
            .map(|o| {
                let row = &self.weight[o * self.inputs..(o + 1) * self.inputs];
                let dot: f32 = row.iter().zip(x).map(|(w, v)| w * v).sum();
                dot + self.bias.as_ref().map_or(0.0, |b| b[o])
            })
            .collect()
    }
}

/// The classifier on top of the encoder.
enum Head {
    /// BERT: the pooler (dense + tanh on the first token), then the classifier.
    Bert { pooler: Dense, classifier: Dense },
    /// XLM-RoBERTa: dense + tanh on the first token, then `out_proj`.
    Roberta { dense: Dense, out_proj: Dense },
    /// ModernBERT: CLS or mean pooling, dense, activation, LayerNorm, classifier.
    ModernBert {
        mean: bool,
        dense: Dense,
        activation: HeadActivation,
        norm_weight: Vec<f32>,
        norm_bias: Option<Vec<f32>>,
        eps: f32,
        classifier: Dense,
    },
}

#[derive(Clone, Copy, Debug)]
enum HeadActivation {
    GeluErf,
    GeluTanh,
    Relu,
    Silu,
    Tanh,
}

impl HeadActivation {
    fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "gelu" => Self::GeluErf,
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Self::GeluTanh,
            "relu" => Self::Relu,
            "silu" | "swish" => Self::Silu,
            "tanh" => Self::Tanh,
            _ => return None,
        })
    }

    fn apply(self, x: f32) -> f32 {
        match self {
            Self::GeluErf => gelu::gelu(x),
            Self::GeluTanh => {
                let c = (2.0f32 / std::f32::consts::PI).sqrt();
                0.5 * x * (1.0 + (c * (x + 0.044_715 * x * x * x)).tanh())
            }
            Self::Relu => x.max(0.0),
            Self::Silu => x / (1.0 + (-x).exp()),
            Self::Tanh => x.tanh(),
        }
    }
}

impl Head {
    /// Whether the head pools every token (mean) rather than reading the first.
    fn pools_mean(&self) -> bool {
        matches!(self, Head::ModernBert { mean: true, .. })
    }

    /// The logit of one pooled vector (the first token's state, or the mean).
    fn logit(&self, pooled: &[f32]) -> f32 {
        let tanh = |v: Vec<f32>| v.into_iter().map(f32::tanh).collect::<Vec<_>>();
        match self {
            Head::Bert { pooler, classifier } => {
                classifier.forward(&tanh(pooler.forward(pooled)))[0]
            }
            Head::Roberta { dense, out_proj } => out_proj.forward(&tanh(dense.forward(pooled)))[0],
            Head::ModernBert {
                dense,
                activation,
                norm_weight,
                norm_bias,
                eps,
                classifier,
                ..
            } => {
                let x: Vec<f32> = dense
                    .forward(pooled)
                    .into_iter()
                    .map(|v| activation.apply(v))
                    .collect();
                let n = x.len() as f32;
                let mean = x.iter().sum::<f32>() / n;
                let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
                let inv = 1.0 / (var + eps).sqrt();
                let normed: Vec<f32> = x
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        (v - mean) * inv * norm_weight[i] + norm_bias.as_ref().map_or(0.0, |b| b[i])
                    })
                    .collect();
                classifier.forward(&normed)[0]
            }
        }
    }
}

/// The encoder under the head.
enum Body {
    Cpu(Box<CpuBert>),
    Candle(Bert),
    Rotary(Box<RotaryModel>),
}

pub struct CrossEncoder {
    pub files: ModelFiles,
    tokenizer: Tokenizer,
    body: Body,
    head: Head,
    activation: ScoreActivation,
    hidden: usize,
    max_len: usize,
    pad_id: u32,
    architecture: String,
    device: Device,
}

impl CrossEncoder {
    /// Load a cross-encoder named as `--model` names embedding models (a folder, a name
    /// under models/, a hub id) onto `device`: on the CPU, the BERT-like families in f32 run
    /// the fused engine; bf16 and int8 are refused (rerankers run in f32 on the CPU).
    pub fn load(spec: &str, device: &Device, choice: DTypeChoice) -> Result<Self, EmbedError> {
        let files = ModelFiles::resolve(spec)?;
        Self::load_files(files, device, choice)
    }

    pub fn load_files(
        files: ModelFiles,
        device: &Device,
        choice: DTypeChoice,
    ) -> Result<Self, EmbedError> {
        Self::load_with(files, device, choice, true)
    }

    /// Load with the candle encoder whatever the device (the path GPUs take; on the CPU to
    /// test it where there is no GPU).
    pub fn load_candle(
        files: ModelFiles,
        device: &Device,
        dtype: DType,
    ) -> Result<Self, EmbedError> {
        let choice = match dtype {
            DType::F16 => DTypeChoice::F16,
            DType::BF16 => DTypeChoice::BF16,
            _ => DTypeChoice::F32,
        };
        Self::load_with(files, device, choice, false)
    }

    fn load_with(
        files: ModelFiles,
        device: &Device,
        choice: DTypeChoice,
        fused: bool,
    ) -> Result<Self, EmbedError> {
        let dtype = match (device.is_cpu(), choice) {
            // The candle path on the CPU (tests): any float dtype.
            (true, DTypeChoice::BF16 | DTypeChoice::F16) if !fused => choice.resolve(device),
            _ => choice.f32_on_cpu(device, "a reranker")?,
        };
        let bad_config = |reason: String| files.bad_config(reason);
        let raw = files.read_config()?;
        let config: HeadConfig = serde_json::from_slice(&raw)
            .map_err(|e| bad_config(format!("not the expected JSON: {e}")))?;
        let architecture = config
            .architectures
            .iter()
            .find(|a| CROSS_ENCODER_ARCHITECTURES.contains(&a.as_str()))
            .cloned()
            .ok_or_else(|| {
                EmbedError::Unsupported(format!(
                    "model `{}` is not a cross-encoder ragline runs: config.json's architectures \
                     are {:?}; rerankers must be one of {}",
                    files.name,
                    config.architectures,
                    CROSS_ENCODER_ARCHITECTURES.join(", ")
                ))
            })?;
        let labels = config
            .num_labels
            .or_else(|| config.id2label.as_ref().map(|m| m.len()))
            .unwrap_or(2);
        if labels != 1 {
            return Err(EmbedError::Unsupported(format!(
                "model `{}` gives {labels} labels; ragline reranks with one-label cross-encoders \
                 (a relevance score)",
                files.name
            )));
        }
        // Where sentence-transformers looks, in its order: config_sentence_transformers.json
        // (version 6), config.json's `sentence_transformers` (4-5), the key before 4.
        let st6 = std::fs::read(files.dir.join("config_sentence_transformers.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<StSection>(&b).ok())
            .and_then(|s| s.activation_fn);
        let activation = match st6
            .or_else(|| {
                config
                    .sentence_transformers
                    .as_ref()
                    .and_then(|s| s.activation_fn.clone())
            })
            .or_else(|| config.sbert_ce_default_activation_function.clone())
        {
            // sentence-transformers trusts only torch's own activations; others fall back.
            Some(path) if path.starts_with("torch.") => ScoreActivation::from_path(&path)
                .ok_or_else(|| {
                    EmbedError::Unsupported(format!(
                        "model `{}`: activation `{path}` is not supported; supported: Sigmoid, \
                         Identity, Tanh, ReLU",
                        files.name
                    ))
                })?,
            _ => ScoreActivation::Sigmoid,
        };
        let vb = files.var_builder(dtype, device)?;
        let misfit = |e: candle_core::Error| files.misfit(e);
        let model_type = config.model_type.clone().unwrap_or_default();
        let (body, hidden, positions) = if architecture.starts_with("ModernBert") {
            let rc = RotaryConfig::from_json(&raw, Arch::ModernBert)
                .map_err(|e| bad_config(e.to_string()))?;
            let r = RotaryModel::load(vb.clone(), rc).map_err(misfit)?;
            let (h, p) = (r.hidden_size(), r.max_positions());
            (Body::Rotary(Box::new(r)), h, p)
        } else {
            let bc: BertConfig = serde_json::from_slice(&raw)
                .map_err(|e| bad_config(format!("not a BERT config: {e}")))?;
            let family = Family::from_model_type(&model_type).unwrap_or(Family::Bert);
            let bert = Bert::load_family(vb.clone(), &bc, family).map_err(misfit)?;
            let (h, p) = (bert.hidden_size(), bert.max_positions());
            let body = if fused && device.is_cpu() && dtype == DType::F32 {
                Body::Cpu(Box::new(
                    bert.to_cpu(KernelPath::from_env()?, Precision::F32)?,
                ))
            } else {
                Body::Candle(bert)
            };
            (body, h, p)
        };
        let hidden_in_config = config.hidden_size.or(config.dim).unwrap_or(hidden);
        let head = load_head(&architecture, &config, &vb, hidden_in_config).map_err(misfit)?;
        let max_len = max_length(&files, config.max_position_embeddings, positions)?;
        let tokenizer = pair_tokenizer(&files, max_len)?;
        let pad_id = tokenizer
            .token_to_id("[PAD]")
            .or_else(|| tokenizer.token_to_id("<pad>"))
            .unwrap_or(0);
        Ok(CrossEncoder {
            files,
            tokenizer,
            body,
            head,
            activation,
            hidden,
            max_len,
            pad_id,
            architecture,
            device: device.clone(),
        })
    }

    /// config.json's architecture (`BertForSequenceClassification`...).
    pub fn architecture(&self) -> &str {
        &self.architecture
    }

    /// The name the model was given.
    pub fn name(&self) -> &str {
        &self.files.name
    }

    /// Longest pair in tokens, special tokens included; longer pairs are truncated, the
    /// longer of the two texts first (the tokenizer's `longest_first`).
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    pub fn activation(&self) -> ScoreActivation {
        self.activation
    }

    /// Which encoder runs, in words.
    pub fn encoder_kind(&self) -> String {
        match &self.body {
            Body::Cpu(c) => c.describe(),
            Body::Candle(b) => format!("candle encoder, {:?}", b.dtype()).to_lowercase(),
            Body::Rotary(r) => r.describe(),
        }
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The model's ids of a (query, passage) pair, truncated to [`CrossEncoder::max_len`].
    pub fn encode_pair(&self, query: &str, passage: &str) -> Result<PairIds, EmbedError> {
        let e = self
            .tokenizer
            .encode((query, passage), true)
            .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
        let ids = e.get_ids().to_vec();
        let types = match &self.body {
            Body::Rotary(_) => vec![0; ids.len()],
            _ => e.get_type_ids().to_vec(),
        };
        Ok(PairIds {
            ids,
            types,
            truncated: !e.get_overflowing().is_empty(),
        })
    }

    /// Score `passages` against `query`, in their order (batched by length within
    /// `budget` tokens).
    pub fn rerank(
        &self,
        query: &str,
        passages: &[&str],
        budget: usize,
    ) -> Result<Vec<PairScore>, EmbedError> {
        let pairs = passages
            .iter()
            .map(|p| self.encode_pair(query, p))
            .collect::<Result<Vec<_>, _>>()?;
        self.score_pairs(&pairs, budget)
    }

    /// Score tokenized pairs, in their order, batched by length within `budget` tokens.
    pub fn score_pairs(
        &self,
        pairs: &[PairIds],
        budget: usize,
    ) -> Result<Vec<PairScore>, EmbedError> {
        let lengths: Vec<usize> = pairs.iter().map(|p| p.ids.len()).collect();
        let batches = match self.body {
            Body::Cpu(_) => super::batch::plan_unpadded(&lengths, budget),
            _ => super::batch::plan(&lengths, budget),
        };
        let mut out = vec![
            PairScore {
                raw: 0.0,
                score: 0.0
            };
            pairs.len()
        ];
        for batch in batches {
            let chosen: Vec<&PairIds> = batch.iter().map(|&i| &pairs[i]).collect();
            let logits = self.logits(&chosen)?;
            for (&i, raw) in batch.iter().zip(logits) {
                out[i] = PairScore {
                    raw,
                    score: self.activation.apply(raw),
                };
            }
        }
        Ok(out)
    }

    /// The logit of each pair of one batch.
    fn logits(&self, pairs: &[&PairIds]) -> Result<Vec<f32>, EmbedError> {
        if pairs.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(p) = pairs
            .iter()
            .find(|p| p.ids.is_empty() || p.ids.len() > self.max_len)
        {
            return Err(EmbedError::Tokenizer(format!(
                "a pair of {} tokens: a pair has 1 to {} tokens",
                p.ids.len(),
                self.max_len
            )));
        }
        let h = self.hidden;
        let pooled: Vec<Vec<f32>> = match &self.body {
            Body::Cpu(cpu) => {
                let seqs: Vec<&[u32]> = pairs.iter().map(|p| p.ids.as_slice()).collect();
                let types: Vec<&[u32]> = pairs.iter().map(|p| p.types.as_slice()).collect();
                // The heads read each pair's first token: the last layer computes only it.
                let first = cpu.forward_rows(&seqs, Some(&types), Rows::First)?;
                first.chunks_exact(h).map(<[f32]>::to_vec).collect()
            }
            Body::Candle(bert) => {
                let (ids, types, mask, _) = self.padded(pairs);
                let b = pairs.len();
                let len = ids.len() / b;
                let ids = Tensor::from_vec(ids, (b, len), &self.device)?;
                let types = Tensor::from_vec(types, (b, len), &self.device)?;
                let mask = Tensor::from_vec(mask, (b, len), &self.device)?
                    .to_dtype(bert.activation_dtype())?;
                let mut parts = Parts::start(&self.device)?;
                let hidden = bert.forward_typed(&ids, Some(&types), &mask, &mut parts)?;
                hidden
                    .narrow(1, 0, 1)?
                    .squeeze(1)?
                    .to_dtype(DType::F32)?
                    .to_vec2::<f32>()?
            }
            Body::Rotary(r) => {
                let (ids, _, _, lengths) = self.padded(pairs);
                let hidden = r.forward(ids, &lengths)?.to_dtype(DType::F32)?;
                let mut pooled = Vec::with_capacity(pairs.len());
                for (i, &n) in lengths.iter().enumerate() {
                    let rows = hidden.get(i)?;
                    let v = if self.head.pools_mean() {
                        (rows.narrow(0, 0, n)?.sum(0)? / n as f64)?
                    } else {
                        rows.get(0)?
                    };
                    pooled.push(v.to_vec1::<f32>()?);
                }
                pooled
            }
        };
        Ok(pooled.iter().map(|v| self.head.logit(v)).collect())
    }

    /// Right-padded ids, types and mask of a batch, and each pair's length.
    fn padded(&self, pairs: &[&PairIds]) -> (Vec<u32>, Vec<u32>, Vec<f32>, Vec<usize>) {
        let len = pairs.iter().map(|p| p.ids.len()).max().unwrap_or(0);
        let b = pairs.len();
        let mut ids = vec![self.pad_id; b * len];
        let mut types = vec![0u32; b * len];
        let mut mask = vec![0f32; b * len];
        for (row, p) in pairs.iter().enumerate() {
            let n = p.ids.len();
            ids[row * len..row * len + n].copy_from_slice(&p.ids);
            types[row * len..row * len + n].copy_from_slice(&p.types);
            mask[row * len..row * len + n].fill(1.0);
        }
        (
            ids,
            types,
            mask,
            pairs.iter().map(|p| p.ids.len()).collect(),
        )
    }
}

/// The head of `architecture` from the weights (under their names in transformers'
/// checkpoints).
fn load_head(
    architecture: &str,
    config: &HeadConfig,
    vb: &VarBuilder,
    h: usize,
) -> Result<Head, candle_core::Error> {
    Ok(match architecture {
        "BertForSequenceClassification" => Head::Bert {
            pooler: Dense::load(&vb.pp("bert.pooler.dense"), h, h, true)?,
            classifier: Dense::load(&vb.pp("classifier"), h, 1, true)?,
        },
        "XLMRobertaForSequenceClassification" => Head::Roberta {
            dense: Dense::load(&vb.pp("classifier.dense"), h, h, true)?,
            out_proj: Dense::load(&vb.pp("classifier.out_proj"), h, 1, true)?,
        },
        _ => {
            let pooling = config.classifier_pooling.as_deref().unwrap_or("cls");
            let act = config.classifier_activation.as_deref().unwrap_or("gelu");
            let norm = vb.pp("head.norm");
            Head::ModernBert {
                mean: match pooling {
                    "mean" => true,
                    "cls" => false,
                    other => candle_core::bail!(
                        "classifier_pooling `{other}` is not supported; supported: cls, mean"
                    ),
                },
                dense: Dense::load(&vb.pp("head.dense"), h, h, config.classifier_bias)?,
                activation: HeadActivation::from_name(act).ok_or_else(|| {
                    candle_core::Error::Msg(format!(
                        "classifier_activation `{act}` is not supported; supported: gelu, \
                         gelu_new, gelu_pytorch_tanh, relu, silu, tanh"
                    ))
                })?,
                norm_weight: norm.get(h, "weight")?.to_dtype(DType::F32)?.to_vec1()?,
                norm_bias: if config.norm_bias {
                    Some(norm.get(h, "bias")?.to_dtype(DType::F32)?.to_vec1()?)
                } else {
                    None
                },
                eps: config.norm_eps.unwrap_or(1e-5) as f32,
                classifier: Dense::load(&vb.pp("classifier"), h, 1, true)?,
            }
        }
    })
}

/// The longest pair, as sentence-transformers sets it: sentence_bert_config.json's
/// max_seq_length, else the tokenizer's model_max_length capped at the model's positions.
fn max_length(
    files: &ModelFiles,
    max_position_embeddings: Option<usize>,
    positions: usize,
) -> Result<usize, EmbedError> {
    let len = files.sequence_limit(positions.min(max_position_embeddings.unwrap_or(usize::MAX)));
    if len < 3 {
        return Err(EmbedError::Unsupported(format!(
            "model `{}`: a maximum length of {len} tokens leaves no room for a pair",
            files.name
        )));
    }
    Ok(len)
}

/// The model's tokenizer for pairs: no padding, truncation of the longer text first.
fn pair_tokenizer(files: &ModelFiles, max_len: usize) -> Result<Tokenizer, EmbedError> {
    let bad = |reason: String| EmbedError::ModelFile {
        path: files.tokenizer.clone(),
        reason,
    };
    let mut t = Tokenizer::from_file(&files.tokenizer)
        .map_err(|e| bad(format!("cannot load the tokenizer: {e}")))?;
    t.with_padding(None);
    t.with_truncation(Some(TruncationParams {
        max_length: max_len,
        strategy: TruncationStrategy::LongestFirst,
        stride: 0,
        direction: TruncationDirection::Right,
    }))
    .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
    Ok(t)
}
