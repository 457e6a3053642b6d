//! JSONL: one document per line. The id, text and title come from configurable fields; every
//! other field goes to metadata. A bad line fails that line (its number in the reason) and
//! the connector goes on with the next. A file is read a line at a time and no line is held
//! past `--max-file-bytes` (a line is a document): a longer one is skipped to its end without
//! being kept, and fails with the reason. The JSON itself is bounded by serde_json (nesting
//! 128 deep at most).

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;

use serde_json::{Map, Value};

use super::{BadRecord, Connector, ConnectorError};
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
    /// Bytes one line (one document) may have.
    pub max_line_bytes: u64,
}

impl Connector for JsonlConnector {
    fn name(&self) -> &'static str {
        "jsonl"
    }

    fn run(&mut self, publisher: &Publisher) -> Result<(), ConnectorError> {
        for path in &self.paths {
            if path.as_os_str() == "-" {
                publish_lines(
                    std::io::stdin().lock(),
                    "-",
                    &self.fields,
                    self.max_line_bytes,
                    publisher,
                )?;
                continue;
            }
            let source = path.display().to_string();
            match File::open(path) {
                Ok(file) => publish_lines(
                    BufReader::new(file),
                    &source,
                    &self.fields,
                    self.max_line_bytes,
                    publisher,
                )?,
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
/// messages. A line over `max_line_bytes` fails without being held.
pub fn publish_lines(
    mut reader: impl BufRead,
    source: &str,
    fields: &JsonlFields,
    max_line_bytes: u64,
    publisher: &Publisher,
) -> Result<(), ConnectorError> {
    let mut buf = Vec::new();
    let mut number = 0usize;
    loop {
        buf.clear();
        number += 1;
        let line = match read_line_bounded(&mut reader, &mut buf, max_line_bytes) {
            Ok(line) => line,
            Err(e) => {
                let at = format!("{source}:{number}");
                publisher.publish_failed(&at, Some(&at), "read", &format!("read error: {e}"));
                return Ok(());
            }
        };
        match line {
            Line::End => return Ok(()),
            Line::Read => {}
            Line::TooLong(bytes) => {
                let at = format!("{source}:{number}");
                publisher.publish_failed(
                    &at,
                    Some(&at),
                    "read",
                    &format!(
                        "line {number} is {bytes} bytes, over --max-file-bytes={max_line_bytes} \
                         (the limit of one document); raise it to ingest this line"
                    ),
                );
                continue;
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

/// The fuzz target's view of a JSONL file: every line read as the connector reads it (at
/// most `max_line_bytes` held) and parsed into a document.
#[doc(hidden)]
pub fn fuzz_lines(data: &[u8], max_line_bytes: u64) {
    let mut reader = std::io::BufReader::with_capacity(64, data);
    let mut buf = Vec::new();
    let fields = JsonlFields::default();
    for number in 1.. {
        buf.clear();
        match read_line_bounded(&mut reader, &mut buf, max_line_bytes) {
            Ok(Line::End) | Err(_) => return,
            Ok(Line::TooLong(_)) => {}
            Ok(Line::Read) => {
                assert!(buf.len() as u64 <= max_line_bytes + 1);
                let _ = parse_line(&buf, &format!("fuzz:{number}"), &fields);
            }
        }
    }
}

/// What one read of a line came to.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    /// A line is in the buffer (its newline included, if it had one).
    Read,
    /// The line had this many bytes, over the limit: skipped to its end, not kept.
    TooLong(u64),
    /// Nothing left.
    End,
}

/// Read one line into `buf` (with its newline), holding at most `max` bytes of it: a longer
/// line is read to its end and dropped.
fn read_line_bounded(
    reader: &mut impl BufRead,
    buf: &mut Vec<u8>,
    max: u64,
) -> std::io::Result<Line> {
    // Bytes of the line so far, its newline left out.
    let mut total = 0u64;
    let mut over = false;
    loop {
        let available = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            return Ok(match (total, over) {
                (0, _) => Line::End,
                (_, true) => Line::TooLong(total),
                (_, false) => Line::Read,
            });
        }
        let (len, newline) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (available.len(), false),
        };
        total += len as u64;
        if !over && total > max {
            over = true;
            buf.clear();
        }
        if !over {
            buf.extend_from_slice(&available[..len]);
            if newline {
                buf.push(b'\n');
            }
        }
        reader.consume(len + usize::from(newline));
        if newline {
            return Ok(if over {
                Line::TooLong(total)
            } else {
                Line::Read
            });
        }
    }
}

fn parse_line(line: &[u8], at: &str, fields: &JsonlFields) -> Result<Document, BadRecord> {
    let value: Value = serde_json::from_slice(line).map_err(|e| {
        BadRecord(format!(
            "invalid JSON ({e}); each line must be one JSON object"
        ))
    })?;
    let Value::Object(mut map) = value else {
        return Err(BadRecord(
            "not a JSON object; each line must be one JSON object".into(),
        ));
    };
    let id = match &fields.id {
        Some(name) => take_id(&mut map, name)?.ok_or_else(|| {
            BadRecord(format!("no field `{name}`; set --id-field to the id field"))
        })?,
        None => match take_id(&mut map, "id")? {
            Some(id) => id,
            None => take_id(&mut map, "_id")?.unwrap_or_else(|| at.to_string()),
        },
    };
    let text = match map.remove(&fields.text) {
        Some(Value::String(s)) => s,
        Some(other) => {
            return Err(BadRecord(format!(
                "field `{}` is {}, not a string; set --text-field to the text field",
                fields.text,
                kind(&other)
            )))
        }
        None => {
            return Err(BadRecord(format!(
                "no field `{}`; set --text-field to the text field",
                fields.text
            )))
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

fn take_id(map: &mut Map<String, Value>, name: &str) -> Result<Option<String>, BadRecord> {
    match map.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s)),
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(other) => Err(BadRecord(format!(
            "field `{name}` is {}; an id must be a non-empty string or a number",
            kind(&other)
        ))),
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
        let err = parse_line(br#"{"id":1,"body":"x"}"#, "c:3", &f)
            .unwrap_err()
            .0;
        assert!(err.contains("--text-field"), "{err}");
        let err = parse_line(br#"{"id":1,"text":"x""#, "c:4", &f)
            .unwrap_err()
            .0;
        assert!(err.contains("invalid JSON"), "{err}");
        let strict = JsonlFields {
            id: Some("doc_id".into()),
            ..JsonlFields::default()
        };
        let err = parse_line(br#"{"id":1,"text":"x"}"#, "c:5", &strict)
            .unwrap_err()
            .0;
        assert!(err.contains("--id-field"), "{err}");
    }

    #[test]
    fn a_line_over_the_limit_is_skipped_without_being_held() {
        // A tiny reader buffer, so lines span many fills.
        let text = format!("short\n{}\nlast", "x".repeat(1000));
        let mut r = std::io::BufReader::with_capacity(7, text.as_bytes());
        let mut buf = Vec::new();
        assert_eq!(
            read_line_bounded(&mut r, &mut buf, 100).unwrap(),
            Line::Read
        );
        assert_eq!(buf, b"short\n");
        buf.clear();
        assert_eq!(
            read_line_bounded(&mut r, &mut buf, 100).unwrap(),
            Line::TooLong(1000)
        );
        assert!(buf.capacity() < 1000, "the long line was never held");
        buf.clear();
        assert_eq!(
            read_line_bounded(&mut r, &mut buf, 100).unwrap(),
            Line::Read
        );
        assert_eq!(buf, b"last");
        buf.clear();
        assert_eq!(read_line_bounded(&mut r, &mut buf, 100).unwrap(), Line::End);
        // Exactly at the limit is fine.
        let mut r = std::io::BufReader::new(&b"abc\n"[..]);
        assert_eq!(read_line_bounded(&mut r, &mut buf, 3).unwrap(), Line::Read);
    }
}
