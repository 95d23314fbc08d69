//! The HTTP server: remote-write ingest, own telemetry, health and readiness.

pub mod budget;
mod cardinality;
pub mod listener;
pub mod live;
mod negotiate;
pub mod tap;
pub mod tls;

pub use live::{Live, ReloadHook};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::Notify;

use crate::derive::writer::Writer;
use crate::forward::{
    ClassicBody, Delivery, Forwarder, InputLabels, Mapped, Outcome, RouteError, verdict,
};
use crate::pipeline::{InputProtocol, Pipeline, Processed};
use crate::telemetry;

pub struct AppState {
    pub pipeline: Pipeline,
    /// The mapping stage's counters for the pipeline's rules.
    pub map_metrics: telemetry::MapMetrics,
    pub forwarder: Arc<Forwarder>,
    /// Flush interval of the derived-series writer.
    pub derived_flush: Duration,
    /// Tells the derived-series writer to flush a last time and stop.
    pub derived_stop: Arc<Notify>,
    pub max_body_bytes: usize,
    pub ingest_token: Option<String>,
    pub metrics: PrometheusHandle,
    /// Shared by the states a reload swaps in: shutdown turns it off for all of them.
    pub ready: Arc<AtomicBool>,
    pub connection_limits: listener::ConnectionLimits,
    /// A request's body must arrive within this once its headers are in.
    pub body_read_timeout: Duration,
    /// Requests in progress and the bytes they hold (`429` beyond it).
    pub budget: budget::Budget,
    /// Declared decoded sizes above this are refused (`413`) without a reservation.
    pub max_decoded_bytes: usize,
    /// TLS on the listener, when configured.
    pub tls: Option<Arc<tls::TlsSource>>,
    /// The answer when promnorm is full and the sender should retry (429 or 503).
    pub throttle_status: StatusCode,
    /// The effective configuration as `check-config --print` writes it, secrets
    /// redacted (the web UI's status page).
    pub config_text: String,
    /// The query API (`query.upstream`), when configured (docs/query.md).
    pub query: Option<Arc<crate::query::QueryApi>>,
    /// `scrape:` (docs/scrape.md), read by the scraper at every tick.
    pub scrape: Option<Arc<crate::scrape::ScrapeOptions>>,
}

/// The server's own settings (the rest of the state is built parts).
pub struct ServerOptions {
    pub derived_flush: Duration,
    pub max_body_bytes: usize,
    pub ingest_token: Option<String>,
    pub connection_limits: listener::ConnectionLimits,
    pub body_read_timeout: Duration,
    pub budget: budget::Budget,
    pub max_decoded_bytes: usize,
    pub tls: Option<Arc<tls::TlsSource>>,
    pub throttle_status: StatusCode,
    pub config_text: String,
}

impl AppState {
    /// The state around a built pipeline and forwarder (see `app::build`).
    pub fn new(pipeline: Pipeline, forwarder: Forwarder, opts: ServerOptions) -> AppState {
        telemetry::metrics_handle();
        let map_metrics = telemetry::register_pipeline(
            pipeline.rules(),
            pipeline
                .deriver()
                .into_iter()
                .flat_map(|d| d.definitions().iter().map(|def| def.name)),
        );
        AppState {
            pipeline,
            map_metrics,
            forwarder: Arc::new(forwarder),
            derived_flush: opts.derived_flush,
            derived_stop: Arc::new(Notify::new()),
            max_body_bytes: opts.max_body_bytes,
            ingest_token: opts.ingest_token,
            metrics: telemetry::metrics_handle(),
            ready: Arc::new(AtomicBool::new(true)),
            connection_limits: opts.connection_limits,
            body_read_timeout: opts.body_read_timeout,
            budget: opts.budget,
            max_decoded_bytes: opts.max_decoded_bytes,
            tls: opts.tls,
            throttle_status: opts.throttle_status,
            config_text: opts.config_text,
            query: None,
            scrape: None,
        }
    }
}

impl AppState {
    /// Opens the backends' queues (replaying disk queues) on the current runtime; a
    /// queue already open (a backend kept across a reload) stays as it is.
    pub fn start_queues(&self) -> Result<(), crate::forward::queue::QueueError> {
        for backend in self.forwarder.backends() {
            backend.start()?;
        }
        Ok(())
    }

    /// Lets every queue deliver what it holds within `within` (all of them together),
    /// then stops it.
    pub async fn stop_queues(&self, within: Duration) {
        let mut stops: Vec<_> = self
            .forwarder
            .backends()
            .map(|b| Some(Box::pin(b.stop(within))))
            .collect();
        // Concurrently: a dead backend's queue does not eat another's time to drain.
        std::future::poll_fn(|cx| {
            let mut pending = false;
            for slot in stops.iter_mut() {
                if let Some(f) = slot {
                    if f.as_mut().poll(cx).is_ready() {
                        *slot = None;
                    } else {
                        pending = true;
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
    }

    /// Starts the derived-series writer (when derived series are on) on the current
    /// runtime. Stop it with [`AppState::stop_background`].
    pub fn spawn_background(&self) -> Option<tokio::task::JoinHandle<()>> {
        let deriver = self.pipeline.deriver()?.clone();
        let writer =
            Writer::new(deriver, self.forwarder.clone()).with_guard(self.pipeline.guard().cloned());
        Some(tokio::spawn(
            writer.run(self.derived_flush, self.derived_stop.clone()),
        ))
    }

    /// Flushes derived samples a last time and waits (bounded) for the writer to end.
    pub async fn stop_background(
        &self,
        handle: Option<tokio::task::JoinHandle<()>>,
        within: Duration,
    ) {
        if let Some(h) = handle {
            self.derived_stop.notify_one();
            if tokio::time::timeout(within, h).await.is_err() {
                tracing::warn!("derived-series writer did not finish its last flush in time");
            }
        }
    }

    /// Sets the gauges read at scrape time.
    fn update_gauges(&self) {
        if let Some(g) = self.pipeline.guard() {
            let (series, bytes) = g.tracked();
            telemetry::cardinality_state(series, bytes);
        }
        if let Some(x) = self.forwarder.exposition() {
            let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
            telemetry::exposition_state(
                x.len(),
                load(&x.counts.evicted),
                load(&x.counts.expired),
                load(&x.counts.native_left_out),
            );
        }
        for backend in self.forwarder.backends() {
            if let Some(q) = backend.queue_state() {
                telemetry::queue_state(backend.name(), q.bytes, q.requests, q.oldest_age);
            }
        }
        if let Some(d) = self.pipeline.deriver() {
            let c = &d.counters;
            let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
            telemetry::derived_state(&telemetry::DerivedState {
                series: d.series_count(),
                evicted_stale: load(&c.evicted_stale),
                evicted_limit: load(&c.evicted_limit),
                label_bytes: load(&c.label_bytes),
                incomplete: load(&c.incomplete),
                no_peak: load(&c.no_peak),
                ranks_gone: load(&c.ranks_gone),
                backlog_dropped: load(&c.backlog_dropped),
            });
        }
    }
}

/// The routes around one fixed state (no reload).
pub fn router(state: Arc<AppState>, write_paths: &[String]) -> Router {
    router_live(Arc::new(Live::new(state)), write_paths)
}

/// The routes around a state a reload may swap (`/-/reload` included).
pub fn router_live(live: Arc<Live>, write_paths: &[String]) -> Router {
    let mut r = Router::new()
        .route("/metrics", get(metrics))
        .route("/api/v1/renames", get(renames))
        .route("/api/v1/cardinality", get(cardinality::cardinality))
        .route("/api/v1/targets", get(targets))
        .route("/-/healthy", get(|| async { "promnorm is healthy.\n" }))
        .route("/-/ready", get(ready))
        .route("/-/reload", post(live::reload).put(live::reload));
    for p in write_paths {
        r = r.route(p, post(write));
    }
    r.with_state(live)
}

/// The scrape targets and their last scrapes, as Prometheus' `/api/v1/targets`
/// answers (docs/scrape.md); `?state=active|dropped|any`.
async fn targets(State(live): State<Arc<Live>>, uri: axum::http::Uri) -> impl IntoResponse {
    use crate::scrape::Host as _;
    let state = uri.query().and_then(|q| {
        q.split('&')
            .find_map(|kv| kv.strip_prefix("state="))
            .map(str::to_string)
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        crate::scrape::status::api_document(&live.targets().snapshot(), state.as_deref()),
    )
}

async fn metrics(State(live): State<Arc<Live>>) -> impl IntoResponse {
    let st = live.current();
    st.update_gauges();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        st.metrics.render()
            + &telemetry::process_metrics_text()
            + &telemetry::rename_metrics_text(st.pipeline.rules()),
    )
}

/// The cut-over tracking as JSON (docs/migrations.md): every old name a rule renames,
/// with its samples and when it last arrived (`null`: not since start).
async fn renames(State(live): State<Arc<Live>>) -> impl IntoResponse {
    let st = live.current();
    let rules = st.pipeline.rules();
    let data: Vec<serde_json::Value> = rules
        .renames()
        .snapshot()
        .into_iter()
        .map(|r| {
            let queried = st.query.as_ref().and_then(|q| q.usage().of(&r.from));
            let pack = rules
                .packs()
                .get(r.pack as usize)
                .map(|p| p.name.clone())
                .unwrap_or_else(|| "other".into());
            serde_json::json!({
                "pack": pack,
                "from": r.from,
                "to": r.to,
                "rule": r.rule,
                "samples": r.samples,
                "last_seen": r.last_seen,
                "queries": queried.map_or(0, |q| q.0),
                "last_queried": queried.map(|q| q.1),
            })
        })
        .collect();
    (
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::json!({"status": "success", "data": data}).to_string(),
    )
}

async fn ready(State(live): State<Arc<Live>>) -> Response {
    let st = live.current();
    if !st.ready.load(Ordering::Relaxed) || st.forwarder.is_empty() {
        return (StatusCode::SERVICE_UNAVAILABLE, "promnorm is not ready.\n").into_response();
    }
    // Every backend queued and every queue refusing for room: a balancer should send
    // elsewhere until one drains.
    let mut queues = st.forwarder.backends().map(|b| b.queue_state());
    if queues.all(|q| q.is_some_and(|q| q.refusing)) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "promnorm is not ready: every backend queue is full.\n",
        )
            .into_response();
    }
    (StatusCode::OK, "promnorm is ready.\n").into_response()
}

fn answer(status: StatusCode, reason: &str, retry_after: Option<HeaderValue>) -> Response {
    telemetry::request_answered(status.as_u16());
    let mut resp = if reason.is_empty() {
        status.into_response()
    } else {
        let line = format!("{}\n", reason.replace('\n', " "));
        (
            status,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            line,
        )
            .into_response()
    };
    if let Some(v) = retry_after {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    resp
}

/// Why an ingest request was answered without forwarding its data: each variant is one
/// status code of docs/wire.md, its text the answer's body.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("missing bearer token")]
    MissingToken,
    #[error("invalid bearer token")]
    InvalidToken,
    /// Not snappy, or a `Content-Type` that is not remote-write (415).
    #[error("{0}")]
    UnsupportedMedia(String),
    /// A `Content-Length` over `max_body_bytes` (413).
    #[error("body of {len} bytes is over the limit of {limit}")]
    DeclaredTooLarge { len: usize, limit: usize },
    /// More bytes than `max_body_bytes` arrived (413).
    #[error("body is over the limit of {limit} bytes")]
    TooLarge { limit: usize },
    #[error("request body not received within {0:?} (server.body_read_timeout)")]
    BodyTimeout(Duration),
    #[error("reading body: {0}")]
    BodyRead(String),
    /// Beyond the overload budget: the throttle status, with `Retry-After`.
    #[error(
        "promnorm is over its {} budget (limits.{}); retry later",
        budget_name(*.why),
        budget_key(*.why)
    )]
    Throttled {
        why: budget::Throttle,
        status: StatusCode,
    },
    /// The body does not decode (400), or decodes beyond the limits (413).
    #[error("invalid remote-write request: {0}")]
    Invalid(#[source] crate::wire::DecodeError),
    /// Tenant routing refused the request (400), or a body could not be encoded (500).
    #[error("{0}")]
    Route(#[source] RouteError),
}

fn budget_name(why: budget::Throttle) -> &'static str {
    match why {
        budget::Throttle::Concurrency => "concurrent-request",
        budget::Throttle::Bytes => "in-flight bytes",
    }
}

fn budget_key(why: budget::Throttle) -> &'static str {
    match why {
        budget::Throttle::Concurrency => "max_concurrent_requests",
        budget::Throttle::Bytes => "max_inflight_bytes",
    }
}

impl IntoResponse for IngestError {
    fn into_response(self) -> Response {
        let (status, retry_after) = match &self {
            IngestError::MissingToken => (StatusCode::UNAUTHORIZED, None),
            IngestError::InvalidToken => (StatusCode::FORBIDDEN, None),
            IngestError::UnsupportedMedia(_) => (StatusCode::UNSUPPORTED_MEDIA_TYPE, None),
            IngestError::DeclaredTooLarge { .. } | IngestError::TooLarge { .. } => {
                (StatusCode::PAYLOAD_TOO_LARGE, None)
            }
            IngestError::BodyTimeout(_) => (StatusCode::REQUEST_TIMEOUT, None),
            IngestError::BodyRead(_) => (StatusCode::BAD_REQUEST, None),
            IngestError::Throttled { why, status } => {
                telemetry::request_throttled(why.reason());
                (
                    *status,
                    Some(HeaderValue::from_static(budget::RETRY_AFTER_SECONDS)),
                )
            }
            IngestError::Invalid(e) if e.is_too_large() => (StatusCode::PAYLOAD_TOO_LARGE, None),
            IngestError::Invalid(_) => (StatusCode::BAD_REQUEST, None),
            IngestError::Route(RouteError::TooManyTenants { .. }) => {
                (StatusCode::BAD_REQUEST, None)
            }
            IngestError::Route(RouteError::Encode(_)) => (StatusCode::INTERNAL_SERVER_ERROR, None),
        };
        answer(status, &self.to_string(), retry_after)
    }
}

/// Checks the remote-write headers and negotiates the version by `Content-Type`
/// (docs/wire.md).
fn check_headers(headers: &HeaderMap) -> Result<InputProtocol, IngestError> {
    let enc = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok());
    match enc {
        Some(e) if e.trim().eq_ignore_ascii_case("snappy") => {}
        Some(e) => {
            return Err(IngestError::UnsupportedMedia(format!(
                "unsupported Content-Encoding {e:?}: remote-write needs snappy"
            )));
        }
        None => {
            return Err(IngestError::UnsupportedMedia(
                "missing Content-Encoding: remote-write needs snappy".into(),
            ));
        }
    }
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    crate::server::negotiate::content_type(ct).map_err(IngestError::UnsupportedMedia)
}

fn check_auth(st: &AppState, headers: &HeaderMap) -> Result<(), IngestError> {
    let Some(token) = &st.ingest_token else {
        return Ok(());
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match given.and_then(bearer_credentials) {
        None => Err(IngestError::MissingToken),
        Some(g) if constant_time_eq(g.as_bytes(), token.as_bytes()) => Ok(()),
        Some(_) => Err(IngestError::InvalidToken),
    }
}

/// The credentials of an `Authorization: Bearer …` header; the scheme name is
/// case-insensitive (RFC 7235 §2.1).
fn bearer_credentials(value: &str) -> Option<&str> {
    let (scheme, rest) = value.trim_start().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `POST` of a remote-write request: admit → process → forward.
async fn write(State(live): State<Arc<Live>>, headers: HeaderMap, body: Body) -> Response {
    // One state for the whole request: a reload meanwhile does not change its rules.
    let st = live.current();
    match ingest(&live, &st, &headers, body).await {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    }
}

async fn ingest(
    live: &Live,
    st: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, IngestError> {
    let (protocol, mut admitted) = admit(st, headers, body).await?;
    let (processed, deliveries) = process(st, headers, protocol, &mut admitted)?;
    // A valid request, offered to the live tap (one atomic load when none is open).
    tap::offer(live, &admitted.body, protocol, st.max_decoded_bytes);
    // Only the reservation is held while the backends answer.
    let Admitted { body, ticket, .. } = admitted;
    drop(body);
    let resp = forward(st, headers, protocol, &processed, &deliveries).await;
    drop(ticket);
    Ok(resp)
}

/// A body promnorm produced itself (a scrape, docs/scrape.md): taken as a pushed 1.0
/// request is, inside the same overload budget and through the same pipeline, without
/// the checks that belong to a sender (auth, headers).
pub async fn ingest_internal(live: &Live, raw: &[u8]) -> crate::scrape::Delivered {
    use crate::scrape::Delivered;
    let st = live.current();
    let retry_or_reject = |status: StatusCode, why: String| {
        if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
            Delivered::Retry(why)
        } else {
            Delivered::Rejected(why)
        }
    };
    let mut ticket = match st.budget.admit() {
        Ok(t) => t,
        Err(why) => return Delivered::Retry(format!("over the {} budget", budget_name(why))),
    };
    // The batch was encoded in process: it is decoded as it is, never compressed just
    // to be decompressed again (the tap alone, when open, gets a compressed copy).
    if let Err(why) = ticket.reserve(2 * raw.len()) {
        return Delivered::Retry(format!("over the {} budget", budget_name(why)));
    }
    let mut admitted = Admitted {
        body: bytes::Bytes::copy_from_slice(raw),
        ticket,
        decoded_reserved: raw.len(),
        uncompressed: true,
    };
    let headers = HeaderMap::new();
    let (processed, deliveries) = match process(&st, &headers, InputProtocol::V1, &mut admitted) {
        Ok(x) => x,
        Err(e) => {
            let status = e.into_response().status();
            return retry_or_reject(status, format!("answered {status}"));
        }
    };
    if tap::is_open(live) {
        if let Ok(compressed) = snap::raw::Encoder::new().compress_vec(raw) {
            tap::offer(live, &compressed, InputProtocol::V1, st.max_decoded_bytes);
        }
    }
    let Admitted { body, ticket, .. } = admitted;
    drop(body);
    let resp = forward(&st, &headers, InputProtocol::V1, &processed, &deliveries).await;
    drop(ticket);
    let status = resp.status();
    if status.is_success() {
        Delivered::Ok
    } else {
        retry_or_reject(status, format!("the backends' verdict was {status}"))
    }
}

/// A request inside the overload budget: its body, and what it reserved.
struct Admitted {
    body: bytes::Bytes,
    ticket: budget::Ticket,
    /// The decoded size the body declares, reserved for the request's lifetime.
    decoded_reserved: usize,
    /// `body` is an uncompressed `WriteRequest` encoded in process (a scrape's batch).
    uncompressed: bool,
}

/// Checks auth and headers, reads the body within the budget and reserves its declared
/// decoded size.
async fn admit(
    st: &AppState,
    headers: &HeaderMap,
    mut body: Body,
) -> Result<(InputProtocol, Admitted), IngestError> {
    // Refused before the body is read: the body is still read and discarded in the
    // background (bounded), so the sender sees the answer rather than a reset stream.
    let discard = |body: Body| budget::discard_rest(body, st.max_body_bytes, st.body_read_timeout);
    let throttled = |why| IngestError::Throttled {
        why,
        status: st.throttle_status,
    };
    let protocol = match check_auth(st, headers).and_then(|()| check_headers(headers)) {
        Ok(p) => p,
        Err(e) => {
            discard(body);
            return Err(e);
        }
    };
    let content_length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if let Some(len) = content_length
        && len > st.max_body_bytes
    {
        return Err(IngestError::DeclaredTooLarge {
            len,
            limit: st.max_body_bytes,
        });
    }
    // The overload budget: a slot, then the body's bytes as they arrive. A declared
    // length that cannot fit now is answered at once; one that fits reserves nothing
    // until its bytes come (an announcement alone must not hold the budget).
    let mut ticket = match st.budget.admit() {
        Ok(t) => t,
        Err(why) => {
            discard(body);
            return Err(throttled(why));
        }
    };
    if let Some(len) = content_length
        && !st.budget.would_fit(len)
    {
        drop(ticket);
        discard(body);
        return Err(throttled(budget::Throttle::Bytes));
    }
    let collected = tokio::time::timeout(
        st.body_read_timeout,
        budget::read_body(&mut body, &mut ticket, content_length, st.max_body_bytes),
    )
    .await;
    let Ok(collected) = collected else {
        return Err(IngestError::BodyTimeout(st.body_read_timeout));
    };
    let bytes = match collected {
        Ok(b) => b,
        Err(budget::BodyError::Throttled(why)) => {
            drop(ticket);
            discard(body);
            return Err(throttled(why));
        }
        Err(budget::BodyError::TooLarge { limit }) => {
            return Err(IngestError::TooLarge { limit });
        }
        Err(budget::BodyError::Read(e)) => return Err(IngestError::BodyRead(e)),
    };
    // The decoded size the body declares is held for the request's lifetime too. A
    // declaration over the limit, or more than the body can produce, is refused by the
    // decoder (413, 400) before it allocates: such a body reserves nothing more.
    let mut decoded_reserved = 0;
    if let Ok(declared) = snap::raw::decompress_len(&bytes)
        && declared <= st.max_decoded_bytes
        && declared
            <= bytes
                .len()
                .saturating_mul(crate::wire::snappy::MAX_EXPANSION)
    {
        ticket.reserve(declared).map_err(throttled)?;
        decoded_reserved = declared;
    }
    Ok((
        protocol,
        Admitted {
            body: bytes,
            ticket,
            decoded_reserved,
            uncompressed: false,
        },
    ))
}

/// Decodes, maps and routes the request on a pooled workspace (returned to the pool
/// on every exit): its counts and one delivery per backend and tenant.
fn process(
    st: &AppState,
    headers: &HeaderMap,
    protocol: InputProtocol,
    admitted: &mut Admitted,
) -> Result<(Processed, Vec<Delivery>), IngestError> {
    // CPU work on pooled buffers; nothing borrowed from the workspace crosses an await.
    let mut ws = st.pipeline.workspace();
    ws.skip_v1_body = !st.forwarder.wants_whole_v1();
    if let Some(g) = st.pipeline.guard() {
        ws.set_sender_tenant(g.sender_tenant(headers));
    }
    // Decoding resolves 2.0's label references to spans only; what the output will
    // hold with them spelled out is reserved before it is built (a small 2.0 request
    // can refer to one large symbol many times). Over `max_decoded_bytes` it is a 413.
    let expanded = if admitted.uncompressed {
        st.pipeline
            .decode_uncompressed_as(&mut ws, &admitted.body, protocol)
    } else {
        st.pipeline.decode_as(&mut ws, &admitted.body, protocol)
    }
    .map_err(IngestError::Invalid)?;
    admitted
        .ticket
        .reserve(expanded.saturating_sub(admitted.decoded_reserved))
        .map_err(|why| IngestError::Throttled {
            why,
            status: st.throttle_status,
        })?;
    let processed = st
        .pipeline
        .map_decoded(&mut ws)
        .map_err(IngestError::Invalid)?;
    let stats = st.pipeline.stats(&ws);
    telemetry::record_map_stats(st.pipeline.rules(), &st.map_metrics, stats);
    let forwarded = stats.samples_out + stats.histograms_out;
    let metadata_in_body = stats.metadata_out > 0;
    let mut deliveries = Vec::new();
    if !processed.empty {
        let input = ws.route_input();
        let mapped = Mapped {
            body: input.mapped,
            has_start_timestamps: input.has_start_timestamps,
            v1: input.v1,
            samples: forwarded,
            memory: Some(st.pipeline.metadata_memory()),
            metadata_in_body,
            limit_tenants: true,
            sender: Some(headers),
            classic: input.classic.map(|(body, u)| ClassicBody {
                body,
                histograms: u.histograms,
                samples: u.samples,
            }),
            input: Some(InputLabels {
                decoded: input.decoded.0,
                buf: input.decoded.1,
                edited: st.pipeline.rules().edited_labels(),
            }),
        };
        st.forwarder
            .route(&mapped, input.split, input.bodies, &mut deliveries)
            .map_err(|e| {
                if let RouteError::TooManyTenants { .. } = e {
                    telemetry::samples_dropped("too_many_tenants", forwarded);
                }
                IngestError::Route(e)
            })?;
    }
    Ok((processed, deliveries))
}

/// Sends the deliveries and answers the sender with their verdict.
async fn forward(
    st: &AppState,
    headers: &HeaderMap,
    protocol: InputProtocol,
    processed: &Processed,
    deliveries: &[Delivery],
) -> Response {
    telemetry::samples_received((processed.samples_in + processed.histograms_in) as u64);
    if processed.empty || deliveries.is_empty() {
        return negotiate::written(
            answer(StatusCode::NO_CONTENT, "", None),
            protocol,
            processed,
        );
    }
    let outcomes = st.forwarder.send_routed(deliveries, headers).await;
    // Backends' names borrowed: only a tenant's delivery builds one.
    let mut names: Vec<std::borrow::Cow<'_, str>> = Vec::with_capacity(deliveries.len());
    for (d, o) in deliveries.iter().zip(&outcomes) {
        let backend = st.forwarder.backend(d.backend);
        if matches!(o, Outcome::Delivered) {
            backend.metrics().samples_forwarded(d.payload.samples);
        }
        match &d.tenant {
            Some(t) => {
                backend
                    .metrics()
                    .tenant_samples(t, o.label(), d.payload.samples);
                names.push(format!("{} (tenant {t})", backend.name()).into());
            }
            None => names.push(backend.name().into()),
        }
    }
    let v = verdict(names.iter().map(|n| n.as_ref()).zip(&outcomes));
    if !v.status.is_success() {
        tracing::warn!(status = v.status.as_u16(), reason = %v.reason, "forwarding failed");
    }
    negotiate::written(
        answer(v.status, &v.reason, v.retry_after),
        protocol,
        processed,
    )
}

/// Runs the server on `listener` until `shutdown` resolves, then drains in-flight
/// requests for at most `drain_timeout`. `/-/ready` turns false as soon as shutdown
/// begins, so a load balancer stops sending while requests drain.
pub async fn run(
    listener: TcpListener,
    state: Arc<AppState>,
    app: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    drain_timeout: Duration,
) -> std::io::Result<()> {
    let limits = state.connection_limits.clone();
    let tls = state.tls.clone();
    let shutdown = async move {
        shutdown.await;
        state.ready.store(false, Ordering::Relaxed);
    };
    listener::serve_connections(listener, app, limits, tls, shutdown, drain_timeout).await
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutdown signal received; draining");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 24: each early answer keeps the status and text the handler gave inline.
    #[test]
    fn ingest_errors_answer_with_their_status_and_reason() {
        let cases = [
            (IngestError::MissingToken, 401, "missing bearer token"),
            (IngestError::InvalidToken, 403, "invalid bearer token"),
            (
                IngestError::DeclaredTooLarge { len: 10, limit: 5 },
                413,
                "body of 10 bytes is over the limit of 5",
            ),
            (
                IngestError::BodyTimeout(Duration::from_secs(3)),
                408,
                "request body not received within 3s (server.body_read_timeout)",
            ),
            (
                IngestError::Throttled {
                    why: budget::Throttle::Bytes,
                    status: StatusCode::SERVICE_UNAVAILABLE,
                },
                503,
                "promnorm is over its in-flight bytes budget (limits.max_inflight_bytes); retry later",
            ),
            (
                IngestError::Throttled {
                    why: budget::Throttle::Concurrency,
                    status: StatusCode::TOO_MANY_REQUESTS,
                },
                429,
                "promnorm is over its concurrent-request budget (limits.max_concurrent_requests); retry later",
            ),
        ];
        for (e, status, text) in cases {
            assert_eq!(e.to_string(), text);
            let throttled = matches!(e, IngestError::Throttled { .. });
            let resp = e.into_response();
            assert_eq!(resp.status().as_u16(), status, "{text}");
            assert_eq!(
                resp.headers().get(header::RETRY_AFTER).is_some(),
                throttled,
                "{text}"
            );
        }
    }
}
