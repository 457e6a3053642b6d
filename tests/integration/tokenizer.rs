//! The fast WordPiece path gives exactly the Hugging Face tokenizer's ids and offsets.

use proptest::prelude::*;
use ragline::embed::files::ModelFiles;
use ragline::embed::tokenizer::TextTokenizer;

use crate::util::{model_dir, shared_data};

fn tokenizers() -> (TextTokenizer, TextTokenizer) {
    let files = ModelFiles::from_dir("all-MiniLM-L6-v2", &model_dir()).unwrap();
    let fast = TextTokenizer::load(&files, 256).unwrap();
    assert!(
        fast.has_fast_path(),
        "all-MiniLM-L6-v2 is a BERT WordPiece tokenizer"
    );
    let slow = fast.without_fast_path();
    (fast, slow)
}

fn same(fast: &TextTokenizer, slow: &TextTokenizer, text: &str) -> Result<(), String> {
    let a = fast.tokenize(text).unwrap();
    let b = slow.tokenize(text).unwrap();
    if a == b {
        return Ok(());
    }
    let at = a
        .ids
        .iter()
        .zip(&b.ids)
        .position(|(x, y)| x != y)
        .unwrap_or(a.ids.len().min(b.ids.len()));
    let at = a
        .offsets
        .iter()
        .zip(&b.offsets)
        .take(at + 1)
        .position(|(x, y)| x != y)
        .map_or(at, |o| o.min(at));
    Err(format!(
        "differ at token {at}: fast {:?} vs HF {:?} (text {:?})",
        a.ids.get(at).zip(a.offsets.get(at)),
        b.ids.get(at).zip(b.offsets.get(at)),
        &text[..text.len().min(200)]
    ))
}

fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-zA-Z]{1,12}",
        2 => "[0-9]{1,6}",
        2 => "[ \t\n\r]{1,3}",
        2 => "[!-/:-@\\[-`{-~]{1,3}",
        1 => "\\[(CLS|SEP|MASK|UNK|PAD|cls|mask)\\]",
        1 => "[\u{0}-\u{1f}\u{7f}]",
        1 => "[àéîõüçñßøåæœÉÀ]{1,3}",
        1 => "[\u{4e00}-\u{4e20}]{1,4}",
        1 => "[\u{0400}-\u{0450}]{1,5}",
        1 => "[\u{00a0}\u{2000}-\u{200f}\u{3000}\u{feff}\u{85}\u{2028}]",
        1 => "[\u{1f600}-\u{1f610}]",
        1 => "e\u{301}|a\u{308}|\u{130}",
        1 => "[a-z]{101,130}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn fast_path_equals_hugging_face_on_random_text(parts in prop::collection::vec(piece(), 0..40)) {
        let (fast, slow) = tokenizers_once();
        let text = parts.concat();
        prop_assert!(same(fast, slow, &text).is_ok(), "{}", same(fast, slow, &text).unwrap_err());
    }
}

fn tokenizers_once() -> &'static (TextTokenizer, TextTokenizer) {
    static T: std::sync::OnceLock<(TextTokenizer, TextTokenizer)> = std::sync::OnceLock::new();
    T.get_or_init(tokenizers)
}

/// Every react-docs page and the first 2,000 MDN pages tokenize identically.
#[test]
fn fast_path_equals_hugging_face_on_real_corpora() {
    let (fast, slow) = tokenizers_once();
    let mut checked = 0;
    for (corpus, limit) in [("react-docs", usize::MAX), ("mdn", 2000)] {
        let Some(dir) = shared_data(corpus) else {
            continue;
        };
        let mut n = 0;
        for e in walkdir::WalkDir::new(dir).sort_by_file_name() {
            let e = e.unwrap();
            if e.path().extension().is_some_and(|x| x == "md") {
                let text = std::fs::read_to_string(e.path()).unwrap();
                if let Err(msg) = same(fast, slow, &text) {
                    panic!("{}: {msg}", e.path().display());
                }
                n += 1;
                if n == limit {
                    break;
                }
            }
        }
        checked += n;
    }
    eprintln!("{checked} pages tokenized identically");
}
