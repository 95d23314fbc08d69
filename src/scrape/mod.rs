//! Scraping (docs/scrape.md): promnorm reads targets' expositions itself and feeds
//! each scrape into the same pipeline as a pushed request, as Prometheus' agent would
//! have sent it: target labels, `up`, `scrape_duration_seconds`,
//! `scrape_samples_scraped`, staleness markers. One task per target, its scrapes at a
//! fixed phase of the interval (a hash of the target), so targets are spread over it.
//! A source above the pipeline: it knows the server only through [`Host`].

pub mod encode;
pub mod sd;
pub mod status;
pub mod text;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;

use encode::{Batches, EncodeOptions, Report, TargetEncoder};
use text::Format;

/// What `scrape:` says, in the scraper's own terms (`app` translates the configuration).
#[derive(Debug, Clone)]
pub struct ScrapeOptions {
    pub interval: Duration,
    pub timeout: Duration,
    pub max_body_bytes: usize,
    pub honor_labels: bool,
    pub honor_timestamps: bool,
    pub targets: Vec<TargetSpec>,
    pub file_sd: Vec<String>,
    pub file_sd_refresh: Duration,
    pub parse_groups: sd::ParseGroups,
    /// `scrape.params`: the URL query parameters of every target (a target's own, or a
    /// `file_sd` group's `__param_<name>`, replaces a name's first value).
    pub params: Params,
}

/// URL query parameters: name → values, in order.
pub type Params = BTreeMap<String, Vec<String>>;

/// One target: where, the labels its series get, and the query parameters it is
/// scraped with.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TargetSpec {
    pub url: String,
    pub labels: BTreeMap<String, String>,
    pub params: Params,
}

impl TargetSpec {
    /// The URL scraped: `url` with `params` appended to its query, form-encoded.
    pub fn scrape_url(&self) -> String {
        let mut out = self.url.clone();
        let mut sep = if out.contains('?') { '&' } else { '?' };
        for (name, values) in &self.params {
            for v in values {
                out.push(sep);
                out.push_str(&query_component(name));
                out.push('=');
                out.push_str(&query_component(v));
                sep = '&';
            }
        }
        out
    }
}

/// Percent-encodes what a query's name or value may not hold as it is.
fn query_component(s: &str) -> String {
    const RESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(s, RESERVED).to_string()
}

/// `params` over `base`: each name `own` gives replaces `base`'s first value of it (the
/// rest stay), as a `__param_<name>` label does in Prometheus.
pub fn merge_params(base: &Params, own: &Params) -> Params {
    let mut out = base.clone();
    for (name, values) in own {
        let slot = out.entry(name.clone()).or_default();
        let rest = if slot.len() > values.len() {
            slot.split_off(values.len())
        } else {
            Vec::new()
        };
        *slot = values.iter().cloned().chain(rest).collect();
    }
    out
}

/// How the pipeline took a scrape's body.
pub enum Delivered {
    Ok,
    /// Worth sending again (a `5xx`, a `429`, the overload budget full).
    Retry(String),
    /// Refused as data (a `4xx`): sending it again would not help.
    Rejected(String),
}

pub type DeliverFuture<'a> = Pin<Box<dyn Future<Output = Delivered> + Send + 'a>>;

/// What the scraper needs from the running server.
pub trait Host: Send + Sync + 'static {
    /// The current `scrape:` (after a reload, the new one); `None`: no scraping.
    fn scrape_options(&self) -> Option<Arc<ScrapeOptions>>;
    /// Takes one uncompressed remote-write 1.0 body as a pushed request would be taken.
    fn ingest<'a>(&'a self, body: &'a [u8]) -> DeliverFuture<'a>;
    /// Where the targets' states are kept for `/api/v1/targets` (outlives reloads).
    fn targets(&self) -> &status::Targets;
}

/// The `Accept` header Prometheus sends: OpenMetrics first, then the text format.
const ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

type ScrapeClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>;

fn client(tls: rustls::ClientConfig) -> ScrapeClient {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .build(connector)
}

/// Settings every target's loop reads at each scrape.
#[derive(Debug, Clone, Copy, PartialEq)]
struct LoopSettings {
    interval: Duration,
    timeout: Duration,
    max_body_bytes: usize,
    encode: EncodeOptionsEq,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct EncodeOptionsEq {
    honor_labels: bool,
    honor_timestamps: bool,
}

impl LoopSettings {
    fn of(o: &ScrapeOptions) -> LoopSettings {
        LoopSettings {
            interval: o.interval,
            timeout: o.timeout.min(o.interval),
            max_body_bytes: o.max_body_bytes,
            encode: EncodeOptionsEq {
                honor_labels: o.honor_labels,
                honor_timestamps: o.honor_timestamps,
            },
        }
    }
}

/// Runs the scrapers until the task is dropped (which aborts every target's task):
/// reads the host's options every second, so a reload's targets and settings apply
/// within one; a target no longer configured gets its staleness markers and stops.
pub async fn run(host: Arc<dyn Host>, tls: rustls::ClientConfig) {
    let client = client(tls);
    let mut tasks: JoinSet<()> = JoinSet::new();
    let mut running: HashMap<TargetSpec, oneshot::Sender<()>> = HashMap::new();
    let mut settings_tx: Option<watch::Sender<LoopSettings>> = None;
    let mut file_sd = sd::FileSd::default();
    let mut sd_targets: Vec<TargetSpec> = Vec::new();
    let mut sd_read: Option<Instant> = None;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        while tasks.try_join_next().is_some() {}
        let opts = host.scrape_options();
        let mut desired: Vec<TargetSpec> = Vec::new();
        if let Some(o) = &opts {
            if sd_read.is_none_or(|t| t.elapsed() >= o.file_sd_refresh) {
                let patterns = o.file_sd.clone();
                let parse = o.parse_groups;
                let params = o.params.clone();
                let mut sd_state = std::mem::take(&mut file_sd);
                let (state, targets) = tokio::task::spawn_blocking(move || {
                    let t = sd_state.refresh(&patterns, parse, &params);
                    (sd_state, t)
                })
                .await
                .unwrap_or_default();
                file_sd = state;
                sd_targets = targets;
                sd_read = Some(Instant::now());
            }
            desired.extend(o.targets.iter().cloned());
            desired.extend(sd_targets.iter().cloned());
            desired.sort();
            desired.dedup();
            let settings = LoopSettings::of(o);
            match &settings_tx {
                Some(tx) => {
                    tx.send_if_modified(|s| {
                        let changed = *s != settings;
                        *s = settings;
                        changed
                    });
                }
                None => settings_tx = Some(watch::channel(settings).0),
            }
        }
        // The ones no longer configured: dropping their sender tells them to stop.
        running.retain(|spec, _| desired.binary_search(spec).is_ok());
        if let Some(tx) = &settings_tx {
            let s = *tx.borrow();
            for spec in desired {
                if running.contains_key(&spec) {
                    continue;
                }
                let (stop_tx, stop_rx) = oneshot::channel();
                host.targets().started(&spec, s.interval, s.timeout);
                tasks.spawn(target_loop(
                    host.clone(),
                    client.clone(),
                    spec.clone(),
                    tx.subscribe(),
                    stop_rx,
                ));
                running.insert(spec, stop_tx);
            }
        }
        metrics::gauge!(crate::telemetry::SCRAPE_TARGETS).set(running.len() as f64);
    }
}

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn fnv(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in s.as_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// How long from now until this target's next phase of the interval.
fn until_next(phase_key: u64, interval: Duration, now_ms: i64) -> Duration {
    let iv = interval.as_millis().max(1) as i64;
    let phase = (phase_key % iv as u64) as i64;
    let mut next = now_ms - now_ms.rem_euclid(iv) + phase;
    if next <= now_ms {
        next += iv;
    }
    Duration::from_millis((next - now_ms) as u64)
}

/// The labels a target's series get: its configured ones, `job` (`scrape` unless
/// given) and `instance` (the URL's `host:port` unless given).
pub fn target_labels(spec: &TargetSpec) -> Vec<(String, String)> {
    let mut labels: Vec<(String, String)> = spec
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if !spec.labels.contains_key("job") {
        labels.push(("job".into(), "scrape".into()));
    }
    if !spec.labels.contains_key("instance") {
        let instance = spec
            .url
            .parse::<http::Uri>()
            .ok()
            .and_then(|u| u.authority().map(|a| a.as_str().to_string()))
            .unwrap_or_else(|| spec.url.clone());
        labels.push(("instance".into(), instance));
    }
    labels.retain(|(_, v)| !v.is_empty());
    labels
}

async fn target_loop(
    host: Arc<dyn Host>,
    client: ScrapeClient,
    spec: TargetSpec,
    settings: watch::Receiver<LoopSettings>,
    mut stop: oneshot::Receiver<()>,
) {
    let mut enc = TargetEncoder::new(target_labels(&spec));
    let phase_key = fnv(&format!("{}{:?}", spec.url, spec.labels));
    let mut last_error: Option<String> = None;
    let url = spec.scrape_url();
    // The last scrape's sizes: this one's buffers are reserved at once.
    let (mut body_hint, mut encoded_hint) = (0usize, 0usize);
    loop {
        let s = *settings.borrow();
        let wait = until_next(phase_key, s.interval, unix_ms());
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = &mut stop => {
                let mut out = Batches::expecting(0);
                let stale = enc.encode_removal(unix_ms(), &mut out);
                metrics::counter!(crate::telemetry::SCRAPE_STALE).increment(stale);
                tracing::info!(target = %url, stale_markers = stale, "scrape target removed");
                host.targets().stopped(&spec);
                deliver(&*host, out, Instant::now() + s.interval).await;
                return;
            }
        }
        let started = Instant::now();
        let now_ms = unix_ms();
        let fetched = tokio::time::timeout(s.timeout, fetch(&client, &url, &s, body_hint)).await;
        let fetched = match fetched {
            Ok(r) => r,
            Err(_) => Err(format!(
                "scrape timed out after {:?} (scrape.timeout)",
                s.timeout
            )),
        };
        let mut out = Batches::expecting(encoded_hint);
        let opts = EncodeOptions {
            honor_labels: s.encode.honor_labels,
            honor_timestamps: s.encode.honor_timestamps,
        };
        let outcome = fetched.and_then(|(body, format)| {
            body_hint = body.len();
            enc.encode_scrape(&body, format, now_ms, opts, &mut out)
                .map_err(|e| format!("parsing the exposition: {e}"))
        });
        let duration = started.elapsed().as_secs_f64();
        let (up, samples) = match outcome {
            Ok(c) => {
                if let Some(e) = last_error.take() {
                    tracing::info!(target = %url, previous_error = %e, "scrape target up again");
                }
                metrics::counter!(crate::telemetry::SCRAPES, "result" => "ok").increment(1);
                metrics::counter!(crate::telemetry::SCRAPE_SAMPLES).increment(c.scraped);
                metrics::counter!(crate::telemetry::SCRAPE_STALE).increment(c.stale);
                if c.duplicates > 0 {
                    crate::telemetry::samples_dropped("scrape_duplicate", c.duplicates);
                }
                (true, c.scraped)
            }
            Err(e) => {
                let stale = enc.encode_failure(now_ms, &mut out);
                metrics::counter!(crate::telemetry::SCRAPES, "result" => "failed").increment(1);
                metrics::counter!(crate::telemetry::SCRAPE_STALE).increment(stale);
                if last_error.as_deref() != Some(e.as_str()) {
                    tracing::warn!(target = %url, error = %e, stale_markers = stale, "scrape failed; up is 0");
                } else {
                    tracing::debug!(target = %url, error = %e, "scrape failed");
                }
                last_error = Some(e);
                (false, 0)
            }
        };
        metrics::histogram!(crate::telemetry::SCRAPE_DURATION).record(duration);
        encoded_hint = out.bytes();
        host.targets().scraped(
            &spec,
            &status::Scraped {
                up,
                error: if up { None } else { last_error.as_deref() },
                at_ms: now_ms,
                duration_seconds: duration,
                samples,
                interval: s.interval,
                timeout: s.timeout,
            },
        );
        enc.encode_report(
            &Report {
                up,
                duration_seconds: duration,
            },
            samples,
            now_ms,
            &mut out,
        );
        deliver(&*host, out, started + s.interval).await;
    }
}

/// Sends a scrape's bodies in order; a retryable refusal is retried (backing off) until
/// the next scrape is due, then the rest is dropped and counted.
async fn deliver(host: &dyn Host, out: Batches, deadline: Instant) {
    let mut bodies = out.bodies.iter();
    while let Some(body) = bodies.next() {
        let samples = count_series(body);
        let mut backoff = Duration::from_millis(100);
        loop {
            match host.ingest(body).await {
                Delivered::Ok => break,
                Delivered::Rejected(why) => {
                    tracing::warn!(reason = %why, samples, "a scrape's samples were refused as data");
                    crate::telemetry::samples_dropped("scrape_rejected", samples);
                    break;
                }
                Delivered::Retry(why) => {
                    if Instant::now() + backoff >= deadline {
                        let rest: u64 =
                            samples + bodies.by_ref().map(|b| count_series(b)).sum::<u64>();
                        tracing::warn!(reason = %why, samples = rest, "a scrape's samples could not be delivered before the next scrape");
                        crate::telemetry::samples_dropped("scrape_undeliverable", rest);
                        return;
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}

/// The number of series (one sample each) in a body the encoder wrote.
fn count_series(body: &[u8]) -> u64 {
    let mut r = crate::wire::pb::Reader::new(body, 0, body.len());
    let mut n = 0;
    while !r.is_done() {
        let Ok((field, wire)) = r.key() else { break };
        if field == 1 {
            n += 1;
        }
        if r.skip(wire).is_err() {
            break;
        }
    }
    n
}

/// One HTTP scrape: the body (gunzipped) within `max_body_bytes`, and its format;
/// `size_hint` is the last body's size (its buffer is reserved at once).
async fn fetch(
    client: &ScrapeClient,
    url: &str,
    s: &LoopSettings,
    size_hint: usize,
) -> Result<(Vec<u8>, Format), String> {
    let req = http::Request::get(url)
        .header(http::header::ACCEPT, ACCEPT)
        .header(http::header::ACCEPT_ENCODING, "gzip")
        .header(
            http::header::USER_AGENT,
            concat!("promnorm/", env!("CARGO_PKG_VERSION")),
        )
        .header(
            "X-Prometheus-Scrape-Timeout-Seconds",
            format!("{}", s.timeout.as_secs_f64()),
        )
        .body(Empty::<Bytes>::new())
        .map_err(|e| format!("building the request: {e}"))?;
    let resp = client.request(req).await.map_err(|e| {
        let (causes, _) = crate::forward::http_backend::error_causes(Some(&e));
        if causes.is_empty() {
            e.to_string()
        } else {
            causes.join(": ")
        }
    })?;
    if resp.status() != http::StatusCode::OK {
        return Err(format!("server returned HTTP status {}", resp.status()));
    }
    let format = Format::of_content_type(
        resp.headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
    );
    let gzip = resp
        .headers()
        .get(http::header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("gzip"));
    let limit = s.max_body_bytes;
    let too_large =
        move || format!("the body is larger than scrape.max_body_bytes ({limit} bytes)");
    let declared = resp
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > limit) {
        return Err(too_large());
    }
    let mut body = resp.into_body();
    // The declared length, or a little more than the last body (gzip: the last body is
    // the gunzipped one, more than this one needs); never past the limit.
    let expect = declared.unwrap_or(size_hint + size_hint / 8);
    let mut raw: Vec<u8> = Vec::with_capacity(expect.min(limit));
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("reading the body: {e}"))?;
        if let Ok(data) = frame.into_data() {
            if raw.len() + data.len() > limit {
                return Err(too_large());
            }
            raw.extend_from_slice(&data);
        }
    }
    if !gzip {
        return Ok((raw, format));
    }
    tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut out = Vec::with_capacity(raw.len().saturating_mul(4).min(limit));
        flate2::read::GzDecoder::new(raw.as_slice())
            .take(limit as u64 + 1)
            .read_to_end(&mut out)
            .map_err(|e| format!("gunzipping the body: {e}"))?;
        if out.len() > limit {
            return Err(too_large());
        }
        Ok((out, format))
    })
    .await
    .map_err(|e| format!("gunzipping the body: {e}"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_spread_targets_over_the_interval() {
        let iv = Duration::from_secs(15);
        let now = 1_700_000_000_123;
        let a = until_next(fnv("http://a/metrics"), iv, now);
        let b = until_next(fnv("http://b/metrics"), iv, now);
        assert!(a <= iv && b <= iv && a > Duration::ZERO);
        assert_ne!(a, b);
        // The same target keeps its phase from one scrape to the next.
        let later = now + a.as_millis() as i64;
        assert_eq!(until_next(fnv("http://a/metrics"), iv, later), iv);
    }

    #[test]
    fn params_are_appended_form_encoded_and_merged_first_value_first() {
        let base: Params = [
            (
                "module".to_string(),
                vec!["gpu".to_string(), "cpu".to_string()],
            ),
            ("target".to_string(), vec!["a b&c".to_string()]),
        ]
        .into();
        let own: Params = [("module".to_string(), vec!["nic".to_string()])].into();
        let merged = merge_params(&base, &own);
        assert_eq!(merged["module"], vec!["nic", "cpu"]);
        let spec = TargetSpec {
            url: "http://h:1/probe?x=1".into(),
            labels: BTreeMap::new(),
            params: merged,
        };
        assert_eq!(
            spec.scrape_url(),
            "http://h:1/probe?x=1&module=nic&module=cpu&target=a%20b%26c"
        );
        let plain = TargetSpec {
            params: Params::new(),
            ..spec
        };
        assert_eq!(plain.scrape_url(), "http://h:1/probe?x=1");
    }

    #[test]
    fn job_and_instance_default_from_the_url() {
        let spec = TargetSpec {
            url: "http://10.1.2.3:8000/metrics".into(),
            labels: [("team".to_string(), "ml".to_string())].into(),
            params: Params::new(),
        };
        let mut l = target_labels(&spec);
        l.sort();
        assert_eq!(
            l,
            vec![
                ("instance".to_string(), "10.1.2.3:8000".to_string()),
                ("job".to_string(), "scrape".to_string()),
                ("team".to_string(), "ml".to_string()),
            ]
        );
    }
}
