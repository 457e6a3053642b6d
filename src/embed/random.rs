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
    let shape = RandomBert {
        vocab: number("vocab_size", 30522),
        hidden,
        layers,
        heads: if hidden.is_multiple_of(4) { 4 } else { 1 },
        intermediate: hidden * 2,
        positions: number("max_position_embeddings", 512),
        seed,
    };
    for file in [
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "vocab.txt",
        "modules.json",
        "sentence_bert_config.json",
        "config_sentence_transformers.json",
    ] {
        let from = base.join(file);
        if from.is_file() {
            std::fs::copy(&from, out.join(file)).map_err(|e| io(&from, e))?;
        }
    }
    let pooling = serde_json::json!({
        "word_embedding_dimension": hidden,
        "pooling_mode_cls_token": false,
        "pooling_mode_mean_tokens": true,
        "pooling_mode_max_tokens": false,
        "pooling_mode_mean_sqrt_len_tokens": false
    });
    let write_json = |path: &Path, v: &serde_json::Value| {
        std::fs::write(path, serde_json::to_vec_pretty(v).expect("JSON")).map_err(|e| io(path, e))
    };
    write_json(&out.join("1_Pooling/config.json"), &pooling)?;
    write_json(&out.join("config.json"), &shape.config())?;
    candle_core::safetensors::save(&shape.weights(), out.join("model.safetensors"))?;
    Ok(())
}
