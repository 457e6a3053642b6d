//! The model's tokenizer, set up the way sentence-transformers uses it: no fixed padding, no
//! truncation inside the tokenizer (the shipped tokenizer.json of all-MiniLM-L6-v2 truncates
//! at 128 and pads to 128; sentence-transformers overrides both), special tokens added by us
//! around content ids so that chunk token ids can be reused as they are.

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use tokenizers::Tokenizer;

use crate::embed::wordpiece::FastWordPiece;

use crate::embed::files::ModelFiles;
use crate::embed::EmbedError;

/// Texts longer than this are tokenized in pieces cut at whitespace. For BERT-style
/// pre-tokenization (split on whitespace and punctuation) that gives the same tokens, and it
/// keeps memory flat on huge single-line documents.
const PIECE_BYTES: usize = 64 * 1024;

#[derive(Clone)]
pub struct TextTokenizer {
    inner: Tokenizer,
    /// The fast path for BERT WordPiece tokenizers (same output, several times faster).
    fast: Option<Arc<FastWordPiece>>,
    /// Special ids before and after the content ([CLS] and [SEP] for BERT).
    before: Vec<u32>,
    after: Vec<u32>,
    pad_id: u32,
    /// Longest input in tokens, special tokens included.
    max_len: usize,
    query_prompt: Vec<u32>,
    passage_prompt: Vec<u32>,
}

pub use crate::tokens::Tokens;

impl crate::tokens::Tokenize for TextTokenizer {
    type Error = EmbedError;

    fn tokenize(&self, text: &str) -> Result<Tokens, EmbedError> {
        TextTokenizer::tokenize(self, text)
    }
}

impl TextTokenizer {
    pub fn load(files: &ModelFiles, max_len: usize) -> Result<Self, EmbedError> {
        let mut t = TextTokenizer::from_file(&files.tokenizer, max_len)?;
        if let Some(p) = &files.query_prompt {
            t.query_prompt = t.prompt_ids(p)?;
        }
        if let Some(p) = &files.passage_prompt {
            t.passage_prompt = t.prompt_ids(p)?;
        }
        Ok(t)
    }

    /// The ids a prompt contributes when sentence-transformers tokenizes `prompt + text`: the
    /// ids of `prompt + "x"` before those of "x" (a SentencePiece tokenizer makes the prompt's
    /// trailing space part of the next word, so the prompt alone would end in a stray "▁"),
    /// else the prompt's own ids.
    pub fn prompt_ids(&self, prompt: &str) -> Result<Vec<u32>, EmbedError> {
        let probe = self.content_ids("x")?;
        let joined = self.content_ids(&format!("{prompt}x"))?;
        if !probe.is_empty() && joined.ends_with(&probe) {
            return Ok(joined[..joined.len() - probe.len()].to_vec());
        }
        self.content_ids(prompt)
    }

    pub fn from_file(path: &Path, max_len: usize) -> Result<Self, EmbedError> {
        let bad = |reason: String| EmbedError::ModelFile {
            path: path.to_path_buf(),
            reason,
        };
        let raw = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let mut inner = Tokenizer::from_str(&raw)
            .map_err(|e| bad(format!("cannot load the tokenizer: {e}")))?;
        let json: serde_json::Value =
            serde_json::from_str(&raw).map_err(|e| bad(format!("not JSON: {e}")))?;
        let fast = FastWordPiece::from_json(&json).map(Arc::new);
        inner.with_padding(None);
        inner
            .with_truncation(None)
            .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
        // Find the special tokens the post-processor puts around a single sequence.
        let probe = "a";
        let with = inner
            .encode(probe, true)
            .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
        let without = inner
            .encode(probe, false)
            .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
        let (w, c) = (with.get_ids(), without.get_ids());
        let start = w
            .windows(c.len().max(1))
            .position(|win| win == c)
            .ok_or_else(|| EmbedError::Tokenizer("cannot locate the special tokens".into()))?;
        let before = w[..start].to_vec();
        let after = w[start + c.len()..].to_vec();
        let pad_id = inner
            .token_to_id("[PAD]")
            .or_else(|| inner.token_to_id("<pad>"))
            .unwrap_or(0);
        if max_len <= before.len() + after.len() {
            return Err(EmbedError::Unsupported(format!(
                "max_seq_length {max_len} leaves no room for content"
            )));
        }
        Ok(TextTokenizer {
            inner,
            fast,
            before,
            after,
            pad_id,
            max_len,
            query_prompt: Vec::new(),
            passage_prompt: Vec::new(),
        })
    }

    /// The same tokenizer without the fast path (for comparing the two).
    pub fn without_fast_path(&self) -> Self {
        TextTokenizer {
            fast: None,
            ..self.clone()
        }
    }

    pub fn has_fast_path(&self) -> bool {
        self.fast.is_some()
    }

    /// Longest input in tokens, special tokens included.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Longest content (prompt included) in tokens.
    pub fn max_content_len(&self) -> usize {
        self.max_len - self.before.len() - self.after.len()
    }

    /// The special ids that go before and after the content.
    pub fn specials(&self) -> (&[u32], &[u32]) {
        (&self.before, &self.after)
    }

    pub fn pad_id(&self) -> u32 {
        self.pad_id
    }

    pub fn query_prompt_ids(&self) -> &[u32] {
        &self.query_prompt
    }

    pub fn passage_prompt_ids(&self) -> &[u32] {
        &self.passage_prompt
    }

    /// Override the prompts (from flags).
    pub fn set_prompts(
        &mut self,
        query: Option<&str>,
        passage: Option<&str>,
    ) -> Result<(), EmbedError> {
        if let Some(q) = query {
            self.query_prompt = self.prompt_ids(q)?;
        }
        if let Some(p) = passage {
            self.passage_prompt = self.prompt_ids(p)?;
        }
        Ok(())
    }

    /// Content token ids of `text`, without special tokens or truncation.
    pub fn content_ids(&self, text: &str) -> Result<Vec<u32>, EmbedError> {
        Ok(self.tokenize(text)?.ids)
    }

    /// The content ids of `text` as sentence-transformers feeds it to the model: truncated so
    /// that prompt, content and special tokens fit in `max_len`. Only as much of a long text
    /// is tokenized as the kept tokens need.
    pub fn ids_for_embedding(&self, text: &str, prompt: &[u32]) -> Result<Vec<u32>, EmbedError> {
        let room = self.max_content_len().saturating_sub(prompt.len());
        let mut ids = Vec::new();
        for piece in whitespace_pieces(text, 4 * 1024) {
            ids.extend(self.tokenize(piece)?.ids);
            if ids.len() >= room {
                break;
            }
        }
        ids.truncate(room);
        Ok(ids)
    }

    /// Token ids of `text` with byte offsets, no special tokens.
    pub fn tokenize(&self, text: &str) -> Result<Tokens, EmbedError> {
        let mut out = Tokens::default();
        if let Some(fast) = &self.fast {
            fast.tokenize(
                text,
                &mut out.ids,
                &mut out.offsets,
                |run, base, ids, offsets| {
                    let enc = self
                        .inner
                        .encode(run, false)
                        .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
                    ids.extend_from_slice(enc.get_ids());
                    offsets.extend(enc.get_offsets().iter().map(|&(a, b)| (a + base, b + base)));
                    Ok::<(), EmbedError>(())
                },
            )?;
            return Ok(out);
        }
        let mut start = 0;
        for piece in whitespace_pieces(text, PIECE_BYTES) {
            let enc = self
                .inner
                .encode(piece, false)
                .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
            out.ids.extend_from_slice(enc.get_ids());
            out.offsets.extend(
                enc.get_offsets()
                    .iter()
                    .map(|&(a, b)| (a + start, b + start)),
            );
            start += piece.len();
        }
        Ok(out)
    }
}

/// Runs of non-whitespace longer than this may be cut (at a char boundary): only absurd
/// input has them, and tokenizers give such a "word" one unknown token anyway.
const HARD_CUT_BYTES: usize = 1 << 20;

/// Split `text` into consecutive pieces of about `size` bytes, each ending just after a
/// whitespace character, so that tokenizing the pieces gives the tokens of the whole.
pub fn whitespace_pieces(text: &str, size: usize) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let at = cut_point(rest, size);
        let (piece, tail) = rest.split_at(at);
        rest = tail;
        Some(piece)
    })
}

fn cut_point(rest: &str, size: usize) -> usize {
    if rest.len() <= size {
        return rest.len();
    }
    let mut cut = size.max(1);
    while !rest.is_char_boundary(cut) {
        cut += 1;
    }
    // Only ASCII whitespace: BERT normalisation deletes some other "whitespace" characters
    // (form feed, vertical tab), which would join the words around them.
    let is_space = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
    if let Some(i) = rest.as_bytes()[..cut].iter().rposition(is_space) {
        return i + 1;
    }
    // No whitespace in the window: go on to the end of this run.
    match rest.as_bytes()[cut..].iter().position(is_space) {
        Some(i) if cut + i < HARD_CUT_BYTES => cut + i + 1,
        None if rest.len() < HARD_CUT_BYTES => rest.len(),
        _ => {
            let mut hard = HARD_CUT_BYTES.min(rest.len());
            while !rest.is_char_boundary(hard) {
                hard -= 1;
            }
            hard
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cut_after_whitespace_and_cover_the_text() {
        let text = "alpha beta  gamma\u{00e9}\u{00e9} delta epsilon";
        for size in 1..text.len() + 2 {
            let pieces: Vec<&str> = whitespace_pieces(text, size).collect();
            assert_eq!(pieces.concat(), text, "size {size}");
            for p in &pieces[..pieces.len() - 1] {
                let last = p.chars().last().unwrap();
                assert!(last.is_ascii_whitespace(), "{p:?} at size {size}");
            }
        }
    }
}
