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

use candle_core::{DType, Device};
use serde::Deserialize;
use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

use crate::embed::device::DTypeChoice;
use crate::embed::files::ModelFiles;
use crate::embed::head::{pad_id, Encoder, OpenAs, Opened, SequenceHead};
use crate::embed::EmbedError;

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

#[derive(Deserialize)]
struct StSection {
    #[serde(default)]
    activation_fn: Option<String>,
}

/// Where sentence-transformers records a cross-encoder's activation in config.json.
#[derive(Deserialize)]
struct StKeys {
    #[serde(default)]
    sentence_transformers: Option<StSection>,
    #[serde(default)]
    sbert_ce_default_activation_function: Option<String>,
}

pub struct CrossEncoder {
    pub files: ModelFiles,
    tokenizer: Tokenizer,
    encoder: Encoder,
    head: SequenceHead,
    activation: ScoreActivation,
    max_len: usize,
    architecture: String,
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
        Self::load_with(files, device, DTypeChoice::of(dtype), false)
    }

    fn load_with(
        files: ModelFiles,
        device: &Device,
        choice: DTypeChoice,
        fused: bool,
    ) -> Result<Self, EmbedError> {
        let opened = Opened::open(
            &files,
            device,
            choice,
            fused,
            OpenAs {
                known: CROSS_ENCODER_ARCHITECTURES,
                what: "a cross-encoder",
                low_precision: false,
            },
        )?;
        let labels = opened.labels.len();
        if labels != 1 {
            return Err(EmbedError::Unsupported(format!(
                "model `{}` gives {labels} labels; ragline reranks with one-label cross-encoders \
                 (a relevance score); `ragline classify` reads models of several labels",
                files.name
            )));
        }
        let keys: StKeys = serde_json::from_slice(&opened.raw)
            .map_err(|e| files.bad_config(format!("not the expected JSON: {e}")))?;
        // Where sentence-transformers looks, in its order: config_sentence_transformers.json
        // (version 6), config.json's `sentence_transformers` (4-5), the key before 4.
        let st6 = std::fs::read(files.dir.join("config_sentence_transformers.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<StSection>(&b).ok())
            .and_then(|s| s.activation_fn);
        let activation = match st6
            .or_else(|| {
                keys.sentence_transformers
                    .as_ref()
                    .and_then(|s| s.activation_fn.clone())
            })
            .or_else(|| keys.sbert_ce_default_activation_function.clone())
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
        let head = SequenceHead::load(
            &opened.architecture,
            &opened.config,
            &opened.vb,
            opened.head_hidden(),
            1,
        )
        .map_err(|e| files.misfit(e))?;
        let Opened {
            config,
            architecture,
            mut encoder,
            ..
        } = opened;
        let max_len = max_length(&files, config.max_position_embeddings, encoder.positions)?;
        let tokenizer = pair_tokenizer(&files, max_len)?;
        encoder.pad_id = pad_id(&tokenizer);
        Ok(CrossEncoder {
            files,
            tokenizer,
            encoder,
            head,
            activation,
            max_len,
            architecture,
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
        self.encoder.describe()
    }

    pub fn device(&self) -> &Device {
        &self.encoder.device
    }

    /// The model's ids of a (query, passage) pair, truncated to [`CrossEncoder::max_len`].
    pub fn encode_pair(&self, query: &str, passage: &str) -> Result<PairIds, EmbedError> {
        let e = self
            .tokenizer
            .encode((query, passage), true)
            .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
        let ids = e.get_ids().to_vec();
        let types = if self.encoder.reads_types() {
            e.get_type_ids().to_vec()
        } else {
            vec![0; ids.len()]
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
        let batches = if self.encoder.pads() {
            crate::embed::batch::plan(&lengths, budget)
        } else {
            crate::embed::batch::plan_unpadded(&lengths, budget)
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
        let seqs: Vec<&[u32]> = pairs.iter().map(|p| p.ids.as_slice()).collect();
        let types: Vec<&[u32]> = pairs.iter().map(|p| p.types.as_slice()).collect();
        let pooled = self
            .encoder
            .pooled(&seqs, Some(&types), self.head.pooled())?;
        Ok(pooled.iter().map(|v| self.head.logits(v)[0]).collect())
    }
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
