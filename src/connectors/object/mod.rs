//! Object stores as a source: `s3://BUCKET/PREFIX`, `gs://BUCKET/PREFIX` and
//! `az://CONTAINER/PREFIX`, through the `object_store` crate.
//!
//! Every object under the prefix that the selection takes (`--ext`, `--include`, `--exclude`,
//! matched against the key below the prefix) is a document whose id is its URL
//! (`s3://bucket/docs/a.md`). The listing is streamed (the store pages it), and objects are
//! downloaded `--fetch-concurrency` at a time while earlier ones are published, in listing
//! order. An object's format comes from its extension (its `Content-Type` where the key has
//! none); its metadata holds the URL, ETag, last-modified time, size and content type.
//!
//! **Incremental by ETag.** The version key of an object is made of its URL and ETag and is what
//! the index stores as its content hash: an object whose ETag the index holds is published as
//! unchanged without being downloaded (the listing carries the ETag). JSONL objects, which are
//! many documents each, are always read.
//!
//! **Credentials** come from each cloud's standard chain as `object_store` reads it: S3 from
//! `AWS_*` variables, web identity, the container or instance metadata service, and here also
//! the shared credentials and config files (`AWS_PROFILE`, `~/.aws/credentials`,
//! `~/.aws/config`), which `object_store` does not read; GCS from `GOOGLE_*` variables and the
//! metadata service; Azure from `AZURE_*` variables (the account in
//! `AZURE_STORAGE_ACCOUNT_NAME`). A URL never carries a credential.

mod keys;
mod profile;

use std::io::Cursor;
use std::sync::Arc;

use futures::StreamExt;
use object_store::{path::Path as KeyPath, Attribute, ObjectMeta, ObjectStore};

use super::filesystem::{document_of, format_of, Selection, Unusable};
use super::jsonl::{publish_lines, JsonlFields};
use super::{known_unchanged, version_key, Connector, ConnectorError, KnownIndex};
use crate::publisher::Publisher;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cloud {
    S3,
    Gcs,
    Azure,
}

/// A parsed object store URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectSpec {
    cloud: Cloud,
    scheme: String,
    bucket: String,
    /// The key prefix (no leading or trailing `/`), empty for the whole bucket.
    prefix: String,
    endpoint: Option<String>,
    region: Option<String>,
}

impl ObjectSpec {
    /// Parse `s3://BUCKET[/PREFIX][?endpoint=URL&region=R]` (and `gs://`, `az://`).
    pub fn parse(url: &str) -> Result<ObjectSpec, ConnectorError> {
        let bad = |why: String| ConnectorError::Config(format!("{}: {why}", redact(url)));
        let parsed = url::Url::parse(url).map_err(|e| bad(format!("not a URL ({e})")))?;
        let cloud = match parsed.scheme() {
            "s3" => Cloud::S3,
            "gs" => Cloud::Gcs,
            "az" => Cloud::Azure,
            other => return Err(bad(format!("unknown scheme `{other}`"))),
        };
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(bad(
                "credentials do not go in the URL: set them in the environment (AWS_ACCESS_KEY_ID \
                 and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, GOOGLE_APPLICATION_CREDENTIALS, \
                 AZURE_STORAGE_ACCOUNT_KEY...)"
                    .into(),
            ));
        }
        let bucket = parsed
            .host_str()
            .filter(|b| !b.is_empty())
            .ok_or_else(|| bad("no bucket: write SCHEME://BUCKET/PREFIX".into()))?
            .to_string();
        let prefix = percent_decode(parsed.path().trim_matches('/'));
        let mut spec = ObjectSpec {
            cloud,
            scheme: parsed.scheme().to_string(),
            bucket,
            prefix,
            endpoint: None,
            region: None,
        };
        for (key, value) in parsed.query_pairs() {
            match key.as_ref() {
                "endpoint" if cloud == Cloud::Gcs => {
                    return Err(bad(
                        "`endpoint=` is for S3-compatible stores and Azure; a GCS emulator is set \
                         with GOOGLE_* variables"
                            .into(),
                    ))
                }
                "endpoint" => {
                    let e = url::Url::parse(&value)
                        .map_err(|e| bad(format!("`endpoint={value}` is not a URL ({e})")))?;
                    if !matches!(e.scheme(), "http" | "https") {
                        return Err(bad(format!(
                            "`endpoint={value}` must be http:// or https://"
                        )));
                    }
                    if !e.username().is_empty() || e.password().is_some() {
                        return Err(bad("the endpoint must not carry credentials".into()));
                    }
                    spec.endpoint = Some(value.trim_end_matches('/').to_string());
                }
                "region" if cloud == Cloud::S3 => spec.region = Some(value.into_owned()),
                other => {
                    return Err(bad(format!(
                        "unknown option `{other}`: an object store URL takes `endpoint=` \
                         (S3-compatible stores, Azure) and `region=` (S3)"
                    )))
                }
            }
        }
        Ok(spec)
    }

    /// The URL of the object at `key`: its document id.
    fn url_of(&self, key: &str) -> String {
        format!("{}://{}/{key}", self.scheme, self.bucket)
    }

    /// The store client, its credentials from the environment.
    fn store(&self) -> Result<Arc<dyn ObjectStore>, ConnectorError> {
        let failed = |e: object_store::Error| {
            ConnectorError::Config(format!("{}://{}: {e}", self.scheme, self.bucket))
        };
        let store: Arc<dyn ObjectStore> = match self.cloud {
            Cloud::S3 => {
                use object_store::aws::AmazonS3Builder;
                let mut b =
                    profile::apply(AmazonS3Builder::from_env()).with_bucket_name(&self.bucket);
                let env_endpoint = std::env::var("AWS_ENDPOINT_URL").ok();
                if let Some(e) = self.endpoint.as_ref().or(env_endpoint.as_ref()) {
                    b = b.with_endpoint(e).with_allow_http(e.starts_with("http://"));
                }
                if let Some(r) = &self.region {
                    b = b.with_region(r);
                }
                Arc::new(
                    b.with_http_connector(keys::GuardedKeys)
                        .build()
                        .map_err(failed)?,
                )
            }
            Cloud::Gcs => {
                use object_store::gcp::GoogleCloudStorageBuilder;
                let b = GoogleCloudStorageBuilder::from_env().with_bucket_name(&self.bucket);
                Arc::new(
                    b.with_http_connector(keys::GuardedKeys)
                        .build()
                        .map_err(failed)?,
                )
            }
            Cloud::Azure => {
                use object_store::azure::MicrosoftAzureBuilder;
                let mut b = MicrosoftAzureBuilder::from_env().with_container_name(&self.bucket);
                if let Some(e) = &self.endpoint {
                    b = b
                        .with_endpoint(e.clone())
                        .with_allow_http(e.starts_with("http://"));
                }
                Arc::new(
                    b.with_http_connector(keys::GuardedKeys)
                        .build()
                        .map_err(failed)?,
                )
            }
        };
        Ok(store)
    }
}

/// `url` as it may be shown (the query, which may name an endpoint with a token, cut).
fn redact(url: &str) -> String {
    crate::secret::redact_url(url)
}

fn percent_decode(s: &str) -> String {
    url::form_urlencoded::parse(format!("k={}", s.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

/// Reads the objects under a prefix.
pub struct ObjectConnector {
    spec: ObjectSpec,
    selection: Selection,
    jsonl: JsonlFields,
    max_bytes: u64,
    concurrency: usize,
    known: Option<KnownIndex>,
}

/// What became of one listed object.
enum Fetched {
    /// Known unchanged from its ETag: not downloaded.
    Unchanged { id: String, key: String },
    /// Downloaded.
    Read {
        id: String,
        meta: ObjectMeta,
        content_type: Option<String>,
        bytes: Vec<u8>,
    },
    /// Failed (too large, the download failed) or dropped (gone since the listing).
    Unusable { id: String, why: Unusable },
}

impl ObjectConnector {
    pub fn new(
        url: &str,
        selection: Selection,
        jsonl: JsonlFields,
        max_bytes: u64,
        concurrency: usize,
    ) -> Result<Self, ConnectorError> {
        let spec = ObjectSpec::parse(url)?;
        // Built once here so a bad configuration (no region, no account) stops the run before
        // anything starts.
        spec.store()?;
        Ok(ObjectConnector {
            spec,
            selection,
            jsonl,
            max_bytes,
            concurrency: concurrency.max(1),
            known: None,
        })
    }

    /// The version key of an object with this ETag: what the index stores as its content hash.
    fn key_of(id: &str, etag: &str) -> String {
        version_key(&["object", id, etag])
    }

    async fn publish_all(&self, publisher: &Publisher) -> Result<(), ConnectorError> {
        let store = self.spec.store()?;
        let prefix =
            (!self.spec.prefix.is_empty()).then(|| KeyPath::from(self.spec.prefix.as_str()));
        let under = |key: &str| -> String {
            if self.spec.prefix.is_empty() {
                key.to_string()
            } else {
                key.strip_prefix(&self.spec.prefix)
                    .map(|k| k.trim_start_matches('/').to_string())
                    .unwrap_or_else(|| key.to_string())
            }
        };
        let listing = store.list(prefix.as_ref());
        let mut listing_error = None;
        let mut fetches = listing
            .filter_map(|meta| {
                let out = match meta {
                    // A key the client cannot address fails alone (see `keys`).
                    Ok(meta) => match keys::unaddressable(meta.location.as_ref()) {
                        Some(key) if self.selection.selects(&under(&key)) => {
                            let unusable = Fetched::Unusable {
                                id: self.spec.url_of(&key),
                                why: Unusable::Failed(keys::reason(&key)),
                            };
                            Some(Box::pin(std::future::ready(unusable))
                                as futures::future::BoxFuture<'static, Fetched>)
                        }
                        Some(_) => None,
                        None if self.selection.selects(&under(meta.location.as_ref())) => {
                            Some(self.start(&store, meta, publisher))
                        }
                        None => None,
                    },
                    Err(e) => {
                        listing_error.get_or_insert(e);
                        None
                    }
                };
                std::future::ready(out)
            })
            .buffered(self.concurrency);
        while let Some(fetched) = fetches.next().await {
            self.publish(fetched, publisher)?;
        }
        drop(fetches);
        match listing_error {
            // The listing stopped: the source as a whole failed (nothing is pruned).
            Some(e) => Err(ConnectorError::Source(format!(
                "listing {}: {e}",
                self.spec.url_of(&self.spec.prefix)
            ))),
            None => Ok(()),
        }
    }

    /// Start on one listed object: known unchanged, too large, or a download (spawned, so
    /// downloads go on while earlier objects are published).
    fn start(
        &self,
        store: &Arc<dyn ObjectStore>,
        meta: ObjectMeta,
        publisher: &Publisher,
    ) -> futures::future::BoxFuture<'static, Fetched> {
        let id = self.spec.url_of(meta.location.as_ref());
        let jsonl = format_of(std::path::Path::new(meta.location.as_ref())) == "jsonl";
        if let (Some(etag), Some(known), false) = (&meta.e_tag, &self.known, jsonl) {
            let key = Self::key_of(&id, etag);
            if known.holds(&id, &key) {
                return Box::pin(std::future::ready(Fetched::Unchanged { id, key }));
            }
        }
        if meta.size > self.max_bytes {
            let why = Unusable::Failed(too_large(meta.size, self.max_bytes));
            return Box::pin(std::future::ready(Fetched::Unusable { id, why }));
        }
        let store = Arc::clone(store);
        let max_bytes = self.max_bytes;
        let publisher = publisher.clone();
        let failed_id = id.clone();
        let task = tokio::spawn(async move {
            let got = download(&*store, &meta.location, max_bytes).await;
            match got {
                Ok((meta, content_type, bytes)) => {
                    publisher.fetched(bytes.len() as u64);
                    Fetched::Read {
                        id,
                        meta,
                        content_type,
                        bytes,
                    }
                }
                Err(why) => Fetched::Unusable { id, why },
            }
        });
        Box::pin(async move {
            task.await.unwrap_or_else(|e| Fetched::Unusable {
                id: failed_id,
                why: Unusable::Failed(format!("the download stopped: {e}")),
            })
        })
    }

    fn publish(&self, fetched: Fetched, publisher: &Publisher) -> Result<(), ConnectorError> {
        match fetched {
            Fetched::Unchanged { id, key } => {
                publisher.publish(known_unchanged(id.clone(), id, key))?;
            }
            Fetched::Unusable { id, why } => why.publish(publisher, &id, Some(&id), "read"),
            Fetched::Read {
                id,
                meta,
                content_type,
                bytes,
            } => {
                let key = meta.location.as_ref();
                let format = format_for(key, content_type.as_deref());
                if format == "jsonl" {
                    return publish_lines(
                        Cursor::new(bytes),
                        &id,
                        &self.jsonl,
                        self.max_bytes,
                        publisher,
                    );
                }
                match document_of(id.clone(), bytes, format) {
                    Ok(mut doc) => {
                        let m = &mut doc.fields.metadata;
                        m.insert("url".into(), id.clone().into());
                        if let Some(etag) = &meta.e_tag {
                            m.insert("etag".into(), etag.clone().into());
                            doc.content_hash = Some(Self::key_of(&id, etag));
                        }
                        m.insert("modified".into(), meta.last_modified.to_rfc3339().into());
                        m.insert("size".into(), meta.size.into());
                        if let Some(t) = content_type {
                            m.insert("content_type".into(), t.into());
                        }
                        doc.fields.source = Some(id);
                        publisher.publish(doc)?;
                    }
                    Err(why) => why.publish(publisher, &id, Some(&id), "read"),
                }
            }
        }
        Ok(())
    }
}

fn too_large(size: u64, max_bytes: u64) -> String {
    format!(
        "object is {size} bytes, over --max-file-bytes={max_bytes}; raise it to ingest this object"
    )
}

/// Download one object, no more than `max_bytes` of it (its size may have changed since the
/// listing): its metadata as the GET saw it, its content type, its bytes.
async fn download(
    store: &dyn ObjectStore,
    location: &KeyPath,
    max_bytes: u64,
) -> Result<(ObjectMeta, Option<String>, Vec<u8>), Unusable> {
    let got = match store.get(location).await {
        Ok(got) => got,
        Err(object_store::Error::NotFound { .. }) => {
            return Err(Unusable::Dropped(
                "deleted after it was listed; the next run will not list it".into(),
            ))
        }
        Err(e) => return Err(Unusable::Failed(format!("cannot download: {e}"))),
    };
    if got.meta.size > max_bytes {
        return Err(Unusable::Failed(too_large(got.meta.size, max_bytes)));
    }
    let meta = got.meta.clone();
    let content_type = got
        .attributes
        .get(&Attribute::ContentType)
        .map(|v| v.to_string());
    let mut bytes = Vec::with_capacity(meta.size as usize);
    let mut body = got.into_stream();
    while let Some(part) = body.next().await {
        let part = part.map_err(|e| Unusable::Failed(format!("download cut short: {e}")))?;
        if (bytes.len() + part.len()) as u64 > max_bytes {
            return Err(Unusable::Failed(too_large(
                (bytes.len() + part.len()) as u64,
                max_bytes,
            )));
        }
        bytes.extend_from_slice(&part);
    }
    Ok((meta, content_type, bytes))
}

/// An object's format: from its key's extension, else from its content type.
fn format_for(key: &str, content_type: Option<&str>) -> &'static str {
    let path = std::path::Path::new(key);
    if path.extension().is_some() {
        return format_of(path);
    }
    let media = content_type
        .and_then(|t| t.split(';').next())
        .map(|t| t.trim().to_ascii_lowercase())
        .unwrap_or_default();
    match media.as_str() {
        "text/html" | "application/xhtml+xml" => "html",
        "text/markdown" | "text/x-markdown" => "markdown",
        "application/pdf" => "pdf",
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document" => "docx",
        "application/msword" => "doc",
        "application/x-ndjson" | "application/jsonl" => "jsonl",
        _ => "text",
    }
}

impl Connector for ObjectConnector {
    fn name(&self) -> &'static str {
        "object store"
    }

    fn know(&mut self, index: &KnownIndex) {
        self.known = Some(index.clone());
    }

    fn run(&mut self, publisher: &Publisher) -> Result<(), ConnectorError> {
        publisher.count_fetches();
        super::block_on_io("ragline-objects", self.publish_all(publisher))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_the_bucket_the_prefix_and_the_options() {
        let s = ObjectSpec::parse(
            "s3://docs/guides/2026/?endpoint=http://127.0.0.1:9000/&region=eu-west-1",
        )
        .unwrap();
        assert_eq!(s.cloud, Cloud::S3);
        assert_eq!(s.bucket, "docs");
        assert_eq!(s.prefix, "guides/2026");
        assert_eq!(s.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(s.region.as_deref(), Some("eu-west-1"));
        assert_eq!(s.url_of("guides/2026/a.md"), "s3://docs/guides/2026/a.md");
        let s = ObjectSpec::parse("gs://bucket").unwrap();
        assert_eq!((s.cloud, s.prefix.as_str()), (Cloud::Gcs, ""));
        let s = ObjectSpec::parse("az://container/a%20b").unwrap();
        assert_eq!((s.cloud, s.prefix.as_str()), (Cloud::Azure, "a b"));
    }

    #[test]
    fn credentials_unknown_options_and_bad_endpoints_are_refused() {
        let err = |u: &str| match ObjectSpec::parse(u) {
            Err(ConnectorError::Config(m)) => m,
            other => panic!("{u}: {other:?}"),
        };
        let m = err("s3://AKIA:s3cr3t@bucket/docs");
        assert!(m.contains("credentials do not go in the URL"), "{m}");
        assert!(!m.contains("s3cr3t"), "the secret is shown: {m}");
        assert!(err("s3://bucket?acl=public").contains("unknown option `acl`"));
        assert!(err("s3://bucket?endpoint=ftp://x").contains("http:// or https://"));
        assert!(err("s3://bucket?endpoint=http://u:p@x").contains("must not carry"));
        assert!(err("gs://bucket?endpoint=http://x").contains("GOOGLE_"));
        assert!(err("s3:///docs").contains("no bucket"));
    }

    #[test]
    fn a_format_comes_from_the_extension_then_the_content_type() {
        assert_eq!(format_for("a/b.md", Some("text/html")), "markdown");
        assert_eq!(
            format_for("a/page", Some("text/html; charset=utf-8")),
            "html"
        );
        assert_eq!(format_for("a/paper", Some("application/pdf")), "pdf");
        assert_eq!(format_for("a/notes", None), "text");
    }

    #[test]
    fn version_keys_follow_the_etag_and_the_object() {
        let a = ObjectConnector::key_of("s3://b/a.md", "\"e1\"");
        assert_eq!(a.len(), 32);
        assert_ne!(a, ObjectConnector::key_of("s3://b/a.md", "\"e2\""));
        assert_ne!(a, ObjectConnector::key_of("s3://b/b.md", "\"e1\""));
    }
}
