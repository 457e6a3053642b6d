//! Document-level stages that ask a language model (`summary`, and `llm` stages with their
//! own prompt): for each claimed document, its text (from its chunks) goes into the stage's
//! prompt, the answers are asked for at once within the endpoint's limits, and each answer is
//! written with the status change in one transaction (replacing any earlier answer). A
//! failure is recorded against the document (retried with backoff, then dead-lettered with
//! each attempt's status and message).

use std::sync::Arc;

use super::{EnrichWorker, Shared};
use crate::http::chat::ChatClient;
use crate::lifecycle::{EnrichStore, Owner, StageSettings, StoreError, WorkItem, WorkKey};

/// One LLM stage as enrich runs it.
pub struct LlmStage {
    /// The stage's name: its lifecycle rows and the metadata key of its answers.
    pub name: String,
    pub client: Arc<ChatClient>,
    /// `{title}`, `{text}`, `{source}` and `{id}` are the document's; `{summary}`,
    /// `{entities}`, `{labels}` (any stage it depends on) what that stage made of it.
    pub prompt: String,
    /// The text is cut to about this many tokens (4 bytes each, at a char boundary).
    pub max_input_tokens: usize,
    /// Answers go in the keyword index too.
    pub keyword_index: bool,
    pub settings: StageSettings,
    /// What its answers depend on (model, prompt...): a change makes them all stale.
    pub fingerprint: String,
}

impl std::fmt::Debug for LlmStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmStage")
            .field("name", &self.name)
            .field("url", &self.client.endpoint().settings().url)
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

impl LlmStage {
    /// The prompt for a document, and its size in tokens (estimated). `outputs`: what the
    /// document-level stages made of it, (stage, output).
    pub fn prompt_for(
        &self,
        id: &str,
        title: &str,
        source: &str,
        text: &str,
        outputs: &[(String, String)],
    ) -> (String, usize) {
        let budget = self.max_input_tokens * 4;
        let text = if text.len() > budget {
            let mut end = budget;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            &text[..end]
        } else {
            text
        };
        let mut slots: Vec<(&str, &str)> = vec![
            ("title", title),
            ("source", source),
            ("id", id),
            ("text", text),
        ];
        slots.extend(outputs.iter().map(|(s, o)| (s.as_str(), o.as_str())));
        let prompt = fill(&self.prompt, &slots);
        let tokens = prompt.len().div_ceil(4);
        (prompt, tokens)
    }
}

/// The template with each `{name}` of `slots` replaced by its value, in one pass (a value
/// holding `{text}` stays as it is); other braces are kept.
fn fill(template: &str, slots: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let value = after.find('}').and_then(|close| {
            let name = &after[..close];
            slots
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v, close))
        });
        match value {
            Some((v, close)) => {
                out.push_str(v);
                rest = &after[close + 1..];
            }
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Ask the model about each claimed document and record the answers.
pub(super) fn process<S: EnrichStore>(
    w: &mut EnrichWorker<S>,
    stage: &LlmStage,
    owner: &Owner,
    items: Vec<WorkItem>,
    shared: &Shared<'_>,
) -> Result<(), StoreError> {
    let mut asked: Vec<(WorkKey, (String, usize))> = Vec::with_capacity(items.len());
    let mut gone: Vec<WorkKey> = Vec::new();
    for item in items {
        match w.store.document_text(&item.key.document_id)? {
            Some(doc) => {
                let title = doc.title.as_deref().unwrap_or(&item.key.document_id);
                let prompt = stage.prompt_for(
                    &item.key.document_id,
                    title,
                    doc.source.as_deref().unwrap_or(""),
                    &doc.text,
                    &doc.outputs,
                );
                asked.push((item.key, prompt));
            }
            None => gone.push(item.key),
        }
    }
    if !gone.is_empty() {
        // Deleted while queued: nothing to do, and nothing to retry.
        w.store.complete(owner.as_str(), &gone)?;
    }
    let prompts: Vec<(String, usize)> = asked.iter().map(|(_, p)| p.clone()).collect();
    let answers = stage.client.complete_many(&prompts);
    let mut failures = Vec::new();
    for ((key, _), answer) in asked.into_iter().zip(answers) {
        match answer {
            Ok(text) => {
                if w.store
                    .write_output(owner.as_str(), &key, &text, stage.keyword_index)?
                {
                    shared.tally().done(&key);
                }
            }
            Err(e) => failures.push((
                key,
                format!("{}: {e}", stage.client.endpoint().shown_url("")),
            )),
        }
    }
    super::record_failures(w, owner, &failures, &stage.settings, shared)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::chat::ChatSettings;
    use crate::http::{Endpoint, EndpointSettings};

    #[test]
    fn prompts_take_the_documents_fields_and_a_cut_text() {
        let endpoint = Endpoint::new(EndpointSettings {
            url: "http://127.0.0.1:9".into(),
            ..Default::default()
        })
        .unwrap();
        let stage = LlmStage {
            name: "summary".into(),
            client: Arc::new(ChatClient::new(
                endpoint,
                ChatSettings {
                    model: "m".into(),
                    system: None,
                    max_answer_tokens: 10,
                    temperature: 0.0,
                },
            )),
            prompt: "{id} | {title} | {source} | {entities}\n{text}".into(),
            max_input_tokens: 2,
            keyword_index: true,
            settings: StageSettings::default(),
            fingerprint: "f".into(),
        };
        let outputs = [
            ("entities".to_string(), "ORG: Acme".to_string()),
            ("labels".to_string(), "news (0.90)".to_string()),
        ];
        let (p, tokens) = stage.prompt_for("a.md", "A {text}", "/x/a.md", "héllo world", &outputs);
        // 2 tokens = 8 bytes, cut back to a char boundary; a title's braces stay as they are.
        assert_eq!(p, "a.md | A {text} | /x/a.md | ORG: Acme\nhéllo w");
        assert_eq!(tokens, p.len().div_ceil(4));
    }
}
