//! Sequence classification: one text in, a score per label out, as transformers'
//! `text-classification` pipeline computes it (`*ForSequenceClassification` of BERT,
//! XLM-RoBERTa, RoBERTa, DistilBERT, MPNet and ModernBERT).
//!
//! The scores are the logits' softmax (single-label), or each logit's sigmoid where config.json
//! says `problem_type: multi_label_classification` or the model has one label (the pipeline's
//! rule). Texts past the model's length are truncated (the pipeline with `truncation=True`).

use candle_core::{DType, Device};
use serde::Serialize;
use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

use crate::embed::device::DTypeChoice;
use crate::embed::files::{tokenizer_max_length, ModelFiles};
use crate::embed::head::{pad_id, Encoder, OpenAs, Opened, SequenceHead, SEQUENCE_ARCHITECTURES};
use crate::embed::EmbedError;

/// Tokens a batch may hold (padding included where the encoder pads).
pub const DEFAULT_BATCH_TOKENS: usize = 16_384;

/// What turns a text's logits into its scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ScoreFunction {
    /// One label per text: the scores sum to 1.
    Softmax,
    /// Labels independent of each other (multi-label, or one label).
    Sigmoid,
    /// The logits themselves (`raw_scores`).
    None,
}

impl ScoreFunction {
    /// The scores of one text's logits (in f32, as the pipeline's numpy does).
    pub fn apply(self, logits: &[f32]) -> Vec<f32> {
        match self {
            ScoreFunction::Softmax => softmax(logits),
            ScoreFunction::Sigmoid => logits.iter().map(|&x| 1.0 / (1.0 + (-x).exp())).collect(),
            ScoreFunction::None => logits.to_vec(),
        }
    }
}

/// The softmax of `x`, shifted by its maximum.
pub fn softmax(x: &[f32]) -> Vec<f32> {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = x.iter().map(|v| (v - max).exp()).collect();
    let sum: f32 = e.iter().sum();
    e.into_iter().map(|v| v / sum).collect()
}

/// One label of a text and its score.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LabelScore {
    pub label: String,
    pub score: f32,
}

/// A text (or a pair of texts) as the model reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextIds {
    pub ids: Vec<u32>,
    /// Token types: 1 for a pair's second text where the model reads types, else 0.
    pub types: Vec<u32>,
    /// Tokens were cut to fit the model's length.
    pub truncated: bool,
}

/// Which labels of a text to keep: best first, those at or above `threshold`, at most
/// `top_k` (None: all).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LabelChoice {
    pub top_k: Option<usize>,
    pub threshold: Option<f32>,
}

pub struct SequenceClassifier {
    pub files: ModelFiles,
    tokenizer: Tokenizer,
    encoder: Encoder,
    head: SequenceHead,
    labels: Vec<String>,
    function: ScoreFunction,
    max_len: usize,
    architecture: String,
}

impl SequenceClassifier {
    /// Load a classifier named as `--model` names embedding models (a folder, a name under
    /// models/, a hub id) onto `device`: on the CPU the BERT-like families in f32 run the
    /// fused engine.
    pub fn load(spec: &str, device: &Device, choice: DTypeChoice) -> Result<Self, EmbedError> {
        Self::load_with(ModelFiles::resolve(spec)?, device, choice, true)
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
                known: SEQUENCE_ARCHITECTURES,
                what: "a sequence classifier",
                low_precision: true,
            },
        )?;
        let head = SequenceHead::load(
            &opened.architecture,
            &opened.config,
            &opened.vb,
            opened.head_hidden(),
            opened.labels.len(),
        )
        .map_err(|e| files.misfit(e))?;
        let Opened {
            config,
            architecture,
            labels,
            mut encoder,
            ..
        } = opened;
        let function = match config.problem_type.as_deref() {
            Some("multi_label_classification") => ScoreFunction::Sigmoid,
            _ if labels.len() == 1 => ScoreFunction::Sigmoid,
            _ => ScoreFunction::Softmax,
        };
        let max_len = task_max_len(&files, config.max_position_embeddings, encoder.positions)?;
        let tokenizer = task_tokenizer(&files, max_len, 0)?;
        encoder.pad_id = pad_id(&tokenizer);
        Ok(SequenceClassifier {
            files,
            tokenizer,
            encoder,
            head,
            labels,
            function,
            max_len,
            architecture,
        })
    }

    /// A string that changes whenever the results would: the bytes of the config, tokenizer
    /// and weights, and how texts are read.
    pub fn fingerprint(&self) -> Result<String, EmbedError> {
        self.files
            .fingerprint(&format!("|classify|{}|{:?}", self.max_len, self.function))
    }

    pub fn architecture(&self) -> &str {
        &self.architecture
    }

    pub fn name(&self) -> &str {
        &self.files.name
    }

    /// The labels, in the order of the scores.
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// How logits become scores unless told otherwise.
    pub fn function(&self) -> ScoreFunction {
        self.function
    }

    /// The longest text in tokens, special tokens included; longer texts are truncated.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    pub fn encoder_kind(&self) -> String {
        self.encoder.describe()
    }

    pub fn device(&self) -> &Device {
        &self.encoder.device
    }

    /// A text's ids (special tokens included), truncated to [`SequenceClassifier::max_len`].
    pub fn encode(&self, text: &str) -> Result<TextIds, EmbedError> {
        self.encoded(self.tokenizer.encode(text, true))
    }

    /// A pair's ids (`[CLS] a [SEP] b [SEP]` in BERT's template), the longer text truncated
    /// first.
    pub fn encode_pair(&self, a: &str, b: &str) -> Result<TextIds, EmbedError> {
        self.encoded(self.tokenizer.encode((a, b), true))
    }

    fn encoded(&self, e: tokenizers::Result<tokenizers::Encoding>) -> Result<TextIds, EmbedError> {
        let e = e.map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
        let ids = e.get_ids().to_vec();
        let types = if self.encoder.reads_types() {
            e.get_type_ids().to_vec()
        } else {
            vec![0; ids.len()]
        };
        Ok(TextIds {
            ids,
            types,
            truncated: !e.get_overflowing().is_empty(),
        })
    }

    /// The logits of each text, in order, batched by length within `budget` tokens.
    pub fn logits(&self, seqs: &[&TextIds], budget: usize) -> Result<Vec<Vec<f32>>, EmbedError> {
        let lengths: Vec<usize> = seqs.iter().map(|s| s.ids.len()).collect();
        let batches = if self.encoder.pads() {
            crate::embed::batch::plan(&lengths, budget)
        } else {
            crate::embed::batch::plan_unpadded(&lengths, budget)
        };
        let mut out = vec![Vec::new(); seqs.len()];
        for batch in batches {
            let chosen: Vec<&[u32]> = batch.iter().map(|&i| seqs[i].ids.as_slice()).collect();
            let types: Vec<&[u32]> = batch.iter().map(|&i| seqs[i].types.as_slice()).collect();
            if let Some(s) = chosen
                .iter()
                .find(|s| s.is_empty() || s.len() > self.max_len)
            {
                return Err(EmbedError::Tokenizer(format!(
                    "a text of {} tokens: a text has 1 to {} tokens",
                    s.len(),
                    self.max_len
                )));
            }
            let pooled = self
                .encoder
                .pooled(&chosen, Some(&types), self.head.pooled())?;
            for (&i, v) in batch.iter().zip(&pooled) {
                out[i] = self.head.logits(v);
            }
        }
        Ok(out)
    }

    /// The labels of each text, best first, as `choice` keeps them, scored by `function`
    /// (None: the model's).
    pub fn classify(
        &self,
        texts: &[&str],
        choice: LabelChoice,
        function: Option<ScoreFunction>,
        budget: usize,
    ) -> Result<Vec<Vec<LabelScore>>, EmbedError> {
        let seqs = texts
            .iter()
            .map(|t| self.encode(t))
            .collect::<Result<Vec<_>, _>>()?;
        let refs: Vec<&TextIds> = seqs.iter().collect();
        let logits = self.logits(&refs, budget)?;
        let function = function.unwrap_or(self.function);
        Ok(logits
            .iter()
            .map(|l| self.choose(&function.apply(l), choice))
            .collect())
    }

    /// The labels `choice` keeps of one text's scores, best first (ties in label order).
    pub fn choose(&self, scores: &[f32], choice: LabelChoice) -> Vec<LabelScore> {
        let mut order: Vec<usize> = (0..scores.len()).collect();
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        order
            .into_iter()
            .filter(|&i| choice.threshold.is_none_or(|t| scores[i] >= t))
            .take(choice.top_k.unwrap_or(usize::MAX))
            .map(|i| LabelScore {
                label: self.labels[i].clone(),
                score: scores[i],
            })
            .collect()
    }
}

/// The longest sequence a task model reads, as transformers' pipelines truncate: the
/// tokenizer's `model_max_length`, capped at the model's positions.
pub(crate) fn task_max_len(
    files: &ModelFiles,
    max_position_embeddings: Option<usize>,
    positions: usize,
) -> Result<usize, EmbedError> {
    let positions = positions.min(max_position_embeddings.unwrap_or(usize::MAX));
    let len = tokenizer_max_length(&files.dir)
        .unwrap_or(positions)
        .min(positions);
    if len < 3 {
        return Err(EmbedError::Unsupported(format!(
            "model `{}`: a maximum length of {len} tokens leaves no room for a text",
            files.name
        )));
    }
    Ok(len)
}

/// The model's tokenizer for single texts: no padding, truncation at `max_len` tokens with
/// `stride` tokens shared by consecutive windows (the overflowing ones).
pub(crate) fn task_tokenizer(
    files: &ModelFiles,
    max_len: usize,
    stride: usize,
) -> Result<Tokenizer, EmbedError> {
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
        stride,
        direction: TruncationDirection::Right,
    }))
    .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
    Ok(t)
}
