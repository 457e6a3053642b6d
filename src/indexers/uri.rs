//! Parsing `--index` URIs.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

#[cfg(feature = "kafka")]
use super::kafka::KafkaTarget;
#[cfg(feature = "postgres")]
use super::postgres::PgTarget;
use super::BackendError;

/// Where a run writes its output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IndexUri {
    /// `sqlite://PATH` (also `sqlite:PATH`): the embedded index.
    Sqlite(PathBuf),
    /// `postgres://USER[:PASS]@HOST:PORT/DB[?schema=S&...]`: PostgreSQL with pgvector.
    #[cfg(feature = "postgres")]
    Postgres(PgTarget),
    /// `parquet:PATH`: one row per document or chunk, vectors as fixed-size float32 lists.
    #[cfg(feature = "parquet")]
    Parquet(PathBuf),
    /// `jsonl:PATH`: one JSON object per document or chunk.
    Jsonl(PathBuf),
    /// `kafka://HOST:PORT/TOPIC`: one record per chunk on a Kafka topic.
    #[cfg(feature = "kafka")]
    Kafka(KafkaTarget),
    /// `null:` discards everything (for measuring); `null:?delay=5ms` also waits per batch,
    /// standing in for a slow backend.
    Null { delay: Duration },
}

impl FromStr for IndexUri {
    type Err = BackendError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s.strip_prefix("sqlite:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err(BackendError::Invalid(
                    "`sqlite://` needs a path, e.g. sqlite://ragline.db".into(),
                ));
            }
            return Ok(IndexUri::Sqlite(PathBuf::from(path)));
        }
        if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            #[cfg(feature = "postgres")]
            return Ok(IndexUri::Postgres(PgTarget::parse(s)?));
            #[cfg(not(feature = "postgres"))]
            return Err(not_built("postgres://", "postgres"));
        }
        if let Some(path) = s.strip_prefix("parquet:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err(BackendError::Invalid(
                    "`parquet:` needs a path, e.g. parquet:out.parquet".into(),
                ));
            }
            #[cfg(feature = "parquet")]
            return Ok(IndexUri::Parquet(PathBuf::from(path)));
            #[cfg(not(feature = "parquet"))]
            return Err(not_built("parquet:", "parquet"));
        }
        if s.starts_with("kafka://") {
            #[cfg(feature = "kafka")]
            return Ok(IndexUri::Kafka(KafkaTarget::parse(s)?));
            #[cfg(not(feature = "kafka"))]
            return Err(not_built("kafka://", "kafka"));
        }
        if let Some(path) = s.strip_prefix("jsonl:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err(BackendError::Invalid(
                    "`jsonl:` needs a path, e.g. jsonl:out.jsonl".into(),
                ));
            }
            return Ok(IndexUri::Jsonl(PathBuf::from(path)));
        }
        if let Some(rest) = s.strip_prefix("null:") {
            let mut delay = Duration::ZERO;
            if let Some(query) = rest.strip_prefix("?") {
                for pair in query.split('&') {
                    match pair.split_once('=') {
                        // A stand-in for a slow backend: a hook for tests and benchmarks.
                        Some(("delay", value)) if cfg!(feature = "test-hooks") => {
                            delay = parse_duration(value)?
                        }
                        _ => {
                            return Err(BackendError::Invalid(format!(
                                "unknown option `{pair}` in `{s}`; null: takes none (?delay=5ms \
                                 in test builds)"
                            )))
                        }
                    }
                }
            }
            return Ok(IndexUri::Null { delay });
        }
        Err(BackendError::UnknownScheme(s.to_string()))
    }
}

impl std::fmt::Display for IndexUri {
    /// The URI as given, without a password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IndexUri::Sqlite(p) => write!(f, "sqlite://{}", p.display()),
            #[cfg(feature = "postgres")]
            IndexUri::Postgres(t) => write!(f, "{t}"),
            #[cfg(feature = "parquet")]
            IndexUri::Parquet(p) => write!(f, "parquet:{}", p.display()),
            IndexUri::Jsonl(p) => write!(f, "jsonl:{}", p.display()),
            #[cfg(feature = "kafka")]
            IndexUri::Kafka(t) => write!(f, "{t}"),
            IndexUri::Null { .. } => write!(f, "null:"),
        }
    }
}

impl IndexUri {
    /// Whether the index keeps a lifecycle and answers searches (`sqlite://`, `postgres://`);
    /// output files and `null:` do neither.
    pub fn is_store(&self) -> bool {
        match self {
            IndexUri::Sqlite(_) => true,
            #[cfg(feature = "postgres")]
            IndexUri::Postgres(_) => true,
            _ => false,
        }
    }
}

/// A scheme this build leaves out, with the feature that brings it.
#[cfg(not(all(feature = "postgres", feature = "parquet")))]
fn not_built(scheme: &str, feature: &str) -> BackendError {
    BackendError::Invalid(format!(
        "{scheme} indexes need the `{feature}` feature, which this build of ragline leaves out: \
         build it with `--features {feature}` (the default build has it)"
    ))
}

fn parse_duration(value: &str) -> Result<Duration, BackendError> {
    let bad = || BackendError::Invalid(format!("bad duration `{value}`: use e.g. 250us, 5ms, 1s"));
    let (number, unit) = value
        .find(|c: char| !c.is_ascii_digit())
        .map(|i| value.split_at(i))
        .ok_or_else(bad)?;
    let n: u64 = number.parse().map_err(|_| bad())?;
    match unit {
        "us" => Ok(Duration::from_micros(n)),
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_schemes() {
        assert_eq!(
            "sqlite://rag.db".parse::<IndexUri>().unwrap(),
            IndexUri::Sqlite("rag.db".into())
        );
        assert_eq!(
            "sqlite:///abs/rag.db".parse::<IndexUri>().unwrap(),
            IndexUri::Sqlite("/abs/rag.db".into())
        );
        assert_eq!(
            "jsonl:/tmp/o.jsonl".parse::<IndexUri>().unwrap(),
            IndexUri::Jsonl("/tmp/o.jsonl".into())
        );
        #[cfg(feature = "test-hooks")]
        assert_eq!(
            "null:?delay=5ms".parse::<IndexUri>().unwrap(),
            IndexUri::Null {
                delay: Duration::from_millis(5)
            }
        );
        #[cfg(feature = "parquet")]
        assert_eq!(
            "parquet:out/v.parquet".parse::<IndexUri>().unwrap(),
            IndexUri::Parquet("out/v.parquet".into())
        );
        #[cfg(feature = "postgres")]
        {
            let pg = "postgres://u:pw@127.0.0.1:5432/db?schema=s1"
                .parse::<IndexUri>()
                .unwrap();
            assert!(matches!(&pg, IndexUri::Postgres(t) if t.schema == "s1"));
            assert_eq!(pg.to_string(), "postgres://u@127.0.0.1:5432/db?schema=s1");
        }
        // A build without a part refuses its scheme, naming the feature that brings it.
        #[cfg(not(feature = "postgres"))]
        assert!(matches!(
            "postgres://u@h/db".parse::<IndexUri>(),
            Err(BackendError::Invalid(m)) if m.contains("`postgres` feature")
        ));
        assert!(matches!(
            "es://x".parse::<IndexUri>(),
            Err(BackendError::UnknownScheme(_))
        ));
        assert!("null:?delay=5parsecs".parse::<IndexUri>().is_err());
    }
}
