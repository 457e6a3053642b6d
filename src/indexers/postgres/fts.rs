//! The keyword index's text analysis, done by the writer rather than by the server: a chunk's
//! `tsvector` is made here and sent with the row by binary COPY, and a query's `tsquery` is
//! made here the same way, so the two always agree.
//!
//! Why not `to_tsvector('english', ...)` on the server: it costs PostgreSQL about 80 µs of
//! one core for a chunk of 600 bytes, several times everything else a chunk's row costs
//! (heap, b-trees, WAL), and it runs in the single backend of the writer's connection. Made
//! here it costs a few microseconds and runs beside the server.
//!
//! The analysis is that of PostgreSQL's `english` configuration for ordinary text: words are
//! the runs of letters and digits (`char::is_alphanumeric`), lowercased; the Snowball English
//! stop words (PostgreSQL's `english.stop`) are dropped but keep their position; every other
//! word is reduced by the Snowball English (Porter 2) stemmer, the algorithm of PostgreSQL's
//! `english_stem`. Positions count words from 1, as PostgreSQL's do. What differs is
//! PostgreSQL's parser's special tokens: it also keeps a hyphenated word whole
//! (`use-effect` besides `use` and `effect`), and e-mail addresses, URLs, file paths and
//! version numbers as single lexemes; here they are only their words, on both sides.

use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::{Arc, LazyLock};

use postgres::types::{to_sql_checked, IsNull, ToSql, Type};
use rust_stemmers::{Algorithm, Stemmer};
use rustc_hash::FxHashMap;

/// PostgreSQL's limits for a `tsvector` (`ts_type.h`): a lexeme's bytes, a position, the
/// positions kept per lexeme, and all the lexemes' bytes together.
const MAX_LEXEME: usize = (1 << 11) - 1;
const MAX_POSITION: u32 = (1 << 14) - 1;
const MAX_POSITIONS: usize = 255;
const MAX_BYTES: usize = (1 << 20) - 1;

/// The Snowball project's English stop words, as PostgreSQL ships them
/// (`share/tsearch_data/english.stop`), sorted for binary search.
const STOP_WORDS: &[&str] = &[
    "a",
    "about",
    "above",
    "after",
    "again",
    "against",
    "all",
    "am",
    "an",
    "and",
    "any",
    "are",
    "as",
    "at",
    "be",
    "because",
    "been",
    "before",
    "being",
    "below",
    "between",
    "both",
    "but",
    "by",
    "can",
    "did",
    "do",
    "does",
    "doing",
    "don",
    "down",
    "during",
    "each",
    "few",
    "for",
    "from",
    "further",
    "had",
    "has",
    "have",
    "having",
    "he",
    "her",
    "here",
    "hers",
    "herself",
    "him",
    "himself",
    "his",
    "how",
    "i",
    "if",
    "in",
    "into",
    "is",
    "it",
    "its",
    "itself",
    "just",
    "me",
    "more",
    "most",
    "my",
    "myself",
    "no",
    "nor",
    "not",
    "now",
    "of",
    "off",
    "on",
    "once",
    "only",
    "or",
    "other",
    "our",
    "ours",
    "ourselves",
    "out",
    "over",
    "own",
    "s",
    "same",
    "she",
    "should",
    "so",
    "some",
    "such",
    "t",
    "than",
    "that",
    "the",
    "their",
    "theirs",
    "them",
    "themselves",
    "then",
    "there",
    "these",
    "they",
    "this",
    "those",
    "through",
    "to",
    "too",
    "under",
    "until",
    "up",
    "very",
    "was",
    "we",
    "were",
    "what",
    "when",
    "where",
    "which",
    "while",
    "who",
    "whom",
    "why",
    "will",
    "with",
    "you",
    "your",
    "yours",
    "yourself",
    "yourselves",
];

/// Where `rust-stemmers` (an older Snowball) and PostgreSQL 18's Snowball disagree on English
/// words: of the 64,274 distinct words of react-docs and MDN, only these (`ad` there, `add`
/// in PostgreSQL); the others that differ are hex strings PostgreSQL's parser reads as
/// numbers in scientific notation (`1e2f0`), and a dotted capital I.
const ADD: &[&str] = &["add", "added", "adding", "adds"];

static STEMMER: LazyLock<Stemmer> = LazyLock::new(|| Stemmer::create(Algorithm::English));

/// Words this thread has analysed, as written, with their lexeme (`None`: a stop word or
/// nothing to index). Text repeats its words (a few thousand make most of any corpus), and
/// the Snowball stemmer costs far more than a lookup: most of a writer's time without this.
/// Bounded: emptied when it holds `CACHE_WORDS`; words longer than `CACHE_WORD_BYTES` are
/// not kept.
type Lexemes = FxHashMap<Box<str>, Option<Arc<str>>>;
const CACHE_WORDS: usize = 200_000;
const CACHE_WORD_BYTES: usize = 48;

thread_local! {
    static LEXEMES: RefCell<Lexemes> = RefCell::new(FxHashMap::default());
}

/// A word's lexeme: lowercased; a word with a digit in it is kept as it is (PostgreSQL's
/// `english` configuration gives numbers and words with digits to the `simple` dictionary);
/// otherwise `None` for a stop word, else stemmed. `None` too when too long to index
/// (PostgreSQL skips such a word).
fn lexeme_of(word: &str) -> Option<Arc<str>> {
    let lower = word.to_lowercase();
    let lexeme = if lower.chars().any(|c| c.is_numeric()) {
        Cow::Borrowed(lower.as_str())
    } else if STOP_WORDS.binary_search(&lower.as_str()).is_ok() {
        return None;
    } else if ADD.contains(&lower.as_str()) {
        Cow::Borrowed("add")
    } else {
        STEMMER.stem(&lower)
    };
    (!lexeme.is_empty() && lexeme.len() <= MAX_LEXEME).then(|| Arc::from(lexeme.as_ref()))
}

/// The lexemes of `text` in order, each with its position (from `first`); stop words take a
/// position and give no lexeme. Returns the next free position.
fn analyse(text: &str, first: u32, mut each: impl FnMut(Arc<str>, u32)) -> u32 {
    LEXEMES.with_borrow_mut(|cache| {
        let mut position = first;
        for word in text.split(|c: char| !c.is_alphanumeric()) {
            if word.is_empty() {
                continue;
            }
            let lexeme = match cache.get(word) {
                Some(known) => known.clone(),
                None => {
                    let lexeme = lexeme_of(word);
                    if word.len() <= CACHE_WORD_BYTES {
                        if cache.len() >= CACHE_WORDS {
                            cache.clear();
                        }
                        cache.insert(word.into(), lexeme.clone());
                    }
                    lexeme
                }
            };
            if let Some(lexeme) = lexeme {
                each(lexeme, position.min(MAX_POSITION));
            }
            position += 1;
        }
        position
    })
}

/// A `tsvector`: distinct lexemes in PostgreSQL's order (by bytes), each with its
/// positions, ascending. Sent in PostgreSQL's binary format.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct TsVector {
    entries: Vec<(Arc<str>, Vec<u16>)>,
}

impl TsVector {
    /// The `tsvector` of the texts taken as one, separated by a space: what
    /// `to_tsvector('english', a || ' ' || b)` gives for ordinary text.
    pub(crate) fn of(texts: &[&str]) -> TsVector {
        let mut words: Vec<(Arc<str>, u32)> = Vec::new();
        let mut position = 1;
        for text in texts {
            position = analyse(text, position, |lexeme, p| words.push((lexeme, p)));
        }
        // Grouped by word first: a word's lexeme is one shared string (the cache's), so
        // grouping compares addresses, and only the distinct lexemes are compared as text
        // (a chunk repeats its words: sorting every word by its text was most of this).
        words.sort_unstable_by_key(|(lexeme, p)| (Arc::as_ptr(lexeme) as *const u8 as usize, *p));
        let mut groups: Vec<(Arc<str>, Vec<u16>)> = Vec::new();
        for (lexeme, p) in words {
            match groups.last_mut() {
                Some((last, positions)) if Arc::ptr_eq(last, &lexeme) => positions.push(p as u16),
                _ => groups.push((lexeme, vec![p as u16])),
            }
        }
        // By lexeme, then position: the order PostgreSQL stores them in. Words with one
        // lexeme (`render`, `renders`) meet here.
        groups.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut entries: Vec<(Arc<str>, Vec<u16>)> = Vec::with_capacity(groups.len());
        let mut bytes = 0;
        for (lexeme, positions) in groups {
            match entries.last_mut() {
                Some((last, mine)) if *last == lexeme => {
                    mine.extend(positions);
                    mine.sort_unstable();
                }
                _ => {
                    bytes += lexeme.len();
                    if bytes > MAX_BYTES {
                        break;
                    }
                    entries.push((lexeme, positions));
                }
            }
        }
        for (_, positions) in &mut entries {
            // Positions past the limit all read as the last one; kept once.
            positions.dedup();
            positions.truncate(MAX_POSITIONS);
        }
        TsVector { entries }
    }

    /// The lexemes, in order.
    #[cfg(test)]
    pub(crate) fn lexemes(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(l, _)| &**l)
    }

    /// PostgreSQL's text form (`'lexeme':1,5 ...`).
    #[cfg(test)]
    pub(crate) fn to_text(&self) -> String {
        let mut out = String::new();
        for (lexeme, positions) in &self.entries {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(&quote(lexeme));
            out.push(':');
            let ps: Vec<String> = positions.iter().map(u16::to_string).collect();
            out.push_str(&ps.join(","));
        }
        out
    }
}

impl ToSql for TsVector {
    /// `tsvectorsend`'s layout: the count; then per lexeme its bytes and a NUL, the count of
    /// positions and each position (weight D: the top two bits clear).
    fn to_sql(
        &self,
        _: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        use bytes::BufMut;
        out.put_i32(self.entries.len() as i32);
        for (lexeme, positions) in &self.entries {
            out.put_slice(lexeme.as_bytes());
            out.put_u8(0);
            out.put_u16(positions.len() as u16);
            for p in positions {
                out.put_u16(*p);
            }
        }
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::TS_VECTOR
    }

    to_sql_checked!();
}

/// A query's words, analysed as chunks are, as a `tsquery` in text form where every word is
/// optional (`'a' | 'b'`); `None` when nothing is left (only stop words or punctuation).
pub(crate) fn any_word_query(query: &str) -> Option<String> {
    let mut lexemes: Vec<Arc<str>> = Vec::new();
    analyse(query, 1, |lexeme, _| {
        if !lexemes.contains(&lexeme) {
            lexemes.push(lexeme);
        }
    });
    if lexemes.is_empty() {
        return None;
    }
    Some(
        lexemes
            .iter()
            .map(|l| quote(l))
            .collect::<Vec<_>>()
            .join(" | "),
    )
}

/// A lexeme quoted for `tsquery` (and `tsvector`) text: taken as it is, not analysed again.
fn quote(lexeme: &str) -> String {
    let escaped = lexeme.replace('\\', "\\\\").replace('\'', "''");
    format!("'{escaped}'")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn stop_words_are_sorted_for_binary_search() {
        assert!(STOP_WORDS.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(STOP_WORDS.len(), 127);
    }

    #[test]
    fn words_are_stemmed_and_positioned_and_stop_words_skipped() {
        let v = TsVector::of(&[
            "Hooks > Effects",
            "The effects of rendering: render, renders!",
        ]);
        assert_eq!(
            v.to_text(),
            "'effect':2,4 'hook':1 'render':6,7,8",
            "'the' and 'of' take positions 3 and 5 and give no lexeme"
        );
    }

    #[test]
    fn lexemes_are_in_byte_order_and_distinct() {
        let v = TsVector::of(&["zeta alpha Alpha ALPHA beta éclair zeta"]);
        let lexemes: Vec<&str> = v.lexemes().collect();
        let mut sorted = lexemes.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(lexemes, sorted);
        assert_eq!(lexemes, ["alpha", "beta", "zeta", "éclair"]);
    }

    #[test]
    fn positions_past_the_limit_are_kept_once_at_the_limit() {
        let text = "word ".repeat(20_000);
        let v = TsVector::of(&[&text]);
        let (_, positions) = &v.entries[0];
        assert_eq!(positions.len(), MAX_POSITIONS);
        assert!(positions.windows(2).all(|w| w[0] < w[1]));
        let late = format!("{}tail", "x ".repeat(20_000));
        let v = TsVector::of(&[&late]);
        let tail = v.entries.iter().find(|(l, _)| &**l == "tail").unwrap();
        assert_eq!(tail.1, [MAX_POSITION as u16]);
    }

    #[test]
    fn the_word_cache_gives_what_the_stemmer_gives_also_once_emptied() {
        let text = "Connections connected connecting; the CONNECTION's connectivity";
        let fresh = TsVector::of(&[text]);
        assert_eq!(
            fresh,
            TsVector::of(&[text]),
            "a second time, from the cache"
        );
        let many: Vec<String> = (0..CACHE_WORDS + 10).map(|i| format!("w{i}")).collect();
        let _ = TsVector::of(&[&many.join(" ")]);
        assert!(
            LEXEMES.with_borrow(|c| c.len()) < CACHE_WORDS,
            "emptied when full"
        );
        assert_eq!(fresh, TsVector::of(&[text]));
        assert!(
            fresh.to_text().starts_with("'connect':1,2,3,5"),
            "{}",
            fresh.to_text()
        );
    }

    #[test]
    fn binary_form_is_postgres_tsvectorsend() {
        let v = TsVector::of(&["cats cat"]);
        let mut out = bytes::BytesMut::new();
        v.to_sql(&Type::TS_VECTOR, &mut out).unwrap();
        assert_eq!(
            &out[..],
            &[0, 0, 0, 1, b'c', b'a', b't', 0, 0, 2, 0, 1, 0, 2]
        );
    }

    /// Against the server (skipped without `RAGLINE_TEST_POSTGRES`): for ordinary words (the
    /// React fixture and SciFact abstracts, punctuation taken out), the tsvector made here,
    /// sent in binary, is the one `to_tsvector('english', ...)` makes: lexemes and positions.
    #[test]
    fn agrees_with_postgres_to_tsvector_on_ordinary_words() {
        let Some(mut c) = crate::indexers::postgres::test_server() else {
            return;
        };
        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        let mut text = std::fs::read_to_string(fixtures.join("react/useEffect.md")).unwrap();
        text += &std::fs::read_to_string(fixtures.join("scifact-mini/corpus.jsonl")).unwrap();
        let words: Vec<&str> = text
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .collect();
        assert!(words.len() > 20_000, "the fixtures are there");
        let (mut pieces, mut differ) = (0, Vec::new());
        for piece in words.chunks(400) {
            let (head, body) = piece.split_at(7);
            let (head, body) = (head.join(" "), body.join(" "));
            let ours = TsVector::of(&[&head, &body]);
            let row = c
                .query_one(
                    "SELECT $3::tsvector = to_tsvector('english', $1 || ' ' || $2),
                            to_tsvector('english', $1 || ' ' || $2)::text, $3::tsvector::text",
                    &[&head, &body, &ours],
                )
                .unwrap();
            pieces += 1;
            if !row.get::<_, bool>(0) {
                let (theirs, sent): (String, String) = (row.get(1), row.get(2));
                assert_eq!(sent, ours.to_text(), "the binary form reads back as made");
                let theirs: BTreeSet<&str> = theirs.split(' ').collect();
                let ours: BTreeSet<&str> = sent.split(' ').collect();
                differ.push(format!(
                    "server only: {:?}; here only: {:?}",
                    theirs.difference(&ours).take(5).collect::<Vec<_>>(),
                    ours.difference(&theirs).take(5).collect::<Vec<_>>()
                ));
            }
        }
        assert!(pieces > 50);
        assert!(
            differ.is_empty(),
            "{} of {pieces} pieces differ: {differ:#?}",
            differ.len()
        );
    }

    /// Every distinct word of react-docs and MDN (`../shared/data`, 64k words) against
    /// `to_tsvector('english', word)`: at most 0.1% differ (see `ADD`). Ignored: a survey for
    /// when the stemmer or the server changes (`cargo test -- --ignored vocabulary`).
    #[test]
    #[ignore]
    fn vocabulary_of_the_corpora_agrees_with_postgres() {
        let url = std::env::var("RAGLINE_TEST_POSTGRES").expect("RAGLINE_TEST_POSTGRES");
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let data = std::env::var("RAGLINE_DATA_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|_| {
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data")
            });
        let mut words = BTreeSet::new();
        for dir in ["react-docs", "mdn"] {
            for e in walkdir::WalkDir::new(data.join(dir)).into_iter().flatten() {
                let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                for w in text.split(|c: char| !c.is_alphanumeric()) {
                    if !w.is_empty() && w.len() < 40 {
                        words.insert(w.to_lowercase());
                    }
                }
            }
        }
        assert!(
            words.len() > 10_000,
            "the corpora are in {}",
            data.display()
        );
        let words: Vec<String> = words.into_iter().collect();
        let mut differ = Vec::new();
        for part in words.chunks(20_000) {
            let rows = c
                .query(
                    "SELECT w, to_tsvector('english', w)::text FROM unnest($1::text[]) w",
                    &[&part],
                )
                .unwrap();
            for r in rows {
                let (w, theirs): (String, String) = (r.get(0), r.get(1));
                let ours = TsVector::of(&[&w]).to_text();
                if ours != theirs {
                    differ.push(format!("{w}: {theirs} there, {ours} here"));
                }
            }
        }
        eprintln!(
            "{} of {} words differ: {differ:#?}",
            differ.len(),
            words.len()
        );
        assert!(differ.len() * 1000 <= words.len());
    }

    #[test]
    fn queries_are_analysed_like_chunks_and_quoted() {
        assert_eq!(
            any_word_query("How do effects re-render?").as_deref(),
            Some("'effect' | 're' | 'render'")
        );
        assert_eq!(any_word_query("the of and ..."), None);
        assert_eq!(quote("it's"), "'it''s'");
    }
}
