//! The embeddings requests' bodies, parsed as they are read: inputs are counted against the
//! limit while the JSON is read, so a huge list is refused having held little.

use super::*;

/// One request's fields, parsed as the body streams by: `input` (OpenAI) or `inputs` (TEI)
/// is counted as it is read, so a body of a million inputs stops at the first one past the
/// limit instead of being held whole; fields this server does not use are skipped unread.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Request {
    pub(super) texts: Vec<String>,
    pub(super) model: Option<String>,
    pub(super) encoding_format: Option<String>,
    pub(super) dimensions: Option<usize>,
    pub(super) truncate: Option<bool>,
    pub(super) normalize: Option<bool>,
    pub(super) prompt_name: Option<String>,
}

/// The fuzz target's view of a request body: parsed in both shapes.
#[doc(hidden)]
pub fn fuzz_request(body: &[u8]) {
    for field in ["input", "inputs"] {
        if let Ok(r) = parse_request(body, field, 16) {
            assert!(!r.texts.is_empty() && r.texts.len() <= 16);
        }
    }
}

/// Parse a request body whose inputs are in `field`, at most `max` of them.
pub(super) fn parse_request(
    body: &[u8],
    field: &'static str,
    max: usize,
) -> Result<Request, ApiError> {
    use serde::de::DeserializeSeed;
    let mut d = serde_json::Deserializer::from_slice(body);
    let request = RequestSeed { field, max }
        .deserialize(&mut d)
        .and_then(|r| d.end().map(|()| r))
        .map_err(|e| ApiError::bad(format!("the body is not valid: {e}")))?;
    if request.texts.is_empty() {
        return Err(ApiError::bad(format!("`{field}` is an empty list")));
    }
    Ok(request)
}

pub(super) struct RequestSeed {
    pub(super) field: &'static str,
    pub(super) max: usize,
}

impl<'de> serde::de::DeserializeSeed<'de> for RequestSeed {
    type Value = Request;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Request, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for RequestSeed {
    type Value = Request;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a JSON object with `{}`", self.field)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Request, A::Error> {
        use serde::de::{Error, IgnoredAny};
        let mut r = Request::default();
        let mut seen = false;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match key.as_ref() {
                k if k == self.field => {
                    r.texts = map.next_value_seed(TextsSeed {
                        field: self.field,
                        max: self.max,
                        objects: false,
                    })?;
                    seen = true;
                }
                "model" => r.model = map.next_value()?,
                "encoding_format" => r.encoding_format = map.next_value()?,
                "dimensions" => r.dimensions = map.next_value()?,
                "truncate" => r.truncate = map.next_value()?,
                "normalize" => r.normalize = map.next_value()?,
                "prompt_name" => r.prompt_name = map.next_value()?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        if !seen {
            return Err(A::Error::custom(format!("`{}` is missing", self.field)));
        }
        Ok(r)
    }
}

/// `input`: a string, or a list of strings of at most `max` (with `objects`, a list item may
/// also be `{"text": STRING}`, the Cohere/Jina documents' shape).
pub(super) struct TextsSeed {
    pub(super) field: &'static str,
    pub(super) max: usize,
    pub(super) objects: bool,
}

impl<'de> serde::de::DeserializeSeed<'de> for TextsSeed {
    type Value = Vec<String>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Vec<String>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for TextsSeed {
    type Value = Vec<String>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}` as a string or a list of strings", self.field)
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Vec<String>, E> {
        Ok(vec![s.to_string()])
    }

    fn visit_string<E: serde::de::Error>(self, s: String) -> Result<Vec<String>, E> {
        Ok(vec![s])
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
        use serde::de::Error;
        let mut texts = Vec::new();
        let mut i = 0;
        while let Some(text) = seq.next_element_seed(TextSeed {
            field: self.field,
            index: i,
            objects: self.objects,
        })? {
            if texts.len() == self.max {
                return Err(A::Error::custom(format!(
                    "`{}` has more than {} inputs; at most {} per request (split the request)",
                    self.field, self.max, self.max
                )));
            }
            texts.push(text);
            i += 1;
        }
        Ok(texts)
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Vec<String>, E> {
        Err(E::custom(format!("`{}` is missing", self.field)))
    }

    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Vec<String>, E> {
        Err(self.wrong("a boolean"))
    }
    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Vec<String>, E> {
        Err(self.wrong("a number"))
    }
    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Vec<String>, E> {
        Err(self.wrong("a number"))
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Vec<String>, E> {
        Err(self.wrong("a number"))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, _: A) -> Result<Vec<String>, A::Error> {
        Err(self.wrong("an object"))
    }
}

impl TextsSeed {
    pub(super) fn wrong<E: serde::de::Error>(&self, kind: &str) -> E {
        E::custom(format!(
            "`{}` must be a string or a list of strings, not {kind}",
            self.field
        ))
    }
}

/// One input of the list: a string (or, with `objects`, `{"text": STRING}`).
pub(super) struct TextSeed {
    pub(super) field: &'static str,
    pub(super) index: usize,
    pub(super) objects: bool,
}

impl<'de> serde::de::DeserializeSeed<'de> for TextSeed {
    type Value = String;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for TextSeed {
    type Value = String;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}[{}]` as a string", self.field, self.index)
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<String, E> {
        Ok(s.to_string())
    }
    fn visit_string<E: serde::de::Error>(self, s: String) -> Result<String, E> {
        Ok(s)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, _: A) -> Result<String, A::Error> {
        use serde::de::Error;
        Err(A::Error::custom(format!(
            "`{}[{}]` is a list: token-id inputs are not supported here; send the text",
            self.field, self.index
        )))
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<String, E> {
        Err(self.wrong("null"))
    }
    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<String, E> {
        Err(self.wrong("a boolean"))
    }
    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<String, E> {
        Err(self.wrong("a number"))
    }
    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<String, E> {
        Err(self.wrong("a number"))
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<String, E> {
        Err(self.wrong("a number"))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<String, A::Error> {
        use serde::de::{Error, IgnoredAny};
        if !self.objects {
            return Err(A::Error::custom(format!(
                "`{}[{}]` must be a string, not an object",
                self.field, self.index
            )));
        }
        let mut text = None;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if key == "text" {
                text = Some(map.next_value_seed(TextSeed {
                    objects: false,
                    ..self
                })?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        text.ok_or_else(|| {
            A::Error::custom(format!(
                "`{}[{}]` has no `text`: give a string or {{\"text\": STRING}}",
                self.field, self.index
            ))
        })
    }
}

impl TextSeed {
    pub(super) fn wrong<E: serde::de::Error>(&self, kind: &str) -> E {
        E::custom(format!(
            "`{}[{}]` must be a string, not {kind}",
            self.field, self.index
        ))
    }
}
