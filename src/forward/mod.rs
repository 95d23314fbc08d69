//! Forwarding: sends an encoded request to every backend concurrently and maps their
//! answers onto the one answer the sender gets (docs/wire.md).
//!
//! A [`Backend`] is one configured backend: its HTTP client and, when it has one, the
//! queue in front of it, as a field (vmagent's client holds its queue the same way). The
//! request path only sees "deliver this payload, tell me the outcome".

pub mod exposition;
pub mod http_backend;
pub mod queue;
pub mod route;
pub mod tls;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};

pub use http_backend::HttpBackend;
pub use route::{ClassicBody, Delivery, InputLabels, Mapped, RouteError, Routing, TenancyOptions};

/// What one backend said about one request.
#[derive(Debug, Clone)]
pub enum Outcome {
    Delivered,
    /// Stored in the backend's queue (`backends[].queue`), which delivers it later.
    Queued,
    /// The backend answered a non-2xx status.
    Rejected {
        status: StatusCode,
        retry_after: Option<http::HeaderValue>,
        reason: String,
    },
    /// No answer within the backend's timeout.
    Timeout,
    /// Could not connect or the connection broke.
    Unreachable(String),
}

/// The answer promnorm gives the sender.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub status: StatusCode,
    pub retry_after: Option<http::HeaderValue>,
    pub reason: String,
}

pub type SendFuture<'a> = Pin<Box<dyn Future<Output = Outcome> + Send + 'a>>;

/// The remote-write protocol version of an encoded body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// Remote-write 1.0: a snappy-compressed `prometheus.WriteRequest`.
    V1,
    /// Remote-write 2.0: a snappy-compressed `io.prometheus.write.v2.Request`.
    V2,
}

impl Protocol {
    /// `Content-Type` of a body in this protocol.
    pub fn content_type(self) -> &'static str {
        match self {
            Protocol::V1 => "application/x-protobuf",
            Protocol::V2 => "application/x-protobuf;proto=io.prometheus.write.v2.Request",
        }
    }

    /// `X-Prometheus-Remote-Write-Version` of a body in this protocol.
    pub fn version_header(self) -> &'static str {
        match self {
            Protocol::V1 => "0.1.0",
            Protocol::V2 => "2.0.0",
        }
    }
}

/// Which protocol a backend is sent (`backends[].protocol`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackendProtocol {
    /// Always 1.0.
    #[default]
    V1,
    /// Always 2.0.
    V2,
    /// 2.0 until the backend shows it only speaks 1.0 (a `415`, or a `2xx` without the
    /// written headers); then 1.0 for good, and the refused request is sent again as 1.0.
    Auto,
}

/// What a backend gets of native histograms with custom buckets (NHCB)
/// (`backends[].native_histograms`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NativeHistogramsPolicy {
    /// Unrolled into classic series in the 1.0 body, kept in the 2.0 body.
    #[default]
    Auto,
    /// Forwarded as they are.
    AsIs,
    /// Unrolled whichever protocol the backend takes.
    Classic,
}

/// A request body ready to send: the bytes and the protocol they are in.
#[derive(Clone, Debug)]
pub struct Encoded {
    pub body: Bytes,
    pub protocol: Protocol,
    /// The tenant header (tenant routing).
    pub tenant: Option<TenantHeader>,
}

impl Encoded {
    pub fn v1(body: Bytes) -> Encoded {
        Encoded {
            body,
            protocol: Protocol::V1,
            tenant: None,
        }
    }
}

/// One request in the protocols the backends need: the 1.0 body always (every backend
/// can fall back to it), the 2.0 body when some backend takes 2.0. The request path
/// hands these over; each backend picks its body.
#[derive(Clone, Debug)]
pub struct Payload {
    pub v1: Bytes,
    pub v2: Option<Bytes>,
    /// Series in the 2.0 body. A 2.0 body without series is not sent (its content,
    /// metadata only, reaches 2.0 backends attached to later series).
    pub v2_series: usize,
    /// Samples (float and histogram) in the request, for a queue's counts.
    pub samples: u64,
    /// The tenant these series belong to (tenant routing). `None`: the sender's own
    /// tenant header, if it sent one and the backend routes by tenant.
    pub tenant: Option<TenantHeader>,
}

/// The header that names a request's tenant, and its value. It travels with the request
/// (into a queue's record too), so a queued request reaches its tenant whatever the
/// backend's tenancy settings are when it is finally sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantHeader {
    pub name: http::HeaderName,
    pub value: http::HeaderValue,
}

impl Payload {
    /// A payload for 1.0 backends only.
    pub fn v1(body: Bytes) -> Payload {
        Payload {
            v1: body,
            v2: None,
            v2_series: 0,
            samples: 0,
            tenant: None,
        }
    }

    pub fn with_samples(mut self, samples: u64) -> Payload {
        self.samples = samples;
        self
    }
}

/// What a queue delivers through: a backend's HTTP client, or, for a queue a reload
/// retired, the new backend of its name. No default bodies: an implementation says
/// everything, so nothing is silently left at a default (a forgotten delegation once
/// turned tenancy off).
pub trait Transport: Send + Sync {
    fn name(&self) -> &str;
    /// `incoming` are the sender's headers, for configured pass-through.
    fn send<'a>(&'a self, payload: Payload, incoming: &'a HeaderMap) -> SendFuture<'a>;
}

/// One backend (`backends[]`): its HTTP client and its queue, when it has one. A queued
/// backend's `send` means "stored"; the queue's senders deliver through the client.
pub struct Backend {
    http: Arc<HttpBackend>,
    queue: Option<queue::Queue>,
}

impl Backend {
    /// The backend around `http`, with a queue when `queue` is set. Nothing is opened
    /// until [`Backend::start`].
    pub fn new(http: HttpBackend, queue: Option<queue::QueueOptions>) -> Backend {
        let http = Arc::new(http);
        let queue = queue.map(|opts| {
            queue::Queue::new(
                http.clone(),
                http.pass_headers().to_vec(),
                http.tenancy().map(|t| t.header.clone()),
                http.metrics().clone(),
                opts,
            )
        });
        Backend { http, queue }
    }

    pub fn name(&self) -> &str {
        self.http.name()
    }

    /// True when the next request should carry a 2.0 body for this backend (queued or
    /// not: a queued request carries the 2.0 body when the backend takes 2.0 when it is
    /// queued, and the 1.0 body always, for `auto`'s fallback).
    pub fn wants_v2(&self) -> bool {
        self.http.speaks_v2()
    }

    /// False when the backend never sends the 1.0 body (`protocol: v2`): a request whose
    /// backends all say so is not encoded as 1.0 at all.
    pub fn needs_v1(&self) -> bool {
        self.http.needs_v1()
    }

    /// The sender's headers this backend copies through (a queue stores them).
    pub fn pass_headers(&self) -> &[http::HeaderName] {
        self.http.pass_headers()
    }

    /// The backend's tenant routing, when it has one.
    pub fn tenancy(&self) -> Option<&TenancyOptions> {
        self.http.tenancy()
    }

    /// What the backend gets of NHCB histograms.
    pub fn native_histograms(&self) -> NativeHistogramsPolicy {
        self.http.native_histograms()
    }

    /// The backend's metric handles, made when it was built.
    pub fn metrics(&self) -> &crate::telemetry::BackendMetrics {
        self.http.metrics()
    }

    /// The backend's queue, when it has one.
    pub fn queue(&self) -> Option<&queue::Queue> {
        self.queue.as_ref()
    }

    /// The queue's state, for a queued backend (`None` also while it is not open).
    pub fn queue_state(&self) -> Option<queue::QueueState> {
        self.queue.as_ref()?.state()
    }

    /// Opens what the backend keeps across requests (a queue's files, its senders);
    /// called once on the runtime before the server accepts requests.
    pub fn start(&self) -> Result<(), queue::QueueError> {
        match &self.queue {
            Some(q) => q.start(),
            None => Ok(()),
        }
    }

    /// Delivers what is queued within `within`, then stops.
    pub async fn stop(&self, within: Duration) {
        if let Some(q) = &self.queue {
            q.stop(within).await;
        }
    }

    /// Sends `payload` (a queued backend stores it).
    pub fn send<'a>(&'a self, payload: Payload, incoming: &'a HeaderMap) -> SendFuture<'a> {
        match &self.queue {
            Some(q) => Box::pin(std::future::ready(q.send(payload, incoming))),
            None => Box::pin(self.http.send_payload(payload, incoming)),
        }
    }

    /// Takes room for `payload` before anything is sent (a queue's budget); the amount
    /// goes to [`Backend::send_reserved`] or back through [`Backend::unreserve`].
    pub fn reserve(&self, payload: &Payload, incoming: &HeaderMap) -> Result<u64, Outcome> {
        match &self.queue {
            Some(q) => q.reserve(payload, incoming),
            None => Ok(0),
        }
    }

    /// Gives back a reservation that will not be used.
    pub fn unreserve(&self, reserved: u64) {
        if let Some(q) = &self.queue {
            q.unreserve(reserved);
        }
    }

    /// [`Backend::send`] after a successful [`Backend::reserve`].
    pub fn send_reserved<'a>(
        &'a self,
        payload: Payload,
        incoming: &'a HeaderMap,
        reserved: u64,
    ) -> SendFuture<'a> {
        match &self.queue {
            Some(q) => Box::pin(std::future::ready(
                q.send_reserved(payload, incoming, reserved),
            )),
            None => Box::pin(self.http.send_payload(payload, incoming)),
        }
    }
}

/// A retired queue delivers through the new backend of its name, queue included.
impl Transport for Backend {
    fn name(&self) -> &str {
        Backend::name(self)
    }

    fn send<'a>(&'a self, payload: Payload, incoming: &'a HeaderMap) -> SendFuture<'a> {
        Backend::send(self, payload, incoming)
    }
}

/// How often and how patiently a failed delivery is retried.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    pub first_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            first_backoff: Duration::from_millis(250),
            max_backoff: Duration::from_secs(8),
        }
    }
}

/// Sends `body` to `backend` until it is delivered, refused for good (a data error), or
/// `policy.max_attempts` are spent; returns the last outcome. Retryable failures wait
/// with exponential backoff, or the backend's `Retry-After` when it says one (capped
/// at `max_backoff`).
pub async fn deliver_with_retries(
    backend: &Backend,
    body: &Payload,
    incoming: &HeaderMap,
    policy: RetryPolicy,
) -> Outcome {
    let mut backoff = Backoff::new(policy.first_backoff, policy.max_backoff);
    let mut attempt = 1;
    loop {
        let outcome = backend.send(body.clone(), incoming).await;
        if !outcome.is_retryable() || attempt >= policy.max_attempts {
            return outcome;
        }
        tokio::time::sleep(backoff.wait(&outcome)).await;
        attempt += 1;
    }
}

/// The one backoff policy of every retry (the derived writer's and the queues'): the
/// backend's `Retry-After` when it sent one, else an exponential backoff with jitter (a
/// uniform wait in [backoff/2, backoff]), capped at `max`.
pub struct Backoff {
    first: Duration,
    next: Duration,
    max: Duration,
    rng: u64,
}

impl Backoff {
    pub fn new(first: Duration, max: Duration) -> Backoff {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Backoff {
            first,
            next: first,
            max,
            rng: seed | 1,
        }
    }

    /// How long to wait after `outcome`; doubles the backoff for the next time.
    pub fn wait(&mut self, outcome: &Outcome) -> Duration {
        let jittered = {
            // xorshift64: jitter needs no cryptographic randomness.
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            let frac = (self.rng % 1000) as f64 / 1000.0;
            self.next.mul_f64(0.5 + frac / 2.0)
        };
        // A `Retry-After: 0` must not make a hot loop: at least the first backoff.
        let wait = retry_after(outcome)
            .unwrap_or(jittered)
            .max(self.first)
            .min(self.max);
        self.next = (self.next * 2).min(self.max);
        wait
    }

    /// After a success: the next failure waits `first` again.
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

pub(crate) fn retry_after(outcome: &Outcome) -> Option<Duration> {
    match outcome {
        Outcome::Rejected {
            retry_after: Some(v),
            ..
        } => parse_retry_after(v.to_str().ok()?, std::time::SystemTime::now()),
        _ => None,
    }
}

/// A `Retry-After` value (RFC 9110 §10.2.3): delay-seconds, or an HTTP-date (any of
/// the three formats a recipient must accept), as the wait from `now`; a date in the
/// past is no wait.
fn parse_retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Fans a body out to every backend and combines the outcomes.
pub struct Forwarder {
    /// Shared: a reload's new forwarder keeps the backends whose settings did not change.
    backends: Vec<Arc<Backend>>,
    routing: Routing,
    /// The exposition sink (`/federate`), when configured: it records every routed body.
    exposition: Option<Arc<exposition::ExpositionStore>>,
}

impl Forwarder {
    pub fn new(backends: Vec<Arc<Backend>>) -> Self {
        let routing = Routing::new(&backends);
        Forwarder {
            backends,
            routing,
            exposition: None,
        }
    }

    /// Also records what is routed into `store` (`exposition`, docs/federate.md).
    pub fn with_exposition(mut self, store: Option<Arc<exposition::ExpositionStore>>) -> Self {
        self.exposition = store;
        self
    }

    pub fn exposition(&self) -> Option<&Arc<exposition::ExpositionStore>> {
        self.exposition.as_ref()
    }

    pub fn backends(&self) -> impl Iterator<Item = &Arc<Backend>> {
        self.backends.iter()
    }

    /// The backend at `index` (a [`Delivery::backend`]).
    pub fn backend(&self, index: usize) -> &Backend {
        &self.backends[index]
    }

    pub fn is_empty(&self) -> bool {
        self.backends.is_empty()
    }

    /// True when the request path should compress the whole request as 1.0: some backend
    /// takes whole requests (no tenant routing) in 1.0.
    pub fn wants_whole_v1(&self) -> bool {
        self.routing.plain_needs_v1(&self.backends)
    }

    /// The bodies of one mapped request, one [`Delivery`] per backend and tenant.
    pub fn route(
        &self,
        mapped: &Mapped<'_>,
        split: &mut crate::wire::split::TenantSplit,
        bodies: &mut crate::wire::bodies::BodyEncoder,
        out: &mut Vec<Delivery>,
    ) -> Result<(), RouteError> {
        self.routing
            .route(&self.backends, mapped, split, bodies, out)?;
        if let Some(store) = &self.exposition {
            store.record(mapped.body, mapped.sender);
        }
        Ok(())
    }

    /// Delivers each of `deliveries` concurrently, each with its own retries
    /// ([`deliver_with_retries`]); returns each final outcome in order.
    pub async fn deliver_routed(
        &self,
        deliveries: &[Delivery],
        incoming: &HeaderMap,
        policy: RetryPolicy,
    ) -> Vec<Outcome> {
        let futs = deliveries.iter().map(|d| -> SendFuture<'_> {
            match &d.refused {
                Some(o) => Box::pin(std::future::ready(o.clone())),
                None => Box::pin(deliver_with_retries(
                    &self.backends[d.backend],
                    &d.payload,
                    incoming,
                    policy,
                )),
            }
        });
        join_all(futs).await
    }

    /// Sends every delivery at once; returns each outcome in order. Queued backends first
    /// reserve room for theirs, all of them or none: when one queue refuses, nothing is
    /// sent and every outcome is that refusal, so the sender's retry never duplicates
    /// data in the queues that had room.
    pub async fn send_routed(&self, deliveries: &[Delivery], incoming: &HeaderMap) -> Vec<Outcome> {
        let mut reserved = Vec::with_capacity(deliveries.len());
        for d in deliveries {
            if d.refused.is_some() {
                reserved.push(0);
                continue;
            }
            match self.backends[d.backend].reserve(&d.payload, incoming) {
                Ok(r) => reserved.push(r),
                Err(refusal) => {
                    for (d, r) in deliveries.iter().zip(reserved) {
                        self.backends[d.backend].unreserve(r);
                    }
                    return deliveries.iter().map(|_| refusal.clone()).collect();
                }
            }
        }
        let futs = deliveries
            .iter()
            .zip(reserved)
            .map(|(d, r)| -> SendFuture<'_> {
                match &d.refused {
                    Some(o) => Box::pin(std::future::ready(o.clone())),
                    None => self.backends[d.backend].send_reserved(d.payload.clone(), incoming, r),
                }
            });
        join_all(futs).await
    }
}

/// Minimal join_all without pulling in the futures crate.
async fn join_all<'a>(futs: impl Iterator<Item = SendFuture<'a>>) -> Vec<Outcome> {
    let mut handles: Vec<(SendFuture<'a>, Option<Outcome>)> = futs.map(|f| (f, None)).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, out) in handles.iter_mut() {
            if out.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(o) => *out = Some(o),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    handles.into_iter().filter_map(|(_, o)| o).collect()
}

/// What a backend's answer means for the data (docs/wire.md, "Backend answers").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeClass {
    Delivered,
    /// 5xx, 408, a timeout or a broken connection: try again later.
    Unavailable,
    /// 429: the backend asks us to slow down.
    Throttled,
    /// 401, 403, 404, 405, 407, and redirects (301, 302, 303, 307, 308: promnorm follows
    /// none, a remote-write body is not re-sent elsewhere): promnorm's own credentials or
    /// URL are wrong. Not the data's fault, so the data must be kept (retried) until the
    /// operator fixes it.
    Misconfigured,
    /// Any other 4xx (400, 409, 422, …): this data can never succeed.
    DataRejected,
}

impl Outcome {
    pub fn class(&self) -> OutcomeClass {
        match self {
            Outcome::Delivered | Outcome::Queued => OutcomeClass::Delivered,
            Outcome::Timeout | Outcome::Unreachable(_) => OutcomeClass::Unavailable,
            Outcome::Rejected { status, .. } => classify_status(*status),
        }
    }

    /// The outcome as a metric label: `delivered`, `queued`, `rejected` (a data error)
    /// or `failed` (retryable).
    pub fn label(&self) -> &'static str {
        match (self, self.class()) {
            (Outcome::Queued, _) => "queued",
            (_, OutcomeClass::Delivered) => "delivered",
            (_, OutcomeClass::DataRejected) => "rejected",
            _ => "failed",
        }
    }

    /// True when sending the same data again may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.class(),
            OutcomeClass::Unavailable | OutcomeClass::Throttled | OutcomeClass::Misconfigured
        )
    }
}

/// The class of a backend's HTTP status.
pub fn classify_status(status: StatusCode) -> OutcomeClass {
    match status.as_u16() {
        200..=299 => OutcomeClass::Delivered,
        429 => OutcomeClass::Throttled,
        401 | 403 | 404 | 405 | 407 => OutcomeClass::Misconfigured,
        // A redirect: the configured URL is not the receiver's (http:// to https://, a
        // moved path). Retrying the same URL can never succeed.
        301 | 302 | 303 | 307 | 308 => OutcomeClass::Misconfigured,
        408 => OutcomeClass::Unavailable,
        400..=499 => OutcomeClass::DataRejected,
        // 5xx, and 1xx and the other 3xx, which are no delivery either.
        _ => OutcomeClass::Unavailable,
    }
}

/// Combines per-backend outcomes (backend name, outcome): anything retryable wins (the
/// sender must retry so the failed backend gets the data), then 429, then a permanent
/// 4xx, else success.
pub fn verdict<'a>(outcomes: impl IntoIterator<Item = (&'a str, &'a Outcome)>) -> Verdict {
    let mut best: Option<(u8, Verdict)> = None;
    for (backend, o) in outcomes {
        let retry_after = match o {
            Outcome::Rejected { retry_after, .. } => retry_after.clone(),
            _ => None,
        };
        let (rank, status, reason) = match (o, o.class()) {
            (_, OutcomeClass::Delivered) => continue,
            (Outcome::Timeout, _) => (
                4,
                StatusCode::GATEWAY_TIMEOUT,
                format!("backend {backend} timed out"),
            ),
            (Outcome::Unreachable(e), _) => (
                4,
                StatusCode::BAD_GATEWAY,
                format!("backend {backend} unreachable: {e}"),
            ),
            (Outcome::Rejected { status, reason, .. }, OutcomeClass::Misconfigured) => (
                4,
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "backend {backend} refused promnorm ({}): {reason}; check its credentials and URL in promnorm's configuration",
                    status.as_u16()
                ),
            ),
            (Outcome::Rejected { status, reason, .. }, OutcomeClass::Unavailable) => (
                4,
                if status.is_server_error() {
                    StatusCode::SERVICE_UNAVAILABLE
                } else {
                    StatusCode::BAD_GATEWAY
                },
                format!("backend {backend} answered {}: {reason}", status.as_u16()),
            ),
            (Outcome::Rejected { reason, .. }, OutcomeClass::Throttled) => (
                3,
                StatusCode::TOO_MANY_REQUESTS,
                format!("backend {backend} throttled: {reason}"),
            ),
            (Outcome::Rejected { status, reason, .. }, _) => (
                2,
                StatusCode::BAD_REQUEST,
                format!(
                    "backend {backend} rejected the data ({}): {reason}",
                    status.as_u16()
                ),
            ),
            (Outcome::Delivered | Outcome::Queued, _) => continue,
        };
        if best.as_ref().is_none_or(|(r, _)| rank > *r) {
            best = Some((
                rank,
                Verdict {
                    status,
                    retry_after,
                    reason,
                },
            ));
        }
    }
    best.map(|(_, v)| v).unwrap_or(Verdict {
        status: StatusCode::NO_CONTENT,
        retry_after: None,
        reason: String::new(),
    })
}

/// Everything a backend needs, resolved by the caller (secrets already read): forward
/// knows nothing of the configuration file.
/// (No `Debug`: it holds secrets.) `PartialEq`: a reload keeps a backend whose options
/// did not change.
#[derive(Clone, PartialEq)]
pub struct BackendOptions {
    pub name: String,
    pub url: http::Uri,
    pub timeout: Duration,
    pub headers: Vec<(String, String)>,
    pub pass_headers: Vec<String>,
    pub basic: Option<BasicCredentials>,
    pub bearer_token: Option<String>,
    pub tls: TlsOptions,
    pub protocol: BackendProtocol,
    pub tenancy: Option<TenancyOptions>,
    /// Requests in flight at once (`backends[].max_concurrent_requests`); beyond them a
    /// request waits briefly, then is answered `saturated_status` unsent.
    pub max_concurrent_requests: usize,
    /// The answer for a request not sent because the backend is saturated: the
    /// server's `throttle_status` (429, or 503 for senders that drop a 429).
    pub saturated_status: http::StatusCode,
    pub native_histograms: NativeHistogramsPolicy,
}

#[derive(Clone, PartialEq)]
pub struct BasicCredentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for BasicCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BasicCredentials")
            .field("username", &self.username)
            .field("password", &"<secret>")
            .finish()
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct TlsOptions {
    pub ca_file: Option<std::path::PathBuf>,
    pub insecure_skip_verify: bool,
}

/// Why a backend could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("backend {backend}: {what}")]
    Header { backend: String, what: String },
    #[error("a credential is not a valid header value")]
    Credential,
    #[error("tls: {0}")]
    Tls(rustls::Error),
    #[error("ca_file {file}: {reason}")]
    CaFile { file: String, reason: String },
}

/// Per-backend settings resolved from configuration.
#[derive(Clone, Debug)]
pub struct BackendSettings {
    pub name: String,
    pub url: http::Uri,
    pub timeout: Duration,
    pub headers: HeaderMap,
    pub pass_headers: Vec<http::HeaderName>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejected(code: u16) -> Outcome {
        Outcome::Rejected {
            status: StatusCode::from_u16(code).unwrap(),
            retry_after: Some(http::HeaderValue::from_static("7")),
            reason: "x".into(),
        }
    }

    fn v(outcomes: &[Outcome]) -> Verdict {
        verdict(outcomes.iter().map(|o| ("b", o)))
    }

    #[test]
    fn status_mapping() {
        assert_eq!(v(&[Outcome::Delivered]).status, StatusCode::NO_CONTENT);
        assert_eq!(v(&[]).status, StatusCode::NO_CONTENT);
        assert_eq!(v(&[rejected(500)]).status, StatusCode::SERVICE_UNAVAILABLE);
        for data_error in [400, 409, 413, 422] {
            assert_eq!(v(&[rejected(data_error)]).status, StatusCode::BAD_REQUEST);
        }
        let r = v(&[rejected(429)]);
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.retry_after.unwrap(), "7");
        assert_eq!(v(&[Outcome::Timeout]).status, StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(
            v(&[Outcome::Unreachable("x".into())]).status,
            StatusCode::BAD_GATEWAY
        );
        // One backend fine, one down: the sender must retry.
        assert!(
            v(&[Outcome::Delivered, rejected(503)])
                .status
                .is_server_error()
        );
        // Retryable beats permanent.
        assert!(v(&[rejected(400), rejected(502)]).status.is_server_error());
        assert_eq!(
            v(&[rejected(400), rejected(429)]).status,
            StatusCode::TOO_MANY_REQUESTS
        );
    }

    #[test]
    fn promnorms_own_misconfiguration_is_retryable_and_names_the_backend() {
        for code in [401, 403, 404, 405, 407] {
            let o = rejected(code);
            assert!(o.is_retryable(), "{code}");
            let r = verdict([("mimir", &o)]);
            assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{code}");
            assert!(r.reason.contains("backend mimir"), "{}", r.reason);
        }
        assert!(!rejected(400).is_retryable());
        assert!(rejected(408).is_retryable());
    }

    #[test]
    fn a_redirect_is_a_misconfigured_url() {
        for code in [301, 302, 303, 307, 308] {
            let o = rejected(code);
            assert_eq!(o.class(), OutcomeClass::Misconfigured, "{code}");
            assert!(o.is_retryable(), "{code}");
            assert_eq!(v(&[o]).status, StatusCode::SERVICE_UNAVAILABLE, "{code}");
        }
        assert_eq!(rejected(304).class(), OutcomeClass::Unavailable);
        assert!(Outcome::Timeout.is_retryable());
    }

    #[test]
    fn retry_after_takes_seconds_and_http_dates() {
        use std::time::{Duration, UNIX_EPOCH};
        // Sun, 06 Nov 1994 08:49:37 GMT, RFC 9110's example.
        let now = UNIX_EPOCH + Duration::from_secs(784_111_777 - 120);
        for (value, want) in [
            ("7", Some(Duration::from_secs(7))),
            (" 30 ", Some(Duration::from_secs(30))),
            (
                "Sun, 06 Nov 1994 08:49:37 GMT",
                Some(Duration::from_secs(120)),
            ),
            (
                "Sunday, 06-Nov-94 08:49:37 GMT",
                Some(Duration::from_secs(120)),
            ),
            ("Sun Nov  6 08:49:37 1994", Some(Duration::from_secs(120))),
            ("Sat, 05 Nov 1994 08:49:37 GMT", Some(Duration::ZERO)),
            ("soon", None),
            ("-1", None),
        ] {
            assert_eq!(parse_retry_after(value, now), want, "{value:?}");
        }
    }
}
