//! From per-token label scores to entities, as transformers' `token-classification`
//! pipeline's `aggregation_strategy` does it: `none` (every token), `simple` (adjacent tokens
//! of one type grouped by their BIO/IOB2 tags), and `first`, `average`, `max` (the tokens of
//! a word agree first, by the word's first token, its mean scores or its best token). Texts
//! read in several windows keep, where entities of two windows overlap, the longer (the
//! better-scored of two as long).

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

/// How token scores become entities (transformers' `aggregation_strategy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Aggregation {
    /// Every token that is not an ignored label, with its own label.
    None,
    /// Adjacent tokens of one entity type grouped (a `B-` tag starts a new one).
    #[default]
    Simple,
    /// A word takes its first token's label.
    First,
    /// A word takes the label of its tokens' mean scores.
    Average,
    /// A word takes the label of its best-scored token.
    Max,
}

impl Aggregation {
    pub const NAMES: &'static str = "none, simple, first, average, max";

    pub fn as_str(self) -> &'static str {
        match self {
            Aggregation::None => "none",
            Aggregation::Simple => "simple",
            Aggregation::First => "first",
            Aggregation::Average => "average",
            Aggregation::Max => "max",
        }
    }

    /// Whether the tokens of a word are made to agree before grouping.
    fn by_word(self) -> bool {
        matches!(
            self,
            Aggregation::First | Aggregation::Average | Aggregation::Max
        )
    }
}

/// An aggregation strategy of another name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown aggregation `{0}`: use one of {names}", names = Aggregation::NAMES)]
pub struct UnknownAggregation(String);

impl std::str::FromStr for Aggregation {
    type Err = UnknownAggregation;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "none" => Aggregation::None,
            "simple" => Aggregation::Simple,
            "first" => Aggregation::First,
            "average" => Aggregation::Average,
            "max" => Aggregation::Max,
            _ => return Err(UnknownAggregation(s.to_string())),
        })
    }
}

/// One token of a window, before aggregation.
#[derive(Clone, Debug)]
pub struct Token {
    /// The tokenizer's token (`##ing`), or the text it covers for the unknown token.
    pub word: String,
    /// Softmax of the token's logits, one per label.
    pub scores: Vec<f32>,
    /// Character offsets into the text (Unicode scalar values, as Python counts).
    pub start: usize,
    pub end: usize,
    /// Its position in the window's ids (special tokens included).
    pub index: usize,
    /// It continues the word of the token before it.
    pub is_subword: bool,
}

/// An entity: one token (`none`) or a group of tokens of one type.
#[derive(Clone, Debug, PartialEq)]
pub struct Entity {
    /// The label (`none`: `B-ORG`) or the entity type (`ORG`).
    pub label: String,
    pub score: f32,
    /// The text as the tokenizer's decoder writes its tokens (`Acme Corp`).
    pub word: String,
    /// Character offsets into the text.
    pub start: usize,
    pub end: usize,
    /// The token's position in its window (`none` alone).
    pub index: Option<usize>,
}

/// The pipeline's field names: `entity` and `index` for `none`, `entity_group` otherwise.
impl Serialize for Entity {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(if self.index.is_some() { 6 } else { 5 }))?;
        match self.index {
            Some(i) => {
                m.serialize_entry("entity", &self.label)?;
                m.serialize_entry("score", &self.score)?;
                m.serialize_entry("index", &i)?;
            }
            None => {
                m.serialize_entry("entity_group", &self.label)?;
                m.serialize_entry("score", &self.score)?;
            }
        }
        m.serialize_entry("word", &self.word)?;
        m.serialize_entry("start", &self.start)?;
        m.serialize_entry("end", &self.end)?;
        m.end()
    }
}

/// The index of the largest value (the first of equals, as numpy's argmax).
fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

/// A tag's (B or I, type): `B-ORG` is (B, ORG), `I-ORG` (I, ORG), anything else (I, itself).
fn tag(label: &str) -> (bool, &str) {
    if let Some(t) = label.strip_prefix("B-") {
        (true, t)
    } else if let Some(t) = label.strip_prefix("I-") {
        (false, t)
    } else {
        (false, label)
    }
}

/// The entities of one window's tokens, `ignore`d labels left out. `decode` writes tokens
/// as text (the tokenizer's decoder).
pub fn window_entities(
    tokens: &[Token],
    labels: &[String],
    aggregation: Aggregation,
    ignore: &[String],
    decode: &dyn Fn(&[&str]) -> String,
) -> Vec<Entity> {
    let tagged: Vec<Entity> = if aggregation.by_word() {
        words(tokens)
            .into_iter()
            .map(|w| word_entity(w, labels, aggregation, decode))
            .collect()
    } else {
        tokens
            .iter()
            .map(|t| {
                let i = argmax(&t.scores);
                Entity {
                    label: labels[i].clone(),
                    score: t.scores[i],
                    word: t.word.clone(),
                    start: t.start,
                    end: t.end,
                    index: Some(t.index),
                }
            })
            .collect()
    };
    let entities = if aggregation == Aggregation::None {
        tagged
    } else {
        group(tagged, decode)
    };
    entities
        .into_iter()
        .filter(|e| !ignore.contains(&e.label))
        .collect()
}

/// The tokens grouped by word: a token that is not a subword starts a new one.
fn words(tokens: &[Token]) -> Vec<&[Token]> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=tokens.len() {
        if i == tokens.len() || !tokens[i].is_subword {
            if i > start {
                out.push(&tokens[start..i]);
            }
            start = i;
        }
    }
    out
}

/// One word's label and score by `aggregation` (first, average or max).
fn word_entity(
    word: &[Token],
    labels: &[String],
    aggregation: Aggregation,
    decode: &dyn Fn(&[&str]) -> String,
) -> Entity {
    let pieces: Vec<&str> = word.iter().map(|t| t.word.as_str()).collect();
    let (label, score) = match aggregation {
        Aggregation::Max => {
            // The first token whose best score is the word's best.
            let best = word.iter().fold(&word[0], |best, t| {
                let top = |t: &Token| t.scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                if top(t) > top(best) {
                    t
                } else {
                    best
                }
            });
            let i = argmax(&best.scores);
            (i, best.scores[i])
        }
        Aggregation::Average => {
            let n = word.len() as f32;
            let mean: Vec<f32> = (0..labels.len())
                .map(|l| word.iter().map(|t| t.scores[l]).sum::<f32>() / n)
                .collect();
            let i = argmax(&mean);
            (i, mean[i])
        }
        _ => {
            let i = argmax(&word[0].scores);
            (i, word[0].scores[i])
        }
    };
    Entity {
        label: labels[label].clone(),
        score,
        word: decode(&pieces),
        start: word[0].start,
        end: word[word.len() - 1].end,
        index: None,
    }
}

/// Adjacent entities of one type grouped (a `B-` tag starts a new group); a group's score is
/// its members' mean, its type the first member's tag without `B-`/`I-`.
fn group(tagged: Vec<Entity>, decode: &dyn Fn(&[&str]) -> String) -> Vec<Entity> {
    let mut groups = Vec::new();
    let mut current: Vec<Entity> = Vec::new();
    for e in tagged {
        if let Some(last) = current.last() {
            let (b, t) = tag(&e.label);
            let (_, last_t) = tag(&last.label);
            if t != last_t || b {
                groups.push(close(std::mem::take(&mut current), decode));
            }
        }
        current.push(e);
    }
    if !current.is_empty() {
        groups.push(close(current, decode));
    }
    groups
}

fn close(members: Vec<Entity>, decode: &dyn Fn(&[&str]) -> String) -> Entity {
    let first = &members[0];
    let label = match first.label.split_once('-') {
        Some((_, rest)) => rest.to_string(),
        None => first.label.clone(),
    };
    let score = members.iter().map(|e| e.score).sum::<f32>() / members.len() as f32;
    let pieces: Vec<&str> = members.iter().map(|e| e.word.as_str()).collect();
    Entity {
        label,
        score,
        word: decode(&pieces),
        start: first.start,
        end: members[members.len() - 1].end,
        index: None,
    }
}

/// The entities of several windows of one text: sorted by start, and where one starts
/// inside the one kept before it, the longer of the two stays (of two as long, the
/// better-scored).
pub fn merge_windows(mut entities: Vec<Entity>) -> Vec<Entity> {
    if entities.is_empty() {
        return entities;
    }
    entities.sort_by_key(|e| e.start);
    let mut out = Vec::new();
    // The first is compared with itself too, as the pipeline does (an empty one is kept
    // twice there; tokens are never empty).
    let mut previous = entities[0].clone();
    for e in entities {
        if previous.start <= e.start && e.start < previous.end {
            let (len, previous_len) = (e.end - e.start, previous.end - previous.start);
            if len > previous_len || (len == previous_len && e.score > previous.score) {
                previous = e;
            }
        } else {
            out.push(std::mem::replace(&mut previous, e));
        }
    }
    out.push(previous);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels() -> Vec<String> {
        ["O", "B-ORG", "I-ORG", "B-PER", "I-PER"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    fn token(word: &str, best: usize, start: usize, end: usize, sub: bool) -> Token {
        let mut scores = vec![0.05f32; 5];
        scores[best] = 0.8;
        Token {
            word: word.into(),
            scores,
            start,
            end,
            index: start,
            is_subword: sub,
        }
    }

    fn join(pieces: &[&str]) -> String {
        pieces.join(" ").replace(" ##", "")
    }

    #[test]
    fn simple_groups_by_tag_and_first_makes_words_agree() {
        // "Acme Corp sells" with "Corp" split as "Co" "##rp", and "##rp" tagged PER.
        let tokens = vec![
            token("acme", 1, 0, 4, false),
            token("co", 2, 5, 7, false),
            token("##rp", 4, 7, 9, true),
            token("sells", 0, 10, 15, false),
        ];
        let o: Vec<String> = vec!["O".into()];
        let simple = window_entities(&tokens, &labels(), Aggregation::Simple, &o, &join);
        assert_eq!(
            simple
                .iter()
                .map(|e| (e.label.as_str(), e.word.as_str(), e.start, e.end))
                .collect::<Vec<_>>(),
            vec![("ORG", "acme co", 0, 7), ("PER", "##rp", 7, 9)]
        );
        let first = window_entities(&tokens, &labels(), Aggregation::First, &o, &join);
        assert_eq!(first.len(), 1);
        assert_eq!((first[0].word.as_str(), first[0].end), ("acme corp", 9));
        let none = window_entities(&tokens, &labels(), Aggregation::None, &o, &join);
        assert_eq!(none.len(), 3);
        assert_eq!(
            serde_json::to_value(&none[0]).unwrap()["entity"],
            serde_json::json!("B-ORG")
        );
        assert!(serde_json::to_value(&first[0]).unwrap()["entity_group"] == "ORG");
    }

    #[test]
    fn a_b_tag_starts_a_new_group_and_overlaps_keep_the_longer() {
        let tokens = vec![token("a", 1, 0, 1, false), token("b", 1, 2, 3, false)];
        let g = window_entities(&tokens, &labels(), Aggregation::Simple, &[], &join);
        assert_eq!(g.len(), 2);
        let e = |s, t, score| Entity {
            label: "ORG".into(),
            score,
            word: String::new(),
            start: s,
            end: t,
            index: None,
        };
        let merged = merge_windows(vec![e(10, 20, 0.5), e(0, 5, 0.9), e(12, 30, 0.1)]);
        assert_eq!(
            merged.iter().map(|x| (x.start, x.end)).collect::<Vec<_>>(),
            vec![(0, 5), (12, 30)]
        );
        assert!("bogus".parse::<Aggregation>().is_err());
    }
}
