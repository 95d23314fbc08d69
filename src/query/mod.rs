//! The Prometheus HTTP query API over normalised data (docs/query.md): old dashboards
//! keep working, unedited.
//!
//! A query arrives in the old terms (names, labels, units); [`translate`] rewrites it
//! with the migrate engine in keep-values mode from the running rules, the upstream (the
//! backend's own query API) answers the rewritten query, and the answer is put back into
//! the query's terms. The original query is asked too, for the history stored under the
//! old names, and the two answers are merged per label set and timestamp, the new side
//! winning, so a range over the cut-over shows neither a gap nor a double count. A query
//! the rules do not touch is passed through, its answer's bytes untouched.
//!
//! Nothing here is on the ingest path; the handlers read the state a reload swaps
//! (`Live::current()`), so a reload changes the rules queries are translated with.

// The handlers' errors are the responses themselves, made once per request.
#![allow(clippy::result_large_err)]

pub mod form;
pub mod matrix;
pub mod translate;
pub mod upstream;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::Value;
use tokio::sync::Semaphore;

use crate::mapping::Rules;
use crate::telemetry;
use translate::Translation;
use upstream::{Answer, Upstream, UpstreamError, UpstreamOptions};

pub use translate::{BadQuery, translate};

/// The query API's settings (`query.*`, translated by `app`).
#[derive(Clone, Debug)]
pub struct QueryOptions {
    pub upstream: UpstreamOptions,
    pub max_concurrent: usize,
    pub merge_old_names: bool,
}

/// Recent translated queries kept for the web UI.
const RECENT: usize = 100;
/// Old names tracked one by one (a bound for pattern rules, which rename unbounded sets
/// of names); past it, `other`.
const MAX_TRACKED_NAMES: usize = 4096;
/// A `POST` body larger than this is refused (`413`): Grafana's longest queries are a
/// few kilobytes.
const MAX_FORM_BYTES: usize = 1 << 20;

/// One translated query, as the web UI lists it.
#[derive(Clone, Debug)]
pub struct RecentQuery {
    pub at: SystemTime,
    pub endpoint: &'static str,
    pub original: String,
    pub rewritten: String,
    pub warnings: Vec<String>,
}

/// What outlives a reload: which old names queries still read, and the recent queries.
#[derive(Default)]
pub struct QueryUsage {
    names: Mutex<HashMap<String, (u64, f64)>>,
    recent: Mutex<VecDeque<RecentQuery>>,
}

impl QueryUsage {
    fn record(&self, t: &Translation, endpoint: &'static str) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        {
            let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
            let mut seen = Vec::new();
            for from in t.old_names() {
                if seen.contains(&from) {
                    continue;
                }
                seen.push(from);
                let key = if names.contains_key(from) || names.len() < MAX_TRACKED_NAMES {
                    from
                } else {
                    "other"
                };
                let e = names.entry(key.to_string()).or_insert((0, 0.0));
                e.0 += 1;
                e.1 = now;
                telemetry::query_old_name(key);
            }
        }
        if t.text_changed() || !t.warnings.is_empty() {
            let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            if recent.len() == RECENT {
                recent.pop_back();
            }
            recent.push_front(RecentQuery {
                at: SystemTime::now(),
                endpoint,
                original: t.original.clone(),
                rewritten: t.rewritten.clone(),
                warnings: t.warnings.clone(),
            });
        }
    }

    /// Queries that read `from` since start, and when the last one did (Unix seconds).
    pub fn of(&self, from: &str) -> Option<(u64, f64)> {
        self.names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(from)
            .copied()
    }

    /// Every old name queried since start, most queried first: (name, queries, last
    /// queried in Unix seconds).
    pub fn names(&self) -> Vec<(String, u64, f64)> {
        let mut v: Vec<_> = self
            .names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, &(n, t))| (k.clone(), n, t))
            .collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        v
    }

    /// The recent translated queries, newest first.
    pub fn recent(&self) -> Vec<RecentQuery> {
        self.recent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}

/// The built query API: the upstream's client, the slots, the usage.
pub struct QueryApi {
    upstream: Upstream,
    slots: Arc<Semaphore>,
    merge_old_names: bool,
    usage: Arc<QueryUsage>,
}

impl QueryApi {
    /// Builds the API; `usage` carries the counts of the API a reload replaces.
    pub fn new(
        opts: QueryOptions,
        usage: Option<Arc<QueryUsage>>,
    ) -> Result<QueryApi, crate::forward::BackendError> {
        Ok(QueryApi {
            upstream: Upstream::new(opts.upstream)?,
            slots: Arc::new(Semaphore::new(opts.max_concurrent.max(1))),
            merge_old_names: opts.merge_old_names,
            usage: usage.unwrap_or_default(),
        })
    }

    pub fn usage(&self) -> &Arc<QueryUsage> {
        &self.usage
    }

    pub fn upstream(&self) -> &str {
        self.upstream.base()
    }
}

/// What one request reads of the running state, as a reload leaves it: the server
/// implements this, so that this module does not reach back into it.
pub struct Snapshot {
    pub api: Option<Arc<QueryApi>>,
    pub rules: Arc<Rules>,
    /// `ingest_auth`'s token: it protects the query paths too.
    pub ingest_token: Option<String>,
}

/// The running state the handlers read, once per request.
pub trait Source: Send + Sync + 'static {
    fn snapshot(&self) -> Snapshot;
}

type Live = dyn Source;

/// The query API's routes under `prefix` (`web.route_prefix`), merged beside the
/// server's. They answer `404` while the configuration has no `query`.
pub fn router(live: Arc<Live>, prefix: &str) -> Router {
    let p = prefix.trim_end_matches('/');
    Router::new()
        .route(&format!("{p}/api/v1/query"), get(query).post(query))
        .route(
            &format!("{p}/api/v1/query_range"),
            get(query_range).post(query_range),
        )
        .route(&format!("{p}/api/v1/series"), get(series).post(series))
        .route(&format!("{p}/api/v1/labels"), get(labels).post(labels))
        .route(
            &format!("{p}/api/v1/label/{{name}}/values"),
            get(label_values),
        )
        .route(&format!("{p}/api/v1/metadata"), get(metadata))
        .route(
            &format!("{p}/api/v1/query_exemplars"),
            get(exemplars).post(exemplars),
        )
        .route(&format!("{p}/api/v1/status/buildinfo"), get(buildinfo))
        .with_state(live)
}

/// A Prometheus API error: `{"status":"error","errorType":…,"error":…}`.
fn api_error(status: StatusCode, kind: &str, error: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::json!({"status": "error", "errorType": kind, "error": error}).to_string(),
    )
        .into_response()
}

fn upstream_error(e: &UpstreamError) -> Response {
    let (status, kind, reason) = match e {
        UpstreamError::Timeout(_) => (StatusCode::SERVICE_UNAVAILABLE, "timeout", "timeout"),
        UpstreamError::TooLarge(_) => (StatusCode::UNPROCESSABLE_ENTITY, "execution", "too_large"),
        UpstreamError::Unavailable(_) => (StatusCode::BAD_GATEWAY, "unavailable", "unavailable"),
    };
    telemetry::query_failed(reason);
    tracing::warn!(error = %e, "query API: no answer from the upstream");
    api_error(status, kind, &e.to_string())
}

/// The upstream's answer as it came.
fn pass(a: Answer) -> Response {
    let mut resp = Response::new(Body::from(a.body));
    *resp.status_mut() = a.status;
    if let Some(ct) = a.content_type {
        resp.headers_mut().insert(header::CONTENT_TYPE, ct);
    }
    resp
}

/// An upstream answer that is not a success, as the caller gets it: its status with its
/// `errorType` and `error` when it is the Prometheus API's JSON, else those made from it.
fn upstream_refusal(a: Answer) -> Response {
    if serde_json::from_slice::<Value>(&a.body)
        .ok()
        .is_some_and(|d| d["status"] == "error")
    {
        return pass(a);
    }
    let text = String::from_utf8_lossy(&a.body[..a.body.len().min(512)]).into_owned();
    let kind = if a.status.is_server_error() {
        "internal"
    } else {
        "bad_data"
    };
    let status = if a.status.is_success() {
        StatusCode::BAD_GATEWAY
    } else {
        a.status
    };
    api_error(
        status,
        kind,
        &format!("upstream answered {}: {}", a.status, text.trim()),
    )
}

/// A successful answer's JSON, or the response to give instead.
fn success(a: Answer) -> Result<Value, Response> {
    if !a.status.is_success() {
        return Err(upstream_refusal(a));
    }
    match serde_json::from_slice::<Value>(&a.body) {
        Ok(doc) if doc["status"] == "success" => Ok(doc),
        _ => Err(upstream_refusal(a)),
    }
}

fn answer(data: Value, warnings: Vec<String>, infos: Vec<String>) -> Response {
    let mut doc = serde_json::json!({"status": "success", "data": data});
    if !warnings.is_empty() {
        doc["warnings"] = warnings.into();
    }
    if !infos.is_empty() {
        doc["infos"] = infos.into();
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        doc.to_string(),
    )
        .into_response()
}

/// `warnings` (and `infos`) of upstream answers with promnorm's own, each once.
fn notes(own: &[String], docs: &[&Value], field: &str) -> Vec<String> {
    let mut out: Vec<String> = own.to_vec();
    for d in docs {
        for w in d[field].as_array().into_iter().flatten() {
            if let Some(w) = w.as_str()
                && !out.iter().any(|o| o == w)
            {
                out.push(w.to_string());
            }
        }
    }
    out
}

/// One request to the API: the state it loaded, its parameters and headers.
struct Call {
    rules: Arc<Rules>,
    ingest_token: Option<String>,
    api: Arc<QueryApi>,
    params: Vec<(String, String)>,
    headers: HeaderMap,
    endpoint: &'static str,
    started: Instant,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl Call {
    fn rules(&self) -> &Rules {
        &self.rules
    }

    async fn ask(
        &self,
        method: Method,
        path: &str,
        params: &[(String, String)],
    ) -> Result<Answer, UpstreamError> {
        let drop_auth = self.ingest_token.is_some();
        self.api
            .upstream
            .ask(method, path, params, &self.headers, drop_auth)
            .await
    }

    fn done(&self, rewritten: bool, resp: Response) -> Response {
        telemetry::query_answered(self.endpoint, rewritten, self.started.elapsed());
        resp
    }
}

/// Admits a request: the API is on, the caller is authorised, a slot is free in time,
/// and its parameters (query string, and a `POST`'s form) are read.
async fn admit(
    live: &Live,
    method: &Method,
    headers: HeaderMap,
    uri_query: Option<&str>,
    body: Bytes,
    endpoint: &'static str,
) -> Result<Call, Response> {
    let started = Instant::now();
    let st = live.snapshot();
    let Some(api) = st.api.clone() else {
        return Err(api_error(
            StatusCode::NOT_FOUND,
            "not_found",
            "the query API is off: the configuration has no query.upstream",
        ));
    };
    if let Some(token) = &st.ingest_token {
        if !bearer_token_matches(token, &headers) {
            let mut r = api_error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "a bearer token (ingest_auth) is required",
            );
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"promnorm\""),
            );
            return Err(r);
        }
    }
    let mut params = form::decode(uri_query.unwrap_or(""));
    if *method == Method::POST && !body.is_empty() {
        if body.len() > MAX_FORM_BYTES {
            return Err(api_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "bad_data",
                "the form is larger than 1 MiB",
            ));
        }
        params.extend(form::decode(&String::from_utf8_lossy(&body)));
    }
    let wait = api.upstream.timeout();
    let slot = match tokio::time::timeout(wait, api.slots.clone().acquire_owned()).await {
        Ok(Ok(p)) => p,
        _ => {
            telemetry::query_failed("busy");
            return Err(api_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "too many queries in progress (query.max_concurrent)",
            ));
        }
    };
    Ok(Call {
        rules: st.rules,
        ingest_token: st.ingest_token,
        api,
        params,
        headers,
        endpoint,
        started,
        _slot: slot,
    })
}

/// `Path` of a label name in a URL.
fn label_path(name: &str) -> String {
    format!("/api/v1/label/{}/values", form::component(name))
}

macro_rules! admit_or_return {
    ($live:expr, $method:expr, $headers:expr, $uri:expr, $body:expr, $endpoint:expr) => {
        match admit(&*$live, &$method, $headers, $uri.query(), $body, $endpoint).await {
            Ok(c) => c,
            Err(r) => {
                telemetry::query_answered($endpoint, false, Duration::ZERO);
                return r;
            }
        }
    };
}

async fn query(
    State(live): State<Arc<Live>>,
    method: Method,
    headers: HeaderMap,
    uri: axum::http::Uri,
    body: Bytes,
) -> Response {
    let call = admit_or_return!(live, method, headers, uri, body, "query");
    run_query(call, "/api/v1/query").await
}

async fn query_range(
    State(live): State<Arc<Live>>,
    method: Method,
    headers: HeaderMap,
    uri: axum::http::Uri,
    body: Bytes,
) -> Response {
    let call = admit_or_return!(live, method, headers, uri, body, "query_range");
    run_query(call, "/api/v1/query_range").await
}

/// The translation of the call's `query`, or the `400` Prometheus gives.
fn translated(call: &Call) -> Result<Translation, Response> {
    let Some(q) = form::get(&call.params, "query") else {
        return Err(api_error(
            StatusCode::BAD_REQUEST,
            "bad_data",
            "invalid parameter \"query\": no query given",
        ));
    };
    translate(call.rules(), q).map_err(|e| {
        api_error(
            StatusCode::BAD_REQUEST,
            "bad_data",
            &format!("invalid parameter \"query\": {e}"),
        )
    })
}

/// Passes the call through to `path` with its own parameters.
async fn pass_through(call: &Call, method: Method, path: &str) -> Response {
    let resp = match call.ask(method, path, &call.params).await {
        Ok(a) => pass(a),
        Err(e) => upstream_error(&e),
    };
    call.done(false, resp)
}

/// The old names' answer, when asked: `None` when not asked, else its JSON or the
/// response to give instead.
fn old_side(answer: Option<Result<Answer, UpstreamError>>) -> Result<Option<Value>, Response> {
    match answer {
        None => Ok(None),
        Some(Err(e)) => Err(upstream_error(&e)),
        Some(Ok(a)) => success(a).map(Some),
    }
}

async fn run_query(call: Call, path: &str) -> Response {
    let t = match translated(&call) {
        Ok(t) => t,
        Err(r) => return call.done(false, r),
    };
    if !t.translates() && t.warnings.is_empty() {
        return pass_through(&call, Method::POST, path).await;
    }
    call.api.usage.record(&t, call.endpoint);
    if !t.translates() {
        // Not rewritten, but something in it needs a human: the answer as it came, with
        // what the engine said in its warnings.
        let resp = match call.ask(Method::POST, path, &call.params).await {
            Err(e) => upstream_error(&e),
            Ok(a) => match success(a) {
                Err(r) => r,
                Ok(mut doc) => {
                    let warnings = notes(&t.warnings, &[&doc], "warnings");
                    let infos = notes(&[], &[&doc], "infos");
                    answer(doc["data"].take(), warnings, infos)
                }
            },
        };
        return call.done(false, resp);
    }
    let new_params = form::with(&call.params, "query", std::slice::from_ref(&t.rewritten));
    let old_params = form::with(&call.params, "query", std::slice::from_ref(&t.old_query));
    let ask_old = call.api.merge_old_names && t.text_changed();
    let (new, old) = tokio::join!(call.ask(Method::POST, path, &new_params), async {
        if ask_old {
            Some(call.ask(Method::POST, path, &old_params).await)
        } else {
            None
        }
    });
    // The usual range answer: points borrowed from the bodies, never parsed into trees.
    if let Ok(n) = &new
        && let Some(nm) = matrix::parse(&n.body)
    {
        // The old side must be a matrix too (or not asked); anything else, an error
        // included, takes the general path below.
        let om = match &old {
            None => Some(None),
            Some(Ok(o)) => matrix::parse(&o.body).map(Some),
            Some(Err(_)) => None,
        };
        if let Some(om) = om {
            let body = matrix::restore_and_merge(&t, nm, om, &t.warnings);
            let resp = (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                body,
            )
                .into_response();
            return call.done(true, resp);
        }
    }
    let mut new_doc = match new.map_err(|e| upstream_error(&e)).and_then(success) {
        Ok(d) => d,
        Err(r) => return call.done(true, r),
    };
    let mut old_doc = match old_side(old) {
        Ok(d) => d,
        Err(r) => return call.done(true, r),
    };
    let data = new_doc["data"].take();
    let (mut data, old_data) = match &mut old_doc {
        Some(o) => (data, o["data"].take()),
        None if t.text_changed() => (data, Value::Null),
        // One question read both periods (only labels the query does not name change):
        // the series that carry what only the rules write are the new side.
        None => translate::split_sides(&t, data),
    };
    translate::restore_query_data(&t, &mut data, Some(&old_data));
    let data = translate::merge(data, old_data);
    let docs: Vec<&Value> = std::iter::once(&new_doc).chain(old_doc.as_ref()).collect();
    let warnings = notes(&t.warnings, &docs, "warnings");
    let infos = notes(&[], &docs, "infos");
    call.done(true, answer(data, warnings, infos))
}

/// The translations of the call's `match[]` selectors (`400` for one that does not
/// parse, as Prometheus answers).
fn translated_matches(call: &Call) -> Result<Vec<Translation>, Response> {
    form::all(&call.params, "match[]")
        .into_iter()
        .map(|m| {
            translate::translate_selector(call.rules(), m).map_err(|e| {
                api_error(
                    StatusCode::BAD_REQUEST,
                    "bad_data",
                    &format!("invalid parameter \"match[]\": {e}"),
                )
            })
        })
        .collect()
}

/// The `match[]` list that asks for both periods: the rewritten selectors, and the
/// original ones when the old names' history is merged.
fn both_matches(call: &Call, ts: &[Translation]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for t in ts {
        if t.text_changed() {
            out.push(t.rewritten.clone());
        }
        if call.api.merge_old_names || !t.text_changed() {
            out.push(t.old_query.clone());
        }
    }
    out.dedup();
    out
}

fn all_warnings(ts: &[Translation]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for w in ts.iter().flat_map(|t| t.warnings.iter()) {
        if !out.contains(w) {
            out.push(w.clone());
        }
    }
    out
}

async fn series(
    State(live): State<Arc<Live>>,
    method: Method,
    headers: HeaderMap,
    uri: axum::http::Uri,
    body: Bytes,
) -> Response {
    let call = admit_or_return!(live, method, headers, uri, body, "series");
    let ts = match translated_matches(&call) {
        Ok(ts) => ts,
        Err(r) => return call.done(false, r),
    };
    if !ts.iter().any(Translation::translates) {
        return pass_through(&call, Method::POST, "/api/v1/series").await;
    }
    for t in ts.iter().filter(|t| t.translates()) {
        call.api.usage.record(t, call.endpoint);
    }
    let params = form::with(&call.params, "match[]", &both_matches(&call, &ts));
    let doc = match call.ask(Method::POST, "/api/v1/series", &params).await {
        Ok(a) => success(a),
        Err(e) => Err(upstream_error(&e)),
    };
    let mut doc = match doc {
        Ok(d) => d,
        Err(r) => return call.done(true, r),
    };
    let data = match doc["data"].take() {
        Value::Array(items) => translate::restore_series(&ts, items),
        _ => Vec::new(),
    };
    let warnings = notes(&all_warnings(&ts), &[&doc], "warnings");
    call.done(true, answer(Value::Array(data), warnings, Vec::new()))
}

async fn labels(
    State(live): State<Arc<Live>>,
    method: Method,
    headers: HeaderMap,
    uri: axum::http::Uri,
    body: Bytes,
) -> Response {
    let call = admit_or_return!(live, method, headers, uri, body, "labels");
    let ts = match translated_matches(&call) {
        Ok(ts) => ts,
        Err(r) => return call.done(false, r),
    };
    if !ts.iter().any(Translation::translates) {
        return pass_through(&call, Method::POST, "/api/v1/labels").await;
    }
    for t in ts.iter().filter(|t| t.translates()) {
        call.api.usage.record(t, call.endpoint);
    }
    let params = form::with(&call.params, "match[]", &both_matches(&call, &ts));
    let doc = match call.ask(Method::POST, "/api/v1/labels", &params).await {
        Ok(a) => success(a),
        Err(e) => Err(upstream_error(&e)),
    };
    let mut doc = match doc {
        Ok(d) => d,
        Err(r) => return call.done(true, r),
    };
    let data = match doc["data"].take() {
        Value::Array(items) => translate::restore_label_names(&ts, items),
        _ => Vec::new(),
    };
    let warnings = notes(&all_warnings(&ts), &[&doc], "warnings");
    call.done(true, answer(Value::Array(data), warnings, Vec::new()))
}

async fn label_values(
    State(live): State<Arc<Live>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Response {
    let call = admit_or_return!(
        live,
        Method::GET,
        headers,
        uri,
        Bytes::new(),
        "label_values"
    );
    let ts = match translated_matches(&call) {
        Ok(ts) => ts,
        Err(r) => return call.done(false, r),
    };
    let old_path = label_path(&name);
    let (new_label, new_params, ts) = if ts.is_empty() {
        // `label_values(Hostname)`: no selector, so the rules' own renames of the label.
        match call
            .rules()
            .label_renames()
            .into_iter()
            .find(|(old, _)| *old == name)
        {
            Some((_, new)) => (new, call.params.clone(), ts),
            None => return pass_through(&call, Method::GET, &old_path).await,
        }
    } else if ts.iter().any(Translation::translates) {
        let new_label = translate::new_label_name(&ts, &name).to_string();
        let rewritten: Vec<String> = ts.iter().map(|t| t.rewritten.clone()).collect();
        (
            new_label,
            form::with(&call.params, "match[]", &rewritten),
            ts,
        )
    } else {
        return pass_through(&call, Method::GET, &old_path).await;
    };
    for t in ts.iter().filter(|t| t.translates()) {
        call.api.usage.record(t, call.endpoint);
    }
    let old_params = if ts.is_empty() {
        call.params.clone()
    } else {
        let olds: Vec<String> = ts.iter().map(|t| t.old_query.clone()).collect();
        form::with(&call.params, "match[]", &olds)
    };
    let new_path = label_path(&new_label);
    let ask_old = call.api.merge_old_names || new_path == old_path;
    let ask_new = new_path != old_path || new_params != old_params;
    let (new, old) = tokio::join!(
        async {
            if ask_new {
                Some(call.ask(Method::GET, &new_path, &new_params).await)
            } else {
                None
            }
        },
        async {
            if ask_old {
                Some(call.ask(Method::GET, &old_path, &old_params).await)
            } else {
                None
            }
        }
    );
    let (new_doc, old_doc) = match (old_side(new), old_side(old)) {
        (Ok(n), Ok(o)) => (n, o),
        (Err(r), _) | (_, Err(r)) => return call.done(true, r),
    };
    let values = |d: &Option<Value>| match d.as_ref().map(|d| &d["data"]) {
        Some(Value::Array(items)) => items.clone(),
        _ => Vec::new(),
    };
    let restored = translate::restore_label_values(&ts, &name, values(&new_doc));
    let data = translate::union_strings(restored, values(&old_doc));
    let docs: Vec<&Value> = new_doc.iter().chain(old_doc.iter()).collect();
    let warnings = notes(&all_warnings(&ts), &docs, "warnings");
    call.done(true, answer(Value::Array(data), warnings, Vec::new()))
}

async fn metadata(
    State(live): State<Arc<Live>>,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Response {
    let call = admit_or_return!(live, Method::GET, headers, uri, Bytes::new(), "metadata");
    let Some(metric) = form::get(&call.params, "metric").map(str::to_string) else {
        return pass_through(&call, Method::GET, "/api/v1/metadata").await;
    };
    let renamed = translate::translate_selector(call.rules(), &metric)
        .ok()
        .and_then(|t| {
            let to = t.selectors.iter().find(|s| s.from == metric)?.to.clone();
            (to != metric).then_some((t, to))
        });
    let Some((t, to)) = renamed else {
        return pass_through(&call, Method::GET, "/api/v1/metadata").await;
    };
    call.api.usage.record(&t, call.endpoint);
    let new_params = form::with(&call.params, "metric", std::slice::from_ref(&to));
    let (new, old) = tokio::join!(
        call.ask(Method::GET, "/api/v1/metadata", &new_params),
        call.ask(Method::GET, "/api/v1/metadata", &call.params)
    );
    let (new_doc, old_doc) = match (old_side(Some(new)), old_side(Some(old))) {
        (Ok(n), Ok(o)) => (n.unwrap_or_default(), o.unwrap_or_default()),
        (Err(r), _) | (_, Err(r)) => return call.done(true, r),
    };
    // The old view: the old family's own metadata where the history has it (its HELP
    // and unit are the old ones), else the new family's.
    // The new family's unit is not the old name's (its values come back in the old
    // unit), so a borrowed entry says none.
    let entries = match &old_doc["data"][&metric] {
        Value::Array(a) if !a.is_empty() => Value::Array(a.clone()),
        _ => {
            let mut borrowed = new_doc["data"][&to].clone();
            for e in borrowed.as_array_mut().into_iter().flatten() {
                if let Some(unit) = e.get_mut("unit") {
                    *unit = Value::String(String::new());
                }
            }
            borrowed
        }
    };
    let mut data = serde_json::Map::new();
    if !entries.is_null() {
        data.insert(metric, entries);
    }
    call.done(
        true,
        answer(Value::Object(data), t.warnings.clone(), Vec::new()),
    )
}

async fn exemplars(
    State(live): State<Arc<Live>>,
    method: Method,
    headers: HeaderMap,
    uri: axum::http::Uri,
    body: Bytes,
) -> Response {
    let call = admit_or_return!(live, method, headers, uri, body, "query_exemplars");
    let t = match translated(&call) {
        Ok(t) => t,
        Err(r) => return call.done(false, r),
    };
    const PATH: &str = "/api/v1/query_exemplars";
    if !t.translates() {
        return pass_through(&call, Method::POST, PATH).await;
    }
    call.api.usage.record(&t, call.endpoint);
    let new_params = form::with(&call.params, "query", std::slice::from_ref(&t.rewritten));
    let old_params = form::with(&call.params, "query", std::slice::from_ref(&t.old_query));
    let ask_old = call.api.merge_old_names && t.text_changed();
    let (new, old) = tokio::join!(call.ask(Method::POST, PATH, &new_params), async {
        if ask_old {
            Some(call.ask(Method::POST, PATH, &old_params).await)
        } else {
            None
        }
    });
    let (new_doc, old_doc) = match (old_side(Some(new)), old_side(old)) {
        (Ok(n), Ok(o)) => (n.unwrap_or_default(), o),
        (Err(r), _) | (_, Err(r)) => return call.done(true, r),
    };
    let list = |d: Option<&Value>| match d.map(|d| &d["data"]) {
        Some(Value::Array(items)) => items.clone(),
        _ => Vec::new(),
    };
    let mut new_items = list(Some(&new_doc));
    translate::restore_exemplars(&t, &mut new_items);
    let data = translate::merge_exemplars(new_items, list(old_doc.as_ref()));
    let docs: Vec<&Value> = std::iter::once(&new_doc).chain(old_doc.as_ref()).collect();
    let warnings = notes(&t.warnings, &docs, "warnings");
    call.done(true, answer(Value::Array(data), warnings, Vec::new()))
}

async fn buildinfo(
    State(live): State<Arc<Live>>,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Response {
    let call = admit_or_return!(live, Method::GET, headers, uri, Bytes::new(), "buildinfo");
    pass_through(&call, Method::GET, "/api/v1/status/buildinfo").await
}

/// Whether `headers` carry `Authorization: Bearer <token>` (compared in constant time):
/// the `ingest_auth` check of the read endpoints (this API, `/federate`).
pub fn bearer_token_matches(token: &str, headers: &HeaderMap) -> bool {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim_start().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim());
    given.is_some_and(|g| {
        g.len() == token.len()
            && g.bytes()
                .zip(token.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    })
}
