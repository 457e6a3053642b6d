//! JSONL: one document per line. The id, text and title come from configurable fields; every
//! other field goes to metadata. A bad line fails that line (its number in the reason) and
//! the connector goes on with the next.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;

use serde_json::{Map, Value};

use super::{Connector, ConnectorError};
use crate::document::Document;
use crate::publisher::Publisher;

/// Which fields of a line make the document.
#[derive(Clone, Debug)]
pub struct JsonlFields {
    /// The id field. `None`: `id`, else `_id` (BEIR), else `SOURCE:LINE`.
    pub id: Option<String>,
    pub text: String,
    pub title: String,
    /// Put the title at the head of the text ("TITLE\n\nTEXT"), so it is chunked and
    /// embedded with it (the BEIR convention for titled passages).
    pub title_in_text: bool,
}

impl Default for JsonlFields {
    fn default() -> Self {
        JsonlFields {
            id: None,
            text: "text".into(),
            title: "title".into(),
            title_in_text: false,
        }
    }
}

/// Reads JSONL files (or standard input, as `-`).
pub struct JsonlConnector {
    pub paths: Vec<PathBuf>,
    pub fields: JsonlFields,
}

impl Connector for JsonlConnector {
    fn name(&self) -> &'static str {
        "jsonl"
    }

    fn run(&mut self, publisher: &Publisher) -> Result<(), ConnectorError> {
        for path in &self.paths {
            if path.as_os_str() == "-" {
                publish_lines(std::io::stdin().lock(), "-", &self.fields, publisher)?;
                continue;
            }
            let source = path.display().to_string();
            match File::open(path) {
                Ok(file) => publish_lines(BufReader::new(file), &source, &self.fields, publisher)?,
                Err(e) => publisher.publish_failed(
                    &source,
                    Some(&source),
                    "read",
                    &format!("cannot open: {e}"),
                ),
            }
        }
        Ok(())
    }
}

/// Publish one document per non-blank line of `reader`; `source` names the file in ids and
/// messages.
pub fn publish_lines(
    mut reader: impl BufRead,
    source: &str,
    fields: &JsonlFields,
    publisher: &Publisher,
) -> Result<(), ConnectorError> {
    let mut buf = Vec::new();
    let mut number = 0usize;
    loop {
        buf.clear();
        number += 1;
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) => {
                let at = format!("{source}:{number}");
                publisher.publish_failed(&at, Some(&at), "read", &format!("read error: {e}"));
                return Ok(());
            }
        }
        if buf.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let at = format!("{source}:{number}");
        match parse_line(&buf, &at, fields) {
            Ok(doc) => publisher.publish(doc)?,
            Err(reason) => publisher.publish_failed(
                &at,
                Some(&at),
                "read",
                &format!("line {number}: {reason}"),
            ),
        }
    }
}

fn parse_line(line: &[u8], at: &str, fields: &JsonlFields) -> Result<Document, String> {
    let value: Value = serde_json::from_slice(line)
        .map_err(|e| format!("invalid JSON ({e}); each line must be one JSON object"))?;
    let Value::Object(mut map) = value else {
        return Err("not a JSON object; each line must be one JSON object".into());
    };
    let id = match &fields.id {
        Some(name) => take_id(&mut map, name)?
            .ok_or_else(|| format!("no field `{name}`; set --id-field to the id field"))?,
        None => match take_id(&mut map, "id")? {
            Some(id) => id,
            None => take_id(&mut map, "_id")?.unwrap_or_else(|| at.to_string()),
        },
    };
    let text = match map.remove(&fields.text) {
        Some(Value::String(s)) => s,
        Some(other) => {
            return Err(format!(
                "field `{}` is {}, not a string; set --text-field to the text field",
                fields.text,
                kind(&other)
            ))
        }
        None => {
            return Err(format!(
                "no field `{}`; set --text-field to the text field",
                fields.text
            ))
        }
    };
    let mut doc = Document::new(id, text);
    doc.fields.source = Some(at.to_string());
    match map.remove(&fields.title) {
        Some(Value::String(s)) if !s.is_empty() => doc.fields.title = Some(s),
        Some(Value::Null | Value::String(_)) | None => {}
        Some(other) => {
            map.insert(fields.title.clone(), other);
        }
    }
    if fields.title_in_text {
        if let Some(title) = doc.fields.title.as_deref().filter(|t| !t.trim().is_empty()) {
            doc.fields.text = format!("{title}\n\n{}", doc.fields.text);
        }
    }
    doc.fields.metadata = map.into_iter().collect();
    doc.fields
        .metadata
        .entry("format".into())
        .or_insert_with(|| Value::String("text".into()));
    Ok(doc)
}

fn take_id(map: &mut Map<String, Value>, name: &str) -> Result<Option<String>, String> {
    match map.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s)),
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(other) => Err(format!(
            "field `{name}` is {}; an id must be a non-empty string or a number",
            kind(&other)
        )),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "an empty string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fields_and_explains_bad_lines() {
        let f = JsonlFields::default();
        let doc = parse_line(
            br#"{"_id":"7","title":"T","text":"body","year":2020}"#,
            "c:1",
            &f,
        )
        .unwrap();
        assert_eq!(doc.id, "7");
        assert_eq!(doc.fields.title.as_deref(), Some("T"));
        assert_eq!(doc.fields.metadata["year"], 2020);
        let doc = parse_line(br#"{"text":"body"}"#, "c:2", &f).unwrap();
        assert_eq!(doc.id, "c:2");
        let err = parse_line(br#"{"id":1,"body":"x"}"#, "c:3", &f).unwrap_err();
        assert!(err.contains("--text-field"), "{err}");
        let err = parse_line(br#"{"id":1,"text":"x""#, "c:4", &f).unwrap_err();
        assert!(err.contains("invalid JSON"), "{err}");
        let strict = JsonlFields {
            id: Some("doc_id".into()),
            ..JsonlFields::default()
        };
        let err = parse_line(br#"{"id":1,"text":"x"}"#, "c:5", &strict).unwrap_err();
        assert!(err.contains("--id-field"), "{err}");
    }
}
