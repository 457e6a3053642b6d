//! Configuration of the filesystem connector, validated before anything runs.

use std::path::PathBuf;

use globset::{Glob, GlobSet, GlobSetBuilder};
use serde::Deserialize;

use crate::connectors::jsonl::JsonlFields;
use crate::connectors::ConnectorError;

/// File extensions taken by default (lower case, without the dot).
pub const DEFAULT_EXTENSIONS: &[&str] = &[
    "md", "markdown", "mdx", "html", "htm", "txt", "rst", "jsonl", "ndjson", "pdf", "docx", "doc",
];

/// Files larger than this are reported instead of read (100 MiB).
pub const DEFAULT_MAX_FILE_BYTES: u64 = 100 << 20;

fn default_max_file_bytes() -> u64 {
    DEFAULT_MAX_FILE_BYTES
}

fn default_extensions() -> Vec<String> {
    DEFAULT_EXTENSIONS.iter().map(|s| s.to_string()).collect()
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilesystemConfig {
    /// Files or folders to read.
    pub paths: Vec<PathBuf>,
    /// Extensions to take (without the dot); ignored when `include` is set.
    #[serde(default = "default_extensions")]
    pub extensions: Vec<String>,
    /// Globs over the path relative to its root (`docs/**/*.md`); when set, they replace the
    /// extension filter.
    #[serde(default)]
    pub include: Vec<String>,
    /// Globs of files to leave out, applied after `include`.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// Files larger than this are reported as failed instead of read.
    #[serde(default = "default_max_file_bytes")]
    pub max_file_bytes: u64,
}

impl FilesystemConfig {
    pub fn new(paths: Vec<PathBuf>) -> Self {
        FilesystemConfig {
            paths,
            extensions: default_extensions(),
            include: Vec::new(),
            exclude: Vec::new(),
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
        }
    }

    /// Check the paths exist and the globs compile.
    pub fn validate(self, jsonl: JsonlFields) -> Result<ValidFilesystemConfig, ConnectorError> {
        if self.paths.is_empty() {
            return Err(ConnectorError::Config("no path to ingest given".into()));
        }
        for path in &self.paths {
            if let Err(e) = std::fs::metadata(path) {
                return Err(ConnectorError::Config(format!(
                    "path `{}` cannot be read: {e}",
                    path.display()
                )));
            }
        }
        Ok(ValidFilesystemConfig {
            selection: Selection::new(&self.extensions, &self.include, &self.exclude)?,
            roots: self.paths,
            max_file_bytes: self.max_file_bytes,
            jsonl,
        })
    }
}

/// Which paths a source takes (relative to its root, or an object's key under its prefix):
/// by extension, or by `--include` globs when given, less the `--exclude` globs.
#[derive(Clone, Debug)]
pub struct Selection {
    extensions: Vec<String>,
    include: GlobSet,
    exclude: GlobSet,
}

impl Selection {
    pub fn new(
        extensions: &[String],
        include: &[String],
        exclude: &[String],
    ) -> Result<Selection, ConnectorError> {
        Ok(Selection {
            extensions: extensions
                .iter()
                .map(|e| e.trim_start_matches('.').to_ascii_lowercase())
                .collect(),
            include: globs(include, "--include")?,
            exclude: globs(exclude, "--exclude")?,
        })
    }

    /// Does the source take the file (or object) at relative path `rel`?
    pub fn selects(&self, rel: &str) -> bool {
        let ext = std::path::Path::new(rel)
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        let by_extension = ext.is_some_and(|e| self.extensions.contains(&e));
        let included = if self.include.is_empty() {
            by_extension
        } else {
            matches(&self.include, rel)
        };
        included && !matches(&self.exclude, rel)
    }
}

fn matches(set: &GlobSet, rel: &str) -> bool {
    !set.is_empty() && set.is_match(rel)
}

/// A configuration that passed [`FilesystemConfig::validate`].
#[derive(Clone, Debug)]
pub struct ValidFilesystemConfig {
    pub(super) roots: Vec<PathBuf>,
    pub(super) selection: Selection,
    pub(super) max_file_bytes: u64,
    pub(super) jsonl: JsonlFields,
}

fn globs(patterns: &[String], flag: &str) -> Result<GlobSet, ConnectorError> {
    let mut builder = GlobSetBuilder::new();
    for p in patterns {
        let glob = Glob::new(p)
            .map_err(|e| ConnectorError::Config(format!("bad {flag} glob `{p}`: {e}")))?;
        builder.add(glob);
    }
    builder
        .build()
        .map_err(|e| ConnectorError::Config(format!("bad {flag} globs: {e}")))
}
