//! Chunker properties, on a word-level stand-in tokenizer (every run of non-whitespace is one
//! token, long words cut into pieces of 5 bytes as subwords), so that thousands of random
//! documents run in a second. The real tokenizer is checked in tests/chunking.rs.

use proptest::prelude::*;

use super::split::{split, Sizes};
use crate::document::{Block, BlockKind};
use crate::stages::extract::markdown;

/// Word tokens with byte offsets; words longer than 5 bytes are cut like subwords.
fn word_offsets(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in text
        .char_indices()
        .chain(std::iter::once((text.len(), ' ')))
    {
        match (c.is_whitespace(), start) {
            (false, None) => start = Some(i),
            (true, Some(s)) => {
                let mut a = s;
                while a < i {
                    let mut b = (a + 5).min(i);
                    while !text.is_char_boundary(b) {
                        b += 1;
                    }
                    out.push((a, b));
                    a = b;
                }
                start = None;
            }
            _ => {}
        }
    }
    out
}

/// Whether a chunk may start at token `j`: not between two pieces of one word.
fn starts_clean(text: &str, offsets: &[(usize, usize)], j: usize) -> bool {
    if j == 0 || j >= offsets.len() || offsets[j - 1].1 < offsets[j].0 {
        return true;
    }
    let before = text[..offsets[j].0].chars().next_back();
    let after = text[offsets[j].0..].chars().next();
    !(before.is_some_and(char::is_alphanumeric) && after.is_some_and(char::is_alphanumeric))
}

fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z]{1,8}",
        "[a-z]{1,6}\\.",
        Just("é".to_string()),
        "[a-z]{12,30}",
    ]
}

fn paragraph() -> impl Strategy<Value = String> {
    prop::collection::vec(word(), 1..60).prop_map(|w| w.join(" "))
}

fn markdown_doc() -> impl Strategy<Value = String> {
    let part = prop_oneof![
        4 => paragraph(),
        1 => (1u8..4, "[A-Z][a-z]{2,8}").prop_map(|(l, t)| format!("{} {t}", "#".repeat(l as usize))),
        1 => prop::collection::vec("[a-z(){};=]{1,10}", 1..80)
            .prop_map(|lines| format!("```js\n{}\n```", lines.join("\n"))),
    ];
    prop::collection::vec(part, 1..25).prop_map(|parts| parts.join("\n\n"))
}

fn sizes() -> impl Strategy<Value = Sizes> {
    (8usize..120, 0usize..40, 0usize..80).prop_filter_map("overlap < target/2", |(t, o, extra)| {
        (2 * o < t).then_some(Sizes {
            target: t,
            overlap: o,
            limit: t + extra,
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(600))]

    #[test]
    fn chunks_fit_cover_overlap_and_keep_code_whole(text in markdown_doc(), sizes in sizes()) {
        let blocks = markdown::blocks(&text);
        let offsets = word_offsets(&text);
        let spans = split(&text, &blocks, &offsets, sizes);
        if offsets.is_empty() {
            prop_assert!(spans.is_empty());
            return Ok(());
        }
        // No chunk over the limit; every chunk holds something.
        for s in &spans {
            prop_assert!(s.tokens.1 > s.tokens.0);
            prop_assert!(s.tokens.1 - s.tokens.0 <= sizes.limit, "{:?}", s);
        }
        // In order, starting at the first token and ending at the last.
        prop_assert_eq!(spans[0].tokens.0, 0);
        prop_assert_eq!(spans.last().unwrap().tokens.1, offsets.len());
        let code: Vec<(usize, usize)> = blocks
            .iter()
            .filter(|b| b.kind == BlockKind::Code)
            .map(|b| {
                let t0 = offsets.partition_point(|o| o.0 < b.start);
                let t1 = offsets.partition_point(|o| o.0 < b.end);
                (t0, t1)
            })
            .collect();
        for pair in spans.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            prop_assert!(b.tokens.0 >= a.tokens.0 && b.tokens.1 > a.tokens.1, "{:?} then {:?}", a, b);
            if a.section != b.section {
                // Sections meet exactly.
                prop_assert_eq!(b.tokens.0, a.tokens.1);
            } else {
                let overlap = a.tokens.1 - b.tokens.0;
                // Exactly the overlap, unless a whole code block needed the room.
                let near_code = code.iter().any(|&(c0, c1)| {
                    c1 - c0 <= sizes.limit && (a.tokens.1 == c0 || b.tokens.1 == c1 || (b.tokens.0 > c0 && b.tokens.0 < c1))
                });
                if !near_code {
                    // `overlap` tokens back, unless that is inside a word: then the start of
                    // that word when it is at most `overlap` further back, else the next word.
                    let want = a.tokens.1.saturating_sub(sizes.overlap).max(a.tokens.0);
                    let floor = want.saturating_sub(sizes.overlap).max(a.tokens.0);
                    let clean = |j: usize| starts_clean(&text, &offsets, j);
                    let expected = if clean(want) {
                        want
                    } else {
                        (floor..want)
                            .rev()
                            .find(|&j| clean(j))
                            .or_else(|| (want + 1..a.tokens.1).find(|&j| clean(j)))
                            .unwrap_or(want)
                    };
                    prop_assert_eq!(b.tokens.0, expected, "{:?} then {:?}", a, b);
                    prop_assert!(overlap <= 2 * sizes.overlap);
                } else {
                    // Less where the block took the room; more only to start at a word.
                    prop_assert!(overlap <= 2 * sizes.overlap);
                }
            }
        }
        // Every non-whitespace byte is in some chunk's text.
        let mut covered = vec![false; text.len()];
        for s in &spans {
            for c in covered[s.bytes.0..s.bytes.1].iter_mut() {
                *c = true;
            }
        }
        for (i, ch) in text.char_indices() {
            prop_assert!(ch.is_whitespace() || covered[i], "byte {} ({:?}) not in any chunk", i, ch);
        }
        // A code block that fits the limit is inside one chunk.
        for &(c0, c1) in &code {
            if c1 > c0 && c1 - c0 <= sizes.limit {
                prop_assert!(
                    spans.iter().any(|s| s.tokens.0 <= c0 && s.tokens.1 >= c1),
                    "code block {}..{} split", c0, c1
                );
            }
        }
    }
}

#[test]
fn heading_paths_follow_nesting_and_heading_only_sections_join_the_next() {
    let text = "# Hooks\n\n## useEffect\n\nRuns after render.\n\n### Caveats\n\nCleanup runs first.\n\n## useMemo\n\nCaches.\n";
    let blocks = markdown::blocks(text);
    let offsets = word_offsets(text);
    let sizes = Sizes {
        target: 50,
        overlap: 0,
        limit: 50,
    };
    let spans = split(text, &blocks, &offsets, sizes);
    let got: Vec<(String, &str)> = spans
        .iter()
        .map(|s| (s.heading_path.join(" > "), &text[s.bytes.0..s.bytes.1]))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                "Hooks > useEffect".to_string(),
                "# Hooks\n\n## useEffect\n\nRuns after render."
            ),
            (
                "Hooks > useEffect > Caveats".to_string(),
                "### Caveats\n\nCleanup runs first."
            ),
            ("Hooks > useMemo".to_string(), "## useMemo\n\nCaches."),
        ]
    );
}

#[test]
fn long_sections_cut_at_paragraphs_then_sentences() {
    let para = |n: usize, w: &str| vec![w; n].join(" ") + ".";
    let text = format!("{}\n\n{}", para(30, "aa"), para(30, "bb"));
    let blocks = vec![
        Block {
            kind: BlockKind::Paragraph,
            start: 0,
            end: 90,
        },
        Block {
            kind: BlockKind::Paragraph,
            start: 92,
            end: text.len(),
        },
    ];
    let offsets = word_offsets(&text);
    let spans = split(
        &text,
        &blocks,
        &offsets,
        Sizes {
            target: 40,
            overlap: 0,
            limit: 40,
        },
    );
    assert_eq!(spans.len(), 2);
    assert_eq!(
        spans[0].tokens,
        (0, 30),
        "cut at the paragraph, not at 40 tokens"
    );
}
