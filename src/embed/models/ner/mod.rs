//! Token classification (named entities): `*ForTokenClassification` of BERT, XLM-RoBERTa,
//! RoBERTa, DistilBERT, MPNet and ModernBERT, labels from config.json's `id2label` (BIO/IOB2
//! tags), entities as transformers' `token-classification` pipeline makes them
//! ([`aggregate`]).
//!
//! A text longer than the model reads is read in windows of the model's length that share
//! `stride` tokens (the tokenizer's overflowing windows, as the pipeline's `stride` makes
//! them); every window's entities are kept, and where two windows' entities overlap the
//! longer stays. The pipeline refuses a stride with `aggregation_strategy="none"` and
//! truncates instead; ragline reads the whole text in every strategy (its windows' tokens
//! then overlap as the grouped entities do, and the same rule keeps one).
//!
//! Offsets are characters (Unicode scalar values) into the text, as Python counts them.

pub mod aggregate;

use candle_core::{DType, Device};
use tokenizers::{Encoding, ModelWrapper, Tokenizer};

use self::aggregate::{merge_windows, window_entities, Aggregation, Entity, Token};
use crate::embed::classify::{softmax, task_max_len, task_tokenizer};
use crate::embed::device::DTypeChoice;
use crate::embed::files::ModelFiles;
use crate::embed::head::{pad_id, Encoder, OpenAs, Opened, TokenHead, TOKEN_ARCHITECTURES};
use crate::embed::EmbedError;

/// Tokens a batch of windows may hold (padding included where the encoder pads).
pub const DEFAULT_BATCH_TOKENS: usize = 16_384;

/// The tokens consecutive windows share unless told: 64, or a quarter of a window where
/// that is less.
pub const DEFAULT_STRIDE: usize = 64;

/// What `entities` makes of the token scores.
#[derive(Clone, Debug)]
pub struct NerOptions {
    pub aggregation: Aggregation,
    /// Labels left out (the pipeline's `ignore_labels`; default `O`).
    pub ignore: Vec<String>,
}

impl Default for NerOptions {
    fn default() -> Self {
        NerOptions {
            aggregation: Aggregation::Simple,
            ignore: vec!["O".into()],
        }
    }
}

pub struct TokenClassifier {
    pub files: ModelFiles,
    tokenizer: Tokenizer,
    encoder: Encoder,
    head: TokenHead,
    labels: Vec<String>,
    max_len: usize,
    /// Tokens of text a window holds (its special tokens left out).
    window: usize,
    stride: usize,
    architecture: String,
    /// The tokenizer marks a word's continuation (`##`): subwords are known, not guessed.
    word_aware: bool,
    unk_id: Option<u32>,
}

impl TokenClassifier {
    /// Load a token classifier named as `--model` names embedding models, reading long texts
    /// in windows that share `stride` tokens (None: [`DEFAULT_STRIDE`]).
    pub fn load(
        spec: &str,
        device: &Device,
        choice: DTypeChoice,
        stride: Option<usize>,
    ) -> Result<Self, EmbedError> {
        Self::load_with(ModelFiles::resolve(spec)?, device, choice, stride, true)
    }

    pub fn load_files(
        files: ModelFiles,
        device: &Device,
        choice: DTypeChoice,
        stride: Option<usize>,
    ) -> Result<Self, EmbedError> {
        Self::load_with(files, device, choice, stride, true)
    }

    /// Load with the candle encoder whatever the device (the path GPUs take; on the CPU to
    /// test it where there is no GPU).
    pub fn load_candle(
        files: ModelFiles,
        device: &Device,
        dtype: DType,
        stride: Option<usize>,
    ) -> Result<Self, EmbedError> {
        Self::load_with(files, device, DTypeChoice::of(dtype), stride, false)
    }

    fn load_with(
        files: ModelFiles,
        device: &Device,
        choice: DTypeChoice,
        stride: Option<usize>,
        fused: bool,
    ) -> Result<Self, EmbedError> {
        let opened = Opened::open(
            &files,
            device,
            choice,
            fused,
            OpenAs {
                known: TOKEN_ARCHITECTURES,
                what: "a token classifier",
                low_precision: true,
            },
        )?;
        let head = TokenHead::load(
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
        let max_len = task_max_len(&files, config.max_position_embeddings, encoder.positions)?;
        let plain = task_tokenizer(&files, max_len, 0)?;
        let added = plain
            .get_post_processor()
            .map_or(0, |p| tokenizers::PostProcessor::added_tokens(p, false));
        let window = max_len.saturating_sub(added);
        let stride = stride.unwrap_or(DEFAULT_STRIDE.min(window / 4));
        if stride >= window {
            return Err(EmbedError::Unsupported(format!(
                "a stride of {stride} tokens: windows of model `{}` hold {window} tokens of \
                 text, and consecutive windows must share fewer; lower --stride",
                files.name
            )));
        }
        let mut tokenizer = plain;
        tokenizer
            .with_truncation(None)
            .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
        encoder.pad_id = pad_id(&tokenizer);
        let word_aware = match tokenizer.get_model() {
            ModelWrapper::WordPiece(w) => !w.continuing_subword_prefix.is_empty(),
            ModelWrapper::BPE(b) => b
                .continuing_subword_prefix
                .as_ref()
                .is_some_and(|p| !p.is_empty()),
            _ => false,
        };
        let unk_id = ["[UNK]", "<unk>"]
            .iter()
            .find_map(|t| tokenizer.token_to_id(t));
        Ok(TokenClassifier {
            files,
            tokenizer,
            encoder,
            head,
            labels,
            max_len,
            window,
            stride,
            architecture,
            word_aware,
            unk_id,
        })
    }

    /// A string that changes whenever the results would: the bytes of the config, tokenizer
    /// and weights, and how texts are read.
    pub fn fingerprint(&self) -> Result<String, EmbedError> {
        self.files
            .fingerprint(&format!("|ner|{}|{}", self.max_len, self.stride))
    }

    pub fn architecture(&self) -> &str {
        &self.architecture
    }

    pub fn name(&self) -> &str {
        &self.files.name
    }

    /// The labels (tags), in the order of the head's outputs.
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// Tokens of a window, special tokens included.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Tokens consecutive windows share.
    pub fn stride(&self) -> usize {
        self.stride
    }

    pub fn encoder_kind(&self) -> String {
        self.encoder.describe()
    }

    pub fn device(&self) -> &Device {
        &self.encoder.device
    }

    /// A text's windows, with character offsets: the whole text tokenized, cut in windows of
    /// the model's length less its special tokens that share `stride` tokens (the tokenizer's
    /// own cut), each window then given its special tokens. (The tokenizer's truncation is not
    /// used: tokenizers 0.23.2 stops tokenizing near the first window's end when it
    /// truncates, so the overflowing windows are lost.)
    pub fn windows(&self, text: &str) -> Result<Vec<Encoding>, EmbedError> {
        let bad = |e: tokenizers::Error| EmbedError::Tokenizer(e.to_string());
        let mut whole = self
            .tokenizer
            .encode_char_offsets(text, false)
            .map_err(bad)?;
        whole.truncate(
            self.window,
            self.stride,
            tokenizers::TruncationDirection::Right,
        );
        let rest = whole.take_overflowing();
        std::iter::once(whole)
            .chain(rest)
            .map(|part| self.tokenizer.post_process(part, None, true).map_err(bad))
            .collect()
    }

    /// Each window's per-token label scores (softmax of the logits), [tokens][labels].
    pub fn token_scores(
        &self,
        windows: &[&Encoding],
        budget: usize,
    ) -> Result<Vec<Vec<Vec<f32>>>, EmbedError> {
        let lengths: Vec<usize> = windows.iter().map(|w| w.len()).collect();
        let batches = if self.encoder.pads() {
            crate::embed::batch::plan(&lengths, budget)
        } else {
            crate::embed::batch::plan_unpadded(&lengths, budget)
        };
        let mut out = vec![Vec::new(); windows.len()];
        let h = self.encoder.hidden;
        for batch in batches {
            let seqs: Vec<&[u32]> = batch.iter().map(|&i| windows[i].get_ids()).collect();
            if let Some(s) = seqs.iter().find(|s| s.is_empty() || s.len() > self.max_len) {
                return Err(EmbedError::Tokenizer(format!(
                    "a window of {} tokens: a window has 1 to {} tokens",
                    s.len(),
                    self.max_len
                )));
            }
            let states = self.encoder.states(&seqs, None)?;
            for (&i, s) in batch.iter().zip(&states) {
                out[i] = s
                    .chunks_exact(h)
                    .map(|row| softmax(&self.head.logits(row)))
                    .collect();
            }
        }
        Ok(out)
    }

    /// The entities of each text, in order (tokens batched by length within `budget`).
    pub fn entities(
        &self,
        texts: &[&str],
        options: &NerOptions,
        budget: usize,
    ) -> Result<Vec<Vec<Entity>>, EmbedError> {
        let windows = texts
            .iter()
            .map(|t| self.windows(t))
            .collect::<Result<Vec<_>, _>>()?;
        let items: Vec<(&str, &[Encoding], &NerOptions)> = texts
            .iter()
            .zip(&windows)
            .map(|(t, w)| (*t, w.as_slice(), options))
            .collect();
        self.entities_of(&items, budget)
    }

    /// The entities of texts already cut in windows ([`TokenClassifier::windows`]), each with
    /// its own options: the windows of all of them are batched together.
    pub fn entities_of(
        &self,
        items: &[(&str, &[Encoding], &NerOptions)],
        budget: usize,
    ) -> Result<Vec<Vec<Entity>>, EmbedError> {
        let flat: Vec<&Encoding> = items.iter().flat_map(|(_, w, _)| w.iter()).collect();
        let mut scores = self.token_scores(&flat, budget)?.into_iter();
        let mut out = Vec::with_capacity(items.len());
        for (text, ws, options) in items {
            let chars: Vec<char> = text.chars().collect();
            let mut found = Vec::new();
            for w in ws.iter() {
                let s = scores.next().expect("a score for every window");
                let tokens = self.tokens(&chars, w, s);
                found.extend(window_entities(
                    &tokens,
                    &self.labels,
                    options.aggregation,
                    &options.ignore,
                    &|pieces| self.decode(pieces),
                ));
            }
            out.push(if ws.len() > 1 {
                merge_windows(found)
            } else {
                found
            });
        }
        Ok(out)
    }

    /// A window's tokens (special tokens left out), as the pipeline gathers them.
    fn tokens(&self, chars: &[char], w: &Encoding, scores: Vec<Vec<f32>>) -> Vec<Token> {
        let special = w.get_special_tokens_mask();
        let mut out = Vec::with_capacity(w.len());
        for (idx, ((&id, &(start, end)), scores)) in w
            .get_ids()
            .iter()
            .zip(w.get_offsets())
            .zip(scores)
            .enumerate()
        {
            if special.get(idx).copied().unwrap_or(0) != 0 {
                continue;
            }
            let (start, end) = (start.min(chars.len()), end.min(chars.len()));
            let text_of = || chars[start..end.max(start)].iter().collect::<String>();
            let mut word = self.tokenizer.id_to_token(id).unwrap_or_default();
            let mut is_subword = if self.word_aware {
                word.chars().count() != end.saturating_sub(start)
            } else {
                start > 0 && chars[start - 1] != ' ' && chars.get(start) != Some(&' ')
            };
            if Some(id) == self.unk_id {
                word = text_of();
                is_subword = false;
            }
            out.push(Token {
                word,
                scores,
                start,
                end,
                index: idx,
                is_subword,
            });
        }
        out
    }

    /// Tokens as text, as the tokenizer's decoder writes them (`convert_tokens_to_string`).
    pub fn decode(&self, pieces: &[&str]) -> String {
        let owned: Vec<String> = pieces.iter().map(|s| s.to_string()).collect();
        match self.tokenizer.get_decoder() {
            Some(d) => tokenizers::Decoder::decode(d, owned.clone()).unwrap_or(owned.join(" ")),
            None => owned.join(" "),
        }
    }
}
