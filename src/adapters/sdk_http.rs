//! The AWS SDK's HTTP client is reqwest, with the TLS settings of `tls.rs`: one HTTP
//! stack and one set of trusted roots for both clients.
//!
//! The SDK's own HTTPS client (`aws-smithy-http-client`) can only trust roots it
//! decodes from PEM itself, the system's bundle or bytes handed to it, and does so
//! at every client it builds, which was most of a cold start's instructions. This
//! adapter gives the SDK what its `HttpClient` contract asks for (connect and read
//! timeouts per connector settings, a connection pool, errors classified as timeout,
//! I/O or other, which is what the SDK's retry policy reads) and nothing else: the
//! SDK's bodies here are buffered requests and responses of a few kilobytes, so
//! nothing is streamed.

use std::sync::Mutex;
use std::time::Duration;

use aws_sdk_dynamodb::config::{RuntimeComponents, SharedHttpClient};
use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_types::body::SdkBody;

use crate::adapters::tls::Tls;

/// The SDK's HTTP client over `tls`.
pub fn client(tls: &Tls) -> SharedHttpClient {
    SharedHttpClient::new(ReqwestClient {
        tls: tls.clone(),
        connectors: Mutex::new(Vec::new()),
    })
}

/// One reqwest client (one pool) per distinct connector settings: the SDK asks with
/// the same few settings again and again (ours, and the credential providers').
#[derive(Debug)]
struct ReqwestClient {
    tls: Tls,
    connectors: Mutex<Vec<(Timeouts, SharedHttpConnector)>>,
}

type Timeouts = (Option<Duration>, Option<Duration>);

impl HttpClient for ReqwestClient {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        _components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        let timeouts = (settings.connect_timeout(), settings.read_timeout());
        // A poisoned lock only means another thread panicked while pushing: the list
        // is still whole.
        let mut connectors = self
            .connectors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, connector)) = connectors.iter().find(|(t, _)| *t == timeouts) {
            return connector.clone();
        }
        let connector = SharedHttpConnector::new(Connector::new(&self.tls, timeouts));
        connectors.push((timeouts, connector.clone()));
        connector
    }
}

#[derive(Debug)]
struct Connector {
    client: Result<reqwest::Client, std::sync::Arc<reqwest::Error>>,
}

impl Connector {
    fn new(tls: &Tls, (connect, read): Timeouts) -> Self {
        // The SDK decides about redirects and retries itself: a 3xx is its answer to
        // read, and a retry here would be one it does not count.
        let mut builder = reqwest::Client::builder()
            .tls_backend_preconfigured(tls.client_config())
            .redirect(reqwest::redirect::Policy::none())
            .retry(reqwest::retry::never())
            .referer(false);
        if let Some(connect) = connect {
            builder = builder.connect_timeout(connect);
        }
        if let Some(read) = read {
            builder = builder.read_timeout(read);
        }
        // The SDK's contract builds connectors infallibly: a client that cannot be
        // built fails each request instead, with the reason.
        Self {
            client: builder.build().map_err(std::sync::Arc::new),
        }
    }
}

impl HttpConnector for Connector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let client = match &self.client {
            Ok(client) => client.clone(),
            Err(e) => {
                return HttpConnectorFuture::ready(Err(ConnectorError::other(
                    Box::new(SharedError(e.clone())),
                    None,
                )));
            }
        };
        HttpConnectorFuture::new(async move {
            let request = to_reqwest(&client, &request)?;
            let mut response = client.execute(request).await.map_err(classify)?;
            let status = response.status().as_u16();
            // Taken, not cloned: the body read below consumes the response.
            let headers = std::mem::take(response.headers_mut());
            let body = response.bytes().await.map_err(classify)?;
            let status = status
                .try_into()
                .map_err(|e| ConnectorError::other(Box::new(e), None))?;
            let mut out = HttpResponse::new(status, SdkBody::from(body));
            for (name, value) in &headers {
                out.headers_mut()
                    .try_append(name.clone(), value.clone())
                    .map_err(|e| ConnectorError::other(Box::new(e), None))?;
            }
            Ok(out)
        })
    }
}

fn to_reqwest(
    client: &reqwest::Client,
    request: &HttpRequest,
) -> Result<reqwest::Request, ConnectorError> {
    let method = reqwest::Method::from_bytes(request.method().as_bytes())
        .map_err(|e| ConnectorError::user(Box::new(e)))?;
    let body = request
        .body()
        .bytes()
        .ok_or_else(|| {
            ConnectorError::user("a streaming request body, which this client does not send".into())
        })?
        .to_vec();
    let mut builder = client.request(method, request.uri()).body(body);
    for (name, value) in request.headers() {
        builder = builder.header(name, value);
    }
    builder
        .build()
        .map_err(|e| ConnectorError::user(Box::new(e)))
}

/// What the SDK's retry policy reads: a timeout and an I/O error are transient.
fn classify(error: reqwest::Error) -> ConnectorError {
    if error.is_timeout() {
        ConnectorError::timeout(Box::new(error))
    } else if error.is_connect() || error.is_request() || error.is_body() {
        ConnectorError::io(Box::new(error))
    } else {
        ConnectorError::other(Box::new(error), None)
    }
}

/// A client build error, shared by every request that meets it.
#[derive(Debug, thiserror::Error)]
#[error("building the AWS SDK's HTTP client failed")]
struct SharedError(#[source] std::sync::Arc<reqwest::Error>);
