//! What the task models (cross-encoders, sequence and token classifiers) share: the encoder
//! under the head ([`Body`]: the fused CPU engine for the BERT-like families in f32, candle
//! otherwise, the rotary engine for ModernBERT), the heads transformers puts on it (under
//! their names in transformers' checkpoints), and their labels from config.json.
//!
//! The heads are a few small products per sequence or token: they run on the CPU in f32,
//! whatever device the encoder runs on.

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;

use crate::embed::bert::{Bert, BertConfig, Family};
use crate::embed::cpu::kernels::{KernelPath, Precision};
use crate::embed::cpu::{CpuBert, Rows};
use crate::embed::device::DTypeChoice;
use crate::embed::files::ModelFiles;
use crate::embed::gelu;
use crate::embed::profile::Parts;
use crate::embed::rotary::{Arch, RotaryConfig, RotaryModel};
use crate::embed::EmbedError;

/// The parts of config.json a head adds to its encoder's.
#[derive(Deserialize)]
pub(crate) struct HeadConfig {
    #[serde(default)]
    pub architectures: Vec<String>,
    pub model_type: Option<String>,
    pub hidden_size: Option<usize>,
    pub dim: Option<usize>,
    #[serde(default)]
    pub num_labels: Option<usize>,
    #[serde(default)]
    pub id2label: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    pub problem_type: Option<String>,
    pub max_position_embeddings: Option<usize>,
    // ModernBERT's head.
    #[serde(default)]
    pub classifier_pooling: Option<String>,
    #[serde(default)]
    pub classifier_activation: Option<String>,
    #[serde(default)]
    pub classifier_bias: bool,
    #[serde(default)]
    pub norm_bias: bool,
    #[serde(default)]
    pub norm_eps: Option<f64>,
}

impl HeadConfig {
    pub fn read(files: &ModelFiles) -> Result<(Self, Vec<u8>), EmbedError> {
        let raw = files.read_config()?;
        let config = serde_json::from_slice(&raw)
            .map_err(|e| files.bad_config(format!("not the expected JSON: {e}")))?;
        Ok((config, raw))
    }

    /// The first of config.json's architectures that is one of `known`.
    pub fn architecture(
        &self,
        files: &ModelFiles,
        known: &[&str],
        what: &str,
    ) -> Result<String, EmbedError> {
        self.architectures
            .iter()
            .find(|a| known.contains(&a.as_str()))
            .cloned()
            .ok_or_else(|| {
                EmbedError::Unsupported(format!(
                    "model `{}` is not {what} ragline runs: config.json's architectures are \
                     {:?}; it must be one of {}",
                    files.name,
                    self.architectures,
                    known.join(", ")
                ))
            })
    }

    /// The labels in the order of the head's outputs: `id2label`, else `num_labels` names
    /// `LABEL_i` (transformers' default), else two.
    pub fn labels(&self, files: &ModelFiles) -> Result<Vec<String>, EmbedError> {
        let n = self
            .id2label
            .as_ref()
            .map(|m| m.len())
            .or(self.num_labels)
            .unwrap_or(2);
        if n == 0 || n > 100_000 {
            return Err(files.bad_config(format!("{n} labels: a head has 1 to 100000")));
        }
        let mut labels: Vec<String> = (0..n).map(|i| format!("LABEL_{i}")).collect();
        if let Some(map) = &self.id2label {
            for (k, v) in map {
                let i: usize = k.parse().ok().filter(|&i| i < n).ok_or_else(|| {
                    files.bad_config(format!(
                        "id2label's key `{k}` is not an index below its {n} labels"
                    ))
                })?;
                labels[i] = match v {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
            }
        }
        Ok(labels)
    }

    /// The hidden size the head reads (DistilBERT calls it `dim`).
    pub fn hidden(&self, encoder: usize) -> usize {
        self.hidden_size.or(self.dim).unwrap_or(encoder)
    }
}

/// A dense layer of a head, [out, in] row-major.
pub(crate) struct Dense {
    weight: Vec<f32>,
    bias: Option<Vec<f32>>,
    inputs: usize,
    outputs: usize,
}

impl Dense {
    pub fn load(
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

    pub fn forward(&self, x: &[f32]) -> Vec<f32> {
        (0..self.outputs)
            .map(|o| {
                let row = &self.weight[o * self.inputs..(o + 1) * self.inputs];
                let dot: f32 = row.iter().zip(x).map(|(w, v)| w * v).sum();
                dot + self.bias.as_ref().map_or(0.0, |b| b[o])
            })
            .collect()
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum HeadActivation {
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

/// ModernBERT's prediction head: dense, activation, LayerNorm (before its classifier).
pub(crate) struct Prediction {
    dense: Dense,
    activation: HeadActivation,
    norm_weight: Vec<f32>,
    norm_bias: Option<Vec<f32>>,
    eps: f32,
}

impl Prediction {
    fn load(config: &HeadConfig, vb: &VarBuilder, h: usize) -> Result<Self, candle_core::Error> {
        let act = config.classifier_activation.as_deref().unwrap_or("gelu");
        let norm = vb.pp("head.norm");
        Ok(Prediction {
            dense: Dense::load(&vb.pp("head.dense"), h, h, config.classifier_bias)?,
            activation: HeadActivation::from_name(act).ok_or_else(|| {
                candle_core::Error::Msg(format!(
                    "classifier_activation `{act}` is not supported; supported: gelu, gelu_new, \
                     gelu_pytorch_tanh, relu, silu, tanh"
                ))
            })?,
            norm_weight: norm.get(h, "weight")?.to_dtype(DType::F32)?.to_vec1()?,
            norm_bias: if config.norm_bias {
                Some(norm.get(h, "bias")?.to_dtype(DType::F32)?.to_vec1()?)
            } else {
                None
            },
            eps: config.norm_eps.unwrap_or(1e-5) as f32,
        })
    }

    fn forward(&self, x: &[f32]) -> Vec<f32> {
        let x: Vec<f32> = self
            .dense
            .forward(x)
            .into_iter()
            .map(|v| self.activation.apply(v))
            .collect();
        let n = x.len() as f32;
        let mean = x.iter().sum::<f32>() / n;
        let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
        let inv = 1.0 / (var + self.eps).sqrt();
        x.iter()
            .enumerate()
            .map(|(i, v)| {
                (v - mean) * inv * self.norm_weight[i]
                    + self.norm_bias.as_ref().map_or(0.0, |b| b[i])
            })
            .collect()
    }
}

/// Which state of a sequence a head reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pooled {
    /// The first token's (`[CLS]`).
    First,
    /// The mean of every token's.
    Mean,
    /// The last token's (a decoder's: the only one that has read the whole text).
    Last,
}

/// A sequence classifier's head (`*ForSequenceClassification`), on the first token's state
/// (the mean of all where ModernBERT's config says so; the last token's for a decoder).
pub(crate) enum SequenceHead {
    /// BERT: the pooler (dense + tanh on the first token), then the classifier.
    Bert { pooler: Dense, classifier: Dense },
    /// XLM-RoBERTa and MPNet: dense + tanh on the first token, then `out_proj`.
    Roberta { dense: Dense, out_proj: Dense },
    /// DistilBERT: `pre_classifier`, ReLU, then the classifier.
    DistilBert {
        pre_classifier: Dense,
        classifier: Dense,
    },
    /// ModernBERT: CLS or mean pooling, the prediction head, then the classifier.
    ModernBert {
        mean: bool,
        head: Prediction,
        classifier: Dense,
    },
    /// A decoder (Qwen3, Gemma3): `score`, without a bias, on the last token.
    Score(Dense),
}

/// The sequence-classification architectures, each with its encoder's family.
pub const SEQUENCE_ARCHITECTURES: &[&str] = &[
    "BertForSequenceClassification",
    "XLMRobertaForSequenceClassification",
    "RobertaForSequenceClassification",
    "DistilBertForSequenceClassification",
    "MPNetForSequenceClassification",
    "ModernBertForSequenceClassification",
    "Qwen3ForSequenceClassification",
    "Gemma3TextForSequenceClassification",
];

/// The token-classification architectures.
pub const TOKEN_ARCHITECTURES: &[&str] = &[
    "BertForTokenClassification",
    "XLMRobertaForTokenClassification",
    "RobertaForTokenClassification",
    "DistilBertForTokenClassification",
    "MPNetForTokenClassification",
    "ModernBertForTokenClassification",
];

impl SequenceHead {
    pub fn load(
        architecture: &str,
        config: &HeadConfig,
        vb: &VarBuilder,
        h: usize,
        labels: usize,
    ) -> Result<Self, candle_core::Error> {
        Ok(match architecture {
            "BertForSequenceClassification" => SequenceHead::Bert {
                pooler: Dense::load(&vb.pp("bert.pooler.dense"), h, h, true)?,
                classifier: Dense::load(&vb.pp("classifier"), h, labels, true)?,
            },
            "XLMRobertaForSequenceClassification"
            | "RobertaForSequenceClassification"
            | "MPNetForSequenceClassification" => SequenceHead::Roberta {
                dense: Dense::load(&vb.pp("classifier.dense"), h, h, true)?,
                out_proj: Dense::load(&vb.pp("classifier.out_proj"), h, labels, true)?,
            },
            "DistilBertForSequenceClassification" => SequenceHead::DistilBert {
                pre_classifier: Dense::load(&vb.pp("pre_classifier"), h, h, true)?,
                classifier: Dense::load(&vb.pp("classifier"), h, labels, true)?,
            },
            "Qwen3ForSequenceClassification" | "Gemma3TextForSequenceClassification" => {
                SequenceHead::Score(Dense::load(&vb.pp("score"), h, labels, false)?)
            }
            _ => SequenceHead::ModernBert {
                mean: match config.classifier_pooling.as_deref().unwrap_or("cls") {
                    "mean" => true,
                    "cls" => false,
                    other => candle_core::bail!(
                        "classifier_pooling `{other}` is not supported; supported: cls, mean"
                    ),
                },
                head: Prediction::load(config, vb, h)?,
                classifier: Dense::load(&vb.pp("classifier"), h, labels, true)?,
            },
        })
    }

    /// Which state the head reads.
    pub fn pooled(&self) -> Pooled {
        match self {
            SequenceHead::ModernBert { mean: true, .. } => Pooled::Mean,
            SequenceHead::Score(_) => Pooled::Last,
            _ => Pooled::First,
        }
    }

    /// The logits of one pooled vector (the first token's state, or the mean).
    pub fn logits(&self, pooled: &[f32]) -> Vec<f32> {
        let tanh = |v: Vec<f32>| v.into_iter().map(f32::tanh).collect::<Vec<_>>();
        match self {
            SequenceHead::Bert { pooler, classifier } => {
                classifier.forward(&tanh(pooler.forward(pooled)))
            }
            SequenceHead::Roberta { dense, out_proj } => {
                out_proj.forward(&tanh(dense.forward(pooled)))
            }
            SequenceHead::DistilBert {
                pre_classifier,
                classifier,
            } => {
                let x: Vec<f32> = pre_classifier
                    .forward(pooled)
                    .into_iter()
                    .map(|v| v.max(0.0))
                    .collect();
                classifier.forward(&x)
            }
            SequenceHead::ModernBert {
                head, classifier, ..
            } => classifier.forward(&head.forward(pooled)),
            SequenceHead::Score(score) => score.forward(pooled),
        }
    }
}

/// A token classifier's head (`*ForTokenClassification`), on every token's state.
pub(crate) enum TokenHead {
    /// BERT, XLM-RoBERTa, DistilBERT, MPNet: one linear layer.
    Linear(Dense),
    /// ModernBERT: the prediction head, then the classifier.
    ModernBert { head: Prediction, classifier: Dense },
}

impl TokenHead {
    pub fn load(
        architecture: &str,
        config: &HeadConfig,
        vb: &VarBuilder,
        h: usize,
        labels: usize,
    ) -> Result<Self, candle_core::Error> {
        let classifier = Dense::load(&vb.pp("classifier"), h, labels, true)?;
        Ok(if architecture.starts_with("ModernBert") {
            TokenHead::ModernBert {
                head: Prediction::load(config, vb, h)?,
                classifier,
            }
        } else {
            TokenHead::Linear(classifier)
        })
    }

    pub fn logits(&self, state: &[f32]) -> Vec<f32> {
        match self {
            TokenHead::Linear(d) => d.forward(state),
            TokenHead::ModernBert { head, classifier } => classifier.forward(&head.forward(state)),
        }
    }
}

/// The encoder under a head.
pub(crate) enum Body {
    Cpu(Box<CpuBert>),
    Candle(Bert),
    Rotary(Box<RotaryModel>),
}

/// What a head needs to know of the encoder it sits on.
pub(crate) struct Encoder {
    pub body: Body,
    /// The encoder's hidden size.
    pub hidden: usize,
    /// Its positions: the longest sequence it reads.
    pub positions: usize,
    pub pad_id: u32,
    pub device: Device,
}

impl Encoder {
    /// The encoder of `architecture` from the weights in `vb`: ModernBERT and Qwen3 on the
    /// rotary engine (f32 on the CPU), the BERT-like families on the fused CPU engine with its
    /// dense layers in `fused`'s precision where the device and dtype allow it, else candle's.
    pub fn load(
        files: &ModelFiles,
        architecture: &str,
        config: &HeadConfig,
        raw: &[u8],
        vb: &VarBuilder,
        device: &Device,
        fused: Option<Precision>,
    ) -> Result<Self, EmbedError> {
        let bad_config = |reason: String| files.bad_config(reason);
        let misfit = |e: candle_core::Error| files.misfit(e);
        let dtype = vb.dtype();
        let rotary = if architecture.starts_with("ModernBert") {
            Some(Arch::ModernBert)
        } else if architecture.starts_with("Qwen3") {
            Some(Arch::Qwen3)
        } else if architecture.starts_with("Gemma3") {
            Some(Arch::Gemma3)
        } else {
            None
        };
        let (body, hidden, positions) = if let Some(arch) = rotary {
            if let Some(p) = fused.filter(|&p| p != Precision::F32 && device.is_cpu()) {
                return Err(EmbedError::Unsupported(format!(
                    "--dtype {}: {architecture} runs in f32 on the CPU (bf16 and int8 are for \
                     the BERT-like families); use --dtype f32",
                    p.name()
                )));
            }
            let rc = RotaryConfig::from_json(raw, arch).map_err(|e| bad_config(e.to_string()))?;
            let r = RotaryModel::load(vb.clone(), rc).map_err(misfit)?;
            let (h, p) = (r.hidden_size(), r.max_positions());
            (Body::Rotary(Box::new(r)), h, p)
        } else {
            let bc: BertConfig = serde_json::from_slice(raw)
                .map_err(|e| bad_config(format!("not a BERT config: {e}")))?;
            let model_type = config.model_type.clone().unwrap_or_default();
            let family = Family::from_model_type(&model_type).unwrap_or(Family::Bert);
            let bert = Bert::load_family(vb.clone(), &bc, family).map_err(misfit)?;
            let (h, p) = (bert.hidden_size(), bert.max_positions());
            let body = if let (Some(precision), true, DType::F32) = (fused, device.is_cpu(), dtype)
            {
                let path = KernelPath::chosen()?;
                precision.check(path)?;
                Body::Cpu(Box::new(bert.to_cpu(path, precision)?))
            } else {
                Body::Candle(bert)
            };
            (body, h, p)
        };
        Ok(Encoder {
            body,
            hidden,
            positions,
            pad_id: 0,
            device: device.clone(),
        })
    }

    /// Which encoder runs, in words.
    pub fn describe(&self) -> String {
        match &self.body {
            Body::Cpu(c) => c.describe(),
            Body::Candle(b) => format!("candle encoder, {:?}", b.dtype()).to_lowercase(),
            Body::Rotary(r) => r.describe(),
        }
    }

    /// Whether a batch computes its padding (so batches are planned by padded length).
    pub fn pads(&self) -> bool {
        !matches!(self.body, Body::Cpu(_))
    }

    /// Token types are read (BERT's segments); the rotary engine has none.
    pub fn reads_types(&self) -> bool {
        !matches!(self.body, Body::Rotary(_))
    }

    /// The pooled state of each sequence, as `pooled` says.
    pub fn pooled(
        &self,
        seqs: &[&[u32]],
        types: Option<&[&[u32]]>,
        pooled: Pooled,
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        let h = self.hidden;
        if let (Body::Cpu(cpu), Pooled::First) = (&self.body, pooled) {
            // The heads read each sequence's first token: the last layer computes only it.
            let first = cpu.forward_rows(seqs, types, Rows::First)?;
            return Ok(first.chunks_exact(h).map(<[f32]>::to_vec).collect());
        }
        let states = self.states(seqs, types)?;
        Ok(states
            .iter()
            .map(|s| match pooled {
                Pooled::Mean => {
                    let n = (s.len() / h).max(1) as f32;
                    let mut v = vec![0f32; h];
                    for row in s.chunks_exact(h) {
                        v.iter_mut().zip(row).for_each(|(a, b)| *a += b);
                    }
                    v.iter_mut().for_each(|a| *a /= n);
                    v
                }
                Pooled::First => s[..h].to_vec(),
                Pooled::Last => s[s.len() - h..].to_vec(),
            })
            .collect())
    }

    /// Every token's hidden state of each sequence, [its length * hidden].
    pub fn states(
        &self,
        seqs: &[&[u32]],
        types: Option<&[&[u32]]>,
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        let h = self.hidden;
        let lengths: Vec<usize> = seqs.iter().map(|s| s.len()).collect();
        let rows_of = |flat: Vec<f32>, len: usize| -> Vec<Vec<f32>> {
            lengths
                .iter()
                .enumerate()
                .map(|(r, &n)| flat[r * len * h..(r * len + n) * h].to_vec())
                .collect()
        };
        match &self.body {
            Body::Cpu(cpu) => {
                let all = cpu.forward_rows(seqs, types, Rows::All)?;
                let mut out = Vec::with_capacity(seqs.len());
                let mut at = 0;
                for &n in &lengths {
                    out.push(all[at * h..(at + n) * h].to_vec());
                    at += n;
                }
                Ok(out)
            }
            Body::Candle(bert) => {
                let (ids, types, mask, len) = self.padded(seqs, types);
                let b = seqs.len();
                let ids = Tensor::from_vec(ids, (b, len), &self.device)?;
                let types = Tensor::from_vec(types, (b, len), &self.device)?;
                let mask = Tensor::from_vec(mask, (b, len), &self.device)?
                    .to_dtype(bert.activation_dtype())?;
                let mut parts = Parts::start(&self.device)?;
                let hidden = bert.forward_typed(&ids, Some(&types), &mask, &mut parts)?;
                let flat = hidden
                    .to_dtype(DType::F32)?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                Ok(rows_of(flat, len))
            }
            Body::Rotary(r) => {
                let (ids, _, _, len) = self.padded(seqs, None);
                let hidden = r.forward(ids, &lengths)?.to_dtype(DType::F32)?;
                let flat = hidden.flatten_all()?.to_vec1::<f32>()?;
                Ok(rows_of(flat, len))
            }
        }
    }

    /// Right-padded ids, types and mask of a batch, and its padded length.
    fn padded(
        &self,
        seqs: &[&[u32]],
        types: Option<&[&[u32]]>,
    ) -> (Vec<u32>, Vec<u32>, Vec<f32>, usize) {
        let len = seqs.iter().map(|s| s.len()).max().unwrap_or(0);
        let b = seqs.len();
        let mut ids = vec![self.pad_id; b * len];
        let mut ty = vec![0u32; b * len];
        let mut mask = vec![0f32; b * len];
        for (row, s) in seqs.iter().enumerate() {
            let n = s.len();
            ids[row * len..row * len + n].copy_from_slice(s);
            if let Some(t) = types.and_then(|t| t.get(row)) {
                ty[row * len..row * len + t.len().min(n)].copy_from_slice(&t[..t.len().min(n)]);
            }
            mask[row * len..row * len + n].fill(1.0);
        }
        (ids, ty, mask, len)
    }
}

/// The id the encoder pads with: the tokenizer's `[PAD]` or `<pad>`, else 0.
pub(crate) fn pad_id(tokenizer: &tokenizers::Tokenizer) -> u32 {
    tokenizer
        .token_to_id("[PAD]")
        .or_else(|| tokenizer.token_to_id("<pad>"))
        .unwrap_or(0)
}

/// How a task model is opened: the architectures it may have, what it is called in errors,
/// and whether bf16 and int8 dense layers are allowed on the fused CPU engine.
pub(crate) struct OpenAs<'a> {
    pub known: &'a [&'a str],
    pub what: &'a str,
    pub low_precision: bool,
}

/// A task model's parts below its head: config.json (parsed and raw), its architecture and
/// labels, the weights, and the encoder on its device.
pub(crate) struct Opened {
    pub config: HeadConfig,
    pub architecture: String,
    pub labels: Vec<String>,
    pub vb: VarBuilder<'static>,
    pub encoder: Encoder,
    pub raw: Vec<u8>,
}

impl Opened {
    /// Open the model in `files` for `device` and the `--dtype` `choice` (`fused`: the fused
    /// CPU engine where it applies; else candle's encoder whatever the device).
    pub fn open(
        files: &ModelFiles,
        device: &Device,
        choice: DTypeChoice,
        fused: bool,
        how: OpenAs<'_>,
    ) -> Result<Self, EmbedError> {
        let (dtype, precision) = task_dtype(device, choice, fused, how.low_precision, how.what)?;
        let (config, raw) = HeadConfig::read(files)?;
        let architecture = config.architecture(files, how.known, how.what)?;
        let labels = config.labels(files)?;
        let vb = files.var_builder(dtype, device)?;
        let encoder = Encoder::load(
            files,
            &architecture,
            &config,
            &raw,
            &vb,
            device,
            fused.then_some(precision),
        )?;
        Ok(Opened {
            config,
            architecture,
            labels,
            vb,
            encoder,
            raw,
        })
    }

    /// The hidden size the head reads.
    pub fn head_hidden(&self) -> usize {
        self.config.hidden(self.encoder.hidden)
    }
}

/// The dtype a task model's weights are read in, and the precision of the fused CPU
/// encoder's dense layers: f32 on the CPU, or bf16 and int8 layers on the fused engine where
/// `low_precision` allows them (`--dtype bf16|int8`, as embedders take them); any float on
/// candle's.
fn task_dtype(
    device: &Device,
    choice: DTypeChoice,
    fused: bool,
    low_precision: bool,
    what: &str,
) -> Result<(DType, Precision), EmbedError> {
    match (device.is_cpu(), choice) {
        // The candle path on the CPU (tests): any float dtype.
        (true, DTypeChoice::BF16 | DTypeChoice::F16) if !fused => {
            Ok((choice.resolve(device), Precision::F32))
        }
        (true, DTypeChoice::BF16) if fused && low_precision => Ok((DType::F32, Precision::Bf16)),
        (true, DTypeChoice::Int8) if fused && low_precision => Ok((DType::F32, Precision::Int8)),
        _ => Ok((choice.f32_on_cpu(device, what)?, Precision::F32)),
    }
}
