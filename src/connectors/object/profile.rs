//! The AWS shared credentials and config files (`~/.aws/credentials`, `~/.aws/config`), the
//! part of the standard credential chain `object_store` leaves out: a profile's static keys and
//! its region, used when the environment has none. The profile is `AWS_PROFILE` (else
//! `default`); the files are `AWS_SHARED_CREDENTIALS_FILE` and `AWS_CONFIG_FILE` (else under
//! `$HOME/.aws`). SSO and `credential_process` profiles are not run: use `aws configure
//! export-credentials` to put their keys in the environment.

use std::collections::HashMap;
use std::path::PathBuf;

use object_store::aws::AmazonS3Builder;

/// A profile file is read no further than this.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// `builder` with the profile's keys (when the environment has no access key) and region
/// (when it has no region).
pub(super) fn apply(builder: AmazonS3Builder) -> AmazonS3Builder {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let profile = env("AWS_PROFILE").unwrap_or_else(|| "default".into());
    let home = env("HOME").map(PathBuf::from);
    let file = |var: &str, name: &str| {
        env(var)
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".aws").join(name)))
    };
    let credentials = file("AWS_SHARED_CREDENTIALS_FILE", "credentials")
        .and_then(read)
        .map(|text| section(&text, &profile))
        .unwrap_or_default();
    let config = file("AWS_CONFIG_FILE", "config")
        .and_then(read)
        .map(|text| {
            let name = if profile == "default" {
                "default".to_string()
            } else {
                format!("profile {profile}")
            };
            section(&text, &name)
        })
        .unwrap_or_default();
    let get = |k: &str| credentials.get(k).or_else(|| config.get(k)).cloned();
    let mut builder = builder;
    if env("AWS_ACCESS_KEY_ID").is_none() {
        if let (Some(id), Some(secret)) = (get("aws_access_key_id"), get("aws_secret_access_key")) {
            builder = builder
                .with_access_key_id(id)
                .with_secret_access_key(secret);
            if let Some(token) = get("aws_session_token") {
                builder = builder.with_token(token);
            }
        }
    }
    if env("AWS_REGION").is_none() && env("AWS_DEFAULT_REGION").is_none() {
        if let Some(region) = get("region") {
            builder = builder.with_region(region);
        }
    }
    builder
}

fn read(path: PathBuf) -> Option<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_FILE_BYTES)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

/// The keys of section `[name]` of an INI text (`key = value`, `#` and `;` comments; keys
/// lower-cased; the last of a repeated section or key wins).
fn section(text: &str, name: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(header) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = header.split_whitespace().collect::<Vec<_>>().join(" ") == name;
            continue;
        }
        if inside {
            if let Some((k, v)) = line.split_once('=') {
                out.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_are_found_by_name_with_comments_and_spacing() {
        let text = "# keys\n[default]\naws_access_key_id = AKIA1\n\n[ profile  work ]\n\
                    region=eu-west-3\n[work]\nAWS_SECRET_ACCESS_KEY = s\n";
        let d = section(text, "default");
        assert_eq!(d["aws_access_key_id"], "AKIA1");
        assert_eq!(d.len(), 1);
        let p = section(text, "profile work");
        assert_eq!(p["region"], "eu-west-3");
        assert_eq!(section(text, "work")["aws_secret_access_key"], "s");
        assert!(section(text, "other").is_empty());
    }
}
