//! Places: the settings of a pipeline that send data or credentials somewhere (the index's
//! URI, a remote embedder's URL and key variable, each LLM stage's URL and key variable).
//!
//! A process takes its places from its operator only: its own flags and `ragline.toml`.
//! Settings that come from elsewhere (a run's record on a broker, the copy of the settings an
//! index keeps with a dead letter) are untrusted: whoever controls the broker or wrote the
//! file could name `https://elsewhere` with `api_key_env = "AWS_SECRET_ACCESS_KEY"`. So
//! [`adopt`] takes such settings for everything that is not a place, checks that every place
//! they name is the one the operator configured, and refuses them with the difference shown
//! when not; it never sends anything to a place it read from them.

use std::collections::BTreeMap;

use super::PipelineConfig;
use crate::indexers::IndexUri;
use crate::secret::redact_url;

/// Which places matter to the process adopting the settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Uses {
    /// The index and the services (a worker, an indexer, a requeue).
    IndexAndServices,
    /// The services only (an embedder never opens the index).
    ServicesOnly,
}

/// The places `config` names, keyed by their `ragline.toml` key, as messages may show them
/// (no secrets): an absent one is not listed.
pub fn places(config: &PipelineConfig, uses: Uses) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if uses == Uses::IndexAndServices {
        out.insert("index.uri".into(), index_place(&config.index.uri.value));
    }
    let remote = &config.stages.embed.remote;
    if let Some(url) = &remote.url {
        out.insert("stages.embed.remote.url".into(), redact_url(url));
    }
    if let Some(var) = &remote.api_key_env {
        out.insert("stages.embed.remote.api_key_env".into(), var.clone());
    }
    for stage in std::iter::once(&config.stages.summary).chain(&config.stages.llm) {
        if let Some(url) = &stage.url {
            out.insert(format!("stages.{}.url", stage.name), redact_url(url));
        }
        if let Some(var) = &stage.api_key_env {
            out.insert(format!("stages.{}.api_key_env", stage.name), var.clone());
        }
    }
    out
}

/// The index as places compare it: a file by its absolute path, a server without its
/// password.
fn index_place(uri: &IndexUri) -> String {
    match uri {
        IndexUri::Sqlite(path) => format!(
            "sqlite://{}",
            std::path::absolute(path)
                .unwrap_or_else(|_| path.clone())
                .display()
        ),
        other => redact_url(&other.to_string()),
    }
}

/// Settings refused because they name places this process was not given: each place, what
/// the run names and what this process has (None: nothing).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Refused {
    /// The process, for the message ("this worker").
    pub who: String,
    pub differences: Vec<(String, Option<String>, Option<String>)>,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let who = &self.who;
        writeln!(
            f,
            "refusing settings that name places {who} was not given (a place gets data or a \
             key only when its operator names it):"
        )?;
        for (key, w, h) in &self.differences {
            writeln!(
                f,
                "  {key}: the run names {}, {who} has {}",
                w.as_deref().map_or("nothing".into(), |v| format!("`{v}`")),
                h.as_deref().map_or("nothing".into(), |v| format!("`{v}`"))
            )?;
        }
        write!(
            f,
            "start it with the same places as the run's publisher: --index, and the services' \
             sections in its own ragline.toml (--config)"
        )
    }
}

/// `theirs` (settings from a broker or an index) with every place taken from `own` (this
/// process's flags and `ragline.toml`). Refused, with each difference shown, when `theirs`
/// names a place `own` does not, or another one. `who` is the process, for the message
/// ("this worker").
pub fn adopt(
    theirs: PipelineConfig,
    own: &PipelineConfig,
    uses: Uses,
    who: &str,
) -> Result<PipelineConfig, Refused> {
    let (want, have) = (places(&theirs, uses), places(own, uses));
    let mut differences = Vec::new();
    for key in want.keys().chain(have.keys()) {
        let (w, h) = (want.get(key), have.get(key));
        if w != h && !differences.iter().any(|(k, _, _)| k == key) {
            differences.push((key.clone(), w.cloned(), h.cloned()));
        }
    }
    if !differences.is_empty() {
        return Err(Refused {
            who: who.to_string(),
            differences,
        });
    }
    let mut adopted = theirs;
    if uses == Uses::IndexAndServices {
        adopted.index.uri = own.index.uri.clone();
    }
    adopted.stages.embed.remote.url = own.stages.embed.remote.url.clone();
    adopted.stages.embed.remote.api_key_env = own.stages.embed.remote.api_key_env.clone();
    let own_stage = |name: &str| {
        std::iter::once(&own.stages.summary)
            .chain(&own.stages.llm)
            .find(|s| s.name == name)
    };
    for stage in std::iter::once(&mut adopted.stages.summary).chain(adopted.stages.llm.iter_mut()) {
        let mine = own_stage(&stage.name);
        stage.url = mine.and_then(|s| s.url.clone());
        stage.api_key_env = mine.and_then(|s| s.api_key_env.clone());
    }
    Ok(adopted)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(feature = "postgres")]
    use crate::jobs::config::Parsed;

    fn with_remote(url: Option<&str>, key: Option<&str>) -> PipelineConfig {
        let mut c = PipelineConfig::default();
        c.stages.embed.remote.url = url.map(str::to_string);
        c.stages.embed.remote.api_key_env = key.map(str::to_string);
        c
    }

    #[test]
    fn places_come_from_the_operator_and_a_hostile_run_is_refused_with_the_difference() {
        let own = with_remote(Some("http://127.0.0.1:8080"), None);
        // The same places: taken, with the process's own values.
        let mut same = with_remote(Some("http://127.0.0.1:8080"), None);
        same.chunk.tokens = 99;
        let got = adopt(same, &own, Uses::ServicesOnly, "this worker").unwrap();
        assert_eq!(
            got.chunk.tokens, 99,
            "what is not a place comes from the run"
        );
        // A run that would send a secret elsewhere.
        let hostile = with_remote(
            Some("https://elsewhere.example"),
            Some("AWS_SECRET_ACCESS_KEY"),
        );
        let e = adopt(hostile, &own, Uses::ServicesOnly, "this worker")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("stages.embed.remote.url: the run names `https://elsewhere.example`"),
            "{e}"
        );
        assert!(
            e.contains("stages.embed.remote.api_key_env: the run names `AWS_SECRET_ACCESS_KEY`, this worker has nothing"),
            "{e}"
        );
        // An index the process was not given (a Postgres one: it has a password to keep).
        #[cfg(feature = "postgres")]
        {
            // An index the process was not given.
            let mut theirs = PipelineConfig::default();
            theirs.index.uri = Parsed::parse("postgres://u@elsewhere/db").unwrap();
            let mut mine = PipelineConfig::default();
            mine.index.uri = Parsed::parse("postgres://u:pw@db.local/db").unwrap();
            let e = adopt(
                theirs.clone(),
                &mine,
                Uses::IndexAndServices,
                "this indexer",
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains("index.uri"), "{e}");
            assert!(!e.contains("pw"), "{e}");
            // The embedder never opens the index: that difference does not matter to it.
            assert!(adopt(theirs, &mine, Uses::ServicesOnly, "this embedder").is_ok());
            // The same index, the password only on this side: the process's URI is used.
            let mut theirs = PipelineConfig::default();
            theirs.index.uri = Parsed::parse("postgres://u@db.local/db").unwrap();
            let got = adopt(theirs, &mine, Uses::IndexAndServices, "this indexer").unwrap();
            assert_eq!(got.index.uri, mine.index.uri);
        }
        // An LLM stage's URL is a place too.
        let mut theirs = PipelineConfig::default();
        theirs.stages.summary.url = Some("http://attacker.example".into());
        theirs.stages.summary.model = "m".into();
        let e = adopt(
            theirs,
            &PipelineConfig::default(),
            Uses::ServicesOnly,
            "this worker",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("stages.summary.url"), "{e}");
    }
}
