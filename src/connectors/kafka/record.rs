//! What a Kafka record says: a document, a deletion, or why it is neither.
//!
//! - `format=json` (the default): the value is a JSON object; its `text` field (`&text=`) is
//!   the document's text, `title` (`&title=`) its title, `id` (`&id=`) its id, and every other
//!   field goes into the document's metadata. Without an id field the record's key is the id.
//! - `format=text`: the value is the text, the key the id.
//! - `format=debezium`: Debezium's change event (`{"payload": {"op", "before", "after"}}`, or
//!   the payload alone when the connector runs without schemas): `after` is the row, read as
//!   `json` reads an object; `op = d` deletes the row's document. The key (`{"id": 5}` or with
//!   its schema) is the id when no id field is named.
//!
//! A record whose value is null (a tombstone) deletes the document its key names.
//!
//! The bytes come from the broker, so they are untrusted: a record is at most `--max-file-bytes`
//! (checked before it is read) and serde_json bounds its nesting (128 deep).

use serde_json::{Map, Value};

/// How the records of a topic are read (`&format=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Json,
    Text,
    Debezium,
}

/// Which fields of a JSON record are what.
#[derive(Clone, Debug)]
pub struct Fields {
    pub format: Format,
    /// The field holding the id; None: the record's key.
    pub id: Option<String>,
    pub text: String,
    pub title: String,
}

impl Default for Fields {
    fn default() -> Self {
        Fields {
            format: Format::Json,
            id: None,
            text: "text".into(),
            title: "title".into(),
        }
    }
}

/// What a record says.
#[derive(Debug, PartialEq)]
pub enum Said {
    Document {
        id: String,
        text: String,
        title: Option<String>,
        /// The other fields of the record.
        metadata: Map<String, Value>,
    },
    /// The document `id` is gone from the source (a tombstone, Debezium's `op = d`).
    Deleted { id: String },
}

/// Why a record is not a document: the reason, and the id when the record had one.
#[derive(Debug, PartialEq)]
pub struct Unreadable {
    pub id: Option<String>,
    pub reason: String,
}

fn unreadable(id: Option<String>, reason: impl Into<String>) -> Unreadable {
    Unreadable {
        id,
        reason: reason.into(),
    }
}

/// Read one record's key and value.
pub fn read(fields: &Fields, key: Option<&[u8]>, value: Option<&[u8]>) -> Result<Said, Unreadable> {
    let key_id = match key {
        None => None,
        Some(k) => Some(key_id(k, fields.format)?),
    };
    let Some(value) = value else {
        return match key_id {
            Some(id) => Ok(Said::Deleted { id }),
            None => Err(unreadable(
                None,
                "a tombstone (null value) without a key names no document to delete",
            )),
        };
    };
    match fields.format {
        Format::Text => {
            let text = std::str::from_utf8(value).map_err(|e| {
                unreadable(
                    key_id.clone(),
                    format!("the value is not UTF-8 text ({e}); format=text reads UTF-8"),
                )
            })?;
            let id = key_id.ok_or_else(|| {
                unreadable(
                    None,
                    "format=text takes the id from the record's key, and this record has none: \
                     publish it with a key",
                )
            })?;
            Ok(Said::Document {
                id,
                text: text.to_string(),
                title: None,
                metadata: Map::new(),
            })
        }
        Format::Json => {
            let object = json_object(value, &key_id, "format=json reads one JSON object")?;
            document(fields, object, key_id)
        }
        Format::Debezium => debezium(fields, value, key_id),
    }
}

/// The value as a JSON object.
fn json_object(
    value: &[u8],
    key_id: &Option<String>,
    shape: &str,
) -> Result<Map<String, Value>, Unreadable> {
    match serde_json::from_slice::<Value>(value) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(unreadable(
            key_id.clone(),
            format!("not a JSON object; {shape}"),
        )),
        Err(e) => Err(unreadable(
            key_id.clone(),
            format!("not valid JSON ({e}); {shape}"),
        )),
    }
}

/// A JSON object's document.
fn document(
    fields: &Fields,
    mut object: Map<String, Value>,
    key_id: Option<String>,
) -> Result<Said, Unreadable> {
    let id = match &fields.id {
        Some(name) => match object.remove(name) {
            Some(v) => scalar(&v).ok_or_else(|| {
                unreadable(
                    key_id.clone(),
                    format!("the id field `{name}` is not a string or a number"),
                )
            })?,
            None => {
                return Err(unreadable(
                    key_id,
                    format!("no `{name}` field (the id, &id={name})"),
                ))
            }
        },
        None => key_id.clone().ok_or_else(|| {
            unreadable(
                None,
                "the record has no key and no id field is named: publish it with a key, or \
                 name the field with &id=FIELD",
            )
        })?,
    };
    let text = match object.remove(&fields.text) {
        Some(Value::String(s)) => s,
        Some(Value::Null) | None => {
            return Err(unreadable(
                Some(id),
                format!(
                    "no `{}` field (the text; name another with &text=FIELD)",
                    fields.text
                ),
            ))
        }
        Some(_) => {
            return Err(unreadable(
                Some(id),
                format!("the text field `{}` is not a string", fields.text),
            ))
        }
    };
    let title = match object.remove(&fields.title) {
        Some(Value::String(s)) => Some(s),
        Some(Value::Null) | None => None,
        Some(other) => Some(other.to_string()),
    };
    Ok(Said::Document {
        id,
        text,
        title,
        metadata: object,
    })
}

/// A Debezium change event.
fn debezium(fields: &Fields, value: &[u8], key_id: Option<String>) -> Result<Said, Unreadable> {
    const SHAPE: &str = "format=debezium reads Debezium's JSON change events (an object with \
                         payload.op, payload.before and payload.after)";
    let mut event = json_object(value, &key_id, SHAPE)?;
    if let Some(Value::Object(payload)) = event.remove("payload") {
        event = payload;
    }
    let op = event
        .get("op")
        .and_then(Value::as_str)
        .ok_or_else(|| unreadable(key_id.clone(), format!("no `op` field; {SHAPE}")))?
        .to_string();
    let row = |name: &str| match event.get(name) {
        Some(Value::Object(o)) => Some(o.clone()),
        _ => None,
    };
    match op.as_str() {
        "d" => {
            let id = match (&fields.id, row("before")) {
                (Some(name), Some(before)) => before.get(name).and_then(scalar),
                _ => None,
            }
            .or(key_id)
            .ok_or_else(|| {
                unreadable(
                    None,
                    "a delete (op = d) whose document cannot be told: no key, and no `before` \
                     row with the id field",
                )
            })?;
            Ok(Said::Deleted { id })
        }
        "c" | "u" | "r" => {
            let after = row("after").ok_or_else(|| {
                unreadable(key_id.clone(), format!("op = {op} without an `after` row"))
            })?;
            document(fields, after, key_id)
        }
        other => Err(unreadable(
            key_id,
            format!("op `{other}` is not a change of a row (c, u, r or d)"),
        )),
    }
}

/// The id a key names: its UTF-8 text; for Debezium, the key's one field (`{"id": 5}`, with
/// or without its schema envelope), else its JSON text.
fn key_id(key: &[u8], format: Format) -> Result<String, Unreadable> {
    let text = std::str::from_utf8(key)
        .map_err(|_| unreadable(None, "the record's key is not UTF-8: it cannot be an id"))?;
    if text.is_empty() {
        return Err(unreadable(
            None,
            "the record's key is empty: it cannot be an id",
        ));
    }
    if format == Format::Debezium {
        if let Ok(Value::Object(mut o)) = serde_json::from_str::<Value>(text) {
            if let Some(Value::Object(p)) = o.remove("payload") {
                o = p;
            }
            o.remove("schema");
            if o.len() == 1 {
                if let Some(id) = o.values().next().and_then(scalar) {
                    return Ok(id);
                }
            }
            return Ok(Value::Object(o).to_string());
        }
    }
    Ok(text.to_string())
}

/// A string or a number as text.
fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json() -> Fields {
        Fields::default()
    }

    #[test]
    fn json_records_name_their_parts() {
        let said = read(
            &json(),
            Some(b"k1"),
            Some(br#"{"text": "hello", "title": "T", "lang": "en"}"#),
        )
        .unwrap();
        let Said::Document {
            id,
            text,
            title,
            metadata,
        } = said
        else {
            panic!("a document")
        };
        assert_eq!((id.as_str(), text.as_str()), ("k1", "hello"));
        assert_eq!(title.as_deref(), Some("T"));
        assert_eq!(metadata.get("lang"), Some(&Value::from("en")));
        let named = Fields {
            id: Some("doc".into()),
            text: "body".into(),
            ..json()
        };
        let said = read(&named, None, Some(br#"{"doc": 7, "body": "b"}"#)).unwrap();
        assert!(
            matches!(said, Said::Document { ref id, .. } if id == "7"),
            "{said:?}"
        );
    }

    #[test]
    fn bad_records_say_why_and_keep_their_id() {
        let e = read(&json(), Some(b"k"), Some(b"{not json")).unwrap_err();
        assert_eq!(e.id.as_deref(), Some("k"));
        assert!(e.reason.contains("not valid JSON"), "{}", e.reason);
        let e = read(&json(), Some(b"k"), Some(br#"{"title": "x"}"#)).unwrap_err();
        assert!(e.reason.contains("no `text` field"), "{}", e.reason);
        let e = read(&json(), None, Some(br#"{"text": "x"}"#)).unwrap_err();
        assert!(e.reason.contains("no key"), "{}", e.reason);
        let e = read(&json(), None, None).unwrap_err();
        assert!(e.reason.contains("tombstone"), "{}", e.reason);
        assert!(read(&json(), Some(&[0xff]), Some(b"{}")).is_err());
    }

    #[test]
    fn a_tombstone_deletes_its_key() {
        assert_eq!(
            read(&json(), Some(b"k9"), None).unwrap(),
            Said::Deleted { id: "k9".into() }
        );
    }

    #[test]
    fn debezium_events_are_rows_and_deletes() {
        let f = Fields {
            format: Format::Debezium,
            ..json()
        };
        let key = br#"{"schema": {"type": "struct"}, "payload": {"id": 5}}"#;
        let create = br#"{"schema": {}, "payload": {"op": "c", "before": null, "after": {"id": 5, "text": "row five", "title": "Five"}}}"#;
        let said = read(&f, Some(key), Some(create)).unwrap();
        assert!(
            matches!(&said, Said::Document { id, text, .. } if id == "5" && text == "row five"),
            "{said:?}"
        );
        let delete = br#"{"op": "d", "before": {"id": 5, "text": "row five"}, "after": null}"#;
        assert_eq!(
            read(&f, Some(br#"{"id": 5}"#), Some(delete)).unwrap(),
            Said::Deleted { id: "5".into() }
        );
        let e = read(&f, Some(b"5"), Some(br#"{"op": "t"}"#)).unwrap_err();
        assert!(e.reason.contains("not a change"), "{}", e.reason);
    }

    #[test]
    fn text_records_are_their_value() {
        let f = Fields {
            format: Format::Text,
            ..json()
        };
        let said = read(&f, Some(b"a"), Some("plain text é".as_bytes())).unwrap();
        assert!(matches!(said, Said::Document { ref text, .. } if text == "plain text é"));
        assert!(read(&f, Some(b"a"), Some(&[0xc3, 0x28])).is_err());
    }
}
