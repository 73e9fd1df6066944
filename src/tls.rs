//! TLS for the two HTTPS clients, built once at start: the AWS SDK's (DynamoDB, Secrets
//! Manager, and the STS/SSO clients of the credential chain) and the payment API's.
//!
//! Both run rustls on *ring*. The SDK's own `default-https-client` would run it on
//! aws-lc, whose C build costs minutes of every fresh build, for nothing these clients
//! need.
//!
//! Trust roots, which are most of a cold start's instructions:
//! * The SDK client trusts the system's roots, as the SDK does by default. It reads and
//!   decodes the PEM files once per process and shares them between its clients.
//! * The payment client trusts Mozilla's roots, compiled in (`webpki-roots`): nothing
//!   to read or decode at start. Reading the system's roots a second time for it (as
//!   reqwest's platform verifier did) cost about 19 M instructions, half of a cold
//!   start. A payment API behind a private CA is not supported.

use std::sync::Arc;

use aws_sdk_dynamodb::config::SharedHttpClient;
use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};

/// The TLS settings of the payment API's client.
pub fn payment_client() -> Result<rustls::ClientConfig, rustls::Error> {
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth())
}

/// The AWS SDK's HTTP client: HTTPS on rustls and ring, the system's roots.
pub fn sdk_http_client() -> SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https()
}
