//! The filesystem connector: walks one or more paths and publishes each matching file.
//!
//! Ids are paths relative to the root given (a file given directly is its own root, its id is
//! its name). Symbolic links are followed only when they resolve inside the root; a dangling
//! link is reported as an unreadable document, a link out of the root as a dropped one.
//! `.jsonl` files hold one document per line (see [`super::jsonl`]).
//!
//! What the walk saw is checked again where it counts, on the open file: the walk and the read
//! are apart in time, and a link can be swapped in between. A file is opened without blocking
//! (a FIFO or a device never stalls the run), must be a regular file, must still resolve
//! inside its root, and is read no further than `--max-file-bytes`.

mod config;

use std::fs;
use std::io::{BufReader, Read};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use walkdir::WalkDir;

pub use config::{FilesystemConfig, Selection, ValidFilesystemConfig, DEFAULT_EXTENSIONS};

use super::jsonl::publish_lines;
use super::{decode, Connector, ConnectorError, Decoded};
use crate::document::Document;
use crate::publisher::Publisher;

pub struct FilesystemConnector {
    config: ValidFilesystemConfig,
}

/// A file found by the walk, before it is read.
struct Found {
    /// The path to read (for a link, the link: reading follows it).
    path: PathBuf,
    id: String,
    /// The root it was found under (canonical), where the opened file must still be.
    root: Option<PathBuf>,
    /// Set when the entry is known to be unusable: (stage, reason, is_failure).
    problem: Option<(&'static str, String, bool)>,
}

/// What is wrong with the symbolic link `path` under `root` (dangling, or pointing outside
/// it), if anything; `None` for a link to a folder inside the root, not followed.
fn link_problem(
    path: &Path,
    root: &Path,
    canonical_root: &Path,
) -> Option<Option<(&'static str, String, bool)>> {
    match fs::canonicalize(path) {
        Err(e) => Some(Some((
            "read",
            format!(
                "dangling symbolic link to `{}` ({e}); fix or remove the link",
                fs::read_link(path)
                    .map(|t| t.display().to_string())
                    .unwrap_or_default()
            ),
            true,
        ))),
        Ok(target) if !target.starts_with(canonical_root) => Some(Some((
            "read",
            format!(
                "symbolic link to `{}`, outside the root `{}`; not followed",
                target.display(),
                root.display()
            ),
            false,
        ))),
        Ok(target) if target.is_dir() => None,
        Ok(_) => Some(None),
    }
}

impl FilesystemConnector {
    pub fn new(config: ValidFilesystemConfig) -> Self {
        FilesystemConnector { config }
    }

    /// Walk every root, in a stable order.
    fn walk(&self) -> Vec<Found> {
        let mut found = Vec::new();
        for root in &self.config.roots {
            if root.is_file() {
                let id = root.file_name().map_or_else(
                    || root.display().to_string(),
                    |n| n.to_string_lossy().into(),
                );
                found.push(Found {
                    path: root.clone(),
                    id,
                    root: None,
                    problem: None,
                });
                continue;
            }
            self.walk_dir(root, &mut found);
        }
        found
    }

    /// Walk the folder `root`, adding the files it selects (and what cannot be read) to
    /// `found`.
    fn walk_dir(&self, root: &Path, found: &mut Vec<Found>) {
        // Roots were checked to exist; canonicalize succeeds unless they vanished since.
        let canonical_root = fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
        let walker = WalkDir::new(root)
            .follow_links(false)
            .sort_by_file_name()
            .into_iter()
            .filter_entry(|e| e.depth() == 0 || !is_hidden(e.file_name()));
        for entry in walker {
            let entry = match entry {
                Ok(entry) => entry,
                Err(err) => {
                    let path = err
                        .path()
                        .map(Path::to_path_buf)
                        .unwrap_or_else(|| root.to_path_buf());
                    found.push(Found {
                        id: relative_id(root, &path),
                        path,
                        root: None,
                        problem: Some(("read", format!("cannot list: {err}"), true)),
                    });
                    continue;
                }
            };
            let path = entry.path();
            let rel = relative_id(root, path);
            let file_type = entry.file_type();
            if file_type.is_dir() {
                continue;
            }
            if !self.config.selection.selects(&rel) {
                continue;
            }
            let problem = if file_type.is_symlink() {
                match link_problem(path, root, &canonical_root) {
                    Some(problem) => problem,
                    // A link to a folder inside the root: its files are walked there.
                    None => continue,
                }
            } else if !file_type.is_file() {
                Some((
                    "read",
                    "not a regular file (socket, device or FIFO)".into(),
                    false,
                ))
            } else {
                None
            };
            found.push(Found {
                path: path.to_path_buf(),
                id: rel,
                root: Some(canonical_root.clone()),
                problem,
            });
        }
    }

    fn publish_file(&self, found: Found, publisher: &Publisher) -> Result<(), ConnectorError> {
        let source = found.path.display().to_string();
        if let Some((stage, reason, failure)) = found.problem {
            if failure {
                publisher.publish_failed(&found.id, Some(&source), stage, &reason);
            } else {
                publisher.publish_dropped(&found.id, Some(&source), stage, &reason);
            }
            return Ok(());
        }
        let format = format_of(&found.path);
        if format == "jsonl" {
            return match open_regular(&found.path, found.root.as_deref()) {
                Ok((file, _)) => publish_lines(
                    BufReader::new(file),
                    &found.id,
                    &self.config.jsonl,
                    self.config.max_file_bytes,
                    publisher,
                ),
                Err(why) => {
                    why.publish(publisher, &found.id, Some(&source), "read");
                    Ok(())
                }
            };
        }
        let read = read_document_in(
            &found.path,
            found.id.clone(),
            self.config.max_file_bytes,
            found.root.as_deref(),
        );
        match read {
            Ok(doc) => publisher.publish(doc)?,
            Err(why) => why.publish(publisher, &found.id, Some(&source), "read"),
        }
        Ok(())
    }
}

/// Why a file gives no document.
#[derive(Debug, PartialEq, Eq)]
pub enum Unusable {
    /// It cannot be read as it is (too large, unreadable, invalid UTF-8): the reason and the fix.
    Failed(String),
    /// It holds nothing to index (empty, binary).
    Dropped(String),
}

impl Unusable {
    /// Publish the item `id` (read from `source`) as failed or dropped at `stage`, with the
    /// reason.
    pub fn publish(self, publisher: &Publisher, id: &str, source: Option<&str>, stage: &str) {
        match self {
            Unusable::Failed(reason) => publisher.publish_failed(id, source, stage, &reason),
            Unusable::Dropped(reason) => publisher.publish_dropped(id, source, stage, &reason),
        }
    }
}

/// Read one file (not JSONL) into a document with id `id`: text formats decoded as UTF-8,
/// binary formats (PDF, DOCX) as bytes for the extract stage, the format in its metadata.
pub fn read_document(path: &Path, id: String, max_bytes: u64) -> Result<Document, Unusable> {
    read_document_in(path, id, max_bytes, None)
}

/// Open `path` for reading as the walk would have it: without blocking (a FIFO or a device
/// named by a link must not stall the run), a regular file, and (given the canonical `root`
/// it was found under) still inside that root once opened: a link swapped after the walk
/// cannot lead out of it. Returns the file and its size.
pub fn open_regular(path: &Path, root: Option<&Path>) -> Result<(fs::File, u64), Unusable> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| Unusable::Failed(format!("cannot open: {e}")))?;
    let meta = file
        .metadata()
        .map_err(|e| Unusable::Failed(format!("cannot read: {e}")))?;
    if !meta.is_file() {
        return Err(Unusable::Dropped(
            "not a regular file (a FIFO, socket or device, or a link to one); not read".into(),
        ));
    }
    if let Some(root) = root {
        // What was opened, wherever the path leads now.
        let opened = fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
            .or_else(|_| fs::canonicalize(path));
        match opened {
            Ok(real) if real.starts_with(root) => {}
            Ok(real) => {
                return Err(Unusable::Dropped(format!(
                    "resolves to `{}` outside the root `{}` when opened (the link changed \
                     after the walk); not read",
                    real.display(),
                    root.display()
                )))
            }
            Err(e) => return Err(Unusable::Failed(format!("cannot resolve: {e}"))),
        }
    }
    Ok((file, meta.len()))
}

/// [`read_document`] for a file the walk found under `root` (canonical): see
/// [`open_regular`].
pub fn read_document_in(
    path: &Path,
    id: String,
    max_bytes: u64,
    root: Option<&Path>,
) -> Result<Document, Unusable> {
    let (file, size) = open_regular(path, root)?;
    let too_large = |size: u64| {
        Unusable::Failed(format!(
            "file is {size} bytes, over --max-file-bytes={max_bytes}; raise it to ingest this file"
        ))
    };
    if size > max_bytes {
        return Err(too_large(size));
    }
    // The size can change between the look and the read: read no more than the limit.
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| Unusable::Failed(format!("cannot read: {e}")))?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_large(bytes.len() as u64));
    }
    let format = format_of(path);
    let mut doc = document_of(id, bytes, format)?;
    doc.fields.source = Some(path.display().to_string());
    Ok(doc)
}

/// The document of a file's (or an object's) bytes in `format`: text formats decoded as
/// UTF-8, binary ones (PDF, DOCX) kept as bytes for the extract stage; the format in its
/// metadata.
pub fn document_of(id: String, bytes: Vec<u8>, format: &str) -> Result<Document, Unusable> {
    let mut doc = if is_binary_format(format) {
        if bytes.is_empty() {
            return Err(Unusable::Dropped("empty file".into()));
        }
        Document::from_bytes(id, bytes)
    } else {
        match decode(bytes) {
            Decoded::Text(text) => Document::new(id, text),
            Decoded::Empty => return Err(Unusable::Dropped("empty document".into())),
            Decoded::Binary => {
                return Err(Unusable::Dropped(
                    "binary content (NUL bytes): not a text document".into(),
                ))
            }
            Decoded::Invalid(reason) => return Err(Unusable::Failed(reason)),
        }
    };
    doc.fields.metadata.insert("format".into(), format.into());
    Ok(doc)
}

impl Connector for FilesystemConnector {
    fn name(&self) -> &'static str {
        "filesystem"
    }

    fn run(&mut self, publisher: &Publisher) -> Result<(), ConnectorError> {
        let found = self.walk();
        publisher.announce(found.len() as u64);
        for file in found {
            self.publish_file(file, publisher)?;
        }
        Ok(())
    }
}

fn is_hidden(name: &std::ffi::OsStr) -> bool {
    name.to_str().is_some_and(|s| s.starts_with('.'))
}

/// The id of `path` under `root`: the relative path with `/` separators.
fn relative_id(root: &Path, path: &Path) -> String {
    let rel = path.strip_prefix(root).unwrap_or(path);
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.is_empty() {
        path.display().to_string()
    } else {
        parts.join("/")
    }
}

/// The document format, from the extension: what the extract stage will parse it as.
pub fn format_of(path: &Path) -> &'static str {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    match ext.as_str() {
        "md" | "markdown" | "mdx" => "markdown",
        "html" | "htm" | "xhtml" => "html",
        "rst" => "rst",
        "jsonl" | "ndjson" => "jsonl",
        "pdf" => "pdf",
        "docx" => "docx",
        "doc" => "doc",
        _ => "text",
    }
}

/// Formats read as bytes and turned into text by the extract stage, not decoded as UTF-8.
pub fn is_binary_format(format: &str) -> bool {
    matches!(format, "pdf" | "docx" | "doc")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::jsonl::JsonlFields;

    fn config(include: &[&str], exclude: &[&str]) -> Selection {
        let dir = std::env::temp_dir();
        let mut c = FilesystemConfig::new(vec![dir]);
        c.include = include.iter().map(|s| s.to_string()).collect();
        c.exclude = exclude.iter().map(|s| s.to_string()).collect();
        c.validate(JsonlFields::default()).unwrap().selection
    }

    #[test]
    fn extensions_include_and_exclude_select_files() {
        let c = config(&[], &["drafts/**"]);
        assert!(c.selects("guide/intro.md"));
        assert!(c.selects("a/B.HTML"));
        assert!(!c.selects("image.png"));
        assert!(!c.selects("drafts/wip.md"));
        let c = config(&["docs/**/*.txt"], &[]);
        assert!(c.selects("docs/a/b.txt"));
        assert!(
            !c.selects("docs/a/b.md"),
            "include replaces the extension list"
        );
        let bad = FilesystemConfig {
            include: vec!["[".into()],
            ..FilesystemConfig::new(vec![std::env::temp_dir()])
        };
        assert!(bad
            .validate(JsonlFields::default())
            .unwrap_err()
            .to_string()
            .contains("--include"));
    }
}
