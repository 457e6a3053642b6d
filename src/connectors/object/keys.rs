//! Object keys the store client cannot address. `object_store` parses every key of a listing
//! page into its `Path`, which refuses a `.` or `..` segment, an empty one (`a//b`) and ASCII
//! control characters; one such key fails the whole page, and its listing stops there ("Encountered
//! illegal character sequence \"..\""). Anyone who may write one object to the bucket could stop
//! the source. The store's HTTP client is therefore wrapped: a listing page's keys (S3's and
//! GCS's `<Key>`, Azure's `<Name>`) that would not parse are replaced by a marker carrying the
//! key in hex, which parses; the connector turns a marker back into the key and fails that
//! object alone, with the reason, and the listing goes on.

use bytes::Bytes;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpResponseBody, HttpService,
    ReqwestConnector,
};
use object_store::path::Path as KeyPath;
use object_store::ClientOptions;

/// The start of a marker key (one path segment: the rest is the key's bytes in hex).
const MARKER: &str = "ragline-unaddressable-key-";

/// The store's HTTP client with listing pages mended as above.
#[derive(Debug, Default)]
pub(super) struct GuardedKeys;

impl HttpConnector for GuardedKeys {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        Ok(HttpClient::new(Guard(
            ReqwestConnector::default().connect(options)?,
        )))
    }
}

#[derive(Debug)]
struct Guard(HttpClient);

#[async_trait::async_trait]
impl HttpService for Guard {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        // A listing: S3 and GCS (`list-type=2`), Azure (`comp=list`).
        let listing = req.method() == http::Method::GET
            && req
                .uri()
                .query()
                .is_some_and(|q| q.split('&').any(|p| p == "list-type=2" || p == "comp=list"));
        let resp = self.0.execute(req).await?;
        if !listing || !resp.status().is_success() {
            return Ok(resp);
        }
        let (mut parts, body) = resp.into_parts();
        let bytes = body.bytes().await?;
        let mended = match std::str::from_utf8(&bytes)
            .ok()
            .and_then(mark_unaddressable)
        {
            Some(text) => Bytes::from(text),
            None => bytes,
        };
        parts.headers.remove(http::header::CONTENT_LENGTH);
        Ok(HttpResponse::from_parts(
            parts,
            HttpResponseBody::from(mended),
        ))
    }
}

/// `xml` with each `<Key>` or `<Name>` element whose key the store client cannot address
/// replaced by a marker; None when there is none.
fn mark_unaddressable(xml: &str) -> Option<String> {
    let mut out = String::with_capacity(xml.len());
    let mut rest = xml;
    let mut changed = false;
    loop {
        // The next element of either name.
        let next = ["<Key>", "<Name>"]
            .iter()
            .filter_map(|open| rest.find(open).map(|at| (at, *open)))
            .min();
        let Some((at, open)) = next else {
            break;
        };
        let close = if open == "<Key>" { "</Key>" } else { "</Name>" };
        let start = at + open.len();
        let Some(len) = rest[start..].find(close) else {
            break;
        };
        let raw = &rest[start..start + len];
        out.push_str(&rest[..start]);
        match unescape(raw) {
            Some(key) if KeyPath::parse(&key).is_err() => {
                out.push_str(&marker(&key));
                changed = true;
            }
            _ => out.push_str(raw),
        }
        out.push_str(close);
        rest = &rest[start + len + close.len()..];
    }
    out.push_str(rest);
    changed.then_some(out)
}

/// The text of an XML element: the five named entities and character references undone.
fn unescape(raw: &str) -> Option<String> {
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        let end = rest[amp..].find(';')? + amp;
        let entity = &rest[amp + 1..end];
        let c = match entity {
            "amp" => '&',
            "lt" => '<',
            "gt" => '>',
            "quot" => '"',
            "apos" => '\'',
            _ => {
                let n = match entity
                    .strip_prefix("#x")
                    .or_else(|| entity.strip_prefix("#X"))
                {
                    Some(hex) => u32::from_str_radix(hex, 16).ok()?,
                    None => entity.strip_prefix('#')?.parse().ok()?,
                };
                char::from_u32(n)?
            }
        };
        out.push(c);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    Some(out)
}

fn marker(key: &str) -> String {
    let hex: String = key.bytes().map(|b| format!("{b:02x}")).collect();
    format!("{MARKER}{hex}")
}

/// The key a listed location stands for when it is a marker: the key as the bucket holds it.
pub(super) fn unaddressable(location: &str) -> Option<String> {
    let hex = location.rsplit('/').next()?.strip_prefix(MARKER)?;
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

/// Why a key cannot be read, and what to do.
pub(super) fn reason(key: &str) -> String {
    let why = match KeyPath::parse(key) {
        Err(e) => e.to_string(),
        Ok(_) => "it cannot be addressed".into(),
    };
    format!(
        "the object key {key:?} cannot be read by the object store client ({why}): keys with \
         a `.` or `..` segment, an empty segment (`//`) or control characters are not \
         supported; rename the object"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_the_client_refuses_become_markers_that_give_them_back() {
        let xml = "<ListBucketResult><Contents><Key>docs/a.md</Key><Size>3</Size></Contents>\
                   <Contents><Key>docs/../evil.md</Key></Contents>\
                   <Contents><Key>docs//x &amp; y.md</Key></Contents>\
                   <Contents><Key>docs/b&amp;c.md</Key></Contents></ListBucketResult>";
        let mended = mark_unaddressable(xml).unwrap();
        assert!(mended.contains("<Key>docs/a.md</Key>"), "{mended}");
        assert!(mended.contains("<Key>docs/b&amp;c.md</Key>"), "{mended}");
        assert!(!mended.contains(".."), "{mended}");
        let keys: Vec<String> = mended
            .split("<Key>")
            .skip(1)
            .map(|s| s.split("</Key>").next().unwrap().to_string())
            .filter_map(|k| unaddressable(&k))
            .collect();
        assert_eq!(keys, ["docs/../evil.md", "docs//x & y.md"]);
        for k in &keys {
            assert!(reason(k).contains("rename the object"), "{}", reason(k));
        }
        // Azure's names, and a page with nothing to mend.
        let azure = "<EnumerationResults><Blobs><Blob><Name>a/./b</Name></Blob></Blobs>";
        assert!(mark_unaddressable(azure).unwrap().contains(MARKER));
        assert_eq!(mark_unaddressable("<Key>fine/key.md</Key>"), None);
        assert_eq!(unaddressable("docs/a.md"), None);
        assert_eq!(unaddressable(&format!("{MARKER}zz")), None);
    }
}
