//! Where chunks begin and end, computed on token offsets.
//!
//! The text is tokenized once; chunk boundaries are token indices. Sections (a heading and
//! what follows it, up to the next heading) are never mixed in one chunk; a section with
//! nothing but its heading joins the next one. A section longer than the target is cut at the
//! most meaningful boundary that leaves the chunk at least half full: a block boundary
//! (paragraph, list item, code block, table), then a sentence, then a word, then any token.
//! A code block or table that fits in the limit is never cut: a chunk ends before it, and the
//! chunk holding it may grow up to the limit. Consecutive chunks of a section share
//! `overlap` tokens, except where a whole code block or table needs the room, and except that
//! a chunk never starts inside a word: where `overlap` tokens back is the middle of a word
//! (a WordPiece continuation), the chunk starts at that word's first piece, sharing a few
//! tokens more (or, for a word longer than the overlap, at the next word). So a chunk's text,
//! tokenized again, gives the chunk's own ids: what a service that embeds texts computes is
//! what the ids say.

use unicode_segmentation::UnicodeSegmentation;

use crate::document::{Block, BlockKind};

/// Chunk sizes, in model tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizes {
    /// Chunks aim for this many tokens.
    pub target: usize,
    /// Tokens shared by consecutive chunks of a section.
    pub overlap: usize,
    /// No chunk is ever longer (the model's limit).
    pub limit: usize,
}

/// A chunk: tokens `tokens.0..tokens.1`, text `bytes.0..bytes.1`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    pub tokens: (usize, usize),
    pub bytes: (usize, usize),
    pub heading_path: Vec<String>,
    /// Index of the section the chunk belongs to.
    pub section: usize,
}

const BLOCK: u8 = 3;
const SENTENCE: u8 = 2;
const WORD: u8 = 1;

/// Cut `text` (tokenized as `offsets`, byte ranges per token) into chunks.
pub fn split(text: &str, blocks: &[Block], offsets: &[(usize, usize)], sizes: Sizes) -> Vec<Span> {
    let n = offsets.len();
    if n == 0 {
        return Vec::new();
    }
    let sections = sections(blocks, offsets);
    let (class, protected) = boundary_classes(text, blocks, offsets, sizes.limit);
    let starts_clean = clean_starts(text, offsets);

    let mut spans = Vec::new();
    let sentences = |lo: usize, hi: usize| sentence_starts(text, offsets, lo, hi);
    let cut = Cut {
        class: &class,
        starts_clean: &starts_clean,
        protected: &protected,
        sizes,
        sentences: &sentences,
    };
    for (index, (s, e, p)) in sections.into_iter().enumerate() {
        cut_section(s, e, &cut, &mut |a, b| {
            spans.push(Span {
                tokens: (a, b),
                bytes: byte_range(text, offsets, a, b),
                heading_path: p.clone(),
                section: index,
            })
        });
    }
    spans
}

/// The first token that starts at or after `byte`.
fn token_at(offsets: &[(usize, usize)], byte: usize) -> usize {
    offsets.partition_point(|o| o.0 < byte)
}

/// The sections as token ranges with their heading paths.
fn sections(blocks: &[Block], offsets: &[(usize, usize)]) -> Vec<(usize, usize, Vec<String>)> {
    let n = offsets.len();
    // Sections: the preamble, then one per heading up to the next heading. A section that
    // holds nothing but its heading joins the next one.
    let headings: Vec<(usize, usize, u8, &str)> = blocks
        .iter()
        .filter_map(|b| match &b.kind {
            BlockKind::Heading { level, text } => Some((
                token_at(offsets, b.start),
                token_at(offsets, b.end),
                *level,
                text.as_str(),
            )),
            _ => None,
        })
        .collect();
    let mut sections: Vec<(usize, usize, Vec<String>)> = Vec::new();
    let first = headings.first().map_or(n, |h| h.0);
    if first > 0 {
        sections.push((0, first, Vec::new()));
    }
    let mut path: Vec<(u8, &str)> = Vec::new();
    let mut carry: Option<usize> = None;
    for (k, &(t, heading_end, level, title)) in headings.iter().enumerate() {
        while path.last().is_some_and(|(l, _)| *l >= level) {
            path.pop();
        }
        path.push((level, title));
        let next = headings.get(k + 1).map_or(n, |h| h.0);
        if next <= t {
            continue;
        }
        let start = carry.take().unwrap_or(t);
        if heading_end >= next && k + 1 < headings.len() {
            carry = Some(start);
            continue;
        }
        let names = path.iter().map(|(_, t)| t.to_string()).collect();
        sections.push((start, next, names));
    }
    sections
}

/// Per token, how good a place it is to start a chunk, and the token ranges of the blocks
/// kept whole (those of at most `limit` tokens).
fn boundary_classes(
    text: &str,
    blocks: &[Block],
    offsets: &[(usize, usize)],
    limit: usize,
) -> (Vec<u8>, Vec<(usize, usize)>) {
    let n = offsets.len();
    // Boundary classes: how good a place token j is to start a chunk.
    let mut class = vec![0u8; n + 1];
    for j in 1..n {
        if offsets[j - 1].1 < offsets[j].0 {
            class[j] = WORD;
        }
    }
    let mut protected: Vec<(usize, usize)> = Vec::new();
    for b in blocks {
        let t0 = token_at(offsets, b.start);
        let t1 = token_at(offsets, b.end);
        if t0 < n {
            class[t0] = BLOCK;
        }
        if b.keep_whole() && t1 > t0 {
            if t1 - t0 <= limit {
                protected.push((t0, t1));
            } else if b.kind == BlockKind::Code {
                // Too long to keep whole: cut it at lines.
                for (i, _) in text[b.start..b.end].match_indices('\n') {
                    let t = token_at(offsets, b.start + i + 1);
                    if t > t0 && t < t1 {
                        class[t] = class[t].max(SENTENCE);
                    }
                }
            }
        }
    }
    (class, protected)
}

/// Per token (and the end), whether a chunk may start there.
fn clean_starts(text: &str, offsets: &[(usize, usize)]) -> Vec<bool> {
    let n = offsets.len();
    // Where a chunk may start: not inside a word (between two pieces of one word, with no
    // space or punctuation between them).
    let word_char = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric());
    (0..=n)
        .map(|j| {
            j == 0
                || j == n
                || offsets[j - 1].1 < offsets[j].0
                || !word_char(text[..offsets[j].0].chars().next_back())
                || !word_char(text[offsets[j].0..].chars().next())
        })
        .collect()
}

/// Tokens in `lo..=hi` that start a sentence, last first. Segmentation starts a little
/// before `lo` so that the first sentence is seen whole; only the window a cut falls in is
/// segmented, never the whole text.
fn sentence_starts(text: &str, offsets: &[(usize, usize)], lo: usize, hi: usize) -> Vec<usize> {
    let back = lo.saturating_sub(64);
    let from = offsets[back].0;
    let to = if hi < offsets.len() {
        offsets[hi].0
    } else {
        text.len()
    };
    let mut starts: Vec<usize> = text[from..to]
        .split_sentence_bound_indices()
        .map(|(i, _)| offsets.partition_point(|o| o.0 < from + i))
        .filter(|&t| t >= lo && t <= hi)
        .collect();
    starts.reverse();
    starts
}

/// What a section is cut by.
struct Cut<'a> {
    class: &'a [u8],
    starts_clean: &'a [bool],
    protected: &'a [(usize, usize)],
    sizes: Sizes,
    sentences: &'a dyn Fn(usize, usize) -> Vec<usize>,
}

fn cut_section(s: usize, e: usize, cut: &Cut<'_>, emit: &mut dyn FnMut(usize, usize)) {
    let Cut {
        class,
        protected,
        sizes,
        sentences,
        ..
    } = *cut;
    let inside = |t: usize| protected.iter().find(|&&(a, b)| a < t && t < b).copied();
    let mut cur = s;
    // The first token no earlier chunk holds: every chunk must hold some new token.
    let mut fresh = s;
    loop {
        if e - cur <= sizes.target {
            emit(cur, e);
            return;
        }
        let max_end = cur + sizes.target;
        let end = match inside(max_end) {
            // The window ends inside a block that must stay whole: end before it when that
            // leaves something new in the chunk...
            Some((b0, _)) if b0 > fresh => b0,
            // ...else take the whole block, starting late enough to fit in the limit (and
            // not inside a word).
            Some((b0, b1)) => {
                let start = cur.max(b1.saturating_sub(sizes.limit));
                cur = (start..=b0.max(start))
                    .find(|&j| cut.starts_clean[j])
                    .unwrap_or(start);
                b1
            }
            None => best_cut(
                cur,
                fresh,
                max_end,
                sizes.overlap,
                class,
                &inside,
                sentences,
            ),
        };
        emit(cur, end);
        if end >= e {
            return;
        }
        fresh = end;
        cur = overlap_start(end, sizes.overlap, cur, cut.starts_clean);
    }
}

/// Where the chunk after one ending at `end` starts: `overlap` tokens back, moved to the start
/// of the word it falls in (sharing up to `overlap` more tokens), or failing that (a word
/// longer than the overlap) to the next word start before `end`. Never before `prev` (the
/// previous chunk's start).
fn overlap_start(end: usize, overlap: usize, prev: usize, starts_clean: &[bool]) -> usize {
    let want = end.saturating_sub(overlap).max(prev);
    if starts_clean[want] {
        return want;
    }
    let floor = want.saturating_sub(overlap).max(prev);
    (floor..want)
        .rev()
        .find(|&j| starts_clean[j])
        .or_else(|| (want + 1..end).find(|&j| starts_clean[j]))
        .unwrap_or(want)
}

/// The last boundary of the best class in the window that leaves the chunk at least half full
/// (a word or token boundary only has to leave more than the overlap), so that each chunk
/// moves on by at least one token.
fn best_cut(
    cur: usize,
    fresh: usize,
    max_end: usize,
    overlap: usize,
    class: &[u8],
    inside: &dyn Fn(usize) -> Option<(usize, usize)>,
    sentences: &dyn Fn(usize, usize) -> Vec<usize>,
) -> usize {
    let least = (fresh + 1).max(cur + overlap + 1).min(max_end);
    let half = (cur + (max_end - cur) / 2).max(least);
    let last = |lo: usize, level: u8| {
        (lo..=max_end)
            .rev()
            .find(|&j| class[j] >= level && inside(j).is_none())
    };
    if let Some(j) = last(half, BLOCK) {
        return j;
    }
    if let Some(j) = last(half, SENTENCE) {
        return j;
    }
    if let Some(j) = sentences(half, max_end)
        .into_iter()
        .find(|&j| j > cur && inside(j).is_none())
    {
        return j;
    }
    last(least, WORD).unwrap_or(max_end)
}

/// Bytes of tokens `a..b`: from the first token's start to the end of what the last token
/// owns (up to the next token, so characters the tokenizer skipped are kept), trimmed.
pub(crate) fn byte_range(
    text: &str,
    offsets: &[(usize, usize)],
    a: usize,
    b: usize,
) -> (usize, usize) {
    let start = if a == 0 { 0 } else { offsets[a].0 };
    let end = if b < offsets.len() {
        offsets[b].0
    } else {
        text.len()
    };
    let slice = &text[start..end];
    let lead = slice.len() - slice.trim_start().len();
    let trail = slice.len() - slice.trim_end().len();
    (start + lead, (end - trail).max(start + lead))
}
