//! The TLS settings of every HTTPS client, built once at start: which roots are
//! trusted, on which crypto provider. Both clients (the payment API's and the AWS
//! SDK's, see `sdk_http.rs`) use the same settings.
//!
//! * rustls on *ring*. The SDK's own `default-https-client` would bring aws-lc, whose C
//!   build costs minutes of every fresh build, for nothing these clients need.
//! * Mozilla's root certificates, compiled in (`webpki-roots`): a cold start reads and
//!   decodes no certificate file. Reading the system's PEM bundle, once per client,
//!   was most of a cold start's instructions.
//! * Plus the roots in `AWS_CA_BUNDLE` (a PEM file, the variable the AWS CLI reads),
//!   for a TLS-inspecting proxy or a private CA. A file that cannot be read, or holds
//!   no certificate, stops the start with a line naming the variable.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// The start stops on these: the message names the variable and the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("AWS_CA_BUNDLE={}: cannot be read as PEM certificates", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("AWS_CA_BUNDLE={}: holds no certificate", path.display())]
    Empty { path: PathBuf },
    #[error("AWS_CA_BUNDLE={}: a certificate is not a usable root", path.display())]
    Root {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("the TLS settings")]
    Settings(#[source] rustls::Error),
}

/// The client TLS settings; cloning shares them.
#[derive(Clone, Debug)]
pub struct Tls(Arc<rustls::ClientConfig>);

impl Tls {
    /// Mozilla's roots, plus those of `ca_bundle` when given.
    pub fn new(ca_bundle: Option<&Path>) -> Result<Self, TlsError> {
        let mut roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        if let Some(path) = ca_bundle {
            let read = |source| TlsError::Read {
                path: path.to_owned(),
                source,
            };
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(read)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(read)?;
            if certs.is_empty() {
                return Err(TlsError::Empty {
                    path: path.to_owned(),
                });
            }
            for cert in certs {
                roots.add(cert).map_err(|source| TlsError::Root {
                    path: path.to_owned(),
                    source,
                })?;
            }
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Settings)?
        .with_root_certificates(roots)
        .with_no_client_auth();
        Ok(Self(Arc::new(config)))
    }

    /// The settings, for a client builder that takes them by value (reqwest).
    pub fn client_config(&self) -> rustls::ClientConfig {
        (*self.0).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_that_is_missing_or_holds_no_certificate_names_the_variable() {
        let missing = Tls::new(Some(Path::new("/nonexistent/ca.pem"))).unwrap_err();
        assert!(
            missing
                .to_string()
                .starts_with("AWS_CA_BUNDLE=/nonexistent/ca.pem"),
            "{missing}"
        );
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let error = Tls::new(Some(&empty)).unwrap_err();
        assert!(matches!(error, TlsError::Empty { .. }), "{error}");
        assert!(error.to_string().starts_with("AWS_CA_BUNDLE="), "{error}");
    }
}
