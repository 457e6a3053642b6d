//! The chunker with the real tokenizer, on react.dev pages.

use ragline::document::{BlockKind, Document};
use ragline::embed::files::ModelFiles;
use ragline::embed::tokenizer::TextTokenizer;
use ragline::stages::chunk::{ChunkConfig, ChunkStage};
use ragline::stages::extract::Extract;
use ragline::stages::Stage;

use crate::util::{model_dir, root, shared_data};

fn tokenizer() -> TextTokenizer {
    let files = ModelFiles::from_dir("all-MiniLM-L6-v2", &model_dir()).unwrap();
    TextTokenizer::load(&files, 256).unwrap()
}

/// Chunk one markdown document; returns its extracted text, code block byte ranges and chunks.
fn chunk(
    t: &TextTokenizer,
    id: &str,
    raw: &str,
    config: ChunkConfig,
) -> (String, Vec<(usize, usize)>, Vec<Document>) {
    let mut doc = Document::new(id, raw);
    doc.fields
        .metadata
        .insert("format".into(), "markdown".into());
    Extract::default().process(&mut doc).unwrap();
    let code: Vec<(usize, usize)> = doc
        .blocks
        .iter()
        .filter(|b| b.kind == BlockKind::Code)
        .map(|b| (b.start, b.end))
        .collect();
    let sizes = config.validate(t.max_content_len(), false).unwrap();
    let children = ChunkStage::new(t.clone(), sizes).process(&mut doc).unwrap();
    (doc.fields.text, code, children)
}

/// Properties that hold for every document: limit, order, coverage, code kept whole, the
/// chunk's token ids are the document's own tokens (never tokenized twice), and its text
/// tokenized again gives the same ids (no chunk starts inside a word).
fn check(
    t: &TextTokenizer,
    name: &str,
    text: &str,
    code: &[(usize, usize)],
    chunks: &[Document],
    limit: usize,
) {
    let all = t.tokenize(text).unwrap();
    let mut covered = vec![false; text.len()];
    let mut last_start = 0;
    for c in chunks {
        let info = c.chunk.as_ref().unwrap();
        assert!(
            info.token_count as usize <= limit,
            "{name}: chunk {} has {} tokens",
            c.id,
            info.token_count
        );
        assert_eq!(info.token_ids.len(), info.token_count as usize);
        assert_eq!(
            &text[info.start..info.end],
            c.fields.text,
            "{name}: offsets of {}",
            c.id
        );
        assert!(
            info.start >= last_start,
            "{name}: chunks out of order at {}",
            c.id
        );
        last_start = info.start;
        covered[info.start..info.end]
            .iter_mut()
            .for_each(|x| *x = true);
        // The ids are a run of the document's tokens.
        let first = all.offsets.partition_point(|o| o.0 < info.start);
        assert_eq!(
            &all.ids[first..first + info.token_ids.len()],
            info.token_ids.as_slice(),
            "{name}: ids of {}",
            c.id
        );
        assert_eq!(
            t.tokenize(&c.fields.text).unwrap().ids,
            info.token_ids,
            "{name}: the text of {} tokenizes to other ids",
            c.id
        );
    }
    for (i, ch) in text.char_indices() {
        assert!(
            ch.is_whitespace() || covered[i],
            "{name}: byte {i} ({ch:?}) is in no chunk"
        );
    }
    for &(s, e) in code {
        let tokens = t.tokenize(&text[s..e]).unwrap().ids.len();
        if tokens <= limit {
            assert!(
                chunks.iter().any(|c| {
                    let i = c.chunk.as_ref().unwrap();
                    i.start <= s && i.end >= e
                }),
                "{name}: code block at {s}..{e} ({tokens} tokens) was split"
            );
        }
    }
}

#[test]
fn use_effect_page_has_the_right_heading_paths() {
    let t = tokenizer();
    let raw = std::fs::read_to_string(root().join("tests/fixtures/react/useEffect.md")).unwrap();
    let (text, code, chunks) = chunk(&t, "useEffect.md", &raw, ChunkConfig::default());
    check(
        &t,
        "useEffect.md",
        &text,
        &code,
        &chunks,
        t.max_content_len(),
    );
    let path_of = |needle: &str| -> String {
        chunks
            .iter()
            .find(|c| c.fields.text.contains(needle))
            .unwrap_or_else(|| panic!("no chunk holds {needle:?}"))
            .chunk
            .as_ref()
            .unwrap()
            .heading_path
            .join(" > ")
    };
    assert_eq!(
        path_of("#### Caveats"),
        "useEffect > Reference > useEffect(setup, dependencies?) > Caveats"
    );
    assert_eq!(
        path_of("### Connecting to an external system"),
        "useEffect > Usage > Connecting to an external system"
    );
    assert_eq!(
        path_of("### My Effect runs twice when the component mounts"),
        "useEffect > Troubleshooting > My Effect runs twice when the component mounts"
    );
    // Front matter is metadata, not chunk text.
    assert!(chunks
        .iter()
        .all(|c| !c.fields.text.contains("title: useEffect")));
    assert_eq!(chunks[0].fields.title.as_deref(), Some("useEffect"));
    // Ids are parent id + '#' + ordinal.
    assert_eq!(chunks[3].id, "useEffect.md#3");
}

/// Consecutive chunks of a section share the overlap (a few tokens more where it would start
/// inside a word: a chunk never does), and every chunk's text, tokenized again, gives the
/// chunk's own ids (what a service that embeds texts sees is what the ids say).
#[test]
fn overlap_is_exact_between_chunks_of_a_section() {
    let t = tokenizer();
    let raw = std::fs::read_to_string(root().join("tests/fixtures/react/useEffect.md")).unwrap();
    let config = ChunkConfig {
        target: 64,
        overlap: 16,
    };
    let (text, code, chunks) = chunk(&t, "u", &raw, config);
    check(
        &t,
        "useEffect.md",
        &text,
        &code,
        &chunks,
        t.max_content_len(),
    );
    let all = t.tokenize(&text).unwrap();
    let first_token = |c: &Document| {
        all.offsets
            .partition_point(|o| o.0 < c.chunk.as_ref().unwrap().start)
    };
    let mut exact = 0;
    for pair in chunks.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        let (ia, ib) = (a.chunk.as_ref().unwrap(), b.chunk.as_ref().unwrap());
        if ia.heading_path != ib.heading_path {
            continue;
        }
        let a_end = first_token(a) + ia.token_count as usize;
        let overlap = a_end - first_token(b);
        let near_code = code
            .iter()
            .any(|&(s, e)| (ia.end >= s && ia.start < e) || (ib.end >= s && ib.start < e));
        if !near_code {
            assert!(
                (16..=32).contains(&overlap),
                "{} -> {}: {overlap}",
                a.id,
                b.id
            );
            exact += usize::from(overlap == 16);
        }
    }
    assert!(
        exact > 10,
        "only {exact} chunk pairs share exactly the overlap"
    );
    for c in &chunks {
        let info = c.chunk.as_ref().unwrap();
        let before = text[..info.start].chars().next_back();
        let first = text[info.start..].chars().next();
        assert!(
            !(before.is_some_and(char::is_alphanumeric)
                && first.is_some_and(char::is_alphanumeric)),
            "{} starts inside a word: {:?}",
            c.id,
            &c.fields.text[..c.fields.text.len().min(40)]
        );
        assert_eq!(
            t.tokenize(&c.fields.text).unwrap().ids,
            info.token_ids,
            "{}: its text tokenizes to other ids",
            c.id
        );
    }
}

/// Every react-docs page: no chunk over the limit, full coverage, code kept whole.
#[test]
fn every_react_docs_page_chunks_cleanly() {
    let Some(dir) = shared_data("react-docs") else {
        return;
    };
    let t = tokenizer();
    let mut pages = 0;
    for e in walkdir::WalkDir::new(dir).sort_by_file_name() {
        let e = e.unwrap();
        if e.path().extension().is_some_and(|x| x == "md") {
            let raw = std::fs::read_to_string(e.path()).unwrap();
            let name = e.path().display().to_string();
            let (text, code, chunks) = chunk(&t, &name, &raw, ChunkConfig::default());
            check(&t, &name, &text, &code, &chunks, t.max_content_len());
            pages += 1;
        }
    }
    assert!(pages > 200);
}
