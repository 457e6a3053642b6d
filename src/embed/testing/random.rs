//! Random-weight BERT models in the Hugging Face layout: a model of any size and dimension
//! that loads and runs like a real one, for tests (a second model to migrate an index to)
//! and benchmarks. Its vectors mean nothing; its tokenizer and sentence-transformers settings
//! are copied from a real model folder.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};

use crate::embed::EmbedError;

/// The shape of a random BERT.
#[derive(Clone, Copy, Debug)]
pub struct RandomBert {
    pub vocab: usize,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub intermediate: usize,
    pub positions: usize,
    pub seed: u64,
}

impl RandomBert {
    /// The config.json of this shape.
    pub fn config(&self) -> serde_json::Value {
        serde_json::json!({
            "architectures": ["BertModel"],
            "vocab_size": self.vocab, "hidden_size": self.hidden,
            "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
            "intermediate_size": self.intermediate, "hidden_act": "gelu",
            "max_position_embeddings": self.positions, "type_vocab_size": 2,
            "layer_norm_eps": 1e-12, "pad_token_id": 0, "model_type": "bert"
        })
    }

    /// A random matrix [rows, cols] and bias [rows], deterministic in `seed`.
    pub fn matrix(&self, rows: usize, cols: usize) -> (Tensor, Tensor) {
        let mut state = self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = |count: usize, scale: f32| -> Vec<f32> {
            (0..count)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    ((state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32 * scale
                })
                .collect()
        };
        let w = next(rows * cols, 0.5);
        let b = next(rows, 0.1);
        (
            Tensor::from_vec(w, (rows, cols), &Device::Cpu).expect("shape and length agree"),
            Tensor::from_vec(b, rows, &Device::Cpu).expect("shape and length agree"),
        )
    }

    /// Weights named as Hugging Face's BERT checkpoints name them, deterministic in `seed`.
    pub fn weights(&self) -> HashMap<String, Tensor> {
        let h = self.hidden;
        let mut t = RandomTensors::new(self.seed);
        t.put(
            "embeddings.word_embeddings.weight",
            &[self.vocab, h],
            1.0,
            0.0,
        );
        t.put(
            "embeddings.position_embeddings.weight",
            &[self.positions, h],
            0.5,
            0.0,
        );
        t.put("embeddings.token_type_embeddings.weight", &[2, h], 0.5, 0.0);
        // LayerNorm weights near 1, as trained models have them.
        t.put("embeddings.LayerNorm.weight", &[h], 0.1, 1.0);
        t.put("embeddings.LayerNorm.bias", &[h], 0.1, 0.0);
        for l in 0..self.layers {
            self.put_layer(&mut t, l);
        }
        t.tensors
    }

    /// Encoder layer `l`'s weights, named as Hugging Face's BERT checkpoints name them.
    fn put_layer(&self, t: &mut RandomTensors, l: usize) {
        let (h, i) = (self.hidden, self.intermediate);
        let pre = format!("encoder.layer.{l}");
        for name in ["query", "key", "value"] {
            t.put(
                &format!("{pre}.attention.self.{name}.weight"),
                &[h, h],
                0.3,
                0.0,
            );
            t.put(&format!("{pre}.attention.self.{name}.bias"), &[h], 0.1, 0.0);
        }
        t.put(
            &format!("{pre}.attention.output.dense.weight"),
            &[h, h],
            0.3,
            0.0,
        );
        t.put(
            &format!("{pre}.attention.output.dense.bias"),
            &[h],
            0.1,
            0.0,
        );
        t.put(
            &format!("{pre}.attention.output.LayerNorm.weight"),
            &[h],
            0.1,
            1.0,
        );
        t.put(
            &format!("{pre}.attention.output.LayerNorm.bias"),
            &[h],
            0.1,
            0.0,
        );
        t.put(
            &format!("{pre}.intermediate.dense.weight"),
            &[i, h],
            0.3,
            0.0,
        );
        t.put(&format!("{pre}.intermediate.dense.bias"), &[i], 0.1, 0.0);
        t.put(&format!("{pre}.output.dense.weight"), &[h, i], 0.3, 0.0);
        t.put(&format!("{pre}.output.dense.bias"), &[h], 0.1, 0.0);
        t.put(&format!("{pre}.output.LayerNorm.weight"), &[h], 0.1, 1.0);
        t.put(&format!("{pre}.output.LayerNorm.bias"), &[h], 0.1, 0.0);
    }
}

/// Named tensors of deterministic pseudo-random values, drawn in the order they are put.
struct RandomTensors {
    /// xorshift: deterministic weights without a seeded RNG.
    state: u64,
    tensors: HashMap<String, Tensor>,
}

impl RandomTensors {
    /// An empty set whose values follow from `seed`.
    fn new(seed: u64) -> Self {
        RandomTensors {
            state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            tensors: HashMap::new(),
        }
    }

    /// Add `name` of `shape`, its values within `offset` ± 1.7 × `scale`.
    fn put(&mut self, name: &str, shape: &[usize], scale: f32, offset: f32) {
        let count: usize = shape.iter().product();
        let state = &mut self.state;
        let values: Vec<f32> = (0..count)
            .map(|_| {
                *state ^= *state << 13;
                *state ^= *state >> 7;
                *state ^= *state << 17;
                offset
                    + ((*state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32 * scale * 1.7
            })
            .collect();
        self.tensors.insert(
            name.to_string(),
            Tensor::from_vec(values, shape, &Device::Cpu).expect("shape and length agree"),
        );
    }
}

/// Write a random BERT of `hidden` dimensions and `layers` layers into `out`, with the
/// tokenizer and sentence-transformers settings (pooling, normalisation, length) of the model
/// folder `base`.
pub fn save_random_model(
    base: &Path,
    out: &Path,
    hidden: usize,
    layers: usize,
    seed: u64,
) -> Result<(), EmbedError> {
    save_random_family(base, out, "bert", hidden, layers, seed)
}

/// The families [`save_random_family`] writes, with what each one's folder exercises.
pub const RANDOM_FAMILIES: &[&str] = &[
    "bert",
    "xlm-roberta",
    "distilbert",
    "mpnet",
    "modernbert",
    "qwen3",
    "gemma3",
];

/// What else a random model may be asked for.
#[derive(Clone, Copy, Debug, Default)]
pub struct RandomOptions {
    /// sentence_bert_config.json's max_seq_length (and room for it in the positions).
    pub max_seq_length: Option<usize>,
    /// The published models' shapes ([`RotaryShape::real`]; BERT-base's for the BERT-like
    /// families), not `hidden` and `layers`; the vocabulary stays the base folder's.
    pub real_shape: bool,
}

/// Write a random-weight model of `family` (one of [`RANDOM_FAMILIES`]) in the Hugging Face
/// and sentence-transformers layout, with the tokenizer of the model folder `base`. Each
/// family's folder also exercises a part of the sentence-transformers layout:
/// - `bert`: `base`'s own modules (mean pooling, Normalize for MiniLM);
/// - `xlm-roberta`: the layout sentence-transformers 5-6 writes (`pooling_mode`,
///   `embedding_dimension`), e5's prompts ("query: ", "passage: ") and Normalize;
/// - `distilbert`: CLS pooling, a Dense layer (tanh, to 3/4 of the hidden size), Normalize;
/// - `mpnet`: mean pooling without the prompt (`include_prompt: false`), named prompts with a
///   `default_prompt_name`, no normalisation;
/// - `modernbert`: mean pooling, "search_query: " / "search_document: " prompts, Normalize;
///   a local window of 8 in every other layer;
/// - `qwen3`: last-token pooling, the tokenizer appending the end token ([SEP]) and padding
///   on the left, Qwen3-Embedding's instruction as query prompt, Normalize;
/// - `gemma3` (bidirectional, EmbeddingGemma's layout): mean pooling, two Dense layers
///   (hidden -> 2 hidden -> hidden, no bias, identity), Normalize, its prompts.
pub fn save_random_family(
    base: &Path,
    out: &Path,
    family: &str,
    hidden: usize,
    layers: usize,
    seed: u64,
) -> Result<(), EmbedError> {
    save_random_family_with(
        base,
        out,
        family,
        hidden,
        layers,
        seed,
        RandomOptions::default(),
    )
}

/// [`save_random_family`] with [`RandomOptions`].
pub fn save_random_family_with(
    base: &Path,
    out: &Path,
    family: &str,
    hidden: usize,
    layers: usize,
    seed: u64,
    options: RandomOptions,
) -> Result<(), EmbedError> {
    if !RANDOM_FAMILIES.contains(&family) {
        return Err(EmbedError::Unsupported(format!(
            "no random model of family `{family}`; families: {}",
            RANDOM_FAMILIES.join(", ")
        )));
    }
    let folder = Folder { out };
    folder.dir("1_Pooling")?;
    let base_config: serde_json::Value = std::fs::read(base.join("config.json"))
        .map_err(|e| io_error(&base.join("config.json"), e))
        .and_then(|b| {
            serde_json::from_slice(&b).map_err(|e| EmbedError::ModelFile {
                path: base.join("config.json"),
                reason: e.to_string(),
            })
        })?;
    let number = |k: &str, default: usize| {
        base_config
            .get(k)
            .and_then(|v| v.as_u64())
            .map_or(default, |v| v as usize)
    };
    // RoBERTa and MPNet spend two positions before the first token.
    let offset = match family {
        "xlm-roberta" | "mpnet" => 2,
        _ => 0,
    };
    let positions =
        number("max_position_embeddings", 512).max(options.max_seq_length.unwrap_or(0)) + offset;
    // A BERT-like real shape is BERT-base's (XLM-RoBERTa-base, MPNet-base; DistilBERT has 6
    // layers), with the base folder's vocabulary.
    let (hidden, layers, heads, intermediate) = if options.real_shape {
        (768, if family == "distilbert" { 6 } else { 12 }, 12, 3072)
    } else {
        (
            hidden,
            layers,
            if hidden.is_multiple_of(4) { 4 } else { 1 },
            hidden * 2,
        )
    };
    let shape = RandomBert {
        vocab: number("vocab_size", 30522),
        hidden,
        layers,
        heads,
        intermediate,
        positions,
        seed,
    };
    copy_base_files(base, out, family)?;
    if let Some(n) = options.max_seq_length {
        folder.json(
            "sentence_bert_config.json",
            &serde_json::json!({"max_seq_length": n, "do_lower_case": false}),
        )?;
    }
    if matches!(family, "modernbert" | "qwen3" | "gemma3") {
        write_rotary(&folder, family, &shape, options)
    } else {
        write_bert_like(&folder, family, &shape)
    }
}

/// A random model's folder.
struct Folder<'a> {
    out: &'a Path,
}

impl Folder<'_> {
    /// A sub-folder, made.
    fn dir(&self, name: &str) -> Result<std::path::PathBuf, EmbedError> {
        let dir = self.out.join(name);
        std::fs::create_dir_all(&dir).map_err(|e| io_error(&dir, e))?;
        Ok(dir)
    }

    /// A JSON file of the folder (pretty, as the hub's are).
    fn json(&self, name: &str, v: &serde_json::Value) -> Result<(), EmbedError> {
        let path = self.out.join(name);
        std::fs::write(&path, serde_json::to_vec_pretty(v).expect("JSON"))
            .map_err(|e| io_error(&path, e))
    }

    /// A safetensors file of the folder.
    fn tensors(&self, name: &str, tensors: &HashMap<String, Tensor>) -> Result<(), EmbedError> {
        candle_core::safetensors::save(tensors, self.out.join(name))?;
        Ok(())
    }
}

fn io_error(path: &Path, e: std::io::Error) -> EmbedError {
    EmbedError::ModelFile {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

/// A sentence-transformers module of `modules.json`.
fn module(idx: usize, path: &str, kind: &str) -> serde_json::Value {
    serde_json::json!({"idx": idx, "name": idx.to_string(), "path": path,
                       "type": format!("sentence_transformers.models.{kind}")})
}

/// A pooling config in the older layout (`pooling_mode_mean_tokens: true`, ...).
fn old_pooling(hidden: usize, mode: &str) -> serde_json::Value {
    serde_json::json!({
        "word_embedding_dimension": hidden,
        "pooling_mode_cls_token": mode == "cls",
        "pooling_mode_mean_tokens": mode == "mean",
        "pooling_mode_max_tokens": false,
        "pooling_mode_mean_sqrt_len_tokens": false
    })
}

/// The tokenizer and sentence-transformers files of `base` the family keeps (a BERT keeps
/// its modules and prompts too; the others write their own).
fn copy_base_files(base: &Path, out: &Path, family: &str) -> Result<(), EmbedError> {
    let copied: &[&str] = if family == "bert" {
        &[
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "vocab.txt",
            "modules.json",
            "sentence_bert_config.json",
            "config_sentence_transformers.json",
        ]
    } else {
        &[
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "vocab.txt",
            "sentence_bert_config.json",
        ]
    };
    for file in copied {
        let from = base.join(file);
        if from.is_file() {
            std::fs::copy(&from, out.join(file)).map_err(|e| io_error(&from, e))?;
        }
    }
    Ok(())
}

/// A rotary family's folder: weights, pooling, prompts, modules (Gemma3's two Dense layers),
/// and a decoder's tokenizer for Qwen3.
fn write_rotary(
    folder: &Folder<'_>,
    family: &str,
    shape: &RandomBert,
    options: RandomOptions,
) -> Result<(), EmbedError> {
    let seed = shape.seed;
    let rotary = if options.real_shape {
        RotaryShape::real(family)
    } else {
        RotaryShape::small(family, shape.hidden, shape.layers)
    };
    let max_positions = match family {
        "modernbert" => 8192,
        "qwen3" => 32768,
        _ => 2048,
    }
    .max(options.max_seq_length.unwrap_or(0));
    let (config, weights) = random_rotary(family, rotary, shape.vocab, max_positions, seed);
    let h = rotary.hidden;
    let (pooling, prompts) = rotary_pooling_and_prompts(family);
    folder.json(
        "1_Pooling/config.json",
        &serde_json::json!({"embedding_dimension": h, "pooling_mode": pooling,
                            "include_prompt": true}),
    )?;
    folder.json(
        "config_sentence_transformers.json",
        &serde_json::json!({"prompts": prompts, "default_prompt_name": null,
                            "similarity_fn_name": "cosine"}),
    )?;
    let mut modules = vec![
        module(0, "", "Transformer"),
        module(1, "1_Pooling", "Pooling"),
    ];
    if family == "gemma3" {
        gemma_dense(folder, shape, h, &mut modules)?;
    }
    let n = modules.len();
    modules.push(module(n, &format!("{n}_Normalize"), "Normalize"));
    folder.json("modules.json", &serde_json::Value::Array(modules))?;
    if family == "qwen3" {
        decoder_tokenizer(folder.out)?;
    }
    folder.json("config.json", &config)?;
    folder.tensors("model.safetensors", &weights)
}

/// The pooling mode and the prompts of a rotary family.
fn rotary_pooling_and_prompts(family: &str) -> (&'static str, serde_json::Value) {
    match family {
        "modernbert" => (
            "mean",
            serde_json::json!({"query": "search_query: ", "document": "search_document: "}),
        ),
        "qwen3" => (
            "lasttoken",
            serde_json::json!({"query": "Instruct: Given a web search query, retrieve \
                               relevant passages that answer the query\nQuery:",
                               "document": ""}),
        ),
        _ => (
            "mean",
            serde_json::json!({"query": "task: search result | query: ",
                               "document": "title: none | text: ",
                               "Clustering": "task: clustering | query: "}),
        ),
    }
}

/// EmbeddingGemma's two Dense layers after pooling (`h` to 2h, then back to `h`), appended
/// to `modules`.
fn gemma_dense(
    folder: &Folder<'_>,
    shape: &RandomBert,
    h: usize,
    modules: &mut Vec<serde_json::Value>,
) -> Result<(), EmbedError> {
    for (i, (inputs, outputs)) in [(h, 2 * h), (2 * h, h)].into_iter().enumerate() {
        let name = format!("{}_Dense", i + 2);
        folder.dir(&name)?;
        folder.json(
            &format!("{name}/config.json"),
            &serde_json::json!({"in_features": inputs, "out_features": outputs,
                                "bias": false,
                                "activation_function":
                                    "torch.nn.modules.linear.Identity"}),
        )?;
        let (w, _) = RandomBert {
            seed: shape.seed ^ (0xDE45E + i as u64),
            ..*shape
        }
        .matrix(outputs, inputs);
        let w = (w * (1.0 / (inputs as f64).sqrt()))?;
        folder.tensors(
            &format!("{name}/model.safetensors"),
            &HashMap::from([("linear.weight".to_string(), w)]),
        )?;
        modules.push(module(i + 2, &name, "Dense"));
    }
    Ok(())
}

/// A BERT-like family's folder: BERT's weights under the family's names, its config, and the
/// part of the sentence-transformers layout it exercises.
fn write_bert_like(
    folder: &Folder<'_>,
    family: &str,
    shape: &RandomBert,
) -> Result<(), EmbedError> {
    let (hidden, layers) = (shape.hidden, shape.layers);
    let mut weights = shape.weights();
    let mut config = shape.config();
    match family {
        "bert" => folder.json("1_Pooling/config.json", &old_pooling(hidden, "mean"))?,
        "xlm-roberta" => xlm_roberta(folder, hidden, &mut config, &mut weights)?,
        "distilbert" => {
            config = distilbert_config(shape);
            weights = rename_weights(weights, family, layers);
            distilbert_head(folder, shape)?;
        }
        "mpnet" => {
            weights = rename_weights(weights, family, layers);
            mpnet(folder, shape, &mut config, &mut weights)?;
        }
        _ => unreachable!("checked by save_random_family_with"),
    }
    folder.json("config.json", &config)?;
    folder.tensors("model.safetensors", &weights)
}

/// XLM-RoBERTa: BERT's config and weights with one token type, mean pooling, Normalize and
/// e5's prompts.
fn xlm_roberta(
    folder: &Folder<'_>,
    hidden: usize,
    config: &mut serde_json::Value,
    weights: &mut HashMap<String, Tensor>,
) -> Result<(), EmbedError> {
    config["model_type"] = "xlm-roberta".into();
    config["architectures"] = serde_json::json!(["XLMRobertaModel"]);
    config["type_vocab_size"] = 1.into();
    config["layer_norm_eps"] = 1e-5.into();
    config["pad_token_id"] = 1.into();
    let types = weights["embeddings.token_type_embeddings.weight"]
        .narrow(0, 0, 1)
        .expect("two token types");
    weights.insert("embeddings.token_type_embeddings.weight".into(), types);
    folder.json(
        "1_Pooling/config.json",
        &serde_json::json!({"embedding_dimension": hidden, "pooling_mode": "mean",
                            "include_prompt": true}),
    )?;
    folder.json(
        "modules.json",
        &serde_json::json!([
            module(0, "", "Transformer"),
            module(1, "1_Pooling", "Pooling"),
            module(2, "2_Normalize", "Normalize")
        ]),
    )?;
    folder.json(
        "config_sentence_transformers.json",
        &serde_json::json!({"prompts": {"query": "query: ", "document": "passage: "},
                            "default_prompt_name": null,
                            "similarity_fn_name": "cosine"}),
    )
}

/// DistilBERT's config.json, under its own field names.
fn distilbert_config(shape: &RandomBert) -> serde_json::Value {
    serde_json::json!({
        "architectures": ["DistilBertModel"], "model_type": "distilbert",
        "vocab_size": shape.vocab, "dim": shape.hidden, "n_layers": shape.layers,
        "n_heads": shape.heads, "hidden_dim": shape.intermediate,
        "activation": "gelu", "max_position_embeddings": shape.positions,
        "pad_token_id": 0, "sinusoidal_pos_embds": false, "dropout": 0.1,
        "attention_dropout": 0.1, "initializer_range": 0.02,
        "tie_weights_": true
    })
}

/// MPNet: BERT's config without token types, a relative attention bias, mean pooling without
/// the prompt, and prompts with a default one.
fn mpnet(
    folder: &Folder<'_>,
    shape: &RandomBert,
    config: &mut serde_json::Value,
    weights: &mut HashMap<String, Tensor>,
) -> Result<(), EmbedError> {
    config["model_type"] = "mpnet".into();
    config["architectures"] = serde_json::json!(["MPNetModel"]);
    config["layer_norm_eps"] = 1e-5.into();
    config["relative_attention_num_buckets"] = 32.into();
    config["pad_token_id"] = 1.into();
    if let Some(c) = config.as_object_mut() {
        c.remove("type_vocab_size");
    }
    let bias = RandomBert {
        seed: shape.seed ^ 0xB1A5,
        ..*shape
    }
    .matrix(32, shape.heads);
    weights.insert("encoder.relative_attention_bias.weight".into(), bias.0);
    folder.json(
        "1_Pooling/config.json",
        &serde_json::json!({"embedding_dimension": shape.hidden, "pooling_mode": "mean",
                            "include_prompt": false}),
    )?;
    folder.json(
        "modules.json",
        &serde_json::json!([
            module(0, "", "Transformer"),
            module(1, "1_Pooling", "Pooling")
        ]),
    )?;
    folder.json(
        "config_sentence_transformers.json",
        &serde_json::json!({"prompts": {"query": "search_query: ",
                                        "document": "search_document: ",
                                        "classification": "classification: "},
                            "default_prompt_name": "classification",
                            "similarity_fn_name": "cosine"}),
    )
}

/// DistilBERT's sentence-transformers head: CLS pooling, a Dense layer (tanh, to 3/4 of the
/// hidden size), Normalize.
fn distilbert_head(folder: &Folder<'_>, shape: &RandomBert) -> Result<(), EmbedError> {
    let hidden = shape.hidden;
    folder.json("1_Pooling/config.json", &old_pooling(hidden, "cls"))?;
    let dense = hidden * 3 / 4;
    folder.dir("2_Dense")?;
    folder.json(
        "2_Dense/config.json",
        &serde_json::json!({"in_features": hidden, "out_features": dense, "bias": true,
                            "activation_function": "torch.nn.modules.activation.Tanh"}),
    )?;
    let extra = RandomBert {
        seed: shape.seed ^ 0xD15E,
        ..*shape
    }
    .matrix(dense, hidden);
    folder.tensors(
        "2_Dense/model.safetensors",
        &HashMap::from([
            ("linear.weight".to_string(), extra.0),
            ("linear.bias".to_string(), extra.1),
        ]),
    )?;
    folder.json(
        "modules.json",
        &serde_json::json!([
            module(0, "", "Transformer"),
            module(1, "1_Pooling", "Pooling"),
            module(2, "2_Dense", "Dense"),
            module(3, "3_Normalize", "Normalize")
        ]),
    )
}

/// Make the copied BERT tokenizer a decoder's: the end token ([SEP]) after the text and
/// nothing before it, padding on the left (as Qwen3-Embedding's tokenizer does).
fn decoder_tokenizer(out: &Path) -> Result<(), EmbedError> {
    let bad = |path: &Path, reason: String| EmbedError::ModelFile {
        path: path.to_path_buf(),
        reason,
    };
    let path = out.join("tokenizer.json");
    let raw = std::fs::read(&path).map_err(|e| bad(&path, e.to_string()))?;
    let mut t: serde_json::Value =
        serde_json::from_slice(&raw).map_err(|e| bad(&path, e.to_string()))?;
    t["post_processor"] = serde_json::json!({
        "type": "TemplateProcessing",
        "single": [{"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}},
                 {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
        "special_tokens": {"[SEP]": {"id": "[SEP]", "ids": [102], "tokens": ["[SEP]"]}}
    });
    if let Some(p) = t.get_mut("padding").and_then(|p| p.as_object_mut()) {
        p.insert("direction".into(), "Left".into());
    }
    std::fs::write(&path, serde_json::to_vec(&t).expect("JSON"))
        .map_err(|e| bad(&path, e.to_string()))?;
    let path = out.join("tokenizer_config.json");
    let mut c: serde_json::Value = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| serde_json::json!({}));
    c["tokenizer_class"] = "PreTrainedTokenizerFast".into();
    c["padding_side"] = "left".into();
    c["eos_token"] = "[SEP]".into();
    c["pad_token"] = "[PAD]".into();
    std::fs::write(&path, serde_json::to_vec_pretty(&c).expect("JSON"))
        .map_err(|e| bad(&path, e.to_string()))
}

/// BERT's weight names as `family` names them (MPNet has no token types).
fn rename_weights(
    weights: HashMap<String, Tensor>,
    family: &str,
    layers: usize,
) -> HashMap<String, Tensor> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    for l in 0..layers {
        let b = format!("encoder.layer.{l}");
        let table: &[(&str, &str)] = match family {
            "mpnet" => &[
                ("attention.self.query", "attention.attn.q"),
                ("attention.self.key", "attention.attn.k"),
                ("attention.self.value", "attention.attn.v"),
                ("attention.output.dense", "attention.attn.o"),
                ("attention.output.LayerNorm", "attention.LayerNorm"),
                ("intermediate.dense", "intermediate.dense"),
                ("output.dense", "output.dense"),
                ("output.LayerNorm", "output.LayerNorm"),
            ],
            _ => &[
                ("attention.self.query", "attention.q_lin"),
                ("attention.self.key", "attention.k_lin"),
                ("attention.self.value", "attention.v_lin"),
                ("attention.output.dense", "attention.out_lin"),
                ("attention.output.LayerNorm", "sa_layer_norm"),
                ("intermediate.dense", "ffn.lin1"),
                ("output.dense", "ffn.lin2"),
                ("output.LayerNorm", "output_layer_norm"),
            ],
        };
        let to = if family == "mpnet" {
            b.clone()
        } else {
            format!("transformer.layer.{l}")
        };
        for (from, into) in table {
            for part in ["weight", "bias"] {
                pairs.push((format!("{b}.{from}.{part}"), format!("{to}.{into}.{part}")));
            }
        }
    }
    let mut out = HashMap::new();
    for (name, t) in weights {
        if name == "embeddings.token_type_embeddings.weight" {
            continue;
        }
        let new = pairs
            .iter()
            .find(|(from, _)| *from == name)
            .map_or(name.clone(), |(_, into)| into.clone());
        out.insert(new, t);
    }
    out
}

/// Deterministic uniform weights (xorshift), named and shaped as asked.
struct Draw {
    state: u64,
    tensors: HashMap<String, Tensor>,
}

impl Draw {
    fn new(seed: u64) -> Self {
        Draw {
            state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            tensors: HashMap::new(),
        }
    }

    /// Uniform in offset ± scale.
    fn put(&mut self, name: &str, shape: &[usize], scale: f32, offset: f32) {
        let count: usize = shape.iter().product();
        let values: Vec<f32> = (0..count)
            .map(|_| {
                self.state ^= self.state << 13;
                self.state ^= self.state >> 7;
                self.state ^= self.state << 17;
                offset
                    + ((self.state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32 * scale
            })
            .collect();
        let t = Tensor::from_vec(values, shape, &Device::Cpu).expect("shape and length agree");
        self.tensors.insert(name.to_string(), t);
    }

    /// A linear layer's weight [out, in], scaled so activations keep their size.
    fn linear(&mut self, name: &str, outputs: usize, inputs: usize) {
        let scale = 1.7 / (inputs as f32).sqrt();
        self.put(&format!("{name}.weight"), &[outputs, inputs], scale, 0.0);
    }
}

/// The shape of a random rotary-family model.
#[derive(Clone, Copy, Debug)]
pub struct RotaryShape {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    /// ModernBERT's local_attention, Gemma's sliding_window.
    pub window: usize,
    /// Every how many layers one is global (ModernBERT) / full (Gemma).
    pub global_every: usize,
}

impl RotaryShape {
    /// A small shape for tests: 4 heads (2 key/value heads for the decoders, with a head size
    /// that is not hidden / heads), a window of 8 and a global layer every 2.
    pub fn small(family: &str, hidden: usize, layers: usize) -> Self {
        let decoder = family != "modernbert";
        RotaryShape {
            hidden,
            layers,
            heads: 4,
            kv_heads: if decoder { 2 } else { 4 },
            head_dim: if decoder { hidden / 2 } else { hidden / 4 },
            intermediate: hidden * 2,
            window: 8,
            global_every: 2,
        }
    }

    /// The published models' shapes (for benchmarks): ModernBERT-base (gte-modernbert-base),
    /// Qwen3-Embedding-0.6B, EmbeddingGemma-300m.
    pub fn real(family: &str) -> Self {
        match family {
            "modernbert" => RotaryShape {
                hidden: 768,
                layers: 22,
                heads: 12,
                kv_heads: 12,
                head_dim: 64,
                intermediate: 1152,
                window: 128,
                global_every: 3,
            },
            "qwen3" => RotaryShape {
                hidden: 1024,
                layers: 28,
                heads: 16,
                kv_heads: 8,
                head_dim: 128,
                intermediate: 3072,
                window: 0,
                global_every: 1,
            },
            _ => RotaryShape {
                hidden: 768,
                layers: 24,
                heads: 3,
                kv_heads: 1,
                head_dim: 256,
                intermediate: 1152,
                window: 512,
                global_every: 6,
            },
        }
    }
}

/// config.json and weights of a random ModernBERT, Qwen3 or Gemma3 (bidirectional) model.
pub fn random_rotary(
    family: &str,
    shape: RotaryShape,
    vocab: usize,
    max_positions: usize,
    seed: u64,
) -> (serde_json::Value, HashMap<String, Tensor>) {
    let s = shape;
    let (h, hd) = (s.hidden, s.head_dim);
    let mut d = Draw::new(seed);
    match family {
        "modernbert" => {
            d.put("embeddings.tok_embeddings.weight", &[vocab, h], 1.0, 0.0);
            d.put("embeddings.norm.weight", &[h], 0.1, 1.0);
            for l in 0..s.layers {
                let p = format!("layers.{l}");
                if l > 0 {
                    d.put(&format!("{p}.attn_norm.weight"), &[h], 0.1, 1.0);
                }
                d.linear(&format!("{p}.attn.Wqkv"), 3 * s.heads * hd, h);
                d.linear(&format!("{p}.attn.Wo"), h, s.heads * hd);
                d.put(&format!("{p}.mlp_norm.weight"), &[h], 0.1, 1.0);
                d.linear(&format!("{p}.mlp.Wi"), 2 * s.intermediate, h);
                d.linear(&format!("{p}.mlp.Wo"), h, s.intermediate);
            }
            d.put("final_norm.weight", &[h], 0.1, 1.0);
            (modernbert_config(s, vocab, max_positions), d.tensors)
        }
        _ => {
            let gemma = family == "gemma3";
            // Gemma's RMSNorm scales by 1 + w: weights near 0 there, near 1 for Qwen3.
            let norm = if gemma { 0.0 } else { 1.0 };
            d.put(
                "embed_tokens.weight",
                &[vocab, h],
                if gemma { 0.2 } else { 1.0 },
                0.0,
            );
            for l in 0..s.layers {
                let p = format!("layers.{l}");
                d.put(&format!("{p}.input_layernorm.weight"), &[h], 0.1, norm);
                d.put(
                    &format!("{p}.post_attention_layernorm.weight"),
                    &[h],
                    0.1,
                    norm,
                );
                if gemma {
                    d.put(
                        &format!("{p}.pre_feedforward_layernorm.weight"),
                        &[h],
                        0.1,
                        norm,
                    );
                    d.put(
                        &format!("{p}.post_feedforward_layernorm.weight"),
                        &[h],
                        0.1,
                        norm,
                    );
                }
                d.linear(&format!("{p}.self_attn.q_proj"), s.heads * hd, h);
                d.linear(&format!("{p}.self_attn.k_proj"), s.kv_heads * hd, h);
                d.linear(&format!("{p}.self_attn.v_proj"), s.kv_heads * hd, h);
                d.linear(&format!("{p}.self_attn.o_proj"), h, s.heads * hd);
                d.put(&format!("{p}.self_attn.q_norm.weight"), &[hd], 0.1, norm);
                d.put(&format!("{p}.self_attn.k_norm.weight"), &[hd], 0.1, norm);
                d.linear(&format!("{p}.mlp.gate_proj"), s.intermediate, h);
                d.linear(&format!("{p}.mlp.up_proj"), s.intermediate, h);
                d.linear(&format!("{p}.mlp.down_proj"), h, s.intermediate);
            }
            d.put("norm.weight", &[h], 0.1, norm);
            (decoder_config(s, vocab, max_positions, gemma), d.tensors)
        }
    }
}

/// ModernBERT's config.json for `s`.
fn modernbert_config(s: RotaryShape, vocab: usize, max_positions: usize) -> serde_json::Value {
    let h = s.hidden;
    serde_json::json!({
        "architectures": ["ModernBertModel"], "model_type": "modernbert",
        "vocab_size": vocab, "hidden_size": h, "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads, "intermediate_size": s.intermediate,
        "hidden_activation": "gelu", "max_position_embeddings": max_positions,
        "norm_eps": 1e-5, "norm_bias": false, "attention_bias": false,
        "mlp_bias": false, "local_attention": s.window,
        "global_attn_every_n_layers": s.global_every,
        "global_rope_theta": 160000.0, "local_rope_theta": 10000.0,
        "pad_token_id": 0, "bos_token_id": 101, "eos_token_id": 102,
        "cls_token_id": 101, "sep_token_id": 102
    })
}

/// Qwen3's or (with `gemma`) Gemma3's config.json for `s`.
fn decoder_config(
    s: RotaryShape,
    vocab: usize,
    max_positions: usize,
    gemma: bool,
) -> serde_json::Value {
    let (h, hd) = (s.hidden, s.head_dim);
    if gemma {
        let types: Vec<&str> = (0..s.layers)
            .map(|i| {
                if (i + 1) % s.global_every.max(1) == 0 {
                    "full_attention"
                } else {
                    "sliding_attention"
                }
            })
            .collect();
        serde_json::json!({
            "architectures": ["Gemma3TextModel"], "model_type": "gemma3_text",
            "vocab_size": vocab, "hidden_size": h, "num_hidden_layers": s.layers,
            "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads,
            "head_dim": hd, "intermediate_size": s.intermediate,
            "hidden_activation": "gelu_pytorch_tanh",
            "max_position_embeddings": max_positions, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
            "sliding_window": s.window, "layer_types": types,
            "query_pre_attn_scalar": hd + hd / 2,
            "use_bidirectional_attention": true, "attention_bias": false,
            "pad_token_id": 0, "bos_token_id": 101, "eos_token_id": 102,
            "tie_word_embeddings": true
        })
    } else {
        serde_json::json!({
            "architectures": ["Qwen3Model"], "model_type": "qwen3",
            "vocab_size": vocab, "hidden_size": h, "num_hidden_layers": s.layers,
            "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads,
            "head_dim": hd, "intermediate_size": s.intermediate, "hidden_act": "silu",
            "max_position_embeddings": max_positions, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "rope_scaling": null, "use_sliding_window": false,
            "attention_bias": false, "tie_word_embeddings": true,
            "pad_token_id": 0, "bos_token_id": 101, "eos_token_id": 102
        })
    }
}
