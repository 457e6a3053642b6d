//! Cleaning of text taken out of page layouts (PDF): ligatures and other presentation forms
//! normalised, words hyphenated at line ends joined, running headers and footers (the same
//! line at the top or bottom of most pages, page numbers included) dropped, and pages joined
//! with their start offsets kept.

use std::collections::HashMap;

use unicode_normalization::UnicodeNormalization;

/// Lines at the top and at the bottom of a page that may be a running header or footer.
const EDGE_LINES: usize = 3;
/// A line is running when it is at a page edge on at least this share of the pages.
const RUNNING_SHARE: f64 = 0.6;
/// Longer lines are content, even when repeated.
const RUNNING_MAX_CHARS: usize = 120;

/// Ligatures and other presentation forms (U+FB00..U+FB4F: `ﬁ`, `ﬂ`, `ﬃ`...) to their letters
/// by NFKC; soft hyphens and zero-width spaces removed; no-break spaces to spaces. Only these:
/// NFKC on everything would also rewrite `²`, `½` and full-width text, which carry meaning.
pub fn normalise(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\u{FB00}'..='\u{FB4F}' => out.extend(c.nfkc()),
            '\u{00AD}' | '\u{200B}' | '\u{FEFF}' => {}
            '\u{00A0}' => out.push(' '),
            _ => out.push(c),
        }
    }
    out
}

/// Whether a document property's title is a producer's placeholder rather than a title:
/// empty, reportlab's "(anonymous)", "untitled", "Microsoft Word - report.docx" (Office's
/// print-to-PDF), a bare file name. Such a title is ignored, and the first heading taken.
pub fn placeholder_title(title: &str) -> bool {
    const PLACEHOLDERS: &[&str] = &[
        "",
        "(anonymous)",
        "anonymous",
        "untitled",
        "(untitled)",
        "untitled document",
        "no title",
        "title",
        "document",
        "document1",
        "powerpoint presentation",
        "slide 1",
    ];
    const PRODUCERS: &[&str] = &[
        "microsoft word - ",
        "microsoft powerpoint - ",
        "microsoft excel - ",
        "untitled - ",
    ];
    const FILE_EXTENSIONS: &[&str] = &[
        ".pdf", ".doc", ".docx", ".odt", ".rtf", ".txt", ".tex", ".dvi", ".ps", ".ppt", ".pptx",
        ".xls", ".xlsx", ".indd", ".md", ".html", ".htm",
    ];
    let t = title.trim().to_lowercase();
    PLACEHOLDERS.contains(&t.as_str())
        || PRODUCERS.iter().any(|p| t.starts_with(p))
        || FILE_EXTENSIONS.iter().any(|e| t.ends_with(e))
}

/// Normalise each page, join words hyphenated at line ends, and drop running headers and
/// footers.
pub fn clean_pages(pages: Vec<String>) -> Vec<String> {
    let pages: Vec<String> = pages
        .iter()
        .map(|p| plain_lines(&dehyphenate(&normalise(p))))
        .collect();
    strip_running(pages)
}

/// Text laid out on a page, made safe to read as markdown: lines start flush (four spaces of
/// layout indentation are not a code block), a line of only `-`, `=`, `_` or `*` is a rule and
/// goes (it would turn the line above into a heading), and a `#` that starts a line is escaped.
pub fn plain_lines(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let line = line.trim_start();
        let rule = line.len() >= 3
            && line
                .chars()
                .all(|c| matches!(c, '-' | '=' | '_' | '*' | ' '));
        if rule {
            out.push('\n');
            continue;
        }
        if line.starts_with('#') {
            out.push('\\');
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Join `propul-` + `sion` across a line break into `propulsion` (the rest of the second line
/// follows on the first). Only a letter, a hyphen, the line end, and a lower-case letter next.
pub fn dehyphenate(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut lines = text.split('\n').peekable();
    while let Some(line) = lines.next() {
        let mut line = line.to_string();
        while ends_hyphenated(&line) {
            let Some(next) = lines.peek() else { break };
            if !starts_lower(next) {
                break;
            }
            let next = lines.next().expect("peeked").trim_start();
            // `state-of-` + `the-art`: a compound broken at one of its own hyphens keeps it.
            let last_word = line.rsplit(' ').next().unwrap_or("");
            if !last_word[..last_word.len() - 1].contains('-') {
                line.pop();
            }
            line.push_str(next);
        }
        out.push_str(&line);
        if lines.peek().is_some() {
            out.push('\n');
        }
    }
    out
}

fn ends_hyphenated(line: &str) -> bool {
    let mut rev = line.trim_end_matches(' ').chars().rev();
    line.ends_with('-') && rev.nth(1).is_some_and(char::is_alphabetic) && {
        // `-` of a list item or a rule is not a hyphen.
        line.trim().len() > 2
    }
}

fn starts_lower(line: &str) -> bool {
    line.trim_start()
        .chars()
        .next()
        .is_some_and(char::is_lowercase)
}

/// What a line is, ignoring page numbers, markup and spacing: `Page 3 of 12` and `Page 4 of 12`
/// are the same running line.
fn running_key(line: &str) -> String {
    let mut key = String::with_capacity(line.len());
    let mut last_digit = false;
    for c in line.trim().trim_start_matches(['#', '-', '>', ' ']).chars() {
        if c.is_ascii_digit() {
            if !last_digit {
                key.push('#');
            }
            last_digit = true;
            continue;
        }
        last_digit = false;
        if matches!(c, '*' | '_' | '|' | '`') {
            continue;
        }
        if c.is_whitespace() {
            if !key.ends_with(' ') {
                key.push(' ');
            }
        } else {
            key.extend(c.to_lowercase());
        }
    }
    key.trim().to_string()
}

/// The indices of the first and last [`EDGE_LINES`] non-blank lines of a page.
fn edge_lines(lines: &[&str]) -> Vec<usize> {
    let filled: Vec<usize> = (0..lines.len())
        .filter(|&i| !lines[i].trim().is_empty())
        .collect();
    let mut edges: Vec<usize> = filled.iter().take(EDGE_LINES).copied().collect();
    for &i in filled.iter().rev().take(EDGE_LINES) {
        if !edges.contains(&i) {
            edges.push(i);
        }
    }
    edges
}

/// Drop lines at page edges that repeat (page numbers aside) on most pages.
pub fn strip_running(pages: Vec<String>) -> Vec<String> {
    let filled = pages.iter().filter(|p| !p.trim().is_empty()).count();
    if filled < 2 {
        return pages;
    }
    let mut seen: HashMap<String, usize> = HashMap::new();
    for page in &pages {
        let lines: Vec<&str> = page.lines().collect();
        let mut keys: Vec<String> = edge_lines(&lines)
            .into_iter()
            .map(|i| running_key(lines[i]))
            .filter(|k| !k.is_empty() && k.chars().count() <= RUNNING_MAX_CHARS)
            .collect();
        keys.sort_unstable();
        keys.dedup();
        for key in keys {
            *seen.entry(key).or_default() += 1;
        }
    }
    let needed = ((filled as f64 * RUNNING_SHARE).ceil() as usize).max(2);
    let running: Vec<&String> = seen
        .iter()
        .filter(|(_, &n)| n >= needed)
        .map(|(k, _)| k)
        .collect();
    if running.is_empty() {
        return pages;
    }
    pages
        .into_iter()
        .map(|page| {
            let lines: Vec<&str> = page.lines().collect();
            let edges = edge_lines(&lines);
            let kept: Vec<&str> = lines
                .iter()
                .enumerate()
                .filter(|(i, l)| !(edges.contains(i) && running.contains(&&running_key(l))))
                .map(|(_, l)| *l)
                .collect();
            let kept = kept.join("\n").trim().to_string();
            // A page of nothing but what repeats ("Page 1") keeps it: it is the content.
            if kept.is_empty() {
                page
            } else {
                kept
            }
        })
        .collect()
}

/// Join pages with a blank line between them, returning the text and where each page starts.
/// A word hyphenated across a page break is joined too.
pub fn join_pages(pages: &[String]) -> (String, Vec<usize>) {
    let mut text = String::with_capacity(pages.iter().map(|p| p.len() + 2).sum());
    let mut starts = Vec::with_capacity(pages.len());
    // Empty pages start where the next page with text does.
    let mut empty = 0;
    for page in pages {
        let page = page.trim();
        if page.is_empty() {
            empty += 1;
            continue;
        }
        if !text.is_empty() {
            if ends_hyphenated(text.rsplit('\n').next().unwrap_or("")) && starts_lower(page) {
                text.pop();
            } else {
                text.push_str("\n\n");
            }
        }
        starts.extend(std::iter::repeat_n(text.len(), empty + 1));
        empty = 0;
        text.push_str(page);
    }
    starts.extend(std::iter::repeat_n(text.len(), empty));
    (text, starts)
}

#[cfg(test)]
mod tests {
    #[test]
    fn producers_placeholders_are_not_titles() {
        for t in [
            "",
            "  ",
            "(anonymous)",
            "Untitled",
            "Microsoft Word - Quarterly report",
            "Microsoft Word - x.docx",
            "scan_0001.pdf",
            "notes.TXT",
            "Document1",
        ] {
            assert!(placeholder_title(t), "{t:?} taken as a title");
        }
        for t in [
            "Attention Is All You Need",
            "Anonymous functions in JavaScript",
            "Title IX compliance",
            "The .pdf format explained",
            "Documents and their titles",
        ] {
            assert!(!placeholder_title(t), "{t:?} refused as a title");
        }
    }

    use super::*;

    #[test]
    fn ligatures_and_invisible_characters_are_normalised_but_not_superscripts() {
        assert_eq!(
            normalise("the \u{FB01}lm is \u{FB02}exible"),
            "the film is flexible"
        );
        assert_eq!(normalise("e\u{FB03}cient"), "efficient");
        assert_eq!(normalise("co\u{00AD}operate\u{00A0}now"), "cooperate now");
        assert_eq!(normalise("x² and ½"), "x² and ½");
    }

    #[test]
    fn hyphenated_line_ends_are_joined_and_other_dashes_kept() {
        assert_eq!(
            dehyphenate("solar propul-\nsion works\nwell"),
            "solar propulsion works\nwell"
        );
        assert_eq!(
            dehyphenate("the state-of-\nthe-art"),
            "the state-of-the-art",
            "a compound broken at one of its hyphens keeps it"
        );
        assert_eq!(
            dehyphenate("Smith-\nJones"),
            "Smith-\nJones",
            "a capital follows"
        );
        assert_eq!(dehyphenate("- item\n- next"), "- item\n- next");
        assert_eq!(dehyphenate("ends in 2-\nthree"), "ends in 2-\nthree");
    }

    #[test]
    fn running_headers_footers_and_page_numbers_go_and_content_stays() {
        let bodies = [
            ("Introduction", "Sails lean on sunlight."),
            ("Materials", "Polyimide survives the cold."),
            ("Methods", "Booms unroll from a hub."),
            ("Results", "The wobble came from tension."),
        ];
        let pages: Vec<String> = bodies
            .iter()
            .enumerate()
            .map(|(i, (h, body))| {
                format!(
                    "Solar Sails — Draft\n\n# {h}\n\n{body}\n\nPage {} of 4",
                    i + 1
                )
            })
            .collect();
        let clean = strip_running(pages);
        for (page, (h, body)) in clean.iter().zip(bodies) {
            assert_eq!(page, &format!("# {h}\n\n{body}"));
        }
        // Fewer than 60% of the pages: content, kept.
        let words = ["alpha", "beta", "gamma", "delta", "epsilon"];
        let pages: Vec<String> = (0..5)
            .map(|i| match i {
                0 | 1 => format!("Note\n\n{}", words[i]),
                _ => words[i].to_string(),
            })
            .collect();
        assert_eq!(strip_running(pages.clone()), pages);
    }

    #[test]
    fn laid_out_lines_are_safe_markdown() {
        assert_eq!(
            plain_lines("    indented\nTitle\n-----\n#1 pick"),
            "indented\nTitle\n\n\\#1 pick\n"
        );
    }

    #[test]
    fn pages_holding_only_a_repeated_line_keep_it() {
        let pages = vec!["Page1".to_string(), "Page2".to_string()];
        assert_eq!(strip_running(pages.clone()), pages);
    }

    #[test]
    fn a_single_page_keeps_everything() {
        let pages = vec!["Header\n\nBody\n\n1".to_string()];
        assert_eq!(strip_running(pages.clone()), pages);
    }

    #[test]
    fn pages_join_with_their_offsets_and_a_word_split_across_a_page_break() {
        let pages = vec![
            "First page propul-".to_string(),
            "sion, second page.".to_string(),
            String::new(),
            "Fourth.".to_string(),
        ];
        let (text, starts) = join_pages(&pages);
        assert_eq!(text, "First page propulsion, second page.\n\nFourth.");
        assert_eq!(starts.len(), 4);
        assert_eq!(&text[starts[1]..starts[1] + 4], "sion");
        assert_eq!(
            starts[2], starts[3],
            "an empty page starts where the next one does"
        );
        assert_eq!(&text[starts[3]..], "Fourth.");
    }
}
