//! Search filters (`ragline search --where`): which chunks a search may return, by their
//! document's id (`source=GLOB`) or metadata (`KEY=VALUE`, a glob too). Clauses are ANDed.
//! Backends apply them inside the search (the SQLite ANN masks what does not match), so k
//! results come back whenever k chunks match.

use std::str::FromStr;

/// One `--where` clause.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Clause {
    /// `source=GLOB`: the document id (its path or URL) matches the glob (`*`, `?`, `[...]`).
    Document(String),
    /// `KEY=VALUE`: the document's metadata `KEY` (front matter, a JSONL field, connector
    /// metadata; `a.b` for key `b` of an object `a`) is `VALUE` (a glob), or is a list
    /// holding it.
    Metadata { key: String, value: String },
}

/// A `--where` clause that cannot be read: what is wrong and how to write it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FilterError(String);

/// The longest key or value a clause takes.
const MAX_LEN: usize = 1024;

impl FromStr for Clause {
    type Err = FilterError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let Some((key, value)) = s.split_once('=') else {
            return Err(FilterError(format!(
                "--where `{s}` has no `=`: give source=GLOB (document id) or KEY=VALUE (metadata)"
            )));
        };
        let key = key.trim();
        if key.is_empty() || key.len() > MAX_LEN || value.len() > MAX_LEN {
            return Err(FilterError(format!(
                "--where `{s}`: the key must be 1 to {MAX_LEN} characters, the value at most {MAX_LEN}"
            )));
        }
        let part_ok = |p: &str| {
            !p.is_empty()
                && p.chars()
                    .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | ':'))
        };
        if !key.split('.').all(part_ok) {
            return Err(FilterError(format!(
                "--where `{s}`: a metadata key is letters, digits, `_`, `-` and `:`, with `.` \
                 between the keys of nested objects"
            )));
        }
        Ok(match key {
            "source" => Clause::Document(value.to_string()),
            _ => Clause::Metadata {
                key: key.to_string(),
                value: value.to_string(),
            },
        })
    }
}

/// Every clause of a search's `--where`s.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Where(pub Vec<Clause>);

impl Where {
    pub fn parse<S: AsRef<str>>(clauses: &[S]) -> Result<Where, FilterError> {
        clauses
            .iter()
            .map(|c| c.as_ref().parse())
            .collect::<Result<_, _>>()
            .map(Where)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// An SQLite condition over the documents table aliased `doc`, with its parameters (the
    /// keys become JSON paths, quoted; nothing from the clause is pasted into the SQL).
    pub fn sqlite(&self) -> (String, Vec<String>) {
        let mut sql = Vec::new();
        let mut params = Vec::new();
        for clause in &self.0 {
            let n = params.len();
            match clause {
                Clause::Document(glob) => {
                    sql.push(format!("doc.id GLOB ?{}", n + 1));
                    params.push(glob.clone());
                }
                Clause::Metadata { key, value } => {
                    // json_each on a scalar yields it; on a list, each element.
                    sql.push(format!(
                        "EXISTS (SELECT 1 FROM json_each(doc.metadata, ?{}) j
                                 WHERE j.type NOT IN ('object', 'array')
                                   AND CAST(j.value AS TEXT) GLOB ?{})",
                        n + 1,
                        n + 2
                    ));
                    // `a.b` is key `b` of the object under `a` (`metadata.lang` for a JSONL
                    // record's `metadata` object).
                    let path: String = key.split('.').map(|k| format!(".\"{k}\"")).collect();
                    params.push(format!("${path}"));
                    params.push(value.clone());
                }
            }
        }
        if sql.is_empty() {
            ("1".into(), params)
        } else {
            (sql.join(" AND "), params)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clauses_parse_and_bad_ones_say_how_to_write_them() {
        let w = Where::parse(&[
            "source=docs/api/*",
            "lang=en",
            "tags=a=b",
            "metadata.lang=fr",
        ])
        .unwrap();
        assert_eq!(w.0[0], Clause::Document("docs/api/*".into()));
        assert_eq!(
            w.0[2],
            Clause::Metadata {
                key: "tags".into(),
                value: "a=b".into()
            }
        );
        for bad in ["nokey", "=x", "a\"b=c", "a b=c", "a..b=c", ".a=b"] {
            let e = Where::parse(&[bad]).unwrap_err().to_string();
            assert!(e.contains("--where"), "{e}");
        }
        let (sql, params) = w.sqlite();
        assert_eq!(
            params,
            [
                "docs/api/*",
                "$.\"lang\"",
                "en",
                "$.\"tags\"",
                "a=b",
                "$.\"metadata\".\"lang\"",
                "fr"
            ]
        );
        assert!(sql.contains("?5") && !sql.contains("docs/api"), "{sql}");
    }
}
