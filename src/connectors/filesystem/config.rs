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
            roots: self.paths,
            extensions: self
                .extensions
                .iter()
                .map(|e| e.trim_start_matches('.').to_ascii_lowercase())
                .collect(),
            include: globs(&self.include, "--include")?,
            exclude: globs(&self.exclude, "--exclude")?,
            max_file_bytes: self.max_file_bytes,
            jsonl,
        })
    }
}

/// A configuration that passed [`FilesystemConfig::validate`].
#[derive(Clone, Debug)]
pub struct ValidFilesystemConfig {
    pub(super) roots: Vec<PathBuf>,
    pub(super) extensions: Vec<String>,
    pub(super) include: GlobSet,
    pub(super) exclude: GlobSet,
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
