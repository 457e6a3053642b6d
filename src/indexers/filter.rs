//! Search filters (`ragline search --where`): which chunks a search may return, by their
//! document's id (`source=GLOB`), metadata (`KEY=VALUE`, a glob too), entities
//! (`entity.ORG=Acme Corp`, `entity=Acme Corp` for any type) or labels (`label=sports`).
//! Clauses are ANDed. Backends apply them inside the search (the SQLite ANN masks what does
//! not match), so k results come back whenever k chunks match. Entities and labels are
//! looked up by their indexes (`document_entities(type, norm)`, `document_labels(label)`),
//! never by scanning JSON.

use crate::lifecycle::DocumentEntity;

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
    /// `entity.TYPE=NAME` (`entity=NAME`: of any type): the document mentions the entity
    /// (compared in its normalised form: case, runs of spaces and end punctuation aside);
    /// `entity.TYPE=*` (name None): any entity of the type.
    Entity {
        kind: Option<String>,
        name: Option<String>,
    },
    /// `label=LABEL`: the labels stage gave the document this label.
    Label(String),
}

/// A value a backend binds for a clause.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Param {
    Text(String),
    /// A path of keys into a JSON object (Postgres `#>`).
    Path(Vec<String>),
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
            "label" => Clause::Label(value.to_string()),
            "entity" | "entity.*" => Clause::Entity {
                kind: None,
                name: entity_name(s, value)?,
            },
            _ if key.starts_with("entity.") => Clause::Entity {
                kind: Some(key["entity.".len()..].to_string()),
                name: if value.trim() == "*" {
                    None
                } else {
                    entity_name(s, value)?
                },
            },
            _ => Clause::Metadata {
                key: key.to_string(),
                value: value.to_string(),
            },
        })
    }
}

/// An entity's name as filters compare it; a name with nothing left to compare is refused.
fn entity_name(clause: &str, value: &str) -> Result<Option<String>, FilterError> {
    let norm = DocumentEntity::normalize(value);
    if norm.is_empty() {
        return Err(FilterError(format!(
            "--where `{clause}`: give the entity's name (entity.ORG=Acme Corp), or `*` after a \
             type for any entity of it (entity.ORG=*)"
        )));
    }
    Ok(Some(norm))
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
                Clause::Entity { kind, name } => {
                    sql.push(entity_sql(
                        "document_entities",
                        kind.is_some(),
                        name.is_some(),
                        n + 1,
                        "?",
                    ));
                    params.extend(kind.iter().cloned());
                    params.extend(name.iter().cloned());
                }
                Clause::Label(label) => {
                    sql.push(format!(
                        "doc.id IN (SELECT document_id FROM document_labels WHERE label = ?{})",
                        n + 1
                    ));
                    params.push(label.clone());
                }
            }
        }
        if sql.is_empty() {
            ("1".into(), params)
        } else {
            (sql.join(" AND "), params)
        }
    }

    /// A Postgres condition over the documents table aliased `doc` in `schema`, its
    /// parameters numbered from `$first` (globs become anchored regular expressions).
    pub fn postgres(&self, schema: &str, first: usize) -> (String, Vec<Param>) {
        let mut sql = Vec::new();
        let mut params = Vec::new();
        for clause in &self.0 {
            let n = first + params.len();
            match clause {
                Clause::Document(glob) => {
                    sql.push(format!("doc.id ~ ${n}"));
                    params.push(Param::Text(glob_regex(glob)));
                }
                Clause::Metadata { key, value } => {
                    // A scalar is itself; a list, each element.
                    let at = format!("(doc.metadata #> ${n}::text[])");
                    sql.push(format!(
                        "EXISTS (SELECT 1 FROM jsonb_array_elements(CASE jsonb_typeof({at})
                                     WHEN 'array' THEN {at} ELSE jsonb_build_array({at}) END) j
                                 WHERE jsonb_typeof(j) IN ('string', 'number', 'boolean')
                                   AND (j #>> '{{}}') ~ ${})",
                        n + 1
                    ));
                    params.push(Param::Path(key.split('.').map(str::to_string).collect()));
                    params.push(Param::Text(glob_regex(value)));
                }
                Clause::Entity { kind, name } => {
                    let table = format!("{schema}.document_entities");
                    sql.push(entity_sql(&table, kind.is_some(), name.is_some(), n, "$"));
                    params.extend(kind.iter().cloned().map(Param::Text));
                    params.extend(name.iter().cloned().map(Param::Text));
                }
                Clause::Label(label) => {
                    sql.push(format!(
                        "doc.id IN (SELECT document_id FROM {schema}.document_labels
                                    WHERE label = ${n})"
                    ));
                    params.push(Param::Text(label.clone()));
                }
            }
        }
        if sql.is_empty() {
            ("true".into(), params)
        } else {
            (sql.join(" AND "), params)
        }
    }
}

/// The condition of an entity clause: by `(type, norm)`, `type` or `norm`, as given.
fn entity_sql(table: &str, typed: bool, named: bool, n: usize, mark: &str) -> String {
    let mut parts = Vec::new();
    if typed {
        parts.push(format!("type = {mark}{n}"));
    }
    if named {
        parts.push(format!("norm = {mark}{}", n + usize::from(typed)));
    }
    format!(
        "doc.id IN (SELECT document_id FROM {table} WHERE {})",
        parts.join(" AND ")
    )
}

/// An SQLite GLOB (`*`, `?`, `[...]`, `[^...]`) as an anchored POSIX regular expression.
pub fn glob_regex(glob: &str) -> String {
    let mut out = String::from("^");
    let mut chars = glob.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '*' => out.push_str(".*"),
            '?' => out.push('.'),
            '[' => {
                // A class runs to the next `]` (a `]` first in it is itself); unclosed, `[`
                // is itself.
                let rest: String = chars.clone().collect();
                let start = usize::from(rest.starts_with(']') || rest.starts_with("^]"))
                    + usize::from(rest.starts_with('^'));
                match rest[start..].find(']').map(|i| i + start) {
                    Some(end) => {
                        let body = &rest[..end];
                        out.push('[');
                        for (i, b) in body.chars().enumerate() {
                            if b == '\\' || (b == '[' && i > 0) {
                                out.push('\\');
                            }
                            out.push(b);
                        }
                        out.push(']');
                        for _ in 0..body.chars().count() + 1 {
                            chars.next();
                        }
                    }
                    None => out.push_str("\\["),
                }
            }
            c if ".^$+(){}|\\]".contains(c) => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out.push('$');
    out
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

    #[test]
    fn entity_and_label_clauses_look_up_their_tables() {
        let w = Where::parse(&["entity.ORG=  ACME   Corp.", "entity=Ada", "label=sports"]).unwrap();
        assert_eq!(
            w.0[0],
            Clause::Entity {
                kind: Some("ORG".into()),
                name: Some("acme corp".into())
            }
        );
        let any = Where::parse(&["entity.PER=*"]).unwrap();
        assert_eq!(any.sqlite().1, ["PER"]);
        assert!(
            any.sqlite().0.contains("WHERE type = ?1)"),
            "{}",
            any.sqlite().0
        );
        assert!(Where::parse(&["entity=*"]).is_err() && Where::parse(&["entity.ORG=..."]).is_err());
        let (sql, params) = w.sqlite();
        assert_eq!(params, ["ORG", "acme corp", "ada", "sports"]);
        assert!(
            sql.contains("type = ?1 AND norm = ?2") && sql.contains("norm = ?3"),
            "{sql}"
        );
        assert!(sql.contains("label = ?4"), "{sql}");
        let (pg, pg_params) = w.postgres("s", 3);
        assert!(
            pg.contains("s.document_entities WHERE type = $3 AND norm = $4"),
            "{pg}"
        );
        assert!(
            pg.contains("s.document_labels") && pg.contains("label = $6"),
            "{pg}"
        );
        assert_eq!(pg_params.len(), 4);
    }

    #[test]
    fn globs_become_anchored_regular_expressions() {
        assert_eq!(glob_regex("docs/*.md"), "^docs/.*\\.md$");
        assert_eq!(glob_regex("a?[bc][^d]"), "^a.[bc][^d]$");
        assert_eq!(glob_regex("x[("), "^x\\[\\($");
        assert_eq!(glob_regex("(a+b)|c$"), "^\\(a\\+b\\)\\|c\\$$");
    }
}
