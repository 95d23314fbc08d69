//! promnorm's own metrics and logging (docs/telemetry.md).

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::mapping::{MapStats, Rules};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
static START_TIME: OnceLock<f64> = OnceLock::new();

/// Counters without labels exist from start-up, at 0: `rate()` and absence alerts need
/// a first sample before the first event.
fn register_at_zero() {
    for name in [
        SAMPLES_RECEIVED,
        SERIES_COLLISIONS,
        NATIVE_UNSCALED,
        DERIVED_INCOMPLETE,
        DERIVED_NO_PEAK,
        DERIVED_RANKS_FORGOTTEN,
    ] {
        metrics::counter!(name).absolute(0);
    }
}

/// Labelled counters whose label values are known from the configuration exist from
/// start-up, at 0: drops per configured reason, renames and rescales per pack, derived
/// samples per derived series. Returns the mapping stage's handles to count through.
pub fn register_pipeline(
    rules: &Rules,
    derived_series: impl Iterator<Item = &'static str>,
) -> MapMetrics {
    // The recorder first: a handle taken before it is installed counts nowhere.
    metrics_handle();
    let per_pack = |name: &'static str| -> Vec<metrics::Counter> {
        rules
            .packs()
            .iter()
            .map(|pack| metrics::counter!(name, "pack" => pack.name.clone()))
            .collect()
    };
    let map = MapMetrics {
        dropped: rules
            .reasons()
            .iter()
            .map(|reason| metrics::counter!(SAMPLES_DROPPED, "reason" => reason.clone()))
            .collect(),
        renamed: per_pack(SERIES_RENAMED),
        rescaled: per_pack(SERIES_RESCALED),
        rebucketed: per_pack(NATIVE_REBUCKETED),
        total_fixes: std::sync::OnceLock::new(),
        collisions: metrics::counter!(SERIES_COLLISIONS),
        native_unscaled: metrics::counter!(NATIVE_UNSCALED),
    };
    // Every pack's and reason's series from the start, at zero.
    let labelled = [&map.dropped, &map.renamed, &map.rescaled, &map.rebucketed];
    for c in labelled.into_iter().flatten() {
        c.increment(0);
    }
    for series in derived_series {
        metrics::counter!(DERIVED_SAMPLES, "series" => series).increment(0);
    }
    for reason in ["stale", "max_series"] {
        metrics::counter!(DERIVED_EVICTIONS, "reason" => reason).increment(0);
    }
    for reason in THROTTLE_REASONS {
        metrics::counter!(REQUESTS_THROTTLED, "reason" => *reason).increment(0);
    }
    map
}

/// The mapping stage's counters for one set of rules, made with them (a reload makes new
/// ones): a request counts through these handles, without building a label or looking
/// the series up per counter (a few dozen lookups a request with every pack on).
pub struct MapMetrics {
    /// By [`Rules::reasons`] index.
    dropped: Vec<metrics::Counter>,
    /// By [`Rules::packs`] index.
    renamed: Vec<metrics::Counter>,
    rescaled: Vec<metrics::Counter>,
    rebucketed: Vec<metrics::Counter>,
    /// Made at the first fix: the series shows only where the fix runs.
    total_fixes: std::sync::OnceLock<metrics::Counter>,
    collisions: metrics::Counter,
    native_unscaled: metrics::Counter,
}

/// The standard `process_*` metrics (as Prometheus' client libraries write them), read
/// from `/proc` at scrape time, in text exposition format.
pub fn process_metrics_text() -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let mut put = |name: &str, kind: &str, help: &str, value: f64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    };
    if let Some(start) = START_TIME.get() {
        put(
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            *start,
        );
    }
    #[cfg(target_os = "linux")]
    {
        let (ticks, page) = (
            crate::sys::clock_ticks_per_second(),
            crate::sys::page_size(),
        );
        if let Ok(stat) = std::fs::read_to_string("/proc/self/stat")
            && let Some((_, after_comm)) = stat.rsplit_once(") ")
        {
            // Fields after the command name start at field 3 (state).
            let f: Vec<&str> = after_comm.split_whitespace().collect();
            let num = |i: usize| f.get(i - 3).and_then(|v| v.parse::<f64>().ok());
            if let (Some(utime), Some(stime)) = (num(14), num(15))
                && ticks > 0
            {
                put(
                    "process_cpu_seconds_total",
                    "counter",
                    "Total user and system CPU time spent in seconds.",
                    (utime + stime) / ticks as f64,
                );
            }
            if let Some(vsize) = num(23) {
                put(
                    "process_virtual_memory_bytes",
                    "gauge",
                    "Virtual memory size in bytes.",
                    vsize,
                );
            }
            if let Some(rss) = num(24)
                && page > 0
            {
                put(
                    "process_resident_memory_bytes",
                    "gauge",
                    "Resident memory size in bytes.",
                    rss * page as f64,
                );
            }
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            put(
                "process_open_fds",
                "gauge",
                "Number of open file descriptors.",
                dir.count() as f64,
            );
        }
        if let Some((soft, _)) = crate::sys::fd_limits() {
            put(
                "process_max_fds",
                "gauge",
                "Maximum number of open file descriptors.",
                soft as f64,
            );
        }
    }
    out
}

/// Installs the global metrics recorder once (idempotent) and returns its handle.
pub fn metrics_handle() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full(QUERY_DURATION.into()),
                    &[
                        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                        120.0,
                    ],
                )
                .expect("static bucket list is non-empty")
                .set_buckets_for_metric(
                    Matcher::Full(BACKEND_DURATION.into()),
                    &[
                        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                        10.0, 30.0,
                    ],
                )
                .expect("static bucket list is non-empty")
                .build_recorder();
            let handle = recorder.handle();
            // Another recorder may already be installed (embedding); keep our handle anyway.
            let _ = metrics::set_global_recorder(recorder);
            describe();
            register_at_zero();
            metrics::gauge!(
                BUILD_INFO,
                "version" => crate::VERSION,
                "revision" => crate::REVISION,
                "rustc" => crate::RUSTC_VERSION
            )
            .set(1.0);
            let _ = START_TIME.set(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64()),
            );
            handle
        })
        .clone()
}

/// Every metric promnorm exports: name, kind, description. Declared once; the emitters
/// below are the only places that write them (docs/telemetry.md lists them for users).
pub const METRICS: &[(&str, Kind, &str)] = &[
    (
        REQUESTS,
        Kind::Counter,
        "Remote-write requests answered, by status code.",
    ),
    (
        REQUESTS_THROTTLED,
        Kind::Counter,
        "Remote-write requests answered 429 by the overload budget, by reason (concurrent_requests, inflight_bytes).",
    ),
    (
        SAMPLES_RECEIVED,
        Kind::Counter,
        "Samples (float and native histogram) received.",
    ),
    (
        SAMPLES_FORWARDED,
        Kind::Counter,
        "Samples delivered, by backend.",
    ),
    (
        SAMPLES_DROPPED,
        Kind::Counter,
        "Samples not forwarded, by the configured rule or limit that dropped them.",
    ),
    (
        SERIES_RENAMED,
        Kind::Counter,
        "Series renamed (name, label or label value), by pack.",
    ),
    (
        SERIES_RESCALED,
        Kind::Counter,
        "Series rescaled to base units, by pack.",
    ),
    (
        SERIES_COLLISIONS,
        Kind::Counter,
        "Input series merged onto an existing output series.",
    ),
    (
        NATIVE_UNSCALED,
        Kind::Counter,
        "Native histograms forwarded in their old unit under a rescale rule: the rule says native_histograms: keep_unit (the series is not renamed), or the histogram cannot be rescaled (a schema Prometheus does not define, bucket indices out of range).",
    ),
    (
        RENAME_LAST_SEEN,
        Kind::Gauge,
        "Unix time an input series of the old name `from` was last renamed by a rule of `pack` (rendered at scrape time).",
    ),
    (
        RENAME_SAMPLES,
        Kind::Counter,
        "Samples (and native histograms) of the old name `from` renamed by a rule of `pack` since start (rendered at scrape time).",
    ),
    (
        DERIVED_SAMPLES,
        Kind::Counter,
        "Derived samples emitted, by derived series.",
    ),
    (
        DERIVED_EVICTIONS,
        Kind::Counter,
        "Derived-series state dropped, by reason (stale, max_series).",
    ),
    (
        DERIVED_INCOMPLETE,
        Kind::Counter,
        "Derived points given up because one input never reported that timestamp.",
    ),
    (
        DERIVED_NO_PEAK,
        Kind::Counter,
        "MFU/MBU input series that no configured peak matches (per series per request).",
    ),
    (
        DERIVED_RANKS_FORGOTTEN,
        Kind::Counter,
        "Ranks a sum over ranks stopped waiting for.",
    ),
    (
        DERIVED_STATE_SERIES,
        Kind::Gauge,
        "Series held in derived-series state.",
    ),
    (
        BACKEND_REQUESTS,
        Kind::Counter,
        "Requests sent to backends, by backend and code (or timeout, error).",
    ),
    (
        BACKEND_DURATION,
        Kind::Histogram,
        "Backend request latency.",
    ),
    (
        BACKEND_MISCONFIGURED,
        Kind::Gauge,
        "1 while the backend refuses promnorm's credentials or URL (401, 403, 404, 405, 407).",
    ),
    (
        BACKEND_V1_FALLBACK,
        Kind::Gauge,
        "1 once a `protocol: auto` backend showed it speaks only remote-write 1.0 (it is sent 1.0 from then on).",
    ),
    (CONNECTIONS_OPEN, Kind::Gauge, "Open client connections."),
    (
        CONFIG_RELOAD_SUCCESSFUL,
        Kind::Gauge,
        "Whether the last configuration reload (SIGHUP, POST /-/reload) succeeded (1) or kept the running configuration (0).",
    ),
    (
        CONFIG_RELOAD_SUCCESS_TIMESTAMP,
        Kind::Gauge,
        "Timestamp of the last successful configuration load (start-up or reload), in seconds since the epoch.",
    ),
    (
        QUEUE_BYTES,
        Kind::Gauge,
        "Bytes held in a backend's queue (memory, or disk not yet acknowledged).",
    ),
    (
        QUEUE_MAX_BYTES,
        Kind::Gauge,
        "A backend queue's budget (queue.max_bytes).",
    ),
    (
        QUEUE_REQUESTS,
        Kind::Gauge,
        "Requests held in a backend's queue.",
    ),
    (
        QUEUE_OLDEST_AGE,
        Kind::Gauge,
        "Age of the oldest request in a backend's queue (0 when empty): its samples are at least this old.",
    ),
    (
        QUEUE_SEND_LAG,
        Kind::Gauge,
        "Time from queueing to acknowledgement of the last request a backend's queue delivered.",
    ),
    (
        QUEUE_RETRIES,
        Kind::Counter,
        "Sends from a backend's queue that failed retryably and are retried.",
    ),
    (
        QUEUE_REFUSED,
        Kind::Counter,
        "Requests a backend's queue refused (the sender got 429 or 503), by reason (full, disk_full, io_error).",
    ),
    (
        QUEUE_CORRUPT,
        Kind::Counter,
        "Damaged stretches of a disk queue skipped (a record whose checksum failed, or bytes up to the next sound record); their samples, when known, are in promnorm_samples_dropped_total{reason=\"queue_corrupt\"}.",
    ),
    (
        BUILD_INFO,
        Kind::Gauge,
        "Version, revision and rustc of this binary (value 1).",
    ),
    (
        BACKEND_SATURATED,
        Kind::Counter,
        "Requests not sent to a backend because backends[].max_concurrent_requests were in flight for the whole wait; the sender got 429.",
    ),
    (
        METADATA_DROPPED,
        Kind::Counter,
        "Metadata entries not sent to a backend, by reason (no_tenant: alone in its request, with no tenant seen for its family and none for the sender; tenant_copies: copies to more tenants than one request's bound allows).",
    ),
    (
        TENANT_SAMPLES,
        Kind::Counter,
        "Samples of the sender's requests routed to a tenant, by backend, tenant (beyond limits.max_tenants_in_metrics: other) and outcome (delivered, queued, rejected, failed).",
    ),
    (
        NATIVE_REBUCKETED,
        Kind::Counter,
        "Exponential native histograms re-bucketed into float histograms by a rescale whose factor is no power of two (a quantile moves by at most one bucket width), by pack.",
    ),
    (
        NATIVE_UNROLLED,
        Kind::Counter,
        "Native histograms with custom buckets (NHCB) sent to a backend as classic _bucket/_sum/_count series (backends[].native_histograms), by backend.",
    ),
    (
        TAPS,
        Kind::Counter,
        "Live taps (/debug/tap) by outcome: filled, timed_out, refused (one was already open).",
    ),
    (
        QUERY_REQUESTS,
        Kind::Counter,
        "Query API requests answered, by endpoint and whether the rules rewrote them (rewritten: true) or they passed through (false).",
    ),
    (
        QUERY_DURATION,
        Kind::Histogram,
        "Query API requests from arrival to answer, upstream questions included, by endpoint.",
    ),
    (
        QUERY_OLD_NAMES,
        Kind::Counter,
        "Query API requests that read the old name `from` (a name the rules rename or rescale): the dashboards still to migrate.",
    ),
    (
        QUERY_FAILURES,
        Kind::Counter,
        "Query API requests answered without the upstream's answer, by reason: timeout, too_large, unavailable, busy (query.max_concurrent).",
    ),
    (
        CARDINALITY_TRACKED,
        Kind::Gauge,
        "Active series the cardinality guard tracks (limits.max_tracked_series at most; fewer than active when /api/v1/cardinality says estimated).",
    ),
    (
        CARDINALITY_BYTES,
        Kind::Gauge,
        "Bytes the cardinality guard's tables hold (series, metrics, tenants, label sketches), estimated from their capacities.",
    ),
    (
        EXPOSITION_SERIES,
        Kind::Gauge,
        "Series /federate serves now (exposition.max_series bounds them).",
    ),
    (
        EXPOSITION_EVICTED,
        Kind::Counter,
        "Series evicted from /federate's store at exposition.max_series, least recently updated first.",
    ),
    (
        EXPOSITION_EXPIRED,
        Kind::Counter,
        "Series no longer served by /federate: not forwarded again within exposition.ttl.",
    ),
    (
        EXPOSITION_LEFT_OUT,
        Kind::Counter,
        "Native histogram samples /federate cannot show (exponential buckets have no classic form), by reason.",
    ),
    (
        SCRAPES,
        Kind::Counter,
        "Scrapes of scrape targets, by result (ok, failed).",
    ),
    (
        SCRAPE_TARGETS,
        Kind::Gauge,
        "Scrape targets configured now (static and file_sd).",
    ),
    (
        SCRAPE_SAMPLES,
        Kind::Counter,
        "Samples read from scrape targets (before the pipeline).",
    ),
    (
        SCRAPE_STALE,
        Kind::Counter,
        "Staleness markers written for scraped series that vanished, failed or whose target was removed.",
    ),
    (
        SCRAPE_DURATION,
        Kind::Histogram,
        "Scrapes from request to parsed body.",
    ),
];

pub const SCRAPES: &str = "promnorm_scrapes_total";
pub const SCRAPE_TARGETS: &str = "promnorm_scrape_targets";
pub const SCRAPE_SAMPLES: &str = "promnorm_scrape_samples_total";
pub const SCRAPE_STALE: &str = "promnorm_scrape_stale_markers_total";
pub const SCRAPE_DURATION: &str = "promnorm_scrape_duration_seconds";
pub const EXPOSITION_SERIES: &str = "promnorm_exposition_series";
pub const EXPOSITION_EVICTED: &str = "promnorm_exposition_evicted_series_total";
pub const EXPOSITION_EXPIRED: &str = "promnorm_exposition_expired_series_total";
pub const EXPOSITION_LEFT_OUT: &str = "promnorm_exposition_left_out_total";

/// The exposition store's state, read at scrape time of `/metrics`.
pub const CARDINALITY_TRACKED: &str = "promnorm_cardinality_tracked_series";
pub const CARDINALITY_BYTES: &str = "promnorm_cardinality_tracker_bytes";

/// The cardinality guard's tables, set at scrape time.
pub fn cardinality_state(series: usize, bytes: usize) {
    metrics::gauge!(CARDINALITY_TRACKED).set(series as f64);
    metrics::gauge!(CARDINALITY_BYTES).set(bytes as f64);
}

/// The counter of samples of series the cardinality guard left out (`reason`: the
/// limit), by tenant under tenancy (the tenant label bounded as in [`tenant_label`]).
pub fn series_limited(reason: &'static str, tenant: Option<&str>) -> metrics::Counter {
    match tenant {
        Some(t) => {
            metrics::counter!(SAMPLES_DROPPED, "reason" => reason, "tenant" => tenant_label(t))
        }
        None => metrics::counter!(SAMPLES_DROPPED, "reason" => reason),
    }
}

pub fn exposition_state(series: usize, evicted: u64, expired: u64, native_left_out: u64) {
    metrics::gauge!(EXPOSITION_SERIES).set(series as f64);
    metrics::counter!(EXPOSITION_EVICTED).absolute(evicted);
    metrics::counter!(EXPOSITION_EXPIRED).absolute(expired);
    metrics::counter!(EXPOSITION_LEFT_OUT, "reason" => "native_histogram")
        .absolute(native_left_out);
}

pub const REQUESTS: &str = "promnorm_requests_total";
pub const REQUESTS_THROTTLED: &str = "promnorm_requests_throttled_total";
/// The `reason` values of [`REQUESTS_THROTTLED`].
pub const THROTTLE_REASONS: &[&str] = &["concurrent_requests", "inflight_bytes"];
pub const SAMPLES_RECEIVED: &str = "promnorm_samples_received_total";
pub const SAMPLES_FORWARDED: &str = "promnorm_samples_forwarded_total";
pub const SAMPLES_DROPPED: &str = "promnorm_samples_dropped_total";
pub const SERIES_RENAMED: &str = "promnorm_series_renamed_total";
pub const SERIES_RESCALED: &str = "promnorm_series_rescaled_total";
pub const SERIES_COLLISIONS: &str = "promnorm_series_collisions_total";
pub const NATIVE_UNSCALED: &str = "promnorm_native_histograms_unscaled_total";
pub const RENAME_LAST_SEEN: &str = "promnorm_rename_input_last_seen_timestamp_seconds";
pub const RENAME_SAMPLES: &str = "promnorm_rename_input_samples_total";
pub const DERIVED_SAMPLES: &str = "promnorm_derived_samples_total";
pub const DERIVED_EVICTIONS: &str = "promnorm_derived_evictions_total";
pub const DERIVED_INCOMPLETE: &str = "promnorm_derived_incomplete_points_total";
pub const DERIVED_NO_PEAK: &str = "promnorm_derived_inputs_without_peak_total";
pub const DERIVED_RANKS_FORGOTTEN: &str = "promnorm_derived_ranks_forgotten_total";
pub const DERIVED_STATE_SERIES: &str = "promnorm_derived_state_series";
pub const BACKEND_REQUESTS: &str = "promnorm_backend_requests_total";
pub const BACKEND_DURATION: &str = "promnorm_backend_request_duration_seconds";
pub const BACKEND_MISCONFIGURED: &str = "promnorm_backend_misconfigured";
pub const BACKEND_SATURATED: &str = "promnorm_backend_saturated_total";
pub const METADATA_DROPPED: &str = "promnorm_metadata_dropped_total";
pub const BACKEND_V1_FALLBACK: &str = "promnorm_backend_remote_write_v1_fallback";
pub const CONNECTIONS_OPEN: &str = "promnorm_http_connections_open";
pub const BUILD_INFO: &str = "promnorm_build_info";
pub const CONFIG_RELOAD_SUCCESSFUL: &str = "promnorm_config_last_reload_successful";
pub const CONFIG_RELOAD_SUCCESS_TIMESTAMP: &str =
    "promnorm_config_last_reload_success_timestamp_seconds";
pub const QUEUE_BYTES: &str = "promnorm_queue_bytes";
pub const QUEUE_MAX_BYTES: &str = "promnorm_queue_max_bytes";
pub const QUEUE_REQUESTS: &str = "promnorm_queue_requests";
pub const QUEUE_OLDEST_AGE: &str = "promnorm_queue_oldest_request_age_seconds";
pub const QUEUE_SEND_LAG: &str = "promnorm_queue_send_lag_seconds";
pub const QUEUE_RETRIES: &str = "promnorm_queue_retries_total";
pub const QUEUE_REFUSED: &str = "promnorm_queue_refused_requests_total";
pub const QUEUE_CORRUPT: &str = "promnorm_queue_corrupt_records_total";
pub const TENANT_SAMPLES: &str = "promnorm_tenant_samples_total";
pub const NATIVE_REBUCKETED: &str = "promnorm_native_histograms_rebucketed_total";
pub const NATIVE_UNROLLED: &str = "promnorm_native_histograms_unrolled_total";
pub const TAPS: &str = "promnorm_taps_total";
pub const QUERY_REQUESTS: &str = "promnorm_query_requests_total";
pub const QUERY_DURATION: &str = "promnorm_query_duration_seconds";
pub const QUERY_OLD_NAMES: &str = "promnorm_query_old_name_requests_total";
pub const QUERY_FAILURES: &str = "promnorm_query_failures_total";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

fn describe() {
    for (name, kind, help) in METRICS {
        match kind {
            Kind::Counter => metrics::describe_counter!(*name, *help),
            Kind::Gauge => metrics::describe_gauge!(*name, *help),
            Kind::Histogram => metrics::describe_histogram!(*name, *help),
        }
    }
}

// Typed emitters: the request path, the backends and the derive stage call these.

pub fn request_answered(code: u16) {
    metrics::counter!(REQUESTS, "code" => code.to_string()).increment(1);
}

/// A request refused by the overload budget (`reason`: one of [`THROTTLE_REASONS`]).
/// A query API request answered.
pub fn query_answered(endpoint: &'static str, rewritten: bool, took: std::time::Duration) {
    metrics::counter!(QUERY_REQUESTS, "endpoint" => endpoint, "rewritten" => if rewritten { "true" } else { "false" })
        .increment(1);
    metrics::histogram!(QUERY_DURATION, "endpoint" => endpoint).record(took.as_secs_f64());
}

/// A query read the old name `from` (bounded by the query module).
pub fn query_old_name(from: &str) {
    metrics::counter!(QUERY_OLD_NAMES, "from" => from.to_string()).increment(1);
}

/// A query answered without the upstream's answer.
pub fn query_failed(reason: &'static str) {
    metrics::counter!(QUERY_FAILURES, "reason" => reason).increment(1);
}

/// A live tap ended (`filled`, `timed_out`) or was refused (`refused`).
pub fn tap_outcome(outcome: &'static str) {
    metrics::counter!(TAPS, "outcome" => outcome).increment(1);
}

pub fn request_throttled(reason: &'static str) {
    metrics::counter!(REQUESTS_THROTTLED, "reason" => reason).increment(1);
}

pub fn samples_received(n: u64) {
    metrics::counter!(SAMPLES_RECEIVED).increment(n);
}

/// A backend's metric handles, made once when the backend is built: the request path
/// and the queue's senders count through them, without building a label string or
/// looking the series up for each request.
pub struct BackendMetrics {
    /// The `backend` label, shared: cloning it copies no text.
    label: metrics::SharedString,
    samples_forwarded: metrics::Counter,
    duration: metrics::Histogram,
}

impl BackendMetrics {
    pub fn new(backend: &str) -> BackendMetrics {
        // The recorder first: a handle taken before it is installed counts nowhere.
        metrics_handle();
        BackendMetrics {
            label: metrics::SharedString::from_shared(std::sync::Arc::from(backend)),
            samples_forwarded: metrics::counter!(SAMPLES_FORWARDED, "backend" => backend.to_string()),
            duration: metrics::histogram!(BACKEND_DURATION, "backend" => backend.to_string()),
        }
    }

    /// Samples the backend acknowledged.
    pub fn samples_forwarded(&self, n: u64) {
        self.samples_forwarded.increment(n);
    }

    /// One request to the backend: its duration, and its answer's code.
    pub fn request(&self, code: String, seconds: f64) {
        self.duration.record(seconds);
        metrics::counter!(BACKEND_REQUESTS, "backend" => self.label.clone(), "code" => code)
            .increment(1);
    }

    /// What the backend did with one tenant's share of a request (`outcome`:
    /// `delivered`, `queued`, `rejected` (a data error), `failed` (the sender is asked
    /// to retry)).
    pub fn tenant_samples(&self, tenant: &str, outcome: &'static str, n: u64) {
        metrics::counter!(
            TENANT_SAMPLES,
            "backend" => self.label.clone(),
            "tenant" => tenant_label(tenant),
            "outcome" => outcome
        )
        .increment(n);
    }
}

/// NHCB histograms sent to `backend` unrolled into classic series.
pub fn native_histograms_unrolled(backend: &str, n: u64) {
    metrics::counter!(NATIVE_UNROLLED, "backend" => backend.to_string()).increment(n);
}

pub fn samples_dropped(reason: &'static str, n: u64) {
    metrics::counter!(SAMPLES_DROPPED, "reason" => reason).increment(n);
}

/// Tenants with a label value of their own in [`TENANT_SAMPLES`]; the others share
/// `other`, so a sender inventing tenants cannot grow promnorm's `/metrics` without bound.
static TENANTS: std::sync::LazyLock<std::sync::RwLock<(usize, std::collections::HashSet<String>)>> =
    std::sync::LazyLock::new(|| std::sync::RwLock::new((100, std::collections::HashSet::new())));

/// How many tenants get a label value of their own (`limits.max_tenants_in_metrics`;
/// a lower value on reload applies to tenants not seen yet).
pub fn set_tenant_limit(n: usize) {
    if let Ok(mut t) = TENANTS.write() {
        t.0 = n;
    }
}

/// Tenants longer than this share `other` in per-tenant metrics (Mimir's tenant IDs are
/// at most 150 characters; a label value may be 64 KiB, and each of the labelled tenants
/// is repeated in several series on every scrape).
pub const MAX_TENANT_LABEL_BYTES: usize = 256;

/// The label value of `tenant` in per-tenant metrics: its name for the first
/// `limits.max_tenants_in_metrics` tenants seen, `other` after, and for tenants longer
/// than [`MAX_TENANT_LABEL_BYTES`].
pub fn tenant_label(tenant: &str) -> String {
    if tenant.len() > MAX_TENANT_LABEL_BYTES {
        return "other".into();
    }
    if TENANTS.read().is_ok_and(|t| t.1.contains(tenant)) {
        return tenant.to_string();
    }
    let Ok(mut t) = TENANTS.write() else {
        return "other".into();
    };
    if t.1.contains(tenant) || t.1.len() < t.0 {
        t.1.insert(tenant.to_string());
        return tenant.to_string();
    }
    "other".into()
}

/// Samples a backend's queue dropped (`backend_rejected`, `max_age`, `queue_full`,
/// `queue_corrupt`, `shutdown`): the same family as the rules' drops, with the backend.
pub fn samples_dropped_at(reason: &'static str, backend: &str, n: u64) {
    metrics::counter!(SAMPLES_DROPPED, "reason" => reason, "backend" => backend.to_string())
        .increment(n);
}

/// Puts a queued backend's series on /metrics at zero when its queue opens.
pub fn register_queue(backend: &str, max_bytes: u64) {
    let b = || backend.to_string();
    metrics::gauge!(QUEUE_MAX_BYTES, "backend" => b()).set(max_bytes as f64);
    metrics::gauge!(QUEUE_BYTES, "backend" => b()).set(0.0);
    metrics::gauge!(QUEUE_REQUESTS, "backend" => b()).set(0.0);
    metrics::gauge!(QUEUE_OLDEST_AGE, "backend" => b()).set(0.0);
    metrics::gauge!(QUEUE_SEND_LAG, "backend" => b()).set(0.0);
    metrics::counter!(QUEUE_RETRIES, "backend" => b()).absolute(0);
    metrics::counter!(QUEUE_CORRUPT, "backend" => b()).absolute(0);
    for reason in ["full", "disk_full", "io_error", "too_large"] {
        metrics::counter!(QUEUE_REFUSED, "backend" => b(), "reason" => reason).absolute(0);
    }
    for reason in [
        "backend_rejected",
        "max_age",
        "queue_full",
        "queue_corrupt",
        "shutdown",
    ] {
        metrics::counter!(SAMPLES_DROPPED, "reason" => reason, "backend" => b()).absolute(0);
    }
}

/// A queue's state, set at scrape time.
pub fn queue_state(
    backend: &str,
    bytes: u64,
    requests: u64,
    oldest_age: Option<std::time::Duration>,
) {
    let b = || backend.to_string();
    metrics::gauge!(QUEUE_BYTES, "backend" => b()).set(bytes as f64);
    metrics::gauge!(QUEUE_REQUESTS, "backend" => b()).set(requests as f64);
    metrics::gauge!(QUEUE_OLDEST_AGE, "backend" => b())
        .set(oldest_age.map_or(0.0, |d| d.as_secs_f64()));
}

pub fn queue_refused(backend: &str, reason: &'static str) {
    metrics::counter!(QUEUE_REFUSED, "backend" => backend.to_string(), "reason" => reason)
        .increment(1);
}

pub fn queue_corrupt(backend: &str, n: u64) {
    metrics::counter!(QUEUE_CORRUPT, "backend" => backend.to_string()).increment(n);
}

pub fn queue_retry(backend: &str) {
    metrics::counter!(QUEUE_RETRIES, "backend" => backend.to_string()).increment(1);
}

pub fn queue_send_lag(backend: &str, lag: std::time::Duration) {
    metrics::gauge!(QUEUE_SEND_LAG, "backend" => backend.to_string()).set(lag.as_secs_f64());
}

pub fn derived_samples(series: &'static str, n: u64) {
    metrics::counter!(DERIVED_SAMPLES, "series" => series).increment(n);
}

pub fn backend_misconfigured(backend: &str, refused: bool) {
    metrics::gauge!(BACKEND_MISCONFIGURED, "backend" => backend.to_string()).set(if refused {
        1.0
    } else {
        0.0
    });
}

/// A backend's counters at zero from its start: saturation, and the metadata tenant
/// routing drops (`tenancy`).
pub fn register_backend(backend: &str, tenancy: bool) {
    metrics::counter!(BACKEND_SATURATED, "backend" => backend.to_string()).increment(0);
    metrics::counter!(NATIVE_UNROLLED, "backend" => backend.to_string()).increment(0);
    if tenancy {
        for reason in ["no_tenant", "tenant_copies"] {
            metrics::counter!(METADATA_DROPPED, "backend" => backend.to_string(), "reason" => reason)
                .increment(0);
        }
    }
}

/// A request not sent: the backend's `max_concurrent_requests` were in flight.
pub fn backend_saturated(backend: &str) {
    metrics::counter!(BACKEND_SATURATED, "backend" => backend.to_string()).increment(1);
}

/// Metadata entries not sent to `backend` (`reason`: `no_tenant`).
pub fn metadata_dropped(backend: &str, reason: &'static str, n: u64) {
    metrics::counter!(METADATA_DROPPED, "backend" => backend.to_string(), "reason" => reason)
        .increment(n);
}

/// A `protocol: auto` backend turned out to speak only 1.0.
pub fn backend_protocol_fallback(backend: &str) {
    metrics::gauge!(BACKEND_V1_FALLBACK, "backend" => backend.to_string()).set(1.0);
}

// Events that are both logged and counted: one emitter each, so a site cannot do one
// and forget the other (gauges first, then the line: whoever reads it sees the gauges).

/// A reload replaced the running configuration.
pub fn config_reloaded(derived_state_kept: bool, backends_kept: usize) {
    config_loaded(true);
    tracing::info!(derived_state_kept, backends_kept, "configuration reloaded");
}

/// A reload was refused; the running configuration stays.
pub fn config_reload_failed(why: &dyn std::fmt::Display) {
    config_loaded(false);
    tracing::error!("configuration reload failed; the running configuration stays: {why}");
}

/// A `protocol: auto` backend showed it speaks only 1.0 (`why`); it gets 1.0 from now on.
pub fn backend_fell_back_to_v1(backend: &str, why: &str) {
    backend_protocol_fallback(backend);
    tracing::warn!(
        backend = %backend,
        "backend speaks only remote-write 1.0 ({why}); sending it 1.0 from now on"
    );
}

/// A memory queue still held `requests` (`samples`) when `shutdown_timeout` ran out.
pub fn memory_queue_lost_at_shutdown(backend: &str, requests: u64, samples: u64) {
    samples_dropped_at("shutdown", backend, samples);
    tracing::error!(
        backend = %backend,
        requests,
        samples,
        "memory queue not drained before shutdown_timeout: its samples are lost"
    );
}

/// Damaged disk-queue records were skipped (`samples` counted where a record's header
/// survived).
pub fn queue_corrupt_skipped(backend: &str, records: u64, samples: u64, bytes: u64) {
    queue_corrupt(backend, records);
    samples_dropped_at("queue_corrupt", backend, samples);
    tracing::error!(
        backend = %backend,
        records,
        samples,
        bytes,
        "damaged queue data skipped (samples counted when the record's header survived)"
    );
}

static LAST_LOAD: std::sync::Mutex<Option<(bool, std::time::SystemTime)>> =
    std::sync::Mutex::new(None);

/// The last configuration load (start-up or reload): success and when (the web UI).
pub fn last_config_load() -> Option<(bool, std::time::SystemTime)> {
    LAST_LOAD.lock().ok().and_then(|l| *l)
}

/// The outcome of loading the configuration (start-up or reload), as Prometheus writes
/// `prometheus_config_last_reload_*`: a failure leaves the success timestamp as it was.
pub fn config_loaded(success: bool) {
    metrics::gauge!(CONFIG_RELOAD_SUCCESSFUL).set(if success { 1.0 } else { 0.0 });
    if let Ok(mut l) = LAST_LOAD.lock() {
        *l = Some((success, std::time::SystemTime::now()));
    }
    if success {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        metrics::gauge!(CONFIG_RELOAD_SUCCESS_TIMESTAMP).set(now);
    }
}

pub fn connections_open() -> metrics::Gauge {
    metrics::gauge!(CONNECTIONS_OPEN)
}

/// The derive stage's own counts, read at scrape time.
pub struct DerivedState {
    pub series: usize,
    pub evicted_stale: u64,
    pub evicted_limit: u64,
    /// Series and groups not kept for their label set's bytes.
    pub label_bytes: u64,
    pub incomplete: u64,
    pub no_peak: u64,
    pub ranks_gone: u64,
    pub backlog_dropped: u64,
}

pub fn derived_state(s: &DerivedState) {
    metrics::gauge!(DERIVED_STATE_SERIES).set(s.series as f64);
    metrics::counter!(DERIVED_EVICTIONS, "reason" => "stale").absolute(s.evicted_stale);
    metrics::counter!(DERIVED_EVICTIONS, "reason" => "max_series").absolute(s.evicted_limit);
    metrics::counter!(DERIVED_EVICTIONS, "reason" => "label_bytes").absolute(s.label_bytes);
    metrics::counter!(DERIVED_INCOMPLETE).absolute(s.incomplete);
    metrics::counter!(DERIVED_NO_PEAK).absolute(s.no_peak);
    metrics::counter!(DERIVED_RANKS_FORGOTTEN).absolute(s.ranks_gone);
    metrics::counter!(SAMPLES_DROPPED, "reason" => "derived_backlog").absolute(s.backlog_dropped);
}

/// Adds one request's mapping counts to the global counters.
pub fn record_map_stats(rules: &Rules, counters: &MapMetrics, stats: &MapStats) {
    let add = |handles: &[metrics::Counter], counts: &[u64]| {
        for (c, &n) in handles.iter().zip(counts) {
            if n > 0 {
                c.increment(n);
            }
        }
    };
    add(&counters.dropped, &stats.dropped);
    add(&counters.renamed, &stats.renamed);
    add(&counters.rescaled, &stats.rescaled);
    add(&counters.rebucketed, &stats.native_rebucketed);
    if stats.collisions > 0 {
        counters.collisions.increment(stats.collisions);
    }
    if stats.metadata_total_fixes > 0 {
        counters
            .total_fixes
            .get_or_init(|| metrics::counter!(SERIES_RENAMED, "pack" => "metadata_total_fix"))
            .increment(stats.metadata_total_fixes);
    }
    if stats.native_unscaled > 0 {
        counters.native_unscaled.increment(stats.native_unscaled);
    }
    if !stats.renames.is_empty() {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        rules.renames().record(&stats.renames, now_ms);
    }
    if !stats.families().is_empty() {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        rules.families().record_families(stats.families(), now_ms);
    }
}

/// The cut-over tracking metrics, rendered from the rules' tracker at scrape time (one
/// series per old name seen since start; docs/migrations.md).
pub fn rename_metrics_text(rules: &Rules) -> String {
    use std::fmt::Write;
    let seen: Vec<_> = rules
        .renames()
        .snapshot()
        .into_iter()
        .filter(|s| s.samples > 0)
        .collect();
    let mut out = String::new();
    let pack = |i: u16| {
        rules
            .packs()
            .get(i as usize)
            .map(|p| p.name.as_str())
            .unwrap_or("other")
    };
    let esc = |v: &str| {
        v.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
    };
    if seen.is_empty() {
        return out;
    }
    let help = |name: &str| {
        METRICS
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|(_, _, h)| *h)
            .unwrap_or("")
    };
    let _ = writeln!(
        out,
        "# HELP {RENAME_LAST_SEEN} {}\n# TYPE {RENAME_LAST_SEEN} gauge",
        help(RENAME_LAST_SEEN)
    );
    for s in &seen {
        let _ = writeln!(
            out,
            "{RENAME_LAST_SEEN}{{pack=\"{}\",from=\"{}\"}} {}",
            esc(pack(s.pack)),
            esc(&s.from),
            s.last_seen.unwrap_or(0.0)
        );
    }
    let _ = writeln!(
        out,
        "# HELP {RENAME_SAMPLES} {}\n# TYPE {RENAME_SAMPLES} counter",
        help(RENAME_SAMPLES)
    );
    for s in &seen {
        let _ = writeln!(
            out,
            "{RENAME_SAMPLES}{{pack=\"{}\",from=\"{}\"}} {}",
            esc(pack(s.pack)),
            esc(&s.from),
            s.samples
        );
    }
    out
}

/// Logs to stderr: `level` (a `RUST_LOG`-style filter, e.g. `debug` or
/// `promnorm=debug,info`) wins over `RUST_LOG`, default `info`; colours only on a
/// terminal.
pub fn init_logging(json: bool, level: Option<&str>) {
    use std::io::IsTerminal;
    let filter = match level {
        Some(l) => tracing_subscriber::EnvFilter::new(l),
        None => tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

#[cfg(test)]
mod tenant_label_tests {
    use super::*;

    #[test]
    fn long_tenants_share_other() {
        let long = "t".repeat(MAX_TENANT_LABEL_BYTES + 1);
        assert_eq!(tenant_label(&long), "other");
        let fits = "t".repeat(MAX_TENANT_LABEL_BYTES);
        assert_eq!(tenant_label(&fits), fits);
        assert!(TENANTS.read().is_ok_and(|t| !t.1.contains(&long)));
    }
}
