//! YAML front matter (`---` ... `---` at the top of a markdown file).

use std::collections::BTreeMap;

use serde_json::Value;
use yaml_rust2::{Yaml, YamlLoader};

/// Split off front matter: returns (metadata, byte offset where the body starts). Invalid YAML
/// is kept as text, not lost: the body then starts at 0.
pub fn split(text: &str) -> (BTreeMap<String, Value>, usize) {
    let mut meta = BTreeMap::new();
    let first_line_end = match text.find('\n') {
        Some(i) => i,
        None => return (meta, 0),
    };
    if text[..first_line_end].trim_end() != "---" {
        return (meta, 0);
    }
    let mut pos = first_line_end + 1;
    let yaml_start = pos;
    loop {
        let line_end = text[pos..].find('\n').map_or(text.len(), |i| pos + i);
        let line = text[pos..line_end].trim_end();
        if line == "---" || line == "..." {
            let yaml = &text[yaml_start..pos];
            let Ok(docs) = YamlLoader::load_from_str(yaml) else {
                return (BTreeMap::new(), 0);
            };
            if let Some(Yaml::Hash(hash)) = docs.into_iter().next() {
                for (k, v) in hash {
                    if let Some(k) = k.as_str() {
                        meta.insert(k.to_string(), to_json(v));
                    }
                }
            }
            return (meta, (line_end + 1).min(text.len()));
        }
        if line_end >= text.len() {
            return (BTreeMap::new(), 0);
        }
        pos = line_end + 1;
    }
}

fn to_json(y: Yaml) -> Value {
    match y {
        Yaml::String(s) => Value::String(s),
        Yaml::Real(s) => s
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map_or(Value::String(s), Value::Number),
        Yaml::Integer(i) => Value::from(i),
        Yaml::Boolean(b) => Value::Bool(b),
        Yaml::Array(a) => Value::Array(a.into_iter().map(to_json).collect()),
        Yaml::Hash(h) => Value::Object(
            h.into_iter()
                .filter_map(|(k, v)| k.as_str().map(|k| (k.to_string(), to_json(v))))
                .collect(),
        ),
        Yaml::Null | Yaml::BadValue | Yaml::Alias(_) => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_front_matter() {
        let (meta, body) = split("---\ntitle: useEffect\ntags: [a, b]\n---\n# Hi\n");
        assert_eq!(meta["title"], "useEffect");
        assert_eq!(meta["tags"], serde_json::json!(["a", "b"]));
        assert_eq!(body, "---\ntitle: useEffect\ntags: [a, b]\n---\n".len());
        assert_eq!(split("# no front matter\n").1, 0);
        assert_eq!(split("---\nnot closed\n").1, 0);
    }
}
