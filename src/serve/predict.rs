//! The classifiers' routes: TEI's `POST /predict` (a sequence classifier, `--classifier-model`)
//! and ragline's `POST /ner` (a token classifier, `--ner-model`: the `ner` command's JSON).
//! Bodies are parsed as they stream in, the inputs counted against `--max-inputs` as they are
//! read (as the embedding routes do).

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::tasks::{count, not_served, through_queue, NerText};
use super::{observed, ApiError, App, LongInputs};
use crate::embed::classify::{LabelChoice, ScoreFunction};
use crate::embed::ner::aggregate::Aggregation;
use crate::embed::ner::NerOptions;

/// One input of `/predict`: a text, or a pair of texts (premise and hypothesis...).
#[derive(Clone, Debug, PartialEq)]
enum Sequence {
    Single(String),
    Pair(String, String),
}

/// A `/predict` body: TEI's `inputs` (a string; a list of two strings, which TEI reads as
/// one pair; or a list of strings and pairs), `raw_scores`, `truncate`.
#[derive(Debug, Default, PartialEq)]
struct PredictBody {
    inputs: Vec<Sequence>,
    /// One input (answered with its labels), not a batch (answered with a list of them).
    single: bool,
    raw_scores: bool,
    truncate: Option<bool>,
}

fn parse_predict(body: &[u8], max: usize) -> Result<PredictBody, ApiError> {
    use serde::de::DeserializeSeed;
    let mut d = serde_json::Deserializer::from_slice(body);
    let r = PredictSeed { max }
        .deserialize(&mut d)
        .and_then(|r| d.end().map(|()| r))
        .map_err(|e| ApiError::bad(format!("the body is not valid: {e}")))?;
    if r.inputs.is_empty() {
        return Err(ApiError::bad("`inputs` is an empty list"));
    }
    Ok(r)
}

struct PredictSeed {
    max: usize,
}

impl<'de> serde::de::DeserializeSeed<'de> for PredictSeed {
    type Value = PredictBody;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<PredictBody, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for PredictSeed {
    type Value = PredictBody;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object with `inputs`")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<PredictBody, A::Error> {
        use serde::de::{Error, IgnoredAny};
        let mut r = PredictBody::default();
        let mut seen = false;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match key.as_ref() {
                "inputs" => {
                    let (inputs, single) = map.next_value_seed(InputsSeed { max: self.max })?;
                    r.inputs = inputs;
                    r.single = single;
                    seen = true;
                }
                "raw_scores" => r.raw_scores = map.next_value()?,
                "truncate" => r.truncate = map.next_value()?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        if !seen {
            return Err(A::Error::custom("`inputs` is missing"));
        }
        Ok(r)
    }
}

/// `inputs`: a string, or a list of at most `max` strings and pairs; a list of exactly two
/// strings is one pair (TEI's reading).
struct InputsSeed {
    max: usize,
}

/// A list item: a string or a pair.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Item {
    Text(String),
    Pair(String, String),
}

impl<'de> serde::de::DeserializeSeed<'de> for InputsSeed {
    type Value = (Vec<Sequence>, bool);
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for InputsSeed {
    type Value = (Vec<Sequence>, bool);

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("`inputs` as a string, or a list of strings and [text, text] pairs")
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok((vec![Sequence::Single(s.to_string())], true))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        use serde::de::Error;
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Item>()? {
            if items.len() == self.max {
                return Err(A::Error::custom(format!(
                    "`inputs` has more than {} inputs; at most {} per request (split the request)",
                    self.max, self.max
                )));
            }
            items.push(match item {
                Item::Text(t) => Sequence::Single(t),
                Item::Pair(a, b) => Sequence::Pair(a, b),
            });
        }
        if let [Sequence::Single(a), Sequence::Single(b)] = items.as_slice() {
            return Ok((vec![Sequence::Pair(a.clone(), b.clone())], true));
        }
        Ok((items, false))
    }
}

/// TEI's `POST /predict`: each input's labels, best first, `[{"score", "label"}]` (the
/// logits with `"raw_scores": true`); a list of those for a batch.
pub(super) async fn tei_predict(State(app): State<Arc<App>>, body: axum::body::Bytes) -> Response {
    let app2 = Arc::clone(&app);
    observed(&app, "/predict", async move {
        let app = app2;
        let req = parse_predict(&body, app.options.max_inputs)?;
        drop(body);
        let (Some(queue), Some(model)) = (&app.tasks.classify, app.models.classifier.clone())
        else {
            return Err(not_served("classifier", "--classifier-model"));
        };
        let truncate = req
            .truncate
            .unwrap_or(app.options.long_inputs == LongInputs::Truncate);
        let n = req.inputs.len();
        let model2 = Arc::clone(&model);
        let inputs = req.inputs;
        let (logits, tokens) = through_queue(&app, queue, move || {
            inputs
                .iter()
                .enumerate()
                .map(|(i, input)| {
                    let ids = match input {
                        Sequence::Single(t) => model2.encode(t),
                        Sequence::Pair(a, b) => model2.encode_pair(a, b),
                    }
                    .map_err(|e| ApiError::bad(format!("input {i}: {e}")))?;
                    if ids.truncated && !truncate {
                        return Err(ApiError::too_long(format!(
                            "input {i} is over the model's limit of {} tokens; send shorter \
                             texts or ask to truncate (\"truncate\": true)",
                            model2.max_len()
                        )));
                    }
                    Ok(ids)
                })
                .collect()
        })
        .await?;
        count(&app, "/predict", n, tokens);
        let function = if req.raw_scores {
            ScoreFunction::None
        } else {
            model.function()
        };
        let mut rows: Vec<Value> = logits
            .iter()
            .map(|l| json!(model.choose(&function.apply(l), LabelChoice::default())))
            .collect();
        Ok(if req.single {
            axum::Json(rows.swap_remove(0)).into_response()
        } else {
            axum::Json(rows).into_response()
        })
    })
    .await
}

/// `POST /ner`: `{"inputs": TEXT or [TEXT...], "aggregation"?, "ignore_labels"?}`; answers
/// `[{"entities": [...]}]`, one per input in order, the entities as `ragline ner` writes
/// them. A long text is read whole, in windows.
pub(super) async fn ner(State(app): State<Arc<App>>, body: axum::body::Bytes) -> Response {
    let app2 = Arc::clone(&app);
    observed(&app, "/ner", async move {
        let app = app2;
        let req = parse_ner(&body, app.options.max_inputs)?;
        drop(body);
        let (Some(queue), Some(model)) = (&app.tasks.ner, app.models.ner.clone()) else {
            return Err(not_served("token classifier", "--ner-model"));
        };
        let n = req.texts.len();
        let options = Arc::new(req.options);
        let (found, tokens) = through_queue(&app, queue, move || {
            req.texts
                .into_iter()
                .enumerate()
                .map(|(i, text)| {
                    let windows = model
                        .windows(&text)
                        .map_err(|e| ApiError::bad(format!("input {i}: {e}")))?;
                    Ok(NerText {
                        text,
                        windows,
                        options: Arc::clone(&options),
                    })
                })
                .collect()
        })
        .await?;
        count(&app, "/ner", n, tokens);
        let rows: Vec<Value> = found.iter().map(|e| json!({"entities": e})).collect();
        Ok(axum::Json(rows).into_response())
    })
    .await
}

/// A `/ner` body.
struct NerBody {
    texts: Vec<String>,
    options: NerOptions,
}

fn parse_ner(body: &[u8], max: usize) -> Result<NerBody, ApiError> {
    use serde::de::DeserializeSeed;
    let mut d = serde_json::Deserializer::from_slice(body);
    let r = NerSeed { max }
        .deserialize(&mut d)
        .and_then(|r| d.end().map(|()| r))
        .map_err(|e| ApiError::bad(format!("the body is not valid: {e}")))?;
    if r.texts.is_empty() {
        return Err(ApiError::bad("`inputs` is an empty list"));
    }
    Ok(r)
}

struct NerSeed {
    max: usize,
}

impl<'de> serde::de::DeserializeSeed<'de> for NerSeed {
    type Value = NerBody;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<NerBody, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for NerSeed {
    type Value = NerBody;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object with `inputs`")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<NerBody, A::Error> {
        use serde::de::{Error, IgnoredAny};
        let mut texts = None;
        let mut options = NerOptions::default();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match key.as_ref() {
                "inputs" => {
                    texts = Some(map.next_value_seed(super::TextsSeed {
                        field: "inputs",
                        max: self.max,
                        objects: false,
                    })?)
                }
                "aggregation" | "aggregation_strategy" => {
                    let name: String = map.next_value()?;
                    options.aggregation = name.parse::<Aggregation>().map_err(A::Error::custom)?;
                }
                "ignore_labels" => options.ignore = map.next_value()?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let texts = texts.ok_or_else(|| A::Error::custom("`inputs` is missing"))?;
        Ok(NerBody { texts, options })
    }
}

/// The fuzz target's view of the classifiers' bodies.
#[doc(hidden)]
pub fn fuzz_bodies(body: &[u8]) {
    if let Ok(r) = parse_predict(body, 16) {
        assert!(!r.inputs.is_empty() && r.inputs.len() <= 16);
    }
    if let Ok(r) = parse_ner(body, 16) {
        assert!(!r.texts.is_empty() && r.texts.len() <= 16);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predict_bodies_read_as_tei_reads_them() {
        let one = parse_predict(br#"{"inputs": "a"}"#, 4).unwrap();
        assert!(one.single && one.inputs == vec![Sequence::Single("a".into())]);
        let pair = parse_predict(br#"{"inputs": ["a", "b"], "raw_scores": true}"#, 4).unwrap();
        assert!(pair.single && pair.raw_scores);
        assert_eq!(pair.inputs, vec![Sequence::Pair("a".into(), "b".into())]);
        let batch = parse_predict(br#"{"inputs": ["a", ["b", "c"], "d"]}"#, 4).unwrap();
        assert!(!batch.single && batch.inputs.len() == 3);
        assert!(parse_predict(br#"{"inputs": ["a", "b", "c", "d", "e"]}"#, 4).is_err());
        assert!(parse_predict(br#"{"inputs": []}"#, 4).is_err());
        assert!(parse_predict(br#"{"inputs": [1]}"#, 4).is_err());
        let n = parse_ner(br#"{"inputs": ["x"], "aggregation": "max"}"#, 4).unwrap();
        assert_eq!(n.options.aggregation, Aggregation::Max);
        assert!(parse_ner(br#"{"inputs": "x", "aggregation": "most"}"#, 4).is_err());
    }
}
