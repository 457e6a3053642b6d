//! Finding a model's files (a local folder in the Hugging Face layout, or a hub id through the
//! hf-hub cache) and reading its sentence-transformers configuration.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::embed::EmbedError;

/// The model used when none is named.
pub const DEFAULT_MODEL: &str = "sentence-transformers/all-MiniLM-L6-v2";

/// How token embeddings become one vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    Mean,
    Cls,
    LastToken,
    Max,
    MeanSqrtLen,
}

/// Everything needed to run a model, resolved to local paths.
#[derive(Clone, Debug)]
pub struct ModelFiles {
    /// The name the user gave (a hub id or a folder), recorded in the index.
    pub name: String,
    pub dir: PathBuf,
    pub config: PathBuf,
    pub tokenizer: PathBuf,
    /// The safetensors files holding the weights, in order: `model.safetensors`, or the
    /// shards `model.safetensors.index.json` names (as transformers' `save_pretrained` splits
    /// a large model).
    pub weights: Vec<PathBuf>,
    /// The file to name when the weights are wrong: `model.safetensors` or the shard index.
    pub weights_named: PathBuf,
    pub pooling: Pooling,
    pub normalize: bool,
    /// Longest input in tokens, special tokens included (sentence_bert_config.json, else the
    /// model's position embeddings).
    pub max_seq_length: Option<usize>,
    /// Text prepended to queries and to passages (config_sentence_transformers.json prompts:
    /// `query`; `document`, else `passage`, else `corpus`, as sentence-transformers'
    /// `encode_query` and `encode_document` pick them).
    pub query_prompt: Option<String>,
    pub passage_prompt: Option<String>,
    /// Every prompt the model names, and the one `encode` uses when none is asked for.
    pub prompts: std::collections::BTreeMap<String, String>,
    pub default_prompt_name: Option<String>,
    /// Whether pooling counts the prompt's tokens (sentence-transformers' `include_prompt`).
    pub include_prompt: bool,
    /// The Dense layers after pooling, in order (`2_Dense`, `3_Dense`...).
    pub dense: Vec<DenseSpec>,
    /// The folder of its `SpladePooling` module: a sparse model, not a dense embedder.
    pub splade: Option<PathBuf>,
}

/// A sentence-transformers `Dense` module: `activation(x W^T + b)`.
#[derive(Clone, Debug)]
pub struct DenseSpec {
    /// Its safetensors file (`linear.weight`, `linear.bias`).
    pub weights: PathBuf,
    pub in_features: usize,
    pub out_features: usize,
    pub bias: bool,
    pub activation: DenseActivation,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenseActivation {
    Identity,
    Tanh,
    Relu,
    Sigmoid,
    Gelu,
}

#[derive(Deserialize)]
struct DenseConfig {
    in_features: usize,
    out_features: usize,
    #[serde(default = "yes")]
    bias: bool,
    #[serde(default)]
    activation_function: Option<String>,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
struct ModuleEntry {
    #[serde(default)]
    path: String,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct PoolingConfig {
    /// The layout sentence-transformers 5-6 writes: one mode by name.
    #[serde(default)]
    pooling_mode: Option<String>,
    #[serde(default = "yes")]
    include_prompt: bool,
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
    #[serde(default)]
    pooling_mode_lasttoken: bool,
}

#[derive(Deserialize)]
struct SentenceBertConfig {
    max_seq_length: Option<usize>,
}

#[derive(Deserialize)]
struct StConfig {
    #[serde(default)]
    prompts: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    default_prompt_name: Option<String>,
}

impl ModelFiles {
    /// Resolve `spec`: an existing folder; else `models/<name>` beside the working directory
    /// (where scripts/fetch-model.sh puts it); else a hub id, from the hf-hub cache or the hub.
    pub fn resolve(spec: &str) -> Result<Self, EmbedError> {
        let as_path = Path::new(spec);
        if as_path.is_dir() {
            return Self::from_dir(spec, as_path);
        }
        if let Some(last) = spec.rsplit('/').next() {
            for base in models_dirs() {
                let candidate = base.join(last);
                if candidate.join("config.json").is_file() {
                    return Self::from_dir(spec, &candidate);
                }
            }
        }
        if as_path.is_absolute() || spec.starts_with('.') || spec.split('/').count() > 2 {
            return Err(EmbedError::NotFound(format!(
                "model folder `{spec}` does not exist; run scripts/fetch-model.sh or give \
                 --model a folder in the Hugging Face layout or a hub id"
            )));
        }
        let dir = hub_snapshot(spec)?;
        Self::from_dir(spec, &dir)
    }

    /// Read a local folder in the Hugging Face / sentence-transformers layout.
    pub fn from_dir(name: &str, dir: &Path) -> Result<Self, EmbedError> {
        let config = required_file(dir, "config.json")?;
        let tokenizer = required_file(dir, "tokenizer.json")?;
        let (weights, weights_named) = find_weights(dir)?;
        let Modules {
            pooling,
            include_prompt,
            normalize,
            dense,
            splade,
        } = read_modules(dir)?;
        let max_seq_length = match dir.join("sentence_bert_config.json") {
            p if p.is_file() => read_json::<SentenceBertConfig>(&p)?.max_seq_length,
            _ => None,
        };
        let Prompts {
            query_prompt,
            passage_prompt,
            prompts,
            default_prompt_name,
        } = read_prompts(dir)?;
        Ok(ModelFiles {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            config,
            tokenizer,
            weights,
            weights_named,
            pooling,
            normalize,
            max_seq_length,
            query_prompt,
            passage_prompt,
            prompts,
            default_prompt_name,
            include_prompt,
            dense,
            splade,
        })
    }

    /// A fingerprint of the model's files and `how` (what else changes its outputs: pooling,
    /// length limits): 16 hex digits of their hash.
    pub fn fingerprint(&self, how: &str) -> Result<String, EmbedError> {
        let mut h = blake3::Hasher::new();
        self.hash_into(&mut h)?;
        h.update(how.as_bytes());
        Ok(h.finalize().to_hex()[..16].to_string())
    }

    /// Hash the bytes of config.json, tokenizer.json and the weights (a single weights file
    /// as the first models did; shards in their order): what a model's fingerprint starts
    /// with.
    pub fn hash_into(&self, h: &mut blake3::Hasher) -> Result<(), EmbedError> {
        let files = [&self.config, &self.tokenizer];
        for path in files.into_iter().chain(&self.weights) {
            let mut f = std::fs::File::open(path).map_err(|e| EmbedError::ModelFile {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            std::io::copy(&mut f, h).map_err(|e| EmbedError::ModelFile {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        }
        Ok(())
    }

    /// The longest input, as sentence-transformers sets it: sentence_bert_config.json's
    /// max_seq_length, else tokenizer_config.json's model_max_length, capped at the model's
    /// `positions`.
    pub fn sequence_limit(&self, positions: usize) -> usize {
        self.max_seq_length
            .or_else(|| tokenizer_max_length(&self.dir))
            .unwrap_or(positions)
            .min(positions)
    }

    /// config.json's bytes.
    pub fn read_config(&self) -> Result<Vec<u8>, EmbedError> {
        std::fs::read(&self.config).map_err(|e| self.bad_config(e.to_string()))
    }

    /// An error about config.json.
    pub fn bad_config(&self, reason: String) -> EmbedError {
        EmbedError::ModelFile {
            path: self.config.clone(),
            reason,
        }
    }

    /// The weights, memory-mapped, read as `dtype` onto `device`.
    pub fn var_builder(
        &self,
        dtype: candle_core::DType,
        device: &candle_core::Device,
    ) -> Result<candle_nn::VarBuilder<'static>, EmbedError> {
        // SAFETY: the weights file is memory-mapped read-only; ragline does not modify it
        // while running, and a file truncated under us is the user's to avoid.
        unsafe { candle_nn::VarBuilder::from_mmaped_safetensors(&self.weights, dtype, device) }
            .map_err(|e| EmbedError::ModelFile {
                path: self.weights_named.clone(),
                reason: e.to_string(),
            })
    }

    /// An error for weights that do not fit config.json.
    pub fn misfit(&self, e: candle_core::Error) -> EmbedError {
        EmbedError::ModelFile {
            path: self.weights_named.clone(),
            reason: format!("does not fit config.json: {e}"),
        }
    }

    /// The text of the prompt called `name`, or an error naming the model's prompts.
    pub fn prompt(&self, name: &str) -> Result<&str, EmbedError> {
        self.prompts.get(name).map(String::as_str).ok_or_else(|| {
            EmbedError::Unsupported(format!(
                "model `{}` has no prompt called `{name}`; its prompts: {}",
                self.name,
                if self.prompts.is_empty() {
                    "none".to_string()
                } else {
                    self.prompts.keys().cloned().collect::<Vec<_>>().join(", ")
                }
            ))
        })
    }
}

/// tokenizer_config.json's `model_max_length` in `dir`, when it names a real one (the
/// transformers default for "none" is a huge number).
pub fn tokenizer_max_length(dir: &Path) -> Option<usize> {
    #[derive(Deserialize)]
    struct TokenizerConfig {
        #[serde(default)]
        model_max_length: Option<f64>,
    }
    std::fs::read(dir.join("tokenizer_config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<TokenizerConfig>(&b).ok())
        .and_then(|c| c.model_max_length)
        .filter(|n| (1.0..1e9).contains(n))
        .map(|n| n as usize)
}

/// Folders searched for `models/<name>`: $RAGLINE_MODELS, then ./models.
fn models_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("RAGLINE_MODELS") {
        dirs.push(PathBuf::from(d));
    }
    dirs.push(PathBuf::from("models"));
    dirs
}

/// `dir/file`, which must exist.
fn required_file(dir: &Path, file: &str) -> Result<PathBuf, EmbedError> {
    let path = dir.join(file);
    if path.is_file() {
        Ok(path)
    } else {
        Err(EmbedError::ModelFile {
            path,
            reason: "missing; the model folder must be in the Hugging Face layout \
                     (run scripts/fetch-model.sh for the default model)"
                .into(),
        })
    }
}

/// The sentence-transformers pipeline after the transformer, from modules.json.
struct Modules {
    pooling: Pooling,
    include_prompt: bool,
    normalize: bool,
    dense: Vec<DenseSpec>,
    splade: Option<PathBuf>,
}

/// Read modules.json in `dir`: pooling, Dense layers and Normalize, in that order.
fn read_modules(dir: &Path) -> Result<Modules, EmbedError> {
    // modules.json lists the sentence-transformers pipeline; without it, a plain
    // transformers model gets mean pooling, as sentence-transformers itself does.
    let mut pooling = Pooling::Mean;
    let mut include_prompt = true;
    let mut normalize = false;
    let mut dense = Vec::new();
    let mut splade = None;
    let modules_path = dir.join("modules.json");
    if modules_path.is_file() {
        let modules: Vec<ModuleEntry> = read_json(&modules_path)?;
        for module in &modules {
            let kind = module.kind.rsplit('.').next().unwrap_or("");
            if normalize && kind != "Normalize" {
                return Err(EmbedError::Unsupported(format!(
                    "{}: module `{kind}` after Normalize is not supported; Normalize must \
                     come last",
                    modules_path.display()
                )));
            }
            let folder = dir.join(&module.path);
            match kind {
                "Transformer" => {}
                "Pooling" => (pooling, include_prompt) = read_pooling(&folder.join("config.json"))?,
                "Dense" => dense.push(read_dense(&folder)?),
                "Normalize" => normalize = true,
                // A SPLADE model's (read by `splade::SparseModel`; an embedding model
                // refuses a folder that has one).
                "SpladePooling" => splade = Some(folder.clone()),
                "MLMTransformer" => {}
                other => {
                    return Err(EmbedError::Unsupported(format!(
                        "{}: module `{other}` is not supported; supported: Transformer, \
                         Pooling, Dense, Normalize",
                        modules_path.display()
                    )))
                }
            }
        }
    }
    Ok(Modules {
        pooling,
        include_prompt,
        normalize,
        dense,
        splade,
    })
}

/// The prompts of config_sentence_transformers.json.
struct Prompts {
    query_prompt: Option<String>,
    passage_prompt: Option<String>,
    prompts: std::collections::BTreeMap<String, String>,
    default_prompt_name: Option<String>,
}

/// Read the prompts in `dir` (none when config_sentence_transformers.json is absent); the
/// default prompt must be one of them.
fn read_prompts(dir: &Path) -> Result<Prompts, EmbedError> {
    let (mut query_prompt, mut passage_prompt) = (None, None);
    let (mut prompts, mut default_prompt_name) = (Default::default(), None);
    let st_config = dir.join("config_sentence_transformers.json");
    if st_config.is_file() {
        let st: StConfig = read_json(&st_config)?;
        let named = |name: &str| st.prompts.get(name).filter(|p| !p.is_empty()).cloned();
        query_prompt = named("query");
        passage_prompt = ["document", "passage", "corpus"]
            .iter()
            .find_map(|n| named(n));
        if let Some(d) = &st.default_prompt_name {
            if !st.prompts.contains_key(d) {
                return Err(EmbedError::ModelFile {
                    path: st_config,
                    reason: format!(
                        "default_prompt_name `{d}` is not one of its prompts ({})",
                        st.prompts.keys().cloned().collect::<Vec<_>>().join(", ")
                    ),
                });
            }
        }
        default_prompt_name = st.default_prompt_name;
        prompts = st.prompts;
    }
    Ok(Prompts {
        query_prompt,
        passage_prompt,
        prompts,
        default_prompt_name,
    })
}

/// The shard index transformers writes beside sharded weights.
const SHARD_INDEX: &str = "model.safetensors.index.json";

/// The most shards a model may name (Qwen3-Embedding-8B has 4; the largest public models a
/// few hundred).
const MAX_SHARDS: usize = 4096;

#[derive(Deserialize)]
struct ShardIndex {
    weight_map: std::collections::BTreeMap<String, String>,
}

/// The weights of a model folder: `model.safetensors`, else the shards its
/// `model.safetensors.index.json` names (each a plain file name in the folder, in the order
/// of their names), with the file to name in errors.
fn find_weights(dir: &Path) -> Result<(Vec<PathBuf>, PathBuf), EmbedError> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok((vec![single.clone()], single));
    }
    let index = dir.join(SHARD_INDEX);
    if !index.is_file() {
        let reason = if dir.join("pytorch_model.bin").is_file()
            || dir.join("pytorch_model.bin.index.json").is_file()
        {
            "missing: only pytorch_model.bin is there, and ragline reads safetensors; \
             convert it (e.g. with the safetensors `convert` script)"
        } else {
            "missing (and no model.safetensors.index.json naming shards)"
        };
        return Err(EmbedError::ModelFile {
            path: single,
            reason: reason.into(),
        });
    }
    let shards = shard_names(&index)?;
    let mut files = Vec::with_capacity(shards.len());
    for name in shards {
        let path = dir.join(&name);
        if !path.is_file() {
            return Err(EmbedError::ModelFile {
                path: index,
                reason: format!("names the shard `{name}`, which is missing from the folder"),
            });
        }
        files.push(path);
    }
    Ok((files, index))
}

/// The distinct shard files a shard index names, sorted; refused when one is not a plain
/// `.safetensors` file name (the index is a downloaded file: it must not point elsewhere).
fn shard_names(index: &Path) -> Result<Vec<String>, EmbedError> {
    let parsed: ShardIndex = read_json(index)?;
    let bad = |reason: String| EmbedError::ModelFile {
        path: index.to_path_buf(),
        reason,
    };
    let names: std::collections::BTreeSet<String> = parsed.weight_map.into_values().collect();
    if names.is_empty() {
        return Err(bad("its weight_map names no shard".into()));
    }
    if names.len() > MAX_SHARDS {
        return Err(bad(format!(
            "names {} shards; at most {MAX_SHARDS} are read",
            names.len()
        )));
    }
    for name in &names {
        let plain = !name.is_empty()
            && name.ends_with(".safetensors")
            && !name.starts_with('.')
            && !name.contains(['/', '\\', '\0'])
            && Path::new(name).components().count() == 1;
        if !plain {
            return Err(bad(format!(
                "names the shard `{}`, which is not a .safetensors file name in the model folder",
                name.escape_debug()
            )));
        }
    }
    Ok(names.into_iter().collect())
}

/// The most bytes a model's JSON file may hold (configs are kilobytes; a shard index of a
/// large model a few megabytes).
const MAX_JSON_BYTES: u64 = 64 << 20;

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, EmbedError> {
    let io = |e: std::io::Error| EmbedError::ModelFile {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let len = std::fs::metadata(path).map_err(io)?.len();
    if len > MAX_JSON_BYTES {
        return Err(EmbedError::ModelFile {
            path: path.to_path_buf(),
            reason: format!("is {len} bytes; a model's JSON file is at most {MAX_JSON_BYTES}"),
        });
    }
    let bytes = std::fs::read(path).map_err(io)?;
    serde_json::from_slice(&bytes).map_err(|e| EmbedError::ModelFile {
        path: path.to_path_buf(),
        reason: format!("not the expected JSON: {e}"),
    })
}

/// The pooling mode and whether it counts the prompt, in either layout of 1_Pooling/config.json.
fn read_pooling(path: &Path) -> Result<(Pooling, bool), EmbedError> {
    let c: PoolingConfig = read_json(path)?;
    if let Some(mode) = &c.pooling_mode {
        let pooling = match mode.as_str() {
            "mean" => Pooling::Mean,
            "cls" => Pooling::Cls,
            "max" => Pooling::Max,
            "lasttoken" => Pooling::LastToken,
            "mean_sqrt_len_tokens" => Pooling::MeanSqrtLen,
            other => {
                return Err(EmbedError::Unsupported(format!(
                    "{}: pooling_mode `{other}` is not supported; supported: mean, cls, max, \
                     lasttoken, mean_sqrt_len_tokens",
                    path.display()
                )))
            }
        };
        return Ok((pooling, c.include_prompt));
    }
    let modes = [
        (c.pooling_mode_mean_tokens, Pooling::Mean),
        (c.pooling_mode_cls_token, Pooling::Cls),
        (c.pooling_mode_lasttoken, Pooling::LastToken),
        (c.pooling_mode_max_tokens, Pooling::Max),
        (c.pooling_mode_mean_sqrt_len_tokens, Pooling::MeanSqrtLen),
    ];
    let on: Vec<Pooling> = modes.iter().filter(|m| m.0).map(|m| m.1).collect();
    match on.as_slice() {
        [one] => Ok((*one, c.include_prompt)),
        [] => Err(EmbedError::Unsupported(format!(
            "{}: no pooling mode is enabled",
            path.display()
        ))),
        _ => Err(EmbedError::Unsupported(format!(
            "{}: several pooling modes at once ({on:?}) are not supported",
            path.display()
        ))),
    }
}

/// A Dense module's folder: config.json and model.safetensors.
fn read_dense(folder: &Path) -> Result<DenseSpec, EmbedError> {
    let c: DenseConfig = read_json(&folder.join("config.json"))?;
    let weights = folder.join("model.safetensors");
    if !weights.is_file() {
        return Err(EmbedError::ModelFile {
            path: weights,
            reason: if folder.join("pytorch_model.bin").is_file() {
                "missing: only pytorch_model.bin is there, and ragline reads safetensors; \
                 convert it (e.g. with the safetensors `convert` script)"
                    .into()
            } else {
                "missing".into()
            },
        });
    }
    let name = c.activation_function.unwrap_or_default();
    let activation = match name.rsplit('.').next().unwrap_or("") {
        "" | "Identity" => DenseActivation::Identity,
        "Tanh" => DenseActivation::Tanh,
        "ReLU" => DenseActivation::Relu,
        "Sigmoid" => DenseActivation::Sigmoid,
        "GELU" => DenseActivation::Gelu,
        other => {
            return Err(EmbedError::Unsupported(format!(
                "{}: activation `{other}` is not supported; supported: Identity, Tanh, ReLU, \
                 Sigmoid, GELU",
                folder.join("config.json").display()
            )))
        }
    };
    Ok(DenseSpec {
        weights,
        in_features: c.in_features,
        out_features: c.out_features,
        bias: c.bias,
        activation,
    })
}

/// The files of a hub model ragline reads, in the order they are fetched.
const HUB_FILES: &[&str] = &[
    "config.json",
    "tokenizer.json",
    "model.safetensors",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "1_Pooling/config.json",
    "2_Dense/config.json",
    "2_Dense/model.safetensors",
    "3_Dense/config.json",
    "3_Dense/model.safetensors",
];
/// The files of [`HUB_FILES`] a model may lack.
const HUB_OPTIONAL: &[&str] = &[
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "1_Pooling/config.json",
    "2_Dense/config.json",
    "2_Dense/model.safetensors",
    "3_Dense/config.json",
    "3_Dense/model.safetensors",
];

/// The local snapshot folder of a hub model: from the cache when offline (HF_HUB_OFFLINE=1)
/// or when the hub cannot be reached, else downloaded through hf-hub.
fn hub_snapshot(id: &str) -> Result<PathBuf, EmbedError> {
    let offline = std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| v == "1" || v == "true");
    let cache = hf_hub::Cache::from_env();
    let cached = cache.model(id.to_string());
    if offline {
        return cached_snapshot(&cached).ok_or_else(|| {
            EmbedError::NotFound(format!(
                "model `{id}` is not in the Hugging Face cache ({}) and HF_HUB_OFFLINE is set; \
                 unset it to download, or give --model a local folder",
                cache.path().display()
            ))
        });
    }
    let api = hf_hub::api::sync::ApiBuilder::from_env()
        .with_progress(false)
        .build()
        .map_err(|e| EmbedError::NotFound(format!("cannot set up the hub client: {e}")))?;
    let repo = api.model(id.to_string());
    let unreachable = |file: &str, e: hf_hub::api::sync::ApiError| -> Result<PathBuf, EmbedError> {
        if let Some(dir) = cached_snapshot(&cached) {
            return Ok(dir);
        }
        Err(EmbedError::NotFound(format!(
            "cannot get `{file}` of model `{id}` from the hub ({e}) and it is not cached; \
             check the id, the network, or run scripts/fetch-model.sh and give --model the \
             folder"
        )))
    };
    let mut dir = None;
    let mut sharded = false;
    for file in HUB_FILES {
        match repo.get(file) {
            Ok(path) => {
                if dir.is_none() {
                    dir = path.parent().map(Path::to_path_buf);
                }
            }
            Err(_) if HUB_OPTIONAL.contains(file) => {}
            // A large model is split into shards that an index names.
            Err(_) if *file == "model.safetensors" => sharded = true,
            Err(e) => return unreachable(file, e),
        }
    }
    if sharded {
        let index = match repo.get(SHARD_INDEX) {
            Ok(index) => index,
            Err(e) => return unreachable("model.safetensors", e),
        };
        for shard in shard_names(&index)? {
            if let Err(e) = repo.get(&shard) {
                return unreachable(&shard, e);
            }
        }
    }
    dir.ok_or_else(|| EmbedError::NotFound(format!("model `{id}`: no files")))
}

/// The folder of a hub model's snapshot in the local cache, when its config.json is there.
fn cached_snapshot(cached: &hf_hub::CacheRepo) -> Option<PathBuf> {
    let config = cached.get("config.json")?;
    Some(config.parent()?.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, body) in files {
            let p = dir.path().join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, body).unwrap();
        }
        dir
    }

    #[test]
    fn shards_are_read_in_order_and_must_stay_in_the_folder() {
        let index = |map: &str| format!(r#"{{"metadata": {{}}, "weight_map": {map}}}"#);
        let good = index(
            r#"{"b": "model-00002-of-00002.safetensors", "a": "model-00001-of-00002.safetensors",
                "c": "model-00001-of-00002.safetensors"}"#,
        );
        let dir = folder(&[
            ("model.safetensors.index.json", &good),
            ("model-00002-of-00002.safetensors", ""),
            ("model-00001-of-00002.safetensors", ""),
        ]);
        let (files, named) = find_weights(dir.path()).unwrap();
        let names: Vec<_> = files
            .iter()
            .map(|p| p.file_name().unwrap().to_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors"
            ]
        );
        assert!(named.ends_with("model.safetensors.index.json"));

        // One file wins over an index beside it (as transformers loads it).
        let dir = folder(&[
            ("model.safetensors", ""),
            ("model.safetensors.index.json", "{"),
        ]);
        let (files, _) = find_weights(dir.path()).unwrap();
        assert_eq!(files, [dir.path().join("model.safetensors")]);

        for (map, says) in [
            (
                r#"{"a": "../../etc/x.safetensors"}"#,
                "not a .safetensors file name",
            ),
            (
                r#"{"a": "/etc/x.safetensors"}"#,
                "not a .safetensors file name",
            ),
            (
                r#"{"a": "sub/x.safetensors"}"#,
                "not a .safetensors file name",
            ),
            (r#"{"a": "model.bin"}"#, "not a .safetensors file name"),
            (r#"{"a": ".safetensors"}"#, "not a .safetensors file name"),
            (r#"{}"#, "names no shard"),
            (
                r#"{"a": "model-1.safetensors"}"#,
                "`model-1.safetensors`, which is missing",
            ),
            (r#"[1]"#, "not the expected JSON"),
        ] {
            let dir = folder(&[("model.safetensors.index.json", &index(map))]);
            let err = find_weights(dir.path()).unwrap_err().to_string();
            assert!(
                err.contains(says) && err.contains("model.safetensors.index.json"),
                "{map}: {err}"
            );
        }
    }

    #[test]
    fn a_missing_file_is_named_with_the_fix() {
        let dir = folder(&[("config.json", "{}"), ("model.safetensors", "")]);
        let err = ModelFiles::from_dir("m", dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("tokenizer.json") && err.contains("missing"),
            "{err}"
        );
        let dir = folder(&[
            ("config.json", "{}"),
            ("tokenizer.json", "{}"),
            ("pytorch_model.bin", ""),
        ]);
        let err = ModelFiles::from_dir("m", dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("model.safetensors") && err.contains("pytorch_model.bin"),
            "{err}"
        );
    }

    #[test]
    fn reads_the_sentence_transformers_configuration() {
        let dir = folder(&[
            ("config.json", "{}"),
            ("tokenizer.json", "{}"),
            ("model.safetensors", ""),
            (
                "modules.json",
                r#"[{"path":"","type":"sentence_transformers.models.Transformer"},
                    {"path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
                    {"path":"2_Normalize","type":"sentence_transformers.models.Normalize"}]"#,
            ),
            (
                "1_Pooling/config.json",
                r#"{"pooling_mode_cls_token": true}"#,
            ),
            ("sentence_bert_config.json", r#"{"max_seq_length": 512}"#),
            (
                "config_sentence_transformers.json",
                r#"{"prompts": {"query": "query: ", "passage": "passage: "}}"#,
            ),
        ]);
        let f = ModelFiles::from_dir("m", dir.path()).unwrap();
        assert_eq!(f.pooling, Pooling::Cls);
        assert!(f.normalize);
        assert_eq!(f.max_seq_length, Some(512));
        assert_eq!(f.query_prompt.as_deref(), Some("query: "));
        assert_eq!(f.passage_prompt.as_deref(), Some("passage: "));
    }

    #[test]
    fn an_unknown_module_or_pooling_is_refused() {
        let dir = folder(&[
            ("config.json", "{}"),
            ("tokenizer.json", "{}"),
            ("model.safetensors", ""),
            (
                "modules.json",
                r#"[{"path":"2_Lstm","type":"sentence_transformers.models.LSTM"}]"#,
            ),
        ]);
        let err = ModelFiles::from_dir("m", dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("module `LSTM` is not supported"), "{err}");
    }

    /// The layout sentence-transformers 5-6 writes: module types under
    /// `sentence_transformers.base.modules`, `pooling_mode` by name with `include_prompt`,
    /// `embedding_dimension`; prompts with a default; a Dense layer read with its activation.
    #[test]
    fn reads_the_new_layout_dense_layers_and_named_prompts() {
        let dir = folder(&[
            ("config.json", "{}"),
            ("tokenizer.json", "{}"),
            ("model.safetensors", ""),
            (
                "modules.json",
                r#"[{"path":"","type":"sentence_transformers.base.modules.Transformer"},
                    {"path":"1_Pooling","type":"sentence_transformers.base.modules.Pooling"},
                    {"path":"2_Dense","type":"sentence_transformers.base.modules.Dense"},
                    {"path":"3_Normalize","type":"sentence_transformers.base.modules.Normalize"}]"#,
            ),
            (
                "1_Pooling/config.json",
                r#"{"embedding_dimension": 8, "pooling_mode": "lasttoken", "include_prompt": false}"#,
            ),
            (
                "2_Dense/config.json",
                r#"{"in_features": 8, "out_features": 4, "bias": false,
                    "activation_function": "torch.nn.modules.activation.Tanh"}"#,
            ),
            ("2_Dense/model.safetensors", ""),
            (
                "config_sentence_transformers.json",
                r#"{"prompts": {"query": "q: ", "corpus": "c: ", "passage": "p: ", "clf": "k: "},
                    "default_prompt_name": "clf"}"#,
            ),
        ]);
        let f = ModelFiles::from_dir("m", dir.path()).unwrap();
        assert_eq!(f.pooling, Pooling::LastToken);
        assert!(!f.include_prompt);
        assert!(f.normalize);
        assert_eq!(f.dense.len(), 1);
        assert_eq!((f.dense[0].in_features, f.dense[0].out_features), (8, 4));
        assert!(!f.dense[0].bias);
        assert_eq!(f.dense[0].activation, DenseActivation::Tanh);
        // sentence-transformers' encode_document order: document, passage, corpus.
        assert_eq!(f.passage_prompt.as_deref(), Some("p: "));
        assert_eq!(f.query_prompt.as_deref(), Some("q: "));
        assert_eq!(f.default_prompt_name.as_deref(), Some("clf"));
        assert_eq!(f.prompt("clf").unwrap(), "k: ");
        let err = f.prompt("nope").unwrap_err().to_string();
        assert!(
            err.contains("no prompt called `nope`") && err.contains("clf"),
            "{err}"
        );
    }

    #[test]
    fn a_dense_layer_without_safetensors_or_after_normalize_is_refused() {
        let base = [
            ("config.json", "{}"),
            ("tokenizer.json", "{}"),
            ("model.safetensors", ""),
            (
                "2_Dense/config.json",
                r#"{"in_features": 8, "out_features": 4}"#,
            ),
        ];
        let mut files = base.to_vec();
        files.push((
            "modules.json",
            r#"[{"path":"2_Dense","type":"sentence_transformers.models.Dense"}]"#,
        ));
        files.push(("2_Dense/pytorch_model.bin", ""));
        let dir = folder(&files);
        let err = ModelFiles::from_dir("m", dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("2_Dense/model.safetensors") && err.contains("pytorch_model.bin"),
            "{err}"
        );
        let mut files = base.to_vec();
        files.push((
            "modules.json",
            r#"[{"path":"3_Normalize","type":"sentence_transformers.models.Normalize"},
                {"path":"2_Dense","type":"sentence_transformers.models.Dense"}]"#,
        ));
        let dir = folder(&files);
        let err = ModelFiles::from_dir("m", dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("Normalize must come last"), "{err}");
        let dir = folder(&[
            ("config.json", "{}"),
            ("tokenizer.json", "{}"),
            ("model.safetensors", ""),
            (
                "config_sentence_transformers.json",
                r#"{"prompts": {"query": "q: "}, "default_prompt_name": "missing"}"#,
            ),
        ]);
        let err = ModelFiles::from_dir("m", dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("default_prompt_name `missing`"), "{err}");
    }
}
