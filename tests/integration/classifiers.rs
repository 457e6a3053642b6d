//! Token and sequence classifiers against transformers' `token-classification` and
//! `text-classification` pipelines: random-weight models of each family (written by `ragline
//! random-model --task ner|classify|classify-multi`, the same bytes the reference saw;
//! tests/fixtures/classifiers, made by scripts/reference-classifiers.py), on every CPU kernel
//! path and on the candle path.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use ragline::embed::classify::{LabelChoice, SequenceClassifier};
use ragline::embed::ner::aggregate::Aggregation;
use ragline::embed::ner::{NerOptions, TokenClassifier};
use ragline::embed::random_heads::{save_random_classifier, ClassifierTask, RandomClassifier};
use ragline::embed::ModelFiles;
use serde_json::Value;

use crate::embedding::kernel_paths;
use crate::rerankers::fixtures;
use crate::util::{model_dir, ragline, read_jsonl, run};

const NER_FAMILIES: [&str; 4] = ["bert", "xlm-roberta", "distilbert", "modernbert"];
const CLASSIFY: [&str; 8] = [
    "classify-bert",
    "classify-xlm-roberta",
    "classify-distilbert",
    "classify-mpnet",
    "classify-modernbert",
    "classify-qwen3",
    "classify-gemma3",
    "classify-multi-bert",
];

/// The families on candle ops on every device (one CPU run each is enough).
fn rotary(fixture: &str) -> bool {
    fixture.ends_with("modernbert") || fixture.ends_with("qwen3") || fixture.ends_with("gemma3")
}
const STRATEGIES: [&str; 5] = ["none", "simple", "first", "average", "max"];

/// The word after `flag` in a recorded `ragline random-model ...` command.
fn flag<'a>(command: &'a str, flag: &str) -> &'a str {
    let words: Vec<&str> = command.split_whitespace().collect();
    let at = words.iter().position(|w| *w == flag).unwrap();
    words[at + 1]
}

/// Write the model `fixture`'s reference.json recorded, and check it is the same bytes.
fn model_of(fixture: &str, out: &Path) -> PathBuf {
    let reference = fixtures("classifiers").join(fixture);
    let meta: Value =
        serde_json::from_slice(&fs::read(reference.join("reference.json")).unwrap()).unwrap();
    let command = meta["command"].as_str().unwrap();
    let number = |f: &str| flag(command, f).parse::<usize>().unwrap();
    let task = match flag(command, "--task") {
        "ner" => ClassifierTask::Token,
        "classify" => ClassifierTask::Sequence,
        _ => ClassifierTask::MultiLabel,
    };
    save_random_classifier(
        &model_dir(),
        out,
        &RandomClassifier {
            family: flag(command, "--family"),
            task,
            hidden: number("--hidden"),
            layers: number("--layers"),
            seed: number("--seed") as u64,
            max_len: number("--max-len"),
            real_shape: false,
        },
    )
    .unwrap();
    let o = run(std::process::Command::new("sha256sum").arg(out.join("model.safetensors")));
    let sha = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        sha.split_whitespace().next().unwrap(),
        meta["weights_sha256"].as_str().unwrap(),
        "{fixture}: ragline no longer writes the weights the reference was computed on; rerun \
         scripts/reference-classifiers.py"
    );
    out.to_path_buf()
}

fn texts() -> Vec<String> {
    read_jsonl(&fixtures("classifiers/texts.jsonl"))
        .into_iter()
        .map(|v| v["text"].as_str().unwrap().to_string())
        .collect()
}

/// The reference's entities per strategy, per text.
fn reference_entities(family: &str) -> HashMap<String, Vec<Vec<Value>>> {
    let path = fixtures("classifiers").join(format!("ner-{family}/entities.json.gz"));
    let v: Value =
        serde_json::from_reader(flate2::read::GzDecoder::new(fs::File::open(path).unwrap()))
            .unwrap();
    serde_json::from_value(v["entities"].clone()).unwrap()
}

/// Our entities of one text equal the pipeline's: the same fields, spans, labels and words,
/// scores within 1e-4. The largest score difference.
fn same_entities(what: &str, text: usize, ours: &[Value], theirs: &[Value]) -> f64 {
    let spans = |v: &[Value]| -> Vec<(String, String, u64, u64)> {
        v.iter()
            .map(|e| {
                let label = e.get("entity_group").or_else(|| e.get("entity")).unwrap();
                (
                    label.as_str().unwrap().to_string(),
                    e["word"].as_str().unwrap().to_string(),
                    e["start"].as_u64().unwrap(),
                    e["end"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    assert_eq!(spans(ours), spans(theirs), "{what}: text {text}");
    let mut worst = 0f64;
    for (a, b) in ours.iter().zip(theirs) {
        let keys = |e: &Value| e.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
        let (mut ka, mut kb) = (keys(a), keys(b));
        ka.sort();
        kb.sort();
        assert_eq!(ka, kb, "{what}: text {text}: fields");
        assert_eq!(a.get("index"), b.get("index"), "{what}: text {text}: index");
        let d = (a["score"].as_f64().unwrap() - b["score"].as_f64().unwrap()).abs();
        worst = worst.max(d);
    }
    assert!(
        worst <= 1e-4,
        "{what}: text {text}: a score differs by {worst}"
    );
    worst
}

/// `ragline ner` of every token-classification family, on every CPU kernel path (the fused
/// engine; ModernBERT runs on candle ops, one run), equals the token-classification pipeline
/// for every aggregation strategy: 200 texts with non-ASCII ones, texts of several windows
/// of the model's 128 tokens (stride 32) and texts without an entity.
#[test]
fn ner_matches_the_token_classification_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let input = fixtures("classifiers/texts.jsonl");
    let n = texts().len();
    for family in NER_FAMILIES {
        let model = model_of(&format!("ner-{family}"), &dir.path().join(family));
        let reference = reference_entities(family);
        let windowed = reference["simple"].iter().filter(|r| !r.is_empty()).count();
        assert!(windowed > 0, "{family}: the reference found entities");
        assert!(
            reference["simple"].iter().any(|r| r.is_empty()),
            "{family}: some text has no entity"
        );
        let mut paths = kernel_paths();
        if family == "modernbert" {
            paths.truncate(1);
        }
        for kernels in paths {
            for strategy in STRATEGIES {
                let o = run(ragline()
                    .env("RAGLINE_CPU_KERNELS", kernels)
                    .args(["ner", "--device", "cpu", "--stride", "32", "--model"])
                    .arg(&model)
                    .args(["--aggregation", strategy, "--output", "-", "--input"])
                    .arg(&input));
                assert_eq!(o.status.code(), Some(0));
                let lines: Vec<Value> = String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .map(|l| serde_json::from_str(l).unwrap())
                    .collect();
                assert_eq!(lines.len(), n);
                let mut worst = 0f64;
                for (i, (line, theirs)) in lines.iter().zip(&reference[strategy]).enumerate() {
                    assert_eq!(line["id"], serde_json::json!(i));
                    let ours = line["entities"].as_array().unwrap();
                    let what = format!("{family} {kernels} {strategy}");
                    worst = worst.max(same_entities(&what, i, ours, theirs));
                }
                eprintln!("{family} {kernels} {strategy}: largest score difference {worst:.2e}");
            }
        }
    }
}

/// The candle path (what a GPU runs) on the CPU in f32 finds the same entities.
#[test]
fn the_candle_ner_path_matches_the_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let texts = texts();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    for family in ["bert", "distilbert"] {
        let model = model_of(&format!("ner-{family}"), &dir.path().join(family));
        let files = ModelFiles::from_dir(family, &model).unwrap();
        let ner = TokenClassifier::load_candle(files, &Device::Cpu, DType::F32, Some(32)).unwrap();
        assert!(
            ner.encoder_kind().starts_with("candle"),
            "{}",
            ner.encoder_kind()
        );
        let reference = reference_entities(family);
        for strategy in ["none", "average"] {
            let options = NerOptions {
                aggregation: strategy.parse::<Aggregation>().unwrap(),
                ..NerOptions::default()
            };
            let found = ner.entities(&refs, &options, 4096).unwrap();
            for (i, (ours, theirs)) in found.iter().zip(&reference[strategy]).enumerate() {
                let ours: Vec<Value> = ours
                    .iter()
                    .map(|e| serde_json::to_value(e).unwrap())
                    .collect();
                same_entities(&format!("{family} candle {strategy}"), i, &ours, theirs);
            }
        }
    }
}

/// `ragline classify` of every sequence-classification family (Qwen3 reading its last
/// token, and a multi-label model),
/// on every CPU kernel path, gives every text the text-classification pipeline's labels in
/// its order, scores within 1e-5; the candle path too.
#[test]
fn classify_matches_the_text_classification_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let input = fixtures("classifiers/texts.jsonl");
    let texts = texts();
    for fixture in CLASSIFY {
        let model = model_of(fixture, &dir.path().join(fixture));
        let v: Value = serde_json::from_slice(
            &fs::read(fixtures("classifiers").join(fixture).join("labels.json")).unwrap(),
        )
        .unwrap();
        let reference = v["labels"].as_array().unwrap();
        let compare = |what: &str, rows: &[Vec<(String, f64)>]| {
            assert_eq!(rows.len(), reference.len());
            let mut worst = 0f64;
            for (i, (ours, theirs)) in rows.iter().zip(reference).enumerate() {
                let theirs: Vec<(String, f64)> = theirs
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| {
                        (
                            x["label"].as_str().unwrap().to_string(),
                            x["score"].as_f64().unwrap(),
                        )
                    })
                    .collect();
                assert_eq!(ours.len(), theirs.len(), "{what}: text {i}");
                for ((la, sa), (lb, sb)) in ours.iter().zip(&theirs) {
                    let d = (sa - sb).abs();
                    // Labels in the pipeline's order, unless two scores are (nearly) tied.
                    assert!(la == lb || d <= 1e-5, "{what}: text {i}: {la} where {lb}");
                    worst = worst.max(d);
                }
            }
            eprintln!("{what}: largest score difference {worst:.2e}");
            assert!(worst <= 1e-5, "{what}: a score differs by {worst}");
        };
        let mut paths = kernel_paths();
        if rotary(fixture) {
            paths.truncate(1);
        }
        for kernels in paths {
            let o = run(ragline()
                .env("RAGLINE_CPU_KERNELS", kernels)
                .args(["classify", "--device", "cpu", "--model"])
                .arg(&model)
                .args(["--output", "-", "--input"])
                .arg(&input));
            assert_eq!(o.status.code(), Some(0));
            let rows: Vec<Vec<(String, f64)>> = String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(|l| {
                    let v: Value = serde_json::from_str(l).unwrap();
                    v["labels"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| {
                            (
                                x["label"].as_str().unwrap().to_string(),
                                x["score"].as_f64().unwrap(),
                            )
                        })
                        .collect()
                })
                .collect();
            compare(&format!("{fixture} {kernels}"), &rows);
        }
        if !rotary(fixture) {
            let files = ModelFiles::from_dir(fixture, &model).unwrap();
            let c = SequenceClassifier::load_candle(files, &Device::Cpu, DType::F32).unwrap();
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            let rows: Vec<Vec<(String, f64)>> = c
                .classify(&refs, LabelChoice::default(), None, 4096)
                .unwrap()
                .into_iter()
                .map(|r| {
                    r.into_iter()
                        .map(|l| (l.label, f64::from(l.score)))
                        .collect()
                })
                .collect();
            compare(&format!("{fixture} candle"), &rows);
        }
    }
}

/// A bad line is reported, counted and answered with an `error`; the others are classified;
/// `--top-k` and `--threshold` keep what they say.
#[test]
fn classify_keeps_going_past_a_bad_line_and_keeps_what_it_is_asked() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_of("classify-bert", &dir.path().join("m"));
    let input = dir.path().join("in.jsonl");
    fs::write(
        &input,
        "{\"id\": \"a\", \"text\": \"Acme sells rockets\"}\nnot json\n\"plain\"\n",
    )
    .unwrap();
    let o = run(ragline()
        .args(["classify", "--device", "cpu", "--top-k", "2", "--model"])
        .arg(&model)
        .args(["--output", "-", "--input"])
        .arg(&input));
    assert_eq!(
        o.status.code(),
        Some(1),
        "a bad line fails the run's exit code"
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[0]["id"], "a");
    assert_eq!(lines[0]["labels"].as_array().unwrap().len(), 2);
    assert!(lines[1]["error"].as_str().unwrap().contains("invalid JSON"));
    assert!(String::from_utf8_lossy(&o.stderr).contains("line 2"));
    assert_eq!(lines[2]["labels"].as_array().unwrap().len(), 2);
    let o = run(ragline()
        .args([
            "classify",
            "--device",
            "cpu",
            "--threshold",
            "0.99",
            "--model",
        ])
        .arg(&model)
        .args(["--output", "-", "--input"])
        .arg(&input));
    let first: Value =
        serde_json::from_str(String::from_utf8_lossy(&o.stdout).lines().next().unwrap()).unwrap();
    assert!(first["labels"]
        .as_array()
        .unwrap()
        .iter()
        .all(|l| l["score"].as_f64().unwrap() >= 0.99));
    // bf16 dense layers on the fused engine (where the CPU has bf16): the same top labels
    // as f32 on these texts; where it has not, a clear refusal.
    let bf16 = run(ragline()
        .args(["classify", "--device", "cpu", "--dtype", "bf16", "--model"])
        .arg(&model)
        .args(["--output", "-", "--input"])
        .arg(&input));
    let top = |o: &std::process::Output| -> Vec<Value> {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["labels"][0]["label"].clone())
            .collect()
    };
    if bf16.status.code() == Some(1) {
        let f32 = run(ragline()
            .args(["classify", "--device", "cpu", "--model"])
            .arg(&model)
            .args(["--output", "-", "--input"])
            .arg(&input));
        assert_eq!(top(&bf16), top(&f32));
    } else {
        assert!(String::from_utf8_lossy(&bf16.stderr).contains("bf16"));
    }
    // A reranker is not a multi-label classifier, and a token classifier no sequence one.
    let o = run(ragline()
        .args(["classify", "--device", "cpu", "--model"])
        .arg(model_of("ner-bert", &dir.path().join("n")))
        .args(["--output", "-", "--input"])
        .arg(&input));
    assert_ne!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stderr).contains("ForSequenceClassification"));
}

/// `serve --classifier-model --ner-model`: TEI's `POST /predict` answers a text with the
/// pipeline's labels and scores (a batch with a list of them, `raw_scores` with the logits,
/// two strings as one pair), and `POST /ner` answers with the pipeline's entities for the
/// aggregation asked; clients at once are batched together and each gets its own answer.
#[test]
fn serve_predicts_labels_and_entities() {
    use crate::serve::{post, Server};
    use serde_json::json;
    let dir = tempfile::tempdir().unwrap();
    let classifier = model_of("classify-bert", &dir.path().join("c"));
    let ner = model_of("ner-bert", &dir.path().join("n"));
    let server = Server::start(
        &model_dir(),
        &[
            "--classifier-model",
            classifier.to_str().unwrap(),
            "--ner-model",
            ner.to_str().unwrap(),
        ],
        dir.path(),
        "classifiers",
    );
    let texts = texts();
    let labels: Value = serde_json::from_slice(
        &fs::read(fixtures("classifiers/classify-bert/labels.json")).unwrap(),
    )
    .unwrap();
    let entities = reference_entities("bert");
    // Texts of one window (the server's stride is its default, the reference's 32).
    let short: Vec<usize> = (0..texts.len())
        .filter(|&i| !texts[i].is_empty() && texts[i].len() < 200)
        .take(16)
        .collect();
    assert_eq!(short.len(), 16);
    let close = |ours: &Value, theirs: &Value| {
        let (a, b) = (ours.as_array().unwrap(), theirs.as_array().unwrap());
        assert_eq!(a.len(), b.len(), "{ours} vs {theirs}");
        for (x, y) in a.iter().zip(b) {
            assert_eq!(x["label"], y["label"]);
            assert!((x["score"].as_f64().unwrap() - y["score"].as_f64().unwrap()).abs() <= 1e-5);
        }
    };
    type Answer = (u16, Value);
    let answers: Vec<(usize, Answer, Answer)> = std::thread::scope(|s| {
        let handles: Vec<_> = short
            .iter()
            .map(|&i| {
                let (url, text) = (&server.url, &texts[i]);
                s.spawn(move || {
                    let p = post(&format!("{url}/predict"), &json!({"inputs": text}));
                    let n = post(
                        &format!("{url}/ner"),
                        &json!({"inputs": [text], "aggregation": "first"}),
                    );
                    (i, p, n)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (ps, pb), (ns, nb)) in answers {
        assert_eq!(ps, 200, "{pb}");
        close(&pb, &labels["labels"][i]);
        assert_eq!(ns, 200, "{nb}");
        let ours = nb[0]["entities"].as_array().unwrap();
        same_entities("serve /ner first", i, ours, &entities["first"][i]);
    }
    // A batch: a list per input, in order; raw scores are the logits (their softmax is the
    // reference's scores).
    let (status, body) = post(
        &format!("{}/predict", server.url),
        &json!({"inputs": [texts[short[0]], texts[short[1]], texts[short[2]]], "raw_scores": true}),
    );
    assert_eq!(status, 200, "{body}");
    let rows = body.as_array().unwrap();
    assert_eq!(rows.len(), 3);
    for (row, &i) in rows.iter().zip(&short) {
        let logits: Vec<f64> = row
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["score"].as_f64().unwrap())
            .collect();
        let sum: f64 = logits.iter().map(|l| l.exp()).sum();
        let top = &labels["labels"][i][0];
        assert_eq!(row[0]["label"], top["label"]);
        assert!((logits[0].exp() / sum - top["score"].as_f64().unwrap()).abs() <= 1e-5);
    }
    // Two strings are one pair (TEI's reading): one answer, its labels' scores summing to 1.
    let (status, body) = post(
        &format!("{}/predict", server.url),
        &json!({"inputs": ["A premise.", "A hypothesis."]}),
    );
    assert_eq!(status, 200, "{body}");
    let sum: f64 = body
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["score"].as_f64().unwrap())
        .sum();
    assert!(
        body.as_array().unwrap().len() == 4 && (sum - 1.0).abs() < 1e-5,
        "{body}"
    );
    // A long text through /ner is read whole: entities past the first window.
    let long = (0..texts.len()).max_by_key(|&i| texts[i].len()).unwrap();
    let (status, body) = post(
        &format!("{}/ner", server.url),
        &json!({"inputs": texts[long]}),
    );
    assert_eq!(status, 200, "{body}");
    let last = body[0]["entities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["end"].as_u64().unwrap())
        .max()
        .unwrap();
    assert!(last as usize > texts[long].chars().count() / 2, "{last}");
    // Bad bodies are refused by name.
    let (status, body) = post(
        &format!("{}/ner", server.url),
        &json!({"inputs": "x", "aggregation": "most"}),
    );
    assert_eq!(status, 400);
    assert!(body.to_string().contains("unknown aggregation"), "{body}");
    let (status, _) = post(&format!("{}/predict", server.url), &json!({"inputs": []}));
    assert_eq!(status, 400);
    drop(server);
    let plain = Server::start(&model_dir(), &[], dir.path(), "plain");
    let (status, body) = post(&format!("{}/predict", plain.url), &json!({"inputs": "t"}));
    assert_eq!(status, 404);
    assert!(body.to_string().contains("--classifier-model"), "{body}");
    let (status, body) = post(&format!("{}/ner", plain.url), &json!({"inputs": "t"}));
    assert_eq!(status, 404);
    assert!(body.to_string().contains("--ner-model"), "{body}");
}
