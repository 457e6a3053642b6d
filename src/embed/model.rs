//! A sentence-embedding model on one device: tokenizer, encoder, pooling, normalisation.

use candle_core::{DType, Device, Tensor, D};
use candle_nn::VarBuilder;

use super::bert::{Bert, BertConfig, SUPPORTED_MODEL_TYPES};
use super::cpu::kernels::{KernelPath, Precision};
use super::cpu::{CpuBert, Rows};
use super::device::DTypeChoice;
use super::files::{DenseActivation, DenseSpec, ModelFiles, Pooling};
use super::profile::Parts;
use super::readback::{self, Launched};
use super::rotary::{Arch, RotaryConfig, RotaryModel, ROTARY_MODEL_TYPES};
use super::tokenizer::TextTokenizer;
use super::EmbedError;

/// The parts of config.json read before choosing an architecture.
#[derive(serde::Deserialize)]
struct ArchProbe {
    model_type: Option<String>,
    #[serde(default)]
    architectures: Vec<String>,
}

/// The encoder: candle ops on any device, or the fused unpadded path on the CPU in f32 (the
/// BERT-like families); the rotary families (ModernBERT, Qwen3, Gemma3) on candle ops.
enum Encoder {
    Candle(Bert),
    Cpu(Box<CpuBert>),
    Rotary(Box<RotaryModel>),
}

pub struct EmbeddingModel {
    pub files: ModelFiles,
    encoder: Encoder,
    /// The encoder's hidden size (what pooling gives).
    hidden: usize,
    pub tokenizer: TextTokenizer,
    pooling: Pooling,
    head: Head,
    model_type: String,
    device: Device,
    dtype: DType,
}

/// What runs after pooling, as sentence-transformers runs it: the Dense layers, then the
/// Matryoshka truncation (`--dimensions`), then normalisation (of the truncated vector, so a
/// normalising model's short vectors are unit vectors again).
struct Head {
    dense: Vec<Dense>,
    truncate: Option<usize>,
    normalize: bool,
}

/// A Dense module on the CPU (pooled vectors are few and small).
struct Dense {
    /// [in, out].
    weight_t: Tensor,
    bias: Option<Tensor>,
    activation: DenseActivation,
}

impl Dense {
    fn load(spec: &DenseSpec) -> Result<Self, EmbedError> {
        let bad = |reason: String| EmbedError::ModelFile {
            path: spec.weights.clone(),
            reason,
        };
        let tensors = candle_core::safetensors::load(&spec.weights, &Device::Cpu)
            .map_err(|e| bad(e.to_string()))?;
        let get = |name: &str, shape: &[usize]| -> Result<Tensor, EmbedError> {
            let t = tensors
                .get(name)
                .ok_or_else(|| bad(format!("has no tensor `{name}`")))?;
            if t.dims() != shape {
                return Err(bad(format!(
                    "`{name}` is {:?}, config.json says {shape:?}",
                    t.dims()
                )));
            }
            Ok(t.to_dtype(DType::F32)?)
        };
        let weight = get("linear.weight", &[spec.out_features, spec.in_features])?;
        let bias = if spec.bias {
            Some(get("linear.bias", &[spec.out_features])?)
        } else {
            None
        };
        Ok(Dense {
            weight_t: weight.t()?.contiguous()?,
            bias,
            activation: spec.activation,
        })
    }

    fn outputs(&self) -> usize {
        self.weight_t.dims()[1]
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let y = x.matmul(&self.weight_t)?;
        let y = match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        };
        match self.activation {
            DenseActivation::Identity => Ok(y),
            DenseActivation::Tanh => y.tanh(),
            DenseActivation::Relu => y.relu(),
            DenseActivation::Sigmoid => candle_nn::ops::sigmoid(&y),
            DenseActivation::Gelu => y.gelu_erf(),
        }
    }
}

impl Head {
    fn load(files: &ModelFiles) -> Result<Self, EmbedError> {
        Ok(Head {
            dense: files
                .dense
                .iter()
                .map(Dense::load)
                .collect::<Result<_, _>>()?,
            truncate: None,
            normalize: files.normalize,
        })
    }

    /// The dimension before truncation, from pooled vectors of `hidden`.
    fn full_dimension(&self, hidden: usize) -> usize {
        self.dense.last().map_or(hidden, Dense::outputs)
    }

    fn apply(&self, pooled: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut rows = pooled;
        if !self.dense.is_empty() && !rows.is_empty() {
            let (n, d) = (rows.len(), rows[0].len());
            let mut x = Tensor::from_vec(rows.concat(), (n, d), &Device::Cpu)?;
            for layer in &self.dense {
                x = layer.forward(&x)?;
            }
            rows = x.to_vec2::<f32>()?;
        }
        for v in &mut rows {
            self.cut(v, self.truncate);
        }
        Ok(rows)
    }

    /// The truncation and normalisation of one vector.
    fn cut(&self, v: &mut Vec<f32>, truncate: Option<usize>) {
        if let Some(t) = truncate {
            v.truncate(t);
        }
        if self.normalize {
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
            v.iter_mut().for_each(|x| *x /= norm);
        }
    }
}

/// config.json's bytes and its model type, which must be one the candle encoders run.
fn read_model_type(files: &ModelFiles) -> Result<(Vec<u8>, String), EmbedError> {
    let raw = std::fs::read(&files.config).map_err(|e| EmbedError::ModelFile {
        path: files.config.clone(),
        reason: e.to_string(),
    })?;
    let probe: ArchProbe = serde_json::from_slice(&raw).map_err(|e| EmbedError::ModelFile {
        path: files.config.clone(),
        reason: format!("not the expected JSON: {e}"),
    })?;
    if probe
        .architectures
        .iter()
        .any(|a| a.ends_with("ForSequenceClassification"))
    {
        return Err(EmbedError::Unsupported(format!(
            "model `{}` is a cross-encoder (a reranker: {}), not an embedding model; use it \
             with `ragline search --rerank`, `ragline rerank` or `serve --rerank-model`",
            files.name,
            probe.architectures.join(", ")
        )));
    }
    if files.splade.is_some() {
        return Err(EmbedError::Unsupported(format!(
            "model `{}` is a sparse (SPLADE) model, not a dense embedding model; use it with \
             `ragline embed --sparse` or `serve --sparse-model`",
            files.name
        )));
    }
    let model_type = probe.model_type.unwrap_or_else(|| "(none)".into());
    if !SUPPORTED_MODEL_TYPES.contains(&model_type.as_str())
        && !ROTARY_MODEL_TYPES.contains(&model_type.as_str())
    {
        let mut all: Vec<&str> = SUPPORTED_MODEL_TYPES
            .iter()
            .chain(ROTARY_MODEL_TYPES)
            .copied()
            .collect();
        all.sort_unstable();
        return Err(EmbedError::Unsupported(format!(
            "{}: model_type `{model_type}` is not supported; supported: {}",
            files.config.display(),
            all.join(", ")
        )));
    }
    Ok((raw, model_type))
}

/// The candle encoder of `model_type` (rotary or BERT-like), configured by `raw` (config.json)
/// with the weights in `vb`.
fn load_candle_encoder(
    files: &ModelFiles,
    raw: &[u8],
    model_type: &str,
    vb: VarBuilder,
) -> Result<Encoder, EmbedError> {
    let misfit = |e: candle_core::Error| EmbedError::ModelFile {
        path: files.weights_named.clone(),
        reason: format!("does not fit config.json: {e}"),
    };
    Ok(match Arch::from_model_type(model_type) {
        Some(arch) => {
            let config = RotaryConfig::from_json(raw, arch).map_err(|e| EmbedError::ModelFile {
                path: files.config.clone(),
                reason: e.to_string(),
            })?;
            Encoder::Rotary(Box::new(RotaryModel::load(vb, config).map_err(misfit)?))
        }
        None => {
            let config: BertConfig =
                serde_json::from_slice(raw).map_err(|e| EmbedError::ModelFile {
                    path: files.config.clone(),
                    reason: format!("not a BERT config: {e}"),
                })?;
            Encoder::Candle(Bert::load(vb, &config).map_err(misfit)?)
        }
    })
}

/// The first Dense layer must take the `hidden` values the encoder gives.
fn check_dense_input(files: &ModelFiles, hidden: usize) -> Result<(), EmbedError> {
    if let Some(first) = files.dense.first() {
        if first.in_features != hidden {
            return Err(EmbedError::ModelFile {
                path: first.weights.clone(),
                reason: format!(
                    "the Dense layer takes {} inputs, the model gives {hidden}",
                    first.in_features
                ),
            });
        }
    }
    Ok(())
}

impl EmbeddingModel {
    /// Load the model's weights onto `device` in `dtype` (on the CPU in f32: the fused
    /// encoder on the kernels `kernels.cpu` names, or the best the CPU has).
    pub fn load(files: &ModelFiles, device: &Device, dtype: DType) -> Result<Self, EmbedError> {
        let mut model = Self::load_candle(files, device, dtype)?;
        if let Encoder::Candle(bert) = &model.encoder {
            if bert.device().is_cpu() && bert.dtype() == DType::F32 {
                model.encoder = Encoder::Cpu(Box::new(bert.to_cpu(cpu_path()?, Precision::F32)?));
            }
        }
        Ok(model)
    }

    /// Load the model for a `--dtype` choice: on the CPU, auto and f32 run the fused f32
    /// encoder, bf16 and int8 the fused encoder with bf16 or int8 dense layers (where the CPU
    /// has the instructions for them; a clear error otherwise), f16 the candle encoder; on a
    /// GPU the candle encoder in the dtype (int8 is refused).
    pub fn load_for(
        files: &ModelFiles,
        device: &Device,
        choice: DTypeChoice,
    ) -> Result<Self, EmbedError> {
        let precision = match (device.is_cpu(), choice) {
            (true, DTypeChoice::Auto | DTypeChoice::F32) => Precision::F32,
            (true, DTypeChoice::BF16) => Precision::Bf16,
            (_, DTypeChoice::Int8) if !device.is_cpu() => {
                return Err(EmbedError::Unsupported(
                    "--dtype int8 runs on the CPU only; on a GPU use f16 or bf16".into(),
                ))
            }
            (_, DTypeChoice::Int8) => Precision::Int8,
            _ => return Self::load(files, device, choice.resolve(device)),
        };
        let path = cpu_path()?;
        precision.check(path)?;
        let mut model = Self::load_candle(files, device, DType::F32)?;
        match &model.encoder {
            Encoder::Candle(bert) => {
                model.encoder = Encoder::Cpu(Box::new(bert.to_cpu(path, precision)?));
            }
            Encoder::Rotary(_) if precision != Precision::F32 => {
                return Err(EmbedError::Unsupported(format!(
                    "--dtype {}: model_type `{}` runs in f32 on the CPU (bf16 and int8 are for \
                     the BERT-like families); use --dtype f32",
                    precision.name(),
                    model.model_type
                )))
            }
            _ => {}
        }
        Ok(model)
    }

    /// Load with the candle encoder whatever the device: the path GPUs take, here also on the
    /// CPU (to test it where there is no GPU, and to compare the two encoders).
    pub fn load_candle(
        files: &ModelFiles,
        device: &Device,
        dtype: DType,
    ) -> Result<Self, EmbedError> {
        let (raw, model_type) = read_model_type(files)?;
        // SAFETY: the weights file is memory-mapped read-only; ragline does not modify it
        // while running, and a file truncated under us is the user's to avoid.
        let vb = unsafe { VarBuilder::from_mmaped_safetensors(&files.weights, dtype, device) }
            .map_err(|e| EmbedError::ModelFile {
                path: files.weights_named.clone(),
                reason: e.to_string(),
            })?;
        let encoder = load_candle_encoder(files, &raw, &model_type, vb)?;
        let (max_positions, hidden) = match &encoder {
            Encoder::Candle(b) => (b.max_positions(), b.hidden_size()),
            Encoder::Rotary(r) => (r.max_positions(), r.hidden_size()),
            Encoder::Cpu(_) => unreachable!("loaded as candle first"),
        };
        let max_len = files
            .max_seq_length
            .unwrap_or(max_positions)
            .min(max_positions);
        let tokenizer = TextTokenizer::load(files, max_len)?;
        let head = Head::load(files)?;
        check_dense_input(files, hidden)?;
        Ok(EmbeddingModel {
            files: files.clone(),
            hidden,
            tokenizer,
            pooling: files.pooling,
            head,
            model_type,
            device: device.clone(),
            dtype,
            encoder,
        })
    }

    /// Build from an encoder and tokenizer already in memory (tests).
    pub fn from_parts(
        files: ModelFiles,
        bert: Bert,
        tokenizer: TextTokenizer,
    ) -> Result<Self, EmbedError> {
        Ok(EmbeddingModel {
            pooling: files.pooling,
            head: Head::load(&files)?,
            model_type: format!("{:?}", bert.family()).to_lowercase(),
            device: bert.device().clone(),
            dtype: bert.dtype(),
            hidden: bert.hidden_size(),
            encoder: encoder(bert)?,
            files,
            tokenizer,
        })
    }

    /// The vectors' dimension: the model's, or the `--dimensions` it was cut to.
    pub fn dimension(&self) -> usize {
        self.head
            .truncate
            .unwrap_or_else(|| self.head.full_dimension(self.hidden))
    }

    /// The model's own dimension (before any `--dimensions`).
    pub fn full_dimension(&self) -> usize {
        self.head.full_dimension(self.hidden)
    }

    /// Cut vectors to their first `n` dimensions (Matryoshka models), re-normalised when the
    /// model normalises; `None` keeps them whole. More than the model has is refused.
    pub fn set_dimensions(&mut self, n: Option<usize>) -> Result<(), EmbedError> {
        let full = self.full_dimension();
        match n {
            Some(0) => Err(EmbedError::Unsupported(
                "--dimensions 0: a vector needs at least one dimension".into(),
            )),
            Some(n) if n > full => Err(EmbedError::Unsupported(format!(
                "--dimensions {n} is more than model `{}` has ({full})",
                self.files.name
            ))),
            Some(n) if n == full => {
                self.head.truncate = None;
                Ok(())
            }
            n => {
                self.head.truncate = n;
                Ok(())
            }
        }
    }

    /// Cut a vector this model embedded to its first `n` dimensions, re-normalised when the
    /// model normalises: what `--dimensions n` gives, for one call, without reloading the
    /// model. More than the vector has is refused.
    pub fn shorten(&self, vector: &mut Vec<f32>, n: usize) -> Result<(), EmbedError> {
        let have = self.dimension();
        if n == 0 || n > have {
            return Err(EmbedError::Unsupported(format!(
                "dimensions={n}: model `{}` gives vectors of {have} dimensions; ask for 1 to {have}",
                self.files.name
            )));
        }
        if n < have {
            self.head.cut(vector, Some(n));
        }
        Ok(())
    }

    /// config.json's `model_type`.
    pub fn model_type(&self) -> &str {
        &self.model_type
    }

    /// Whether the encoder computes padding: batches are rectangles (candle) or not (the
    /// fused CPU path, which lays sequences end to end).
    pub fn pads(&self) -> bool {
        !matches!(self.encoder, Encoder::Cpu(_))
    }

    /// Batches for sequences of `lengths` tokens within `budget` tokens computed.
    pub fn plan_batches(&self, lengths: &[usize], budget: usize) -> Vec<Vec<usize>> {
        if self.pads() {
            super::batch::plan(lengths, budget)
        } else {
            super::batch::plan_unpadded(lengths, budget)
        }
    }

    /// Tokens the encoder computes for `batch`, padding included.
    pub fn computed_tokens(&self, lengths: &[usize], batch: &[usize]) -> usize {
        if self.pads() {
            super::batch::padded(lengths, batch)
        } else {
            batch.iter().map(|&i| lengths[i]).sum()
        }
    }

    /// Which encoder runs, in words: "fused CPU encoder, f32 on the avx512 kernels" or
    /// "candle encoder, f16".
    pub fn encoder_kind(&self) -> String {
        match &self.encoder {
            Encoder::Candle(b) => format!("candle encoder, {:?}", b.dtype()).to_lowercase(),
            Encoder::Rotary(r) => r.describe(),
            Encoder::Cpu(c) => c.describe(),
        }
    }

    /// FLOPs of encoding sequences of these lengths (special tokens and prompt included), for
    /// the fused CPU encoder; None for the candle one.
    pub fn cpu_flops(&self, lengths: &[usize]) -> Option<f64> {
        match &self.encoder {
            Encoder::Cpu(c) => Some(c.flops(lengths, self.cpu_rows())),
            Encoder::Candle(_) | Encoder::Rotary(_) => None,
        }
    }

    /// The fused CPU encoder's kernel path and precision, if that is the encoder.
    pub fn cpu_kernels(&self) -> Option<(KernelPath, Precision)> {
        match &self.encoder {
            Encoder::Cpu(c) => Some((c.path(), c.precision())),
            Encoder::Candle(_) | Encoder::Rotary(_) => None,
        }
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The number format the encoder computes in: "f32", "bf16", "int8", "f16".
    pub fn precision_name(&self) -> String {
        match &self.encoder {
            Encoder::Cpu(c) => c.precision().name().to_string(),
            Encoder::Candle(b) => format!("{:?}", b.dtype()).to_lowercase(),
            Encoder::Rotary(r) => format!("{:?}", r.dtype()).to_lowercase(),
        }
    }

    /// A string that changes whenever the vectors would: the bytes of the config, tokenizer
    /// and weights, and the pooling, normalisation, length and prompt settings. The same model
    /// named two ways (a hub id, a folder) has the same fingerprint.
    pub fn fingerprint(&self) -> Result<String, EmbedError> {
        let mut h = blake3::Hasher::new();
        self.files.hash_into(&mut h)?;
        h.update(
            format!(
                "|{:?}|{}|{}|{:?}|{:?}",
                self.pooling,
                self.head.normalize,
                self.tokenizer.max_len(),
                self.tokenizer.passage_prompt_ids(),
                self.tokenizer.query_prompt_ids(),
            )
            .as_bytes(),
        );
        // What the first models had none of is hashed only when present, so their
        // fingerprints (and the indexes that record them) stay as they were.
        for d in &self.files.dense {
            let mut f = std::fs::File::open(&d.weights).map_err(|e| EmbedError::ModelFile {
                path: d.weights.clone(),
                reason: e.to_string(),
            })?;
            h.update(format!("|dense:{:?}", d.activation).as_bytes());
            std::io::copy(&mut f, &mut h).map_err(|e| EmbedError::ModelFile {
                path: d.weights.clone(),
                reason: e.to_string(),
            })?;
        }
        if let Some(t) = self.head.truncate {
            h.update(format!("|dimensions:{t}").as_bytes());
        }
        if !self.files.include_prompt {
            h.update(b"|prompt excluded from pooling");
        }
        Ok(h.finalize().to_hex()[..16].to_string())
    }

    /// A string that changes whenever the tokenizer's output for a chunk would: the bytes of
    /// tokenizer.json, the length limit and the passage prompt. Two models with the same one
    /// make the same token ids (and the same chunks).
    pub fn tokenizer_fingerprint(&self) -> Result<String, EmbedError> {
        let bytes = std::fs::read(&self.files.tokenizer).map_err(|e| EmbedError::ModelFile {
            path: self.files.tokenizer.clone(),
            reason: e.to_string(),
        })?;
        let mut h = blake3::Hasher::new();
        h.update(&bytes);
        h.update(
            format!(
                "|{}|{:?}",
                self.tokenizer.max_len(),
                self.tokenizer.passage_prompt_ids()
            )
            .as_bytes(),
        );
        Ok(h.finalize().to_hex()[..16].to_string())
    }

    /// Embed sequences of content token ids (no special tokens), each preceded by the
    /// `prompt` ids (a query or passage prompt, or nothing). Each sequence plus the prompt
    /// must fit in `tokenizer.max_content_len()`. Returns one vector per sequence.
    pub fn embed_ids(&self, seqs: &[&[u32]], prompt: &[u32]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let launched = self.launch_ids(seqs, prompt, false)?;
        self.finish(launched)
    }

    /// Embed `batches` (as [`EmbeddingModel::embed_ids`] each), handing each batch's result to
    /// `each` in order (false from it: stop). On a GPU with `RAGLINE_PIPELINE=1`, the next
    /// batch's work is enqueued before the last one's vectors are waited for, so the device
    /// never idles while the host copies results back and prepares the next batch.
    pub fn embed_batches(
        &self,
        batches: &[Vec<&[u32]>],
        prompt: &[u32],
        mut each: impl FnMut(usize, Result<Vec<Vec<f32>>, EmbedError>) -> bool,
    ) {
        let ahead = usize::from(!self.device.is_cpu() && readback::pipeline_enabled());
        let mut pending = std::collections::VecDeque::new();
        for i in 0..batches.len() + ahead {
            if let Some(seqs) = batches.get(i) {
                pending.push_back(self.launch_ids(seqs, prompt, ahead > 0));
            }
            if i >= ahead {
                let launched = pending.pop_front().expect("batch i - ahead is pending");
                if !each(i - ahead, launched.and_then(|l| self.finish(l))) {
                    return;
                }
            }
        }
    }

    /// Wait for a launched batch's pooled vectors and run the head over them.
    fn finish(&self, launched: Launched) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.head.apply(launched.wait()?)
    }

    /// Enqueue one batch's work; with `early_copy`, its pooled vectors' copy back too (on a
    /// GPU: into page-locked memory, without waiting).
    fn launch_ids(
        &self,
        seqs: &[&[u32]],
        prompt: &[u32],
        early_copy: bool,
    ) -> Result<Launched, EmbedError> {
        if seqs.is_empty() {
            return Ok(Launched::Ready(Vec::new()));
        }
        let (specials_before, suffix) = self.tokenizer.specials();
        let prefix: Vec<u32> = specials_before.iter().chain(prompt).copied().collect();
        let prefix = prefix.as_slice();
        let longest = seqs.iter().map(|s| s.len()).max().unwrap_or(0);
        if longest + prompt.len() > self.tokenizer.max_content_len() {
            return Err(EmbedError::Tokenizer(format!(
                "a sequence of {longest} tokens (plus a {}-token prompt) exceeds the model's \
                 limit of {} content tokens",
                prompt.len(),
                self.tokenizer.max_content_len()
            )));
        }
        let bert = match &self.encoder {
            Encoder::Cpu(cpu) => {
                return Ok(Launched::Ready(self.embed_cpu(cpu, seqs, prefix, suffix)?))
            }
            Encoder::Candle(bert) => Some(bert),
            Encoder::Rotary(_) => None,
        };
        let len = longest + prefix.len() + suffix.len();
        let b = seqs.len();
        let mut ids = vec![self.tokenizer.pad_id(); b * len];
        let mut mask = vec![0f32; b * len];
        let mut lengths = Vec::with_capacity(b);
        for (row, seq) in seqs.iter().enumerate() {
            let out = &mut ids[row * len..(row + 1) * len];
            let n = prefix.len() + seq.len() + suffix.len();
            out[..prefix.len()].copy_from_slice(prefix);
            out[prefix.len()..prefix.len() + seq.len()].copy_from_slice(seq);
            out[prefix.len() + seq.len()..n].copy_from_slice(suffix);
            mask[row * len..row * len + n].fill(1.0);
            lengths.push(n);
        }
        let mut parts = Parts::start(&self.device)?;
        let (hidden, mask) = match (bert, &self.encoder) {
            (Some(bert), _) => {
                let ids = Tensor::from_vec(ids, (b, len), &self.device)?;
                let mask = Tensor::from_vec(mask, (b, len), &self.device)?
                    .to_dtype(bert.activation_dtype())?;
                parts.mark("embeddings")?;
                (bert.forward_timed(&ids, &mask, &mut parts)?, mask)
            }
            (None, Encoder::Rotary(r)) => {
                let hidden = r.forward(ids, &lengths)?;
                parts.mark("encoder")?;
                (hidden, Tensor::from_vec(mask, (b, len), &self.device)?)
            }
            (None, _) => unreachable!("the CPU encoder returned above"),
        };
        // Pooling leaves out the prompt where the model says so (sentence-transformers'
        // include_prompt = false): its tokens are masked for mean and max.
        let skip = self.pool_skip(prefix.len());
        let pool_mask = if skip > 0 {
            let mut m = vec![0f32; b * len];
            for (row, &n) in lengths.iter().enumerate() {
                m[row * len + skip.min(n)..row * len + n].fill(1.0);
            }
            Tensor::from_vec(m, (b, len), &self.device)?
        } else {
            mask
        };
        let pooled = pool(&hidden, &pool_mask, &lengths, self.pooling)?.to_dtype(DType::F32)?;
        if early_copy {
            #[cfg(feature = "cuda")]
            if let Some(copy) = readback::start_copy(&pooled)? {
                return Ok(Launched::Copying(copy));
            }
        }
        parts.enqueued();
        let pooled = pooled.to_vec2::<f32>()?;
        parts.mark("pooling")?;
        parts.finish(b, len, lengths.iter().sum());
        Ok(Launched::Ready(pooled))
    }

    /// Leading tokens that pooling leaves out: the specials and the prompt, when the model's
    /// pooling excludes the prompt (for mean and max; CLS and last-token pick one token).
    fn pool_skip(&self, prefix: usize) -> usize {
        let masked = matches!(
            self.pooling,
            Pooling::Mean | Pooling::Max | Pooling::MeanSqrtLen
        );
        if self.files.include_prompt || !masked {
            0
        } else {
            prefix
        }
    }
}

impl EmbeddingModel {
    /// The hidden states pooling reads from the fused CPU encoder: CLS pooling reads each
    /// sequence's first token alone, so the last layer computes only that row.
    fn cpu_rows(&self) -> Rows {
        match self.pooling {
            Pooling::Cls => Rows::First,
            _ => Rows::All,
        }
    }

    fn embed_cpu(
        &self,
        cpu: &CpuBert,
        seqs: &[&[u32]],
        prefix: &[u32],
        suffix: &[u32],
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        let full: Vec<Vec<u32>> = seqs.iter().map(|s| [prefix, s, suffix].concat()).collect();
        let refs: Vec<&[u32]> = full.iter().map(Vec::as_slice).collect();
        let h = self.hidden;
        if self.cpu_rows() == Rows::First {
            let first = cpu.forward_rows(&refs, None, Rows::First)?;
            return Ok(first.chunks_exact(h).map(<[f32]>::to_vec).collect());
        }
        let hidden = cpu.forward(&refs)?;
        let skip = self.pool_skip(prefix.len());
        let mut row = 0;
        let mut pooled = Vec::with_capacity(seqs.len());
        for s in &full {
            let rows = &hidden[row * h..(row + s.len()) * h];
            row += s.len();
            let rows = if skip > 0 && skip < s.len() {
                &rows[skip * h..]
            } else {
                rows
            };
            pooled.push(pool_rows(rows, h, self.pooling));
        }
        Ok(pooled)
    }
}

/// The CPU kernel path the process's kernels name, or the best this CPU has.
fn cpu_path() -> Result<KernelPath, EmbedError> {
    Ok(KernelPath::chosen()?)
}

fn encoder(bert: Bert) -> Result<Encoder, EmbedError> {
    // (The rotary families load through `load_candle`; this is for BERT-like parts.)
    if bert.device().is_cpu() && bert.dtype() == DType::F32 {
        Ok(Encoder::Cpu(Box::new(
            bert.to_cpu(cpu_path()?, Precision::F32)?,
        )))
    } else {
        Ok(Encoder::Candle(bert))
    }
}

/// Pool the hidden rows [len, h] of one sequence.
fn pool_rows(rows: &[f32], h: usize, pooling: Pooling) -> Vec<f32> {
    let n = rows.len() / h;
    match pooling {
        Pooling::Cls => rows[..h].to_vec(),
        Pooling::LastToken => rows[(n - 1) * h..].to_vec(),
        Pooling::Max => {
            let mut v = vec![f32::NEG_INFINITY; h];
            for r in rows.chunks_exact(h) {
                v.iter_mut().zip(r).for_each(|(a, b)| *a = a.max(*b));
            }
            v
        }
        Pooling::Mean | Pooling::MeanSqrtLen => {
            let mut v = vec![0f32; h];
            for r in rows.chunks_exact(h) {
                v.iter_mut().zip(r).for_each(|(a, b)| *a += b);
            }
            let d = if pooling == Pooling::Mean {
                n as f32
            } else {
                (n as f32).sqrt()
            };
            v.iter_mut().for_each(|a| *a /= d);
            v
        }
    }
}

/// Pool hidden states [b, len, h] into [b, h] (in f32 for the sums).
fn pool(
    hidden: &Tensor,
    mask: &Tensor,
    lengths: &[usize],
    pooling: Pooling,
) -> candle_core::Result<Tensor> {
    let hidden = hidden.to_dtype(DType::F32)?;
    let mask = mask.to_dtype(DType::F32)?;
    match pooling {
        Pooling::Cls => hidden.narrow(1, 0, 1)?.squeeze(1),
        Pooling::LastToken => {
            let rows = lengths
                .iter()
                .enumerate()
                .map(|(i, &n)| hidden.get(i)?.get(n - 1))
                .collect::<candle_core::Result<Vec<_>>>()?;
            Tensor::stack(&rows, 0)
        }
        Pooling::Mean | Pooling::MeanSqrtLen => {
            let m = mask.unsqueeze(2)?;
            let sum = hidden.broadcast_mul(&m)?.sum(1)?;
            let count = mask.sum_keepdim(1)?.clamp(1e-9, f64::MAX)?;
            let count = if pooling == Pooling::MeanSqrtLen {
                count.sqrt()?
            } else {
                count
            };
            sum.broadcast_div(&count)
        }
        Pooling::Max => {
            // Padding must never win: push it far down before the max.
            let m = mask.unsqueeze(2)?;
            let penalty = ((m.ones_like()? - &m)? * -1e9)?;
            hidden.broadcast_add(&penalty)?.max(D::Minus2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unsupported_architecture_names_the_model_type_and_what_is_supported() {
        let dir = tempfile::tempdir().unwrap();
        for (name, body) in [
            ("config.json", r#"{"model_type": "gpt2"}"#),
            ("tokenizer.json", "{}"),
            ("model.safetensors", ""),
        ] {
            std::fs::write(dir.path().join(name), body).unwrap();
        }
        let files = ModelFiles::from_dir("m", dir.path()).unwrap();
        let err = EmbeddingModel::load(&files, &Device::Cpu, DType::F32)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("model_type `gpt2` is not supported")
                && err.contains("supported: bert")
                && err.contains("xlm-roberta"),
            "{err}"
        );
    }
}
