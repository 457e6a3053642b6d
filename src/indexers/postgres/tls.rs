//! TLS to PostgreSQL, as libpq's `sslmode` says (rustls, no OpenSSL):
//!
//! | `sslmode` | TLS | the server's certificate |
//! |---|---|---|
//! | `disable` | never | - |
//! | `allow`, `prefer` (default) | when the server offers it | not checked |
//! | `require` | always | not checked; checked against `sslrootcert` when one is given (as libpq does) |
//! | `verify-ca` | always | signed by a CA of `sslrootcert` |
//! | `verify-full` | always | signed by a CA of `sslrootcert`, and for the host name connected to |
//!
//! `sslrootcert=PATH` (PEM), or `system` for the operating system's store; unset, the checking
//! modes use `~/.postgresql/root.crt` when it exists, else the system's store.
//! `sslcert=PATH&sslkey=PATH`: a client certificate, for servers that ask for one.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

/// TLS settings that cannot be used (a file that does not read, a key that is not PEM): the
/// message names the setting and the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(pub String);

/// libpq's `sslmode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub fn parse(value: &str) -> Option<SslMode> {
        Some(match value {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// What the client library does with it: whether TLS may be skipped.
    pub fn client_mode(self) -> postgres::config::SslMode {
        match self {
            SslMode::Disable => postgres::config::SslMode::Disable,
            SslMode::Allow | SslMode::Prefer => postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
                postgres::config::SslMode::Require
            }
        }
    }
}

/// Where the CAs that sign the server's certificate come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RootCert {
    File(PathBuf),
    System,
}

/// The URI's TLS settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsSettings {
    pub mode: SslMode,
    pub root_cert: Option<RootCert>,
    /// A client certificate and its key (PEM).
    pub client: Option<(PathBuf, PathBuf)>,
}

impl Default for TlsSettings {
    fn default() -> Self {
        TlsSettings {
            mode: SslMode::Prefer,
            root_cert: None,
            client: None,
        }
    }
}

/// How much of the server's certificate is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Check {
    Nothing,
    Chain,
    ChainAndName,
}

impl TlsSettings {
    fn check(&self) -> Check {
        match self.mode {
            SslMode::Disable | SslMode::Allow | SslMode::Prefer => Check::Nothing,
            SslMode::Require if self.root_cert.is_some() => Check::Chain,
            SslMode::Require => Check::Nothing,
            SslMode::VerifyCa => Check::Chain,
            SslMode::VerifyFull => Check::ChainAndName,
        }
    }

    /// The rustls client configuration for these settings; the error says what to fix.
    pub fn client_config(&self) -> Result<ClientConfig, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError(format!("TLS set-up: {e}")))?;
        let builder = match self.check() {
            Check::Nothing => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Unchecked(provider))),
            check => {
                let roots = Arc::new(self.roots()?);
                let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider)
                    .build()
                    .map_err(|e| TlsError(format!("TLS set-up: {e}")))?;
                if check == Check::ChainAndName {
                    builder.with_webpki_verifier(webpki)
                } else {
                    builder
                        .dangerous()
                        .with_custom_certificate_verifier(Arc::new(ChainOnly(webpki)))
                }
            }
        };
        match &self.client {
            None => Ok(builder.with_no_client_auth()),
            Some((cert, key)) => {
                let certs = read_certs(cert, "sslcert")?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                    TlsError(format!(
                        "sslkey={}: not a PEM private key ({e})",
                        key.display()
                    ))
                })?;
                builder
                    .with_client_auth_cert(certs, key)
                    .map_err(|e| TlsError(format!("sslcert/sslkey: {e}")))
            }
        }
    }

    fn roots(&self) -> Result<RootCertStore, TlsError> {
        let mut store = RootCertStore::empty();
        let default = std::env::var_os("HOME")
            .map(|h| Path::new(&h).join(".postgresql/root.crt"))
            .filter(|p| p.is_file());
        let source = match (&self.root_cert, default) {
            (Some(r), _) => r.clone(),
            (None, Some(home)) => RootCert::File(home),
            (None, None) => RootCert::System,
        };
        match source {
            RootCert::File(path) => {
                for cert in read_certs(&path, "sslrootcert")? {
                    store
                        .add(cert)
                        .map_err(|e| TlsError(format!("sslrootcert={}: {e}", path.display())))?;
                }
            }
            RootCert::System => {
                let found = rustls_native_certs::load_native_certs();
                for cert in found.certs {
                    let _ = store.add(cert);
                }
                if store.is_empty() {
                    return Err(TlsError(
                        "sslrootcert=system: the system has no CA certificates; name the CA's \
                         file with sslrootcert=PATH"
                            .into(),
                    ));
                }
            }
        }
        Ok(store)
    }
}

fn read_certs(path: &Path, key: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes =
        std::fs::read(path).map_err(|e| TlsError(format!("{key}={}: {e}", path.display())))?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| {
            TlsError(format!(
                "{key}={}: not PEM certificates ({e})",
                path.display()
            ))
        })?;
    if certs.is_empty() {
        return Err(TlsError(format!(
            "{key}={}: no certificate in it",
            path.display()
        )));
    }
    Ok(certs)
}

/// `prefer`, `require`: encrypted, the server not checked (libpq's behaviour).
#[derive(Debug)]
struct Unchecked(Arc<CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain is checked, the name is not.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_decide_what_is_checked() {
        let with = |mode, root: Option<RootCert>| TlsSettings {
            mode,
            root_cert: root,
            client: None,
        };
        assert_eq!(with(SslMode::Prefer, None).check(), Check::Nothing);
        assert_eq!(with(SslMode::Require, None).check(), Check::Nothing);
        let ca = Some(RootCert::File("/ca.pem".into()));
        assert_eq!(with(SslMode::Require, ca.clone()).check(), Check::Chain);
        assert_eq!(with(SslMode::VerifyCa, None).check(), Check::Chain);
        assert_eq!(with(SslMode::VerifyFull, ca).check(), Check::ChainAndName);
        assert!(with(SslMode::Require, None).client_config().is_ok());
        let e = with(
            SslMode::VerifyFull,
            Some(RootCert::File("/no/such/ca.pem".into())),
        )
        .client_config()
        .unwrap_err()
        .0;
        assert!(e.contains("sslrootcert=/no/such/ca.pem"), "{e}");
        for m in [
            "disable",
            "allow",
            "prefer",
            "require",
            "verify-ca",
            "verify-full",
        ] {
            assert_eq!(SslMode::parse(m).unwrap().name(), m);
        }
        assert_eq!(SslMode::parse("on"), None);
    }
}
