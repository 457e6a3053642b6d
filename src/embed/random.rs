//! Random-weight BERT models in the Hugging Face layout: a model of any size and dimension
//! that loads and runs like a real one, for tests (a second model to migrate an index to)
//! and benchmarks. Its vectors mean nothing; its tokenizer and sentence-transformers settings
//! are copied from a real model folder.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};

use super::EmbedError;

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

    /// Weights named as candle-transformers' BERT loads them, deterministic in `seed`.
    pub fn weights(&self) -> HashMap<String, Tensor> {
        let dev = Device::Cpu;
        let (h, i) = (self.hidden, self.intermediate);
        let mut t = HashMap::new();
        // xorshift: deterministic weights without a seeded RNG.
        let mut state = self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut put = |name: &str, shape: &[usize], scale: f32, offset: f32| {
            let count: usize = shape.iter().product();
            let values: Vec<f32> = (0..count)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    offset
                        + ((state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32
                            * scale
                            * 1.7
                })
                .collect();
            t.insert(
                name.to_string(),
                Tensor::from_vec(values, shape, &dev).expect("shape and length agree"),
            );
        };
        put(
            "embeddings.word_embeddings.weight",
            &[self.vocab, h],
            1.0,
            0.0,
        );
        put(
            "embeddings.position_embeddings.weight",
            &[self.positions, h],
            0.5,
            0.0,
        );
        put("embeddings.token_type_embeddings.weight", &[2, h], 0.5, 0.0);
        // LayerNorm weights near 1, as trained models have them.
        put("embeddings.LayerNorm.weight", &[h], 0.1, 1.0);
        put("embeddings.LayerNorm.bias", &[h], 0.1, 0.0);
        for l in 0..self.layers {
            let pre = format!("encoder.layer.{l}");
            for name in ["query", "key", "value"] {
                put(
                    &format!("{pre}.attention.self.{name}.weight"),
                    &[h, h],
                    0.3,
                    0.0,
                );
                put(&format!("{pre}.attention.self.{name}.bias"), &[h], 0.1, 0.0);
            }
            put(
                &format!("{pre}.attention.output.dense.weight"),
                &[h, h],
                0.3,
                0.0,
            );
            put(
                &format!("{pre}.attention.output.dense.bias"),
                &[h],
                0.1,
                0.0,
            );
            put(
                &format!("{pre}.attention.output.LayerNorm.weight"),
                &[h],
                0.1,
                1.0,
            );
            put(
                &format!("{pre}.attention.output.LayerNorm.bias"),
                &[h],
                0.1,
                0.0,
            );
            put(
                &format!("{pre}.intermediate.dense.weight"),
                &[i, h],
                0.3,
                0.0,
            );
            put(&format!("{pre}.intermediate.dense.bias"), &[i], 0.1, 0.0);
            put(&format!("{pre}.output.dense.weight"), &[h, i], 0.3, 0.0);
            put(&format!("{pre}.output.dense.bias"), &[h], 0.1, 0.0);
            put(&format!("{pre}.output.LayerNorm.weight"), &[h], 0.1, 1.0);
            put(&format!("{pre}.output.LayerNorm.bias"), &[h], 0.1, 0.0);
        }
        t
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
pub const RANDOM_FAMILIES: &[&str] = &["bert", "xlm-roberta", "distilbert", "mpnet"];

/// Write a random-weight model of `family` (one of [`RANDOM_FAMILIES`]) in the Hugging Face
/// and sentence-transformers layout, with the tokenizer of the model folder `base`. Each
/// family's folder also exercises a part of the sentence-transformers layout:
/// - `bert`: `base`'s own modules (mean pooling, Normalize for MiniLM);
/// - `xlm-roberta`: the layout sentence-transformers 5-6 writes (`pooling_mode`,
///   `embedding_dimension`), e5's prompts ("query: ", "passage: ") and Normalize;
/// - `distilbert`: CLS pooling, a Dense layer (tanh, to 3/4 of the hidden size), Normalize;
/// - `mpnet`: mean pooling without the prompt (`include_prompt: false`), named prompts with a
///   `default_prompt_name`, no normalisation.
pub fn save_random_family(
    base: &Path,
    out: &Path,
    family: &str,
    hidden: usize,
    layers: usize,
    seed: u64,
) -> Result<(), EmbedError> {
    if !RANDOM_FAMILIES.contains(&family) {
        return Err(EmbedError::Unsupported(format!(
            "no random model of family `{family}`; families: {}",
            RANDOM_FAMILIES.join(", ")
        )));
    }
    let io = |path: &Path, e: std::io::Error| EmbedError::ModelFile {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    std::fs::create_dir_all(out.join("1_Pooling")).map_err(|e| io(out, e))?;
    let base_config: serde_json::Value = std::fs::read(base.join("config.json"))
        .map_err(|e| io(&base.join("config.json"), e))
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
    let shape = RandomBert {
        vocab: number("vocab_size", 30522),
        hidden,
        layers,
        heads: if hidden.is_multiple_of(4) { 4 } else { 1 },
        intermediate: hidden * 2,
        positions: number("max_position_embeddings", 512) + offset,
        seed,
    };
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
            std::fs::copy(&from, out.join(file)).map_err(|e| io(&from, e))?;
        }
    }
    let write_json = |path: &Path, v: &serde_json::Value| {
        std::fs::write(path, serde_json::to_vec_pretty(v).expect("JSON")).map_err(|e| io(path, e))
    };
    let old_pooling = |mode: &str| {
        serde_json::json!({
            "word_embedding_dimension": hidden,
            "pooling_mode_cls_token": mode == "cls",
            "pooling_mode_mean_tokens": mode == "mean",
            "pooling_mode_max_tokens": false,
            "pooling_mode_mean_sqrt_len_tokens": false
        })
    };
    let module = |idx: usize, path: &str, kind: &str| {
        serde_json::json!({"idx": idx, "name": idx.to_string(), "path": path,
                           "type": format!("sentence_transformers.models.{kind}")})
    };
    let mut weights = shape.weights();
    let mut config = shape.config();
    match family {
        "bert" => write_json(&out.join("1_Pooling/config.json"), &old_pooling("mean"))?,
        "xlm-roberta" => {
            config["model_type"] = "xlm-roberta".into();
            config["architectures"] = serde_json::json!(["XLMRobertaModel"]);
            config["type_vocab_size"] = 1.into();
            config["layer_norm_eps"] = 1e-5.into();
            config["pad_token_id"] = 1.into();
            let types = weights["embeddings.token_type_embeddings.weight"]
                .narrow(0, 0, 1)
                .expect("two token types");
            weights.insert("embeddings.token_type_embeddings.weight".into(), types);
            write_json(
                &out.join("1_Pooling/config.json"),
                &serde_json::json!({"embedding_dimension": hidden, "pooling_mode": "mean",
                                    "include_prompt": true}),
            )?;
            write_json(
                &out.join("modules.json"),
                &serde_json::json!([
                    module(0, "", "Transformer"),
                    module(1, "1_Pooling", "Pooling"),
                    module(2, "2_Normalize", "Normalize")
                ]),
            )?;
            write_json(
                &out.join("config_sentence_transformers.json"),
                &serde_json::json!({"prompts": {"query": "query: ", "document": "passage: "},
                                    "default_prompt_name": null,
                                    "similarity_fn_name": "cosine"}),
            )?;
        }
        "distilbert" => {
            config = serde_json::json!({
                "architectures": ["DistilBertModel"], "model_type": "distilbert",
                "vocab_size": shape.vocab, "dim": hidden, "n_layers": layers,
                "n_heads": shape.heads, "hidden_dim": shape.intermediate,
                "activation": "gelu", "max_position_embeddings": shape.positions,
                "pad_token_id": 0, "sinusoidal_pos_embds": false, "dropout": 0.1,
                "attention_dropout": 0.1, "initializer_range": 0.02,
                "tie_weights_": true
            });
            weights = rename_weights(weights, family, layers);
            write_json(&out.join("1_Pooling/config.json"), &old_pooling("cls"))?;
            let dense = hidden * 3 / 4;
            let dense_dir = out.join("2_Dense");
            std::fs::create_dir_all(&dense_dir).map_err(|e| io(&dense_dir, e))?;
            write_json(
                &dense_dir.join("config.json"),
                &serde_json::json!({"in_features": hidden, "out_features": dense, "bias": true,
                                    "activation_function": "torch.nn.modules.activation.Tanh"}),
            )?;
            let extra = RandomBert {
                seed: seed ^ 0xD15E,
                ..shape
            }
            .matrix(dense, hidden);
            candle_core::safetensors::save(
                &HashMap::from([
                    ("linear.weight".to_string(), extra.0),
                    ("linear.bias".to_string(), extra.1),
                ]),
                dense_dir.join("model.safetensors"),
            )?;
            write_json(
                &out.join("modules.json"),
                &serde_json::json!([
                    module(0, "", "Transformer"),
                    module(1, "1_Pooling", "Pooling"),
                    module(2, "2_Dense", "Dense"),
                    module(3, "3_Normalize", "Normalize")
                ]),
            )?;
        }
        "mpnet" => {
            config["model_type"] = "mpnet".into();
            config["architectures"] = serde_json::json!(["MPNetModel"]);
            config["layer_norm_eps"] = 1e-5.into();
            config["relative_attention_num_buckets"] = 32.into();
            config["pad_token_id"] = 1.into();
            if let Some(c) = config.as_object_mut() {
                c.remove("type_vocab_size");
            }
            weights = rename_weights(weights, family, layers);
            let bias = RandomBert {
                seed: seed ^ 0xB1A5,
                ..shape
            }
            .matrix(32, shape.heads);
            weights.insert("encoder.relative_attention_bias.weight".into(), bias.0);
            write_json(
                &out.join("1_Pooling/config.json"),
                &serde_json::json!({"embedding_dimension": hidden, "pooling_mode": "mean",
                                    "include_prompt": false}),
            )?;
            write_json(
                &out.join("modules.json"),
                &serde_json::json!([
                    module(0, "", "Transformer"),
                    module(1, "1_Pooling", "Pooling")
                ]),
            )?;
            write_json(
                &out.join("config_sentence_transformers.json"),
                &serde_json::json!({"prompts": {"query": "search_query: ",
                                                "document": "search_document: ",
                                                "classification": "classification: "},
                                    "default_prompt_name": "classification",
                                    "similarity_fn_name": "cosine"}),
            )?;
        }
        _ => unreachable!("checked above"),
    }
    write_json(&out.join("config.json"), &config)?;
    candle_core::safetensors::save(&weights, out.join("model.safetensors"))?;
    Ok(())
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
