//! The documents other systems publish on a subject: one JSON object per message.
//!
//! ```json
//! {"id": "doc-1", "text": "...", "title": "...", "format": "markdown", "metadata": {...}}
//! {"id": "doc-2", "url": "https://docs.example.com/page", "metadata": {...}}
//! {"id": "doc-3", "deleted": true}
//! ```
//!
//! The bytes come from the broker, so they are untrusted: a message is at most the server's
//! largest (and `--max-file-bytes`), and serde_json bounds its nesting (128 deep).

use serde_json::{Map, Value};

/// What a message asks for.
#[derive(Debug, PartialEq)]
pub enum Body {
    /// The document's text, with its title and format when the message gives them.
    Text {
        text: String,
        title: Option<String>,
        format: Option<&'static str>,
    },
    /// The document is the page at this URL.
    Url(String),
    /// The document is gone from the source.
    Deleted,
}

/// One message, read.
#[derive(Debug, PartialEq)]
pub struct Message {
    pub id: String,
    pub body: Body,
    /// The message's `metadata` object (empty when it has none).
    pub metadata: Map<String, Value>,
}

/// Why a message is not a document: the reason, and the id when the message had one.
#[derive(Debug, PartialEq)]
pub struct Malformed {
    pub id: Option<String>,
    pub reason: String,
}

/// The shape a message must have, for the reasons.
pub const SHAPE: &str = r#"publish one JSON object per message: {"id": "...", "text": "..."} or {"id": "...", "url": "..."}, with an optional "title", "format" and "metadata" object, or {"id": "...", "deleted": true}"#;

/// The formats a message may name for its text.
const FORMATS: [&str; 3] = ["text", "markdown", "html"];

/// Read a message's bytes.
pub fn parse(payload: &[u8]) -> Result<Message, Malformed> {
    let bad = |id: Option<String>, reason: String| Malformed { id, reason };
    let value: Value = serde_json::from_slice(payload)
        .map_err(|e| bad(None, format!("not JSON ({e}); {SHAPE}")))?;
    let Value::Object(mut map) = value else {
        return Err(bad(None, format!("not a JSON object; {SHAPE}")));
    };
    let id = id_of(&mut map)?;
    let fail = |reason: String| Malformed {
        id: Some(id.clone()),
        reason,
    };
    let metadata = match map.remove("metadata") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m,
        Some(other) => {
            return Err(fail(format!(
                "\"metadata\" is {}, not an object; {SHAPE}",
                kind(&other)
            )))
        }
    };
    let deleted = match map.remove("deleted") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(other) => {
            return Err(fail(format!(
                "\"deleted\" is {}, not true or false",
                kind(&other)
            )))
        }
    };
    let text = map.remove("text");
    let url = map.remove("url");
    let body = match (deleted, text, url) {
        (true, None, None) => Body::Deleted,
        (true, _, _) => {
            return Err(fail(
                "\"deleted\": true with a \"text\" or \"url\": a message either deletes or \
                 gives the document"
                    .into(),
            ))
        }
        (false, Some(_), Some(_)) => {
            return Err(fail("both \"text\" and \"url\": give one of them".into()))
        }
        (false, Some(Value::String(text)), None) => text_body(text, &mut map, &fail)?,
        (false, None, Some(Value::String(url))) => Body::Url(url),
        (false, Some(other), None) => {
            return Err(fail(format!("\"text\" is {}, not a string", kind(&other))))
        }
        (false, None, Some(other)) => {
            return Err(fail(format!("\"url\" is {}, not a string", kind(&other))))
        }
        (false, None, None) => return Err(fail(format!("neither \"text\" nor \"url\"; {SHAPE}"))),
    };
    Ok(Message { id, body, metadata })
}

/// The message's `"id"`: a non-empty string or a number.
fn id_of(map: &mut Map<String, Value>) -> Result<String, Malformed> {
    let bad = |reason: String| Malformed { id: None, reason };
    match map.remove("id") {
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(s),
        Some(Value::Number(n)) => Ok(n.to_string()),
        Some(Value::String(_)) => Err(bad(format!("an empty \"id\"; {SHAPE}"))),
        Some(other) => Err(bad(format!(
            "\"id\" is {}, not a string; {SHAPE}",
            kind(&other)
        ))),
        None => Err(bad(format!("no \"id\"; {SHAPE}"))),
    }
}

/// A message that gives its text: with its optional title and format.
fn text_body(
    text: String,
    map: &mut Map<String, Value>,
    fail: &dyn Fn(String) -> Malformed,
) -> Result<Body, Malformed> {
    let title = optional_string(map, "title")
        .map_err(|k| fail(format!("\"title\" is {k}, not a string")))?;
    let format = match optional_string(map, "format")
        .map_err(|k| fail(format!("\"format\" is {k}, not a string")))?
    {
        None => None,
        Some(f) => Some(
            FORMATS
                .into_iter()
                .find(|known| known.eq_ignore_ascii_case(&f))
                .ok_or_else(|| {
                    fail(format!(
                        "\"format\": \"{}\" is not one of text, markdown, html",
                        f.chars().take(40).collect::<String>()
                    ))
                })?,
        ),
    };
    Ok(Body::Text {
        text,
        title,
        format,
    })
}

/// A string field that may be absent (or null, or empty); the kind of value it is otherwise.
fn optional_string(
    map: &mut Map<String, Value>,
    key: &str,
) -> Result<Option<String>, &'static str> {
    match map.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(kind(&other)),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The fuzz target: any bytes are read without a panic, and what is read keeps its promises.
#[doc(hidden)]
pub fn fuzz(data: &[u8]) {
    match parse(data) {
        Ok(m) => assert!(!m.id.trim().is_empty()),
        Err(e) => assert!(!e.reason.is_empty()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_text_url_and_delete_messages() {
        let m = parse(
            br#"{"id":"a","text":"hello","title":"T","format":"Markdown","metadata":{"lang":"en"}}"#,
        )
        .unwrap();
        assert_eq!(m.id, "a");
        assert_eq!(
            m.body,
            Body::Text {
                text: "hello".into(),
                title: Some("T".into()),
                format: Some("markdown"),
            }
        );
        assert_eq!(m.metadata["lang"], "en");
        let m = parse(br#"{"id":7,"url":"https://x.test/p"}"#).unwrap();
        assert_eq!(
            (m.id.as_str(), m.body),
            ("7", Body::Url("https://x.test/p".into()))
        );
        assert_eq!(
            parse(br#"{"id":"gone","deleted":true}"#).unwrap().body,
            Body::Deleted
        );
    }

    #[test]
    fn malformed_messages_say_why_with_their_id_when_they_have_one() {
        let cases: [(&[u8], Option<&str>, &str); 9] = [
            (b"{not json", None, "not JSON"),
            (b"[1,2]", None, "not a JSON object"),
            (br#"{"text":"x"}"#, None, "no \"id\""),
            (br#"{"id":["x"],"text":"x"}"#, None, "\"id\" is an array"),
            (br#"{"id":"a"}"#, Some("a"), "neither \"text\" nor \"url\""),
            (br#"{"id":"a","text":1}"#, Some("a"), "\"text\" is a number"),
            (br#"{"id":"a","text":"x","url":"y"}"#, Some("a"), "both"),
            (
                br#"{"id":"a","text":"x","metadata":[1]}"#,
                Some("a"),
                "\"metadata\" is an array",
            ),
            (
                br#"{"id":"a","text":"x","format":"pdf"}"#,
                Some("a"),
                "not one of",
            ),
        ];
        for (bytes, id, reason) in cases {
            let e = parse(bytes).unwrap_err();
            assert_eq!(e.id.as_deref(), id, "{}", String::from_utf8_lossy(bytes));
            assert!(e.reason.contains(reason), "{}: {}", reason, e.reason);
        }
    }
}
