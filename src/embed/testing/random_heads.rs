//! Random-weight task models in the Hugging Face layout: cross-encoders (a sequence
//! classification head on BERT, XLM-RoBERTa or ModernBERT) and a SPLADE model (BERT with its
//! masked-language-model head), for the parity tests against sentence-transformers'
//! `CrossEncoder` and `SparseEncoder` and for timing. Their scores mean nothing.

use std::collections::HashMap;
use std::path::Path;

use candle_core::Tensor;

use crate::embed::random::{random_rotary, RandomBert, RotaryShape};
use crate::embed::EmbedError;

/// The families a random cross-encoder may have.
pub const RERANKER_FAMILIES: &[&str] = &["bert", "xlm-roberta", "modernbert"];

/// A random matrix [rows, cols] scaled for a layer of `cols` inputs, and a bias [rows].
fn layer(shape: &RandomBert, salt: u64, rows: usize, cols: usize) -> (Tensor, Tensor) {
    let (w, b) = RandomBert {
        seed: shape.seed ^ salt,
        ..*shape
    }
    .matrix(rows, cols);
    let w = (w * (2.0 / (cols as f64).sqrt())).expect("a scalar product");
    (w, b)
}

/// The tokenizer files of `base`, copied.
fn copy_tokenizer(base: &Path, out: &Path) -> Result<(), EmbedError> {
    std::fs::create_dir_all(out).map_err(|e| io_error(out, e))?;
    for file in [
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "vocab.txt",
    ] {
        let from = base.join(file);
        if from.is_file() {
            std::fs::copy(&from, out.join(file)).map_err(|e| io_error(&from, e))?;
        }
    }
    Ok(())
}

fn io_error(path: &Path, e: std::io::Error) -> EmbedError {
    EmbedError::ModelFile {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

fn write_json(path: &Path, v: &serde_json::Value) -> Result<(), EmbedError> {
    std::fs::write(path, serde_json::to_vec_pretty(v).expect("JSON")).map_err(|e| io_error(path, e))
}

/// Make the copied BERT tokenizer put pairs as RoBERTa's does: `[CLS] A [SEP] [SEP] B [SEP]`,
/// every token of type 0 (XLM-RoBERTa has one token type).
fn roberta_pairs(out: &Path) -> Result<(), EmbedError> {
    let path = out.join("tokenizer.json");
    let bad = |reason: String| EmbedError::ModelFile {
        path: path.clone(),
        reason,
    };
    let raw = std::fs::read(&path).map_err(|e| bad(e.to_string()))?;
    let mut t: serde_json::Value = serde_json::from_slice(&raw).map_err(|e| bad(e.to_string()))?;
    let special = |id: &str| serde_json::json!({"SpecialToken": {"id": id, "type_id": 0}});
    let seq = |id: &str| serde_json::json!({"Sequence": {"id": id, "type_id": 0}});
    t["post_processor"] = serde_json::json!({
        "type": "TemplateProcessing",
        "single": [special("[CLS]"), seq("A"), special("[SEP]")],
        "pair": [special("[CLS]"), seq("A"), special("[SEP]"), special("[SEP]"), seq("B"),
                 special("[SEP]")],
        "special_tokens": {
            "[CLS]": {"id": "[CLS]", "ids": [101], "tokens": ["[CLS]"]},
            "[SEP]": {"id": "[SEP]", "ids": [102], "tokens": ["[SEP]"]}
        }
    });
    std::fs::write(&path, serde_json::to_vec(&t).expect("JSON")).map_err(|e| bad(e.to_string()))?;
    // transformers' BertTokenizer class would put its own template back: the generic fast
    // tokenizer reads tokenizer.json as it is.
    let config = out.join("tokenizer_config.json");
    let mut c: serde_json::Value = std::fs::read(&config)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| serde_json::json!({}));
    c["tokenizer_class"] = "PreTrainedTokenizerFast".into();
    write_json(&config, &c)
}

/// The vocabulary size of `base`'s config.json (30522 when it names none).
fn base_vocab(base: &Path) -> usize {
    std::fs::read(base.join("config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|c| c.get("vocab_size").and_then(|v| v.as_u64()))
        .map_or(30522, |v| v as usize)
}

/// A BERT-like random shape of `hidden` and `layers` (4 heads where they divide it).
fn bert_shape(
    base: &Path,
    hidden: usize,
    layers: usize,
    positions: usize,
    seed: u64,
) -> RandomBert {
    RandomBert {
        vocab: base_vocab(base),
        hidden,
        layers,
        heads: if hidden.is_multiple_of(4) { 4 } else { 1 },
        intermediate: hidden * 2,
        positions,
        seed,
    }
}

fn prefixed(weights: HashMap<String, Tensor>, prefix: &str) -> HashMap<String, Tensor> {
    weights
        .into_iter()
        .map(|(k, v)| (format!("{prefix}.{k}"), v))
        .collect()
}

/// Write a random one-label cross-encoder of `family` (one of [`RERANKER_FAMILIES`]) with
/// `base`'s tokenizer into `out`. Each exercises another part of how sentence-transformers
/// reads one: `bert` token types and the activation where sentence-transformers 6 records it
/// (config_sentence_transformers.json); `xlm-roberta` the activation
/// recorded the old way (`sbert_ce_default_activation_function`: Identity); `modernbert` mean
/// pooling in its head and the activation where versions 4-5 record it (config.json's
/// `sentence_transformers`).
pub fn save_random_reranker(
    base: &Path,
    out: &Path,
    family: &str,
    hidden: usize,
    layers: usize,
    seed: u64,
) -> Result<(), EmbedError> {
    copy_tokenizer(base, out)?;
    let labels = serde_json::json!({"0": "LABEL_0"});
    let (config, weights) = match family {
        "bert" | "xlm-roberta" => {
            let roberta = family == "xlm-roberta";
            let shape = bert_shape(
                base,
                hidden,
                layers,
                512 + if roberta { 2 } else { 0 },
                seed,
            );
            let mut config = shape.config();
            let mut w = shape.weights();
            let h = hidden;
            if roberta {
                config["model_type"] = "xlm-roberta".into();
                config["architectures"] =
                    serde_json::json!(["XLMRobertaForSequenceClassification"]);
                config["type_vocab_size"] = 1.into();
                config["layer_norm_eps"] = 1e-5.into();
                config["pad_token_id"] = 1.into();
                config["sbert_ce_default_activation_function"] =
                    "torch.nn.modules.linear.Identity".into();
                let types = w["embeddings.token_type_embeddings.weight"]
                    .narrow(0, 0, 1)
                    .expect("two token types");
                w.insert("embeddings.token_type_embeddings.weight".into(), types);
                roberta_pairs(out)?;
                let mut w = prefixed(w, "roberta");
                let (dw, db) = layer(&shape, 0xC1A5, h, h);
                let (ow, ob) = layer(&shape, 0x0F7, 1, h);
                w.insert("classifier.dense.weight".into(), dw);
                w.insert("classifier.dense.bias".into(), db);
                w.insert("classifier.out_proj.weight".into(), ow);
                w.insert("classifier.out_proj.bias".into(), ob);
                (config, w)
            } else {
                config["architectures"] = serde_json::json!(["BertForSequenceClassification"]);
                // sentence-transformers 6 records the activation beside the modules.
                write_json(
                    &out.join("config_sentence_transformers.json"),
                    &serde_json::json!({"model_type": "CrossEncoder", "prompts": {},
                                        "default_prompt_name": null,
                                        "activation_fn": "torch.nn.modules.activation.Sigmoid"}),
                )?;
                let mut w = prefixed(w, "bert");
                let (pw, pb) = layer(&shape, 0x9001, h, h);
                let (cw, cb) = layer(&shape, 0xC1A5, 1, h);
                w.insert("bert.pooler.dense.weight".into(), pw);
                w.insert("bert.pooler.dense.bias".into(), pb);
                w.insert("classifier.weight".into(), cw);
                w.insert("classifier.bias".into(), cb);
                (config, w)
            }
        }
        "modernbert" => {
            let rotary = RotaryShape::small("modernbert", hidden, layers);
            let (mut config, w) = random_rotary("modernbert", rotary, base_vocab(base), 8192, seed);
            let h = rotary.hidden;
            config["architectures"] = serde_json::json!(["ModernBertForSequenceClassification"]);
            config["classifier_pooling"] = "mean".into();
            config["classifier_activation"] = "gelu".into();
            config["sentence_transformers"] =
                serde_json::json!({"activation_fn": "torch.nn.modules.activation.Sigmoid"});
            let shape = bert_shape(base, h, layers, 512, seed);
            let mut w = prefixed(w, "model");
            let (dw, _) = layer(&shape, 0xDE45E, h, h);
            let (nw, _) = layer(&shape, 0x4042, 1, h);
            let (cw, cb) = layer(&shape, 0xC1A5, 1, h);
            w.insert("head.dense.weight".into(), dw);
            w.insert(
                "head.norm.weight".into(),
                nw.flatten_all()
                    .expect("a row")
                    .affine(0.1, 1.0)
                    .expect("a scalar sum"),
            );
            w.insert("classifier.weight".into(), cw);
            w.insert("classifier.bias".into(), cb);
            (config, w)
        }
        _ => {
            return Err(EmbedError::Unsupported(format!(
                "no random cross-encoder of family `{family}`; families: {}",
                RERANKER_FAMILIES.join(", ")
            )))
        }
    };
    let mut config = config;
    config["id2label"] = labels;
    config["label2id"] = serde_json::json!({"LABEL_0": 0});
    write_json(&out.join("config.json"), &config)?;
    candle_core::safetensors::save(&weights, out.join("model.safetensors"))?;
    Ok(())
}

/// Write a random SPLADE model (BERT with its masked-language-model head, the decoder tied to
/// the word embeddings, sentence-transformers' `SpladePooling` module: max, relu) with
/// `base`'s tokenizer into `out`. The head's bias leans negative, as trained SPLADE models'
/// logits do, so most of the vocabulary stays zero.
pub fn save_random_splade(
    base: &Path,
    out: &Path,
    hidden: usize,
    layers: usize,
    seed: u64,
) -> Result<(), EmbedError> {
    copy_tokenizer(base, out)?;
    let shape = bert_shape(base, hidden, layers, 512, seed);
    let mut config = shape.config();
    config["architectures"] = serde_json::json!(["BertForMaskedLM"]);
    config["tie_word_embeddings"] = true.into();
    let mut w = prefixed(shape.weights(), "bert");
    let h = hidden;
    let (tw, tb) = layer(&shape, 0x7A5F, h, h);
    w.insert("cls.predictions.transform.dense.weight".into(), tw);
    w.insert("cls.predictions.transform.dense.bias".into(), tb);
    let (nw, _) = layer(&shape, 0x4042, 1, h);
    w.insert(
        "cls.predictions.transform.LayerNorm.weight".into(),
        nw.flatten_all()
            .expect("a row")
            .affine(0.1, 1.0)
            .expect("a scalar sum"),
    );
    w.insert(
        "cls.predictions.transform.LayerNorm.bias".into(),
        (layer(&shape, 0xBEEF, 1, h).0.flatten_all().expect("a row") * 0.1).expect("a product"),
    );
    let vocab = shape.vocab;
    let (_, bias) = layer(&shape, 0xB1A5, vocab, 1);
    w.insert(
        "cls.predictions.bias".into(),
        bias.affine(10.0, -20.0).expect("a scalar product"),
    );
    write_json(&out.join("config.json"), &config)?;
    candle_core::safetensors::save(&w, out.join("model.safetensors"))?;
    // The layout sentence-transformers 6 saves a SparseEncoder in.
    write_json(
        &out.join("modules.json"),
        &serde_json::json!([
            {"idx": 0, "name": "0", "path": "",
             "type": "sentence_transformers.base.modules.transformer.Transformer"},
            {"idx": 1, "name": "1", "path": "1_SpladePooling",
             "type": "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling"}
        ]),
    )?;
    write_json(
        &out.join("config_sentence_transformers.json"),
        &serde_json::json!({"model_type": "SparseEncoder", "prompts": {"query": "", "document": ""},
                            "default_prompt_name": null, "similarity_fn_name": "dot"}),
    )?;
    write_json(
        &out.join("sentence_bert_config.json"),
        &serde_json::json!({"transformer_task": "fill-mask",
                            "modality_config": {"text": {"method": "forward",
                                                         "method_output_name": "logits"}},
                            "module_output_name": "token_embeddings"}),
    )?;
    std::fs::create_dir_all(out.join("1_SpladePooling"))
        .map_err(|e| io_error(&out.join("1_SpladePooling"), e))?;
    write_json(
        &out.join("1_SpladePooling/config.json"),
        &serde_json::json!({"pooling_strategy": "max", "activation_function": "relu",
                            "embedding_dimension": vocab}),
    )?;
    Ok(())
}

/// The families a random sequence or token classifier may have.
pub const CLASSIFIER_FAMILIES: &[&str] = &[
    "bert",
    "xlm-roberta",
    "distilbert",
    "mpnet",
    "modernbert",
    "qwen3",
    "gemma3",
];

/// The tags of a random token classifier (CoNLL-2003's).
pub const NER_LABELS: &[&str] = &[
    "O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC",
];

/// The labels of a random sequence classifier.
pub const TOPIC_LABELS: &[&str] = &["world", "sports", "business", "science"];

/// Which head a random classifier gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClassifierTask {
    /// `*ForTokenClassification` with [`NER_LABELS`].
    Token,
    /// `*ForSequenceClassification` with [`TOPIC_LABELS`], single-label (softmax).
    Sequence,
    /// The same, `problem_type: multi_label_classification` (a sigmoid per label).
    MultiLabel,
}

/// The shape of a random classifier.
#[derive(Clone, Copy, Debug)]
pub struct RandomClassifier<'a> {
    /// One of [`CLASSIFIER_FAMILIES`].
    pub family: &'a str,
    pub task: ClassifierTask,
    pub hidden: usize,
    pub layers: usize,
    pub seed: u64,
    /// The tokenizer's `model_max_length`.
    pub max_len: usize,
    /// BERT-base's shape (ModernBERT-base's), not `hidden` and `layers`.
    pub real_shape: bool,
}

/// Write a random-weight classifier of `family` (one of [`CLASSIFIER_FAMILIES`]) in the
/// Hugging Face layout transformers' pipelines read: the family's random encoder
/// ([`save_random_family`]) under the head's prefix, the head's weights, config.json's
/// `architectures`, `id2label` and `label2id`, and the tokenizer with a `model_max_length` of
/// `max_len` (short, so that windows and truncation are exercised). The token classifier's
/// bias leans to `O`, as trained ones do, so that some texts have no entity.
pub fn save_random_classifier(
    base: &Path,
    out: &Path,
    model: &RandomClassifier<'_>,
) -> Result<(), EmbedError> {
    random_encoder(base, out, model)?;
    let config_path = out.join("config.json");
    let mut config: serde_json::Value = std::fs::read(&config_path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| io_error(&config_path, std::io::Error::other("unreadable")))?;
    let weights_path = out.join("model.safetensors");
    let encoder = candle_core::safetensors::load(&weights_path, &candle_core::Device::Cpu)?;
    let (prefix, arch) = match model.family {
        "bert" => ("bert", "Bert"),
        "xlm-roberta" => ("roberta", "XLMRoberta"),
        "distilbert" => ("distilbert", "DistilBert"),
        "mpnet" => ("mpnet", "MPNet"),
        "qwen3" => ("model", "Qwen3"),
        "gemma3" => ("model", "Gemma3Text"),
        _ => ("model", "ModernBert"),
    };
    let mut w = prefixed(encoder, prefix);
    let h = config
        .get("hidden_size")
        .or_else(|| config.get("dim"))
        .and_then(|v| v.as_u64())
        .map_or(model.hidden, |v| v as usize);
    let shape = bert_shape(base, h, model.layers, 512, model.seed);
    add_classifier_head(model, &shape, &mut w, &mut config)?;
    label_config(model.task, arch, &mut config);
    write_json(&config_path, &config)?;
    candle_core::safetensors::save(&w, &weights_path)?;
    let tc_path = out.join("tokenizer_config.json");
    let mut tc: serde_json::Value = std::fs::read(&tc_path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| serde_json::json!({}));
    tc["model_max_length"] = model.max_len.into();
    write_json(&tc_path, &tc)
}

/// The classifier's random encoder ([`save_random_family`]) without the sentence-transformers
/// files (pipelines do not read them).
fn random_encoder(base: &Path, out: &Path, model: &RandomClassifier<'_>) -> Result<(), EmbedError> {
    let family = model.family;
    if !CLASSIFIER_FAMILIES.contains(&family) {
        return Err(EmbedError::Unsupported(format!(
            "no random classifier of family `{family}`; families: {}",
            CLASSIFIER_FAMILIES.join(", ")
        )));
    }
    if matches!(family, "qwen3" | "gemma3") && model.task == ClassifierTask::Token {
        return Err(EmbedError::Unsupported(format!(
            "no random {family} token classifier: the decoders classify sequences"
        )));
    }
    crate::embed::random::save_random_family_with(
        base,
        out,
        family,
        model.hidden,
        model.layers,
        model.seed,
        crate::embed::random::RandomOptions {
            max_seq_length: None,
            real_shape: model.real_shape,
        },
    )?;
    for leftover in [
        "modules.json",
        "sentence_bert_config.json",
        "config_sentence_transformers.json",
    ] {
        let _ = std::fs::remove_file(out.join(leftover));
    }
    for dir in ["1_Pooling", "2_Dense", "2_Normalize", "3_Dense", "4_Dense"] {
        let _ = std::fs::remove_dir_all(out.join(dir));
    }
    Ok(())
}

/// The head's random weights under transformers' names (and ModernBERT's head settings).
fn add_classifier_head(
    model: &RandomClassifier<'_>,
    shape: &RandomBert,
    w: &mut HashMap<String, Tensor>,
    config: &mut serde_json::Value,
) -> Result<(), EmbedError> {
    let (family, task, h) = (model.family, model.task, shape.hidden);
    let n = labels_of(task).len();
    let insert = |w: &mut HashMap<String, Tensor>, name: &str, (weight, bias): (Tensor, Tensor)| {
        w.insert(format!("{name}.weight"), weight);
        w.insert(format!("{name}.bias"), bias);
    };
    if family == "modernbert" {
        let (dw, _) = layer(shape, 0xDE45E, h, h);
        w.insert("head.dense.weight".into(), dw);
        let (nw, _) = layer(shape, 0x4042, 1, h);
        w.insert(
            "head.norm.weight".into(),
            nw.flatten_all()
                .expect("a row")
                .affine(0.1, 1.0)
                .expect("a scalar sum"),
        );
        config["classifier_pooling"] = "mean".into();
        config["classifier_activation"] = "gelu".into();
    } else if matches!(family, "qwen3" | "gemma3") {
        // A decoder's head is `score` alone, without a bias, on the last token; Gemma3's
        // classifier reads its text causally, as a decoder (EmbeddingGemma's is
        // bidirectional).
        if family == "gemma3" {
            config["use_bidirectional_attention"] = false.into();
        }
    } else if task != ClassifierTask::Token {
        match family {
            "bert" => insert(w, "bert.pooler.dense", layer(shape, 0x9001, h, h)),
            "distilbert" => insert(w, "pre_classifier", layer(shape, 0x9001, h, h)),
            _ => insert(w, "classifier.dense", layer(shape, 0x9001, h, h)),
        }
    }
    let (cw, cb) = layer(shape, 0xC1A5, n, h);
    let (cw, cb) = if task == ClassifierTask::Token {
        // Decisive tags, `O` ahead by 3.5: most tokens are outside any entity.
        let lean: Vec<f32> = (0..n).map(|i| if i == 0 { 3.5 } else { 0.0 }).collect();
        (
            (cw * 4.0)?,
            (cb + Tensor::new(lean.as_slice(), &candle_core::Device::Cpu)?)?,
        )
    } else {
        (cw, cb)
    };
    if matches!(family, "qwen3" | "gemma3") {
        w.insert("score.weight".into(), cw);
    } else if task != ClassifierTask::Token && matches!(family, "xlm-roberta" | "mpnet") {
        insert(w, "classifier.out_proj", (cw, cb));
    } else {
        insert(w, "classifier", (cw, cb));
    }
    Ok(())
}

fn labels_of(task: ClassifierTask) -> &'static [&'static str] {
    match task {
        ClassifierTask::Token => NER_LABELS,
        _ => TOPIC_LABELS,
    }
}

/// config.json's architecture, `id2label`, `label2id` and (multi-label) `problem_type`.
fn label_config(task: ClassifierTask, arch: &str, config: &mut serde_json::Value) {
    let labels = labels_of(task);
    let kind = match task {
        ClassifierTask::Token => "TokenClassification",
        _ => "SequenceClassification",
    };
    config["architectures"] = serde_json::json!([format!("{arch}For{kind}")]);
    config["id2label"] = labels
        .iter()
        .enumerate()
        .map(|(i, l)| (i.to_string(), serde_json::Value::from(*l)))
        .collect::<serde_json::Map<_, _>>()
        .into();
    config["label2id"] = labels
        .iter()
        .enumerate()
        .map(|(i, l)| (l.to_string(), serde_json::Value::from(i)))
        .collect::<serde_json::Map<_, _>>()
        .into();
    if task == ClassifierTask::MultiLabel {
        config["problem_type"] = "multi_label_classification".into();
    }
}
