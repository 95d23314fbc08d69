//! A remote-write 1.0 backend reached over HTTP(S) with a pooled hyper client.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_ENCODING, CONTENT_TYPE, RETRY_AFTER, USER_AGENT};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::Semaphore;

use super::{
    BackendError, BackendOptions, BackendProtocol, BackendSettings, Encoded, Outcome, OutcomeClass,
    Payload, Protocol, SendFuture, TenancyOptions, Transport,
};

pub const USER_AGENT_VALUE: &str = concat!("promnorm/", env!("CARGO_PKG_VERSION"));
/// Bytes of a refusal's body kept as its reason.
const REASON_LIMIT: usize = 512;
/// Bytes of an answer's body read past the reason and discarded, so that the connection
/// goes back to the pool; a longer body (a backend answering megabytes) closes the
/// connection instead: reading it would cost time, and keeping it memory.
const DRAIN_LIMIT: usize = 64 << 10;
/// How long the rest of a body may take to arrive before the connection is closed.
const DRAIN_TIME: Duration = Duration::from_millis(500);

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

pub struct HttpBackend {
    settings: BackendSettings,
    client: HttpsClient,
    protocol: BackendProtocol,
    /// `protocol: auto` found the backend speaks only 1.0.
    fell_back: AtomicBool,
    tenancy: Option<TenancyOptions>,
    native_histograms: super::NativeHistogramsPolicy,
    /// Requests in flight to this backend (`max_concurrent_requests`): tenant routing
    /// multiplies one sender's request by its tenants, and each request in flight holds
    /// a connection (a file descriptor, socket buffers).
    in_flight: Semaphore,
    max_concurrent: usize,
    /// The answer when no slot frees in time (`server.throttle_status`).
    saturated_status: http::StatusCode,
    /// The refusals the misconfigured state holds on.
    config_state: ConfigState,
    /// Made once: the request path counts without building label strings.
    metrics: std::sync::Arc<crate::telemetry::BackendMetrics>,
}

/// How long a request waits for one of the backend's `max_concurrent_requests` slots
/// before the sender is answered `429` (at most the backend's `timeout`): long enough to
/// smooth a burst, short enough that an overloaded backend answers the excess at once.
const PERMIT_WAIT: Duration = Duration::from_secs(1);

/// How long the misconfigured state outlives the backend's last refusal. A backend
/// that refuses some requests and accepts others (a gateway refusing one tenant, or
/// requests without a tenant) is misconfigured all along: a delivery in between must not
/// clear the state, or the gauge flaps and an alert with `for:` never fires. A delivery
/// clears it only when nothing was refused for this long; the alert's `for: 2m` and the
/// senders' and queues' backoffs (at most 30 s) fit well within it.
const MISCONFIGURED_HOLD: Duration = Duration::from_secs(300);

/// The misconfigured state: when the backend last refused promnorm.
#[derive(Default)]
struct ConfigState {
    last_refusal: std::sync::Mutex<Option<Instant>>,
}

/// What one answer changed in the misconfigured state.
#[derive(Debug, PartialEq, Eq)]
enum Change {
    None,
    Started,
    Ended,
}

impl ConfigState {
    /// Notes a refusal (`refused`) or a delivery at `now`; returns whether the backend
    /// counts as misconfigured now, and what changed.
    fn note(&self, refused: bool, now: Instant, hold: Duration) -> (bool, Change) {
        let mut last = self
            .last_refusal
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if refused {
            let was = last.replace(now).is_some();
            return (true, if was { Change::None } else { Change::Started });
        }
        match *last {
            Some(t) if now.saturating_duration_since(t) >= hold => {
                *last = None;
                (false, Change::Ended)
            }
            Some(_) => (true, Change::None),
            None => (false, Change::None),
        }
    }
}

/// The headers by which a 2.0 receiver confirms what it wrote.
const WRITTEN_HEADERS: [&str; 3] = [
    "x-prometheus-remote-write-samples-written",
    "x-prometheus-remote-write-histograms-written",
    "x-prometheus-remote-write-exemplars-written",
];

/// A failed request as a person needs it: the address and the causes underneath
/// hyper's "client error (Connect)": `connecting to 127.0.0.1:19091: tcp connect error:
/// Connection refused (os error 111)`, or `TLS: invalid peer certificate: …`.
pub fn connection_error(e: &hyper_util::client::legacy::Error, url: &http::Uri) -> String {
    use std::error::Error as _;
    let addr = url.authority().map_or("?", |a| a.as_str());
    let addr = addr.rsplit('@').next().unwrap_or(addr); // never the credentials
    let (causes, tls) = error_causes(e.source());
    let what = if e.is_connect() {
        "connecting to"
    } else {
        "talking to"
    };
    let chain = if causes.is_empty() {
        e.to_string()
    } else {
        causes.join(": ")
    };
    format!("{what} {addr}: {}{chain}", if tls { "TLS: " } else { "" })
}

/// The texts of an error chain (each once: wrappers often repeat their source) and
/// whether TLS is among them.
pub fn error_causes(mut source: Option<&(dyn std::error::Error + 'static)>) -> (Vec<String>, bool) {
    let mut causes: Vec<String> = Vec::new();
    let mut tls = false;
    while let Some(s) = source {
        tls |= s.downcast_ref::<rustls::Error>().is_some()
            || s.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some());
        let text = s.to_string();
        if !text.is_empty() && !causes.iter().any(|c| c.contains(&text)) {
            causes.push(text);
        }
        source = s.source();
    }
    (causes, tls)
}

impl HttpBackend {
    pub fn new(opts: BackendOptions) -> Result<HttpBackend, BackendError> {
        let name = opts.name;
        let mut headers = HeaderMap::new();
        for (k, v) in &opts.headers {
            let k: HeaderName = k.parse().map_err(|_| BackendError::Header {
                backend: name.clone(),
                what: format!("bad header name {k:?}"),
            })?;
            let v: HeaderValue = v.parse().map_err(|_| BackendError::Header {
                backend: name.clone(),
                what: format!("bad value for header {k}"),
            })?;
            headers.insert(k, v);
        }
        if let Some(b) = &opts.basic {
            let token = base64_encode(format!("{}:{}", b.username, b.password).as_bytes());
            headers.insert(AUTHORIZATION, secret_header(&format!("Basic {token}"))?);
        }
        if let Some(t) = &opts.bearer_token {
            headers.insert(AUTHORIZATION, secret_header(&format!("Bearer {t}"))?);
        }
        let pass_headers = opts
            .pass_headers
            .iter()
            .map(|h| {
                h.parse::<HeaderName>().map_err(|_| BackendError::Header {
                    backend: name.clone(),
                    what: format!("bad pass_headers entry {h:?}"),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let tls = super::tls::client_config(&opts.tls)?;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(opts.timeout));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let max_concurrent = opts.max_concurrent_requests.max(1);
        crate::telemetry::register_backend(&name, opts.tenancy.is_some());
        let metrics = std::sync::Arc::new(crate::telemetry::BackendMetrics::new(&name));
        // As many idle connections as requests may be in flight: a burst's connections
        // are reused, not closed into TIME_WAIT and opened again.
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(std::time::Duration::from_secs(90))
            .pool_max_idle_per_host(max_concurrent)
            .build(connector);
        Ok(HttpBackend {
            settings: BackendSettings {
                name,
                url: opts.url,
                timeout: opts.timeout,
                headers,
                pass_headers,
            },
            client,
            protocol: opts.protocol,
            fell_back: AtomicBool::new(false),
            tenancy: opts.tenancy,
            native_histograms: opts.native_histograms,
            in_flight: Semaphore::new(max_concurrent),
            max_concurrent,
            saturated_status: opts.saturated_status,
            config_state: ConfigState::default(),
            metrics,
        })
    }

    /// Tracks answers that blame promnorm's configuration: an alertable gauge, and one
    /// loud log line when it starts and one when it ends.
    fn note_configuration_state(&self, outcome: &Outcome) {
        let class = outcome.class();
        let refused = class == OutcomeClass::Misconfigured;
        if class != OutcomeClass::Delivered && !refused {
            return;
        }
        let (state, change) = self
            .config_state
            .note(refused, Instant::now(), MISCONFIGURED_HOLD);
        crate::telemetry::backend_misconfigured(&self.settings.name, state);
        match change {
            Change::Started => {
                if let Outcome::Rejected { status, reason, .. } = outcome {
                    tracing::error!(
                        backend = %self.settings.name,
                        status = status.as_u16(),
                        %reason,
                        "backend refuses promnorm's credentials or URL; senders are asked to retry until the configuration is fixed"
                    );
                }
            }
            Change::Ended => {
                tracing::info!(backend = %self.settings.name, "backend accepts promnorm's requests again");
            }
            Change::None => {}
        }
    }

    fn build_request(
        &self,
        body: Encoded,
        incoming: &HeaderMap,
    ) -> Result<Request<Full<Bytes>>, http::Error> {
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(self.settings.url.clone())
            .body(Full::new(body.body))?;
        let h = req.headers_mut();
        for name in &self.settings.pass_headers {
            for v in incoming.get_all(name) {
                h.append(name.clone(), v.clone());
            }
        }
        for (k, v) in &self.settings.headers {
            h.insert(k.clone(), v.clone());
        }
        // Tenant routing: the series' tenant (also a queued request's, whatever the
        // tenancy settings are now); series without one keep the sender's tenant header.
        match body.tenant {
            Some(t) => {
                h.insert(t.name, t.value);
            }
            None => {
                if let Some(t) = &self.tenancy
                    && let Some(v) = incoming.get(&t.header)
                {
                    h.insert(t.header.clone(), v.clone());
                }
            }
        }
        // The reserved remote-write headers are always ours.
        h.insert(CONTENT_ENCODING, HeaderValue::from_static("snappy"));
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static(body.protocol.content_type()),
        );
        h.insert(
            HeaderName::from_static("x-prometheus-remote-write-version"),
            HeaderValue::from_static(body.protocol.version_header()),
        );
        h.insert(USER_AGENT, HeaderValue::from_static(USER_AGENT_VALUE));
        Ok(req)
    }

    /// True when this backend is sent 2.0 now.
    pub(super) fn speaks_v2(&self) -> bool {
        match self.protocol {
            BackendProtocol::V1 => false,
            BackendProtocol::V2 => true,
            BackendProtocol::Auto => !self.fell_back.load(Ordering::Relaxed),
        }
    }

    /// Sends the payload in this backend's protocol; with `auto`, a `415` or a `2xx`
    /// without the written headers turns the backend to 1.0 for good and the request is
    /// sent again as 1.0 (SPEC §1.4).
    pub(super) async fn send_payload(&self, payload: Payload, incoming: &HeaderMap) -> Outcome {
        let tenant = payload.tenant;
        let v1 = Encoded {
            tenant: tenant.clone(),
            ..Encoded::v1(payload.v1)
        };
        let v2 = payload.v2.filter(|_| self.speaks_v2());
        let Some(v2) = v2 else {
            return self.send_inner(v1, incoming).await.0;
        };
        if payload.v2_series == 0 {
            // Metadata only: 2.0 carries metadata with series, so there is nothing to send.
            return Outcome::Delivered;
        }
        let body = Encoded {
            body: v2,
            protocol: Protocol::V2,
            tenant,
        };
        let (outcome, confirmed) = self.send_inner(body, incoming).await;
        if self.protocol != BackendProtocol::Auto {
            return outcome;
        }
        let why = match &outcome {
            Outcome::Rejected { status, .. } if status.as_u16() == 415 => {
                "it answered 415 to a 2.0 request"
            }
            Outcome::Delivered if !confirmed => {
                "it accepted a 2.0 request without the X-Prometheus-Remote-Write-*-Written headers"
            }
            _ => return outcome,
        };
        if !self.fell_back.swap(true, Ordering::Relaxed) {
            crate::telemetry::backend_fell_back_to_v1(&self.settings.name, why);
        }
        self.send_inner(v1, incoming).await.0
    }

    /// One request; the outcome and whether a `2xx` carried the written headers.
    async fn send_inner(&self, body: Encoded, incoming: &HeaderMap) -> (Outcome, bool) {
        let req = match self.build_request(body, incoming) {
            Ok(r) => r,
            Err(e) => {
                return (
                    Outcome::Unreachable(format!("building request: {e}")),
                    false,
                );
            }
        };
        let name = &self.settings.name;
        let wait = PERMIT_WAIT.min(self.settings.timeout);
        let Ok(Ok(_permit)) = tokio::time::timeout(wait, self.in_flight.acquire()).await else {
            crate::telemetry::backend_saturated(name);
            let outcome = Outcome::Rejected {
                status: self.saturated_status,
                retry_after: Some(HeaderValue::from_static("1")),
                reason: format!(
                    "promnorm has {} requests in flight to this backend (backends[].max_concurrent_requests); retry later",
                    self.max_concurrent
                ),
            };
            return (outcome, false);
        };
        let started = Instant::now();
        let result = tokio::time::timeout(self.settings.timeout, async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| connection_error(&e, &self.settings.url))?;
            let status = resp.status();
            let retry_after = resp.headers().get(RETRY_AFTER).cloned();
            let confirmed = WRITTEN_HEADERS
                .iter()
                .any(|h| resp.headers().contains_key(*h));
            // Only a refusal's reason is read; what follows is discarded unbuffered.
            let want = if status.is_success() { 0 } else { REASON_LIMIT };
            let body = read_prefix(resp.into_body(), want).await;
            Ok::<_, String>((status, retry_after, body, confirmed))
        })
        .await;
        let seconds = started.elapsed().as_secs_f64();
        let mut written_headers = false;
        let (code, outcome) = match result {
            Err(_) => ("timeout".to_string(), Outcome::Timeout),
            Ok(Err(e)) => ("error".to_string(), Outcome::Unreachable(e)),
            Ok(Ok((status, retry_after, body, confirmed))) => {
                written_headers = confirmed;
                let outcome = if status.is_success() {
                    Outcome::Delivered
                } else {
                    // A backend's text goes into logs and the sender's answer: one line,
                    // control characters escaped.
                    let text = String::from_utf8_lossy(&body[..body.len().min(REASON_LIMIT)])
                        .trim()
                        .replace(['\n', '\r'], " ");
                    let mut reason = super::route::printable(text.as_bytes());
                    if reason.is_empty() {
                        reason = status.canonical_reason().unwrap_or("").to_string();
                    }
                    Outcome::Rejected {
                        status,
                        retry_after,
                        reason,
                    }
                };
                (status.as_u16().to_string(), outcome)
            }
        };
        self.metrics.request(code, seconds);
        self.note_configuration_state(&outcome);
        (outcome, written_headers)
    }
}

impl HttpBackend {
    pub fn name(&self) -> &str {
        &self.settings.name
    }

    pub fn pass_headers(&self) -> &[HeaderName] {
        &self.settings.pass_headers
    }

    pub fn tenancy(&self) -> Option<&TenancyOptions> {
        self.tenancy.as_ref()
    }

    pub fn needs_v1(&self) -> bool {
        self.protocol != BackendProtocol::V2
    }

    pub fn native_histograms(&self) -> super::NativeHistogramsPolicy {
        self.native_histograms
    }

    /// The backend's metric handles.
    pub fn metrics(&self) -> &std::sync::Arc<crate::telemetry::BackendMetrics> {
        &self.metrics
    }
}

/// A backend's queue delivers through its client.
impl Transport for HttpBackend {
    fn name(&self) -> &str {
        HttpBackend::name(self)
    }

    fn send<'a>(&'a self, payload: Payload, incoming: &'a HeaderMap) -> SendFuture<'a> {
        Box::pin(self.send_payload(payload, incoming))
    }
}

/// The first `want` bytes of `body`; the rest is read and discarded up to
/// [`DRAIN_LIMIT`] bytes and [`DRAIN_TIME`] (the connection is then reused), or dropped
/// with the connection. Never holds more than `want` bytes.
async fn read_prefix<B>(mut body: B, want: usize) -> Vec<u8>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
{
    let mut prefix = Vec::new();
    let mut seen = 0usize;
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else { break };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let room = want.saturating_sub(prefix.len());
            prefix.extend_from_slice(&data[..data.len().min(room)]);
            seen = seen.saturating_add(data.len());
            if seen > want.saturating_add(DRAIN_LIMIT) {
                break;
            }
        }
    })
    .await;
    prefix
}

fn secret_header(v: &str) -> Result<HeaderValue, BackendError> {
    let mut h = HeaderValue::from_str(v).map_err(|_| BackendError::Credential)?;
    h.set_sensitive(true);
    Ok(h)
}

pub fn base64_encode(input: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        out.push(T[(n >> 18) as usize & 63] as char);
        out.push(T[(n >> 12) as usize & 63] as char);
        out.push(if chunk.len() > 1 {
            T[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        out.push(if chunk.len() > 2 {
            T[n as usize & 63] as char
        } else {
            '='
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_misconfigured_state_holds_across_deliveries_until_refusals_stop() {
        let s = ConfigState::default();
        let hold = Duration::from_secs(300);
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        assert_eq!(s.note(false, at(0), hold), (false, Change::None));
        assert_eq!(s.note(true, at(1), hold), (true, Change::Started));
        // Deliveries to other tenants in between: still misconfigured (no flapping).
        for k in 0..20 {
            assert_eq!(s.note(false, at(2 + 30 * k), hold), (true, Change::None));
            assert_eq!(s.note(true, at(3 + 30 * k), hold), (true, Change::None));
        }
        // Refusals stop: the state ends with the first delivery after the hold.
        let last = 3 + 30 * 19;
        assert_eq!(s.note(false, at(last + 299), hold), (true, Change::None));
        assert_eq!(s.note(false, at(last + 300), hold), (false, Change::Ended));
        assert_eq!(s.note(false, at(last + 301), hold), (false, Change::None));
        assert_eq!(s.note(true, at(last + 302), hold), (true, Change::Started));
    }

    #[test]
    fn base64() {
        assert_eq!(base64_encode(b"user:pass"), "dXNlcjpwYXNz");
        assert_eq!(base64_encode(b"a"), "YQ==");
        assert_eq!(base64_encode(b"ab"), "YWI=");
    }
}
