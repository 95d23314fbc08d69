//! The backend's query API, asked over a pooled hyper client: the caller's headers
//! passed on, one time-out over the whole exchange, the answer read up to a size limit.

use std::time::Duration;

use bytes::Bytes;
use http::header::{
    ACCEPT_ENCODING, AUTHORIZATION, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, HOST, TE, TRAILER,
    TRANSFER_ENCODING, UPGRADE, USER_AGENT,
};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::forward::TlsOptions;
use crate::forward::http_backend::USER_AGENT_VALUE;

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// How the upstream is reached (`query.*` in the configuration, translated by `app`).
#[derive(Clone, Debug)]
pub struct UpstreamOptions {
    /// The root of the query API, without a trailing slash.
    pub base: String,
    pub timeout: Duration,
    pub max_response_bytes: usize,
    /// Sent on every request, replacing the caller's header of that name.
    pub headers: Vec<(String, String)>,
    pub tls: TlsOptions,
}

/// Why no answer came back.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("the upstream did not answer within query.timeout ({0:?})")]
    Timeout(Duration),
    #[error("the upstream's answer is larger than query.max_response_bytes ({0} bytes)")]
    TooLarge(usize),
    #[error("the upstream cannot be reached: {0}")]
    Unavailable(String),
}

/// One answer of the upstream, read whole.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub content_type: Option<HeaderValue>,
    pub body: Bytes,
}

pub struct Upstream {
    opts: UpstreamOptions,
    headers: HeaderMap,
    client: HttpsClient,
}

/// Headers of one hop, never passed on (RFC 9110 §7.6.1), and those promnorm sets itself.
const NOT_PASSED: [HeaderName; 9] = [
    CONNECTION,
    HeaderName::from_static("keep-alive"),
    TE,
    TRAILER,
    TRANSFER_ENCODING,
    UPGRADE,
    HOST,
    CONTENT_LENGTH,
    CONTENT_TYPE,
];

impl Upstream {
    pub fn new(opts: UpstreamOptions) -> Result<Upstream, crate::forward::BackendError> {
        let mut headers = HeaderMap::new();
        for (k, v) in &opts.headers {
            let bad = |what: String| crate::forward::BackendError::Header {
                backend: "query.upstream".into(),
                what,
            };
            let name: HeaderName = k
                .parse()
                .map_err(|_| bad(format!("bad header name {k:?}")))?;
            let mut value: HeaderValue = v
                .parse()
                .map_err(|_| bad(format!("bad value for header {k}")))?;
            if name == AUTHORIZATION {
                value.set_sensitive(true);
            }
            headers.insert(name, value);
        }
        let tls = crate::forward::tls::client_config(&opts.tls)?;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(opts.timeout));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector);
        Ok(Upstream {
            opts,
            headers,
            client,
        })
    }

    pub fn timeout(&self) -> Duration {
        self.opts.timeout
    }

    pub fn base(&self) -> &str {
        &self.opts.base
    }

    /// Asks `path` with `params` (a query string for `GET`, a form for `POST`), the
    /// caller's headers passed on but those of one hop, `Accept-Encoding` (the answer is
    /// read here, so it comes plain) and, when `drop_authorization`, `Authorization`
    /// (promnorm's own credential, not the caller's identity upstream).
    pub async fn ask(
        &self,
        method: Method,
        path: &str,
        params: &[(String, String)],
        caller: &HeaderMap,
        drop_authorization: bool,
    ) -> Result<Answer, UpstreamError> {
        let form = super::form::encode(params);
        let uri = if method == Method::GET && !form.is_empty() {
            format!("{}{path}?{form}", self.opts.base)
        } else {
            format!("{}{path}", self.opts.base)
        };
        let body = if method == Method::GET {
            Bytes::new()
        } else {
            Bytes::from(form)
        };
        let mut req = Request::builder()
            .method(method.clone())
            .uri(uri)
            .body(Full::new(body))
            .map_err(|e| UpstreamError::Unavailable(format!("bad upstream URL: {e}")))?;
        let h = req.headers_mut();
        for (name, value) in caller {
            if NOT_PASSED.contains(name)
                || *name == ACCEPT_ENCODING
                || (drop_authorization && *name == AUTHORIZATION)
                || name.as_str().starts_with("proxy-")
            {
                continue;
            }
            h.append(name.clone(), value.clone());
        }
        for (name, value) in &self.headers {
            h.insert(name.clone(), value.clone());
        }
        if !h.contains_key(USER_AGENT) {
            h.insert(USER_AGENT, HeaderValue::from_static(USER_AGENT_VALUE));
        }
        if method == Method::POST {
            h.insert(
                CONTENT_TYPE,
                HeaderValue::from_static("application/x-www-form-urlencoded"),
            );
        }
        let limit = self.opts.max_response_bytes;
        let exchange = async {
            let resp = self.client.request(req).await.map_err(|e| {
                let (causes, _) =
                    crate::forward::http_backend::error_causes(std::error::Error::source(&e));
                let mut text = format!("{} {}: {e}", self.opts.base, path);
                for c in causes {
                    text.push_str(": ");
                    text.push_str(&c);
                }
                UpstreamError::Unavailable(text)
            })?;
            let status = resp.status();
            let content_type = resp.headers().get(CONTENT_TYPE).cloned();
            if let Some(len) = resp
                .headers()
                .get(CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
                && len > limit as u64
            {
                return Err(UpstreamError::TooLarge(limit));
            }
            let body = Limited::new(resp.into_body(), limit)
                .collect()
                .await
                .map_err(|e| {
                    if e.is::<http_body_util::LengthLimitError>() {
                        UpstreamError::TooLarge(limit)
                    } else {
                        UpstreamError::Unavailable(format!("reading the answer: {e}"))
                    }
                })?
                .to_bytes();
            Ok(Answer {
                status,
                content_type,
                body,
            })
        };
        match tokio::time::timeout(self.opts.timeout, exchange).await {
            Ok(r) => r,
            Err(_) => Err(UpstreamError::Timeout(self.opts.timeout)),
        }
    }
}
