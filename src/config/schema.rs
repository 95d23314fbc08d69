//! The YAML schema: every key promnorm reads, its default and its meaning. A key's doc
//! comment is its reference (README's configuration table and examples/promnorm.full.yaml
//! are checked against this module by tests/it/config_docs.rs and tests/it/config_cli.rs).
#![warn(missing_docs)]

use super::*;

/// promnorm's configuration. Every key has a default (documented on its field); a file
/// overrides the defaults key by key, so an empty file is a valid configuration.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Listen address: `host:port`, `:port` (every IPv4 interface) or `localhost:port`.
    pub listen: String,
    /// Paths that accept remote-write `POST`s.
    pub write_paths: Vec<String>,
    /// `text` or `json` (logs go to stderr; `RUST_LOG` or `--log.level` set the level).
    pub log_format: LogFormat,
    /// Bounds on requests and on the memory promnorm may use (README, "Memory bound").
    pub limits: Limits,
    /// The listener: timeouts, connection limits, TLS (`server.tls`).
    pub server: ServerConfig,
    /// Where normalised data goes. Omitted: one backend, `http://127.0.0.1:9090/api/v1/write`.
    pub backends: Vec<BackendConfig>,
    /// The mapping packs: built-in ones on/off, users' files, per-pack overrides.
    pub packs: PacksConfig,
    /// Also forward the original series beside each renamed one (migration windows).
    pub keep_original: bool,
    /// Drop `*_created` series (they hold a timestamp, not a value).
    pub drop_created_series: bool,
    /// The one spelling OpenTelemetry-originated names are written in (issue 22).
    pub otel_names: OtelNamesConfig,
    /// Give `_total` to series of families that metadata says are counters and that no
    /// pack knows (learnt across requests; names change once the metadata arrives).
    pub metadata_total_fix: bool,
    /// Senders must present `Authorization: Bearer …`.
    pub ingest_auth: Option<IngestAuth>,
    /// On SIGTERM/SIGINT, how long in-flight requests may finish.
    #[serde(deserialize_with = "de_duration", serialize_with = "se_duration")]
    pub shutdown_timeout: Duration,
    /// Derived series (hit rates, MFU, …; docs/derived.md).
    pub derived: DerivedConfig,
    /// Tenant routing for every backend (docs/tenancy.md); a backend's own `tenancy`
    /// replaces it. Omitted: no routing, each request goes whole.
    pub tenancy: Option<TenancyConfig>,
    /// The web UI and its dry-run APIs (docs/ui.md).
    pub web: WebConfig,
    /// The Prometheus query API that answers queries written against the old names and
    /// units from the normalised data and the history under the old names (docs/query.md).
    /// Omitted: no query API.
    pub query: Option<QueryConfig>,
    /// Re-exposition of the forwarded series at `GET /federate`, for collectors that pull
    /// (docs/federate.md). Omitted: no `/federate`.
    pub exposition: Option<ExpositionConfig>,
    /// Targets promnorm scrapes itself, their series fed into the pipeline like a pushed
    /// request (docs/scrape.md). Omitted: no scraping.
    pub scrape: Option<ScrapeConfig>,
    /// Where this configuration was read from, for error positions.
    #[serde(skip)]
    pub source: Option<ConfigSource>,
}

/// The file a configuration came from and its text.
#[derive(Debug, Clone, Default)]
pub struct ConfigSource {
    /// The file name as given (`<embedded default>` for the built-in configuration).
    pub file: String,
    /// The whole text, to find the position of a value an error is about.
    pub text: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "0.0.0.0:9201".into(),
            write_paths: vec!["/api/v1/write".into(), "/api/v1/push".into()],
            log_format: LogFormat::Text,
            limits: Limits::default(),
            server: ServerConfig::default(),
            backends: vec![BackendConfig {
                name: Some("default".into()),
                ..BackendConfig::from_url("http://127.0.0.1:9090/api/v1/write".into())
            }],
            packs: PacksConfig::default(),
            keep_original: false,
            drop_created_series: true,
            otel_names: OtelNamesConfig::default(),
            metadata_total_fix: false,
            ingest_auth: None,
            shutdown_timeout: Duration::from_secs(30),
            derived: DerivedConfig::default(),
            tenancy: None,
            web: WebConfig::default(),
            query: None,
            exposition: None,
            scrape: None,
            source: None,
        }
    }
}

/// `query`: the Prometheus HTTP query API on promnorm's listener (docs/query.md).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct QueryConfig {
    /// Root of the backend's Prometheus-compatible query API: `http://prometheus:9090`,
    /// `http://mimir:8080/prometheus`, `http://victoria-metrics:8428`,
    /// `http://thanos-query:10902` (`/api/v1/query` and the rest are appended).
    pub upstream: String,
    /// One question to the upstream, from connect to the last byte of its answer.
    #[serde(
        default = "default_query_timeout",
        deserialize_with = "de_duration",
        serialize_with = "se_duration"
    )]
    pub timeout: Duration,
    /// An upstream answer larger than this is not read: the caller gets `422`
    /// (`errorType: execution`).
    #[serde(default = "default_query_max_response_bytes")]
    pub max_response_bytes: ByteSize,
    /// Queries answered at once; more wait for a slot (up to `timeout`, then `503`).
    #[serde(default = "default_query_max_concurrent")]
    pub max_concurrent: usize,
    /// Also ask the upstream for the data stored under the old names (history from
    /// before promnorm, or from `keep_original`) and merge it with the new names' data.
    #[serde(default = "default_true")]
    pub merge_old_names: bool,
    /// Extra headers on every upstream request (they replace the caller's of that name).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Basic auth to the upstream (replaces the caller's `Authorization`).
    #[serde(default)]
    pub basic_auth: Option<BasicAuth>,
    /// Bearer token to the upstream (replaces the caller's `Authorization`).
    #[serde(default)]
    pub bearer_token: Option<Secret>,
    /// TLS to an `https://` upstream.
    #[serde(default)]
    pub tls: TlsConfig,
}

fn default_query_timeout() -> Duration {
    Duration::from_secs(120)
}

fn default_query_max_response_bytes() -> ByteSize {
    ByteSize(16 << 20)
}

fn default_query_max_concurrent() -> usize {
    16
}

/// `exposition`: the last forwarded sample of every series, served at `GET /federate`
/// (docs/federate.md).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExpositionConfig {
    /// A series not forwarded again within this is no longer served.
    #[serde(deserialize_with = "de_duration", serialize_with = "se_duration")]
    pub ttl: Duration,
    /// Series held at most (about 160 bytes plus the label bytes each); past it the
    /// least recently updated are evicted and counted.
    pub max_series: usize,
}

impl Default for ExpositionConfig {
    fn default() -> Self {
        ExpositionConfig {
            ttl: Duration::from_secs(300),
            max_series: 200_000,
        }
    }
}

/// `scrape`: targets promnorm scrapes (docs/scrape.md).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScrapeConfig {
    /// Time between two scrapes of a target; targets are spread over it.
    #[serde(deserialize_with = "de_duration", serialize_with = "se_duration")]
    pub interval: Duration,
    /// One scrape, connect to last byte; at most `interval`.
    #[serde(deserialize_with = "de_duration", serialize_with = "se_duration")]
    pub timeout: Duration,
    /// A larger answer (after gzip) fails the scrape (`up` 0).
    pub max_body_bytes: ByteSize,
    /// A target's series keep their own labels where they clash with the target's
    /// (else theirs become `exported_<name>`), as Prometheus' `honor_labels`.
    pub honor_labels: bool,
    /// Keep the timestamps a target writes (else every sample gets the scrape's time).
    pub honor_timestamps: bool,
    /// Static targets.
    pub targets: Vec<ScrapeTargetConfig>,
    /// Files of targets in Prometheus' `file_sd` format (JSON or YAML; globs), reread
    /// when they change.
    pub file_sd: Vec<String>,
    /// How often the `file_sd` files are checked for changes.
    #[serde(deserialize_with = "de_duration", serialize_with = "se_duration")]
    pub file_sd_refresh: Duration,
    /// URL query parameters of every target (name → values), as Prometheus' `params`;
    /// a target's own `params`, or a `file_sd` group's `__param_<name>` label, replaces
    /// the first value of that name.
    pub params: BTreeMap<String, Vec<String>>,
}

impl Default for ScrapeConfig {
    fn default() -> Self {
        ScrapeConfig {
            interval: Duration::from_secs(15),
            timeout: Duration::from_secs(10),
            max_body_bytes: ByteSize::mib(64),
            honor_labels: false,
            honor_timestamps: true,
            targets: Vec::new(),
            file_sd: Vec::new(),
            file_sd_refresh: Duration::from_secs(5),
            params: BTreeMap::new(),
        }
    }
}

/// One static scrape target.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ScrapeTargetConfig {
    /// `http://host:port/path` of the target's exposition.
    pub url: String,
    /// Labels on every series of the target (`job` and `instance` among them; without
    /// them `job` is `scrape` and `instance` the URL's `host:port`).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// URL query parameters of this target; each name replaces the first value of the
    /// same name in `scrape.params`.
    #[serde(default)]
    pub params: BTreeMap<String, Vec<String>>,
}

/// One group of a `file_sd` file (Prometheus' format).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSdGroup {
    /// `host:port` of each target.
    pub targets: Vec<String>,
    /// Labels of every target of the group (`__scheme__`, `__metrics_path__` shape
    /// the URL).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// The web UI (docs/ui.md). Restart-only: a reload keeps the running values.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebConfig {
    /// Serve the pages (`/`, `/rules`, `/explain`, `/debug/normalize`) and the dry-run
    /// APIs (`/api/v1/explain`, `/api/v1/normalize`).
    pub enabled: bool,
    /// Serve them under this path (e.g. `/promnorm`), as Prometheus'
    /// `--web.route-prefix`; none: at the root.
    pub route_prefix: Option<String>,
    /// Protect the pages and APIs: a bearer token or basic auth. None: open.
    pub auth: Option<WebAuth>,
    /// Serve the live tap (`/debug/tap`, `/api/v1/tap`): it shows forwarded data.
    pub enable_debug: bool,
}

impl Default for WebConfig {
    fn default() -> Self {
        WebConfig {
            enabled: true,
            route_prefix: None,
            auth: None,
            enable_debug: false,
        }
    }
}

/// `web.auth`: a bearer token or basic auth (as the ingest auth) that every UI page and
/// API needs; `/metrics`, the health endpoints and remote-write are not affected.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WebAuth {
    /// `Authorization: Bearer <token>` with the secret's value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token: Option<Secret>,
    /// `Authorization: Basic …` with this user name and password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic: Option<BasicAuth>,
}

/// Derived series (docs/derived.md).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DerivedConfig {
    /// Compute the derived series at all.
    pub enabled: bool,
    /// Compute against the oldest point within this window instead of the previous one.
    #[serde(
        deserialize_with = "de_opt_duration",
        serialize_with = "se_opt_duration"
    )]
    pub window: Option<Duration>,
    /// A derived series without a new input sample for this long is forgotten (and gets
    /// a stale marker).
    #[serde(deserialize_with = "de_duration", serialize_with = "se_duration")]
    pub stale_after: Duration,
    /// Derived series kept at most (about 400 bytes each); `auto`: from the memory
    /// limit (`config::memory`), at most 1,000,000.
    pub max_series: AutoCount,
    /// Derived samples waiting for the writer at most; `auto`: as many as `max_series`.
    pub max_pending_samples: AutoCount,
    /// How often the writer sends queued derived samples.
    #[serde(deserialize_with = "de_duration", serialize_with = "se_duration")]
    pub flush_interval: Duration,
    /// Peak FLOP/s and bandwidth per hardware, for MFU and bandwidth utilisation.
    pub peaks: Vec<PeakConfig>,
}

impl Default for DerivedConfig {
    fn default() -> Self {
        DerivedConfig {
            enabled: true,
            window: None,
            stale_after: Duration::from_secs(600),
            max_series: AutoCount::Auto,
            max_pending_samples: AutoCount::Auto,
            flush_interval: Duration::from_secs(1),
            peaks: Vec::new(),
        }
    }
}

/// Peak FLOP/s and memory bandwidth for the series whose labels match `match` exactly:
/// numbers, or a GPU model from the built-in table (numbers override the model's).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PeakConfig {
    /// Label matchers (`name: value`, exact) selecting the series these peaks apply to.
    #[serde(rename = "match", default)]
    pub matchers: BTreeMap<String, String>,
    /// A GPU model of the built-in table (e.g. `H100-SXM`) giving both peaks.
    #[serde(default)]
    pub gpu: Option<String>,
    /// Peak FLOP/s (overrides the model's).
    #[serde(default)]
    pub flops: Option<f64>,
    /// Peak memory bandwidth in bytes/s (overrides the model's).
    #[serde(default)]
    pub bandwidth: Option<f64>,
}

/// `log_format`.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `limits`: what one request and all requests together may hold (413/429 beyond).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Percent of the memory limit (the container's cgroup limit, else the host's
    /// memory) that the `auto` sizes may use together, README's memory bound included
    /// (as vmagent's `-memory.allowedPercent`).
    pub memory_allowed_percent: u8,
    /// Larger compressed bodies get `413`. `auto`: `max_inflight_bytes / 4`, at most
    /// 32 MiB.
    pub max_body_bytes: AutoSize,
    /// A body whose snappy header declares more decoded bytes gets `413`, before
    /// anything is allocated. `auto`: the rest of `max_inflight_bytes` after
    /// `max_body_bytes`, at most 256 MiB.
    pub max_decoded_bytes: AutoSize,
    /// More series in one request gets `413`.
    pub max_series_per_request: usize,
    /// A series with more labels gets the request `400` (receivers such as Mimir would
    /// reject the whole batch).
    pub max_labels_per_series: usize,
    /// A label value longer than this gets the request `400`.
    pub max_label_value_bytes: ByteSize,
    /// Bytes all requests in progress may hold together: each holds its compressed body
    /// (reserved from `Content-Length` before it is read, else as it streams) and the
    /// decoded size its snappy header declares, until it is answered (waiting on
    /// backends included). A request that does not fit gets `429` with `Retry-After`.
    /// Must be at least `max_body_bytes + max_decoded_bytes`. `auto`: from the memory
    /// limit, so that README's bound stays within `memory_allowed_percent` of it
    /// (`config::memory`).
    pub max_inflight_bytes: AutoSize,
    /// Remote-write requests in progress at most; beyond it `429` with `Retry-After`
    /// before the body is read.
    pub max_concurrent_requests: usize,
    /// Tenants with a `tenant` label value of their own in promnorm's per-tenant
    /// metrics; later ones, and tenants longer than 256 bytes, are counted as `other`.
    pub max_tenants_in_metrics: usize,
    /// Active series per metric name (per tenant under tenancy); a new series past it
    /// is left out, the rest of its request goes on (docs/limits.md). `0`: off.
    pub max_series_per_metric: usize,
    /// Active series per tenant (all series without tenancy); `0`: off.
    pub max_series_per_tenant: usize,
    /// A series is active while it had a sample within this window.
    #[serde(deserialize_with = "de_duration", serialize_with = "se_duration")]
    pub active_series_window: Duration,
    /// A series with more labels is left out, the rest of its request goes on. `0`: off.
    pub series_max_labels: usize,
    /// A series with a longer label value is left out, the rest goes on. `0`: off.
    pub series_max_label_value_bytes: ByteSize,
    /// Series the cardinality tracker holds at most (56 bytes each at most). With a
    /// series limit on, a new series past it is left out (`reason="max_tracked_series"`);
    /// without one, the cardinality view samples series beyond it. `auto`: from the
    /// memory limit (`config::memory`), at most 1,000,000.
    pub max_tracked_series: AutoCount,
    /// Per-tenant limits replacing `max_series_per_metric` and `max_series_per_tenant`
    /// for that tenant (the tenant as `tenancy` names it).
    pub tenant_overrides: std::collections::BTreeMap<String, TenantLimits>,
}

/// `limits.tenant_overrides.<tenant>`: the series limits of one tenant; a key left out
/// keeps the global value.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TenantLimits {
    /// This tenant's `limits.max_series_per_metric`.
    pub max_series_per_metric: Option<usize>,
    /// This tenant's `limits.max_series_per_tenant`.
    pub max_series_per_tenant: Option<usize>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_allowed_percent: 60,
            max_body_bytes: AutoSize::Auto,
            max_decoded_bytes: AutoSize::Auto,
            max_series_per_request: 1_000_000,
            max_labels_per_series: 1_000,
            max_label_value_bytes: ByteSize(64 << 10),
            max_inflight_bytes: AutoSize::Auto,
            max_concurrent_requests: 1024,
            max_tenants_in_metrics: 100,
            max_series_per_metric: 0,
            max_series_per_tenant: 0,
            active_series_window: Duration::from_secs(600),
            series_max_labels: 0,
            series_max_label_value_bytes: ByteSize(0),
            max_tracked_series: AutoCount::Auto,
            tenant_overrides: Default::default(),
        }
    }
}

/// Connection hygiene of the listener: slow or idle clients cannot hold it.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// A client must send a request's complete headers within this.
    #[serde(deserialize_with = "de_duration", serialize_with = "se_duration")]
    pub header_read_timeout: Duration,
    /// A client must send a request's complete body within this once its headers are in
    /// (`408` otherwise).
    #[serde(deserialize_with = "de_duration", serialize_with = "se_duration")]
    pub body_read_timeout: Duration,
    /// A keep-alive connection with no request for this long is closed.
    #[serde(deserialize_with = "de_duration", serialize_with = "se_duration")]
    pub idle_timeout: Duration,
    /// Open connections at most; beyond it new ones wait in the listen backlog. Lowered
    /// at start to stay below the process' file-descriptor limit.
    pub max_connections: usize,
    /// Length of the kernel's queue of connections not yet accepted.
    pub listen_backlog: u32,
    /// The status promnorm answers when it is full (a backend queue out of room or disk)
    /// and the sender should retry later: `429` (with `Retry-After`) or `503`. Prometheus
    /// retries a 429 only with `queue_config.retry_on_http_429: true` (default false):
    /// without it, choose 503.
    pub throttle_status: u16,
    /// Serve HTTPS (HTTP/1.1 and HTTP/2 by ALPN) instead of cleartext. Omitted: cleartext
    /// HTTP/1.1 and h2c.
    pub tls: Option<ServerTlsConfig>,
}

/// TLS on the listener. The files are re-read when they change (checked at most once a
/// second, on a handshake); a new file that does not load keeps the old certificate and
/// is logged.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServerTlsConfig {
    /// PEM certificate chain, the server's certificate first.
    pub cert_file: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of that certificate.
    pub key_file: PathBuf,
    /// PEM CA certificates: when set, every client must present a certificate signed by
    /// one of them (mutual TLS).
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            header_read_timeout: Duration::from_secs(30),
            body_read_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(300),
            max_connections: 10_000,
            listen_backlog: 4096,
            throttle_status: 429,
            tls: None,
        }
    }
}

/// One remote-write backend (`backends[]`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// The name in logs, metrics and the UI (default `default` for the first backend,
    /// `backend<N>` after it).
    #[serde(default)]
    pub name: Option<String>,
    /// The remote-write URL (`http://` or `https://`); `user:pass@` in it becomes basic
    /// auth and is never logged.
    pub url: String,
    #[serde(
        default = "default_timeout",
        deserialize_with = "de_duration",
        serialize_with = "se_duration"
    )]
    /// How long one request to this backend may take before it counts as failed (retried).
    pub timeout: Duration,
    /// Requests in flight to this backend at once (pooled connections); a request that
    /// finds no slot within 1s is answered `429` unsent. Bounds tenant routing's fan-out.
    #[serde(default = "default_max_concurrent_requests")]
    pub max_concurrent_requests: usize,
    /// Extra headers set on every request (e.g. `X-Scope-OrgID`).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Headers of the sender's request copied through (e.g. `X-Scope-OrgID`, `Authorization`).
    #[serde(default)]
    pub pass_headers: Vec<String>,
    /// Basic auth sent to this backend.
    #[serde(default)]
    pub basic_auth: Option<BasicAuth>,
    /// `Authorization: Bearer` sent to this backend.
    #[serde(default)]
    pub bearer_token: Option<Secret>,
    /// TLS towards this backend (`https://` URLs).
    #[serde(default)]
    pub tls: TlsConfig,
    /// Delivery queue (docs/queues.md); `type: none` forwards synchronously.
    #[serde(default)]
    pub queue: QueueConfig,
    /// Remote-write version sent to this backend: `v1`, `v2`, or `auto` (2.0 until the
    /// backend shows it speaks only 1.0, then 1.0 for good).
    #[serde(default)]
    pub protocol: BackendProtocolConfig,
    /// This backend's tenant routing, replacing the global `tenancy`
    /// (`tenancy: {enabled: false}` turns it off for this backend).
    #[serde(default)]
    pub tenancy: Option<TenancyConfig>,
    /// What this backend gets of native histograms with custom buckets (NHCB):
    /// `auto` (unrolled into classic series when sent as 1.0, kept in 2.0), `as_is`,
    /// `classic` (unrolled in 1.0 and 2.0).
    #[serde(default)]
    pub native_histograms: NativeHistogramsConfig,
}

/// `backends[].native_histograms`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NativeHistogramsConfig {
    /// NHCB unrolled into classic series when the body is 1.0, kept in 2.0.
    #[default]
    Auto,
    /// Sent as they arrived, whatever the version.
    AsIs,
    /// Always unrolled into classic `_bucket`/`_sum`/`_count` series.
    Classic,
}

/// Tenant routing (docs/tenancy.md): each request's series are split by the value of a
/// label into one request per tenant, sent with the tenant in a header.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TenancyConfig {
    /// `false` turns routing off (for one backend, under a global `tenancy`).
    pub enabled: bool,
    /// The label whose value names the tenant.
    pub label: String,
    /// The header that carries the tenant (`X-Scope-OrgID` for Mimir, Cortex, Loki).
    pub header: String,
    /// The tenant of series without the label (or with it empty). Unset: they keep the
    /// sender's own tenant header, when it sent one.
    pub default: Option<String>,
    /// Keep the tenant label on the forwarded series (removed by default).
    pub keep_label: bool,
    /// A request naming more tenants gets `400` (its samples are counted as dropped,
    /// `too_many_tenants`).
    pub max_tenants_per_request: usize,
}

impl Default for TenancyConfig {
    fn default() -> Self {
        TenancyConfig {
            enabled: true,
            label: "tenant".into(),
            header: "X-Scope-OrgID".into(),
            default: None,
            keep_label: false,
            max_tenants_per_request: 1000,
        }
    }
}

/// `queue.max_samples_per_send` unset.
pub const DEFAULT_MAX_SAMPLES_PER_SEND: u64 = 10_000;

/// A backend's delivery queue.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueConfig {
    /// `none`: the sender waits for the backend and gets its answer; `memory` or
    /// `disk`: the sender gets 204 once the data is queued, the queue delivers it.
    #[serde(rename = "type")]
    pub kind: QueueType,
    /// Directory of a `disk` queue (required for `disk`; one per backend; relative to
    /// the configuration file).
    pub dir: Option<PathBuf>,
    /// Bytes the queue may hold; beyond it the sender gets 429 (`when_full: reject`).
    /// `auto`: `memory` queues share a quarter of what the memory limit leaves
    /// (`config::memory`), each at most 512 MiB; `disk`: 512 MiB.
    pub max_bytes: AutoSize,
    /// `disk`: appended records are fsynced at least this often; `0s` fsyncs before
    /// the sender is answered.
    #[serde(deserialize_with = "de_duration", serialize_with = "se_duration")]
    pub fsync_interval: Duration,
    /// Requests queued longer than this are dropped (counted) instead of sent; unset
    /// keeps them until delivered.
    #[serde(
        deserialize_with = "de_opt_duration",
        serialize_with = "se_opt_duration"
    )]
    pub max_age: Option<Duration>,
    /// Senders per backend, each with one request in flight; requests are split by
    /// series so that every series keeps its order.
    pub shards: usize,
    /// `reject` (429, the sender's WAL keeps the data) or `drop_oldest` (counted).
    pub when_full: WhenFullConfig,
    /// A backlog of 1.0 requests is sent as merged requests of up to this many samples
    /// (each series still in order); `1` sends every queued request as it came.
    pub max_samples_per_send: u64,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            kind: QueueType::None,
            dir: None,
            max_bytes: AutoSize::Auto,
            fsync_interval: Duration::from_secs(1),
            max_age: None,
            shards: 1,
            when_full: WhenFullConfig::Reject,
            max_samples_per_send: DEFAULT_MAX_SAMPLES_PER_SEND,
        }
    }
}

/// `backends[].queue.type`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueType {
    /// No queue: each request is forwarded before the sender is answered.
    #[default]
    None,
    /// A bounded in-memory queue (lost on restart).
    Memory,
    /// A bounded on-disk queue that survives restarts (fsynced per `fsync_interval`).
    Disk,
}

/// `backends[].queue.when_full`: what a full queue does with a new request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WhenFullConfig {
    /// Refuse it with `429` (the sender retries; nothing is lost).
    #[default]
    Reject,
    /// Make room by dropping the oldest queued data (counted as dropped).
    DropOldest,
}

/// `backends[].protocol`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendProtocolConfig {
    /// Remote-write 1.0, what every receiver accepts.
    #[default]
    V1,
    /// Remote-write 2.0.
    V2,
    /// 2.0, falling back to 1.0 for good on a `415` or a `2xx` without the written headers.
    Auto,
}

impl BackendConfig {
    /// A backend with every setting at its default.
    pub fn from_url(url: String) -> BackendConfig {
        BackendConfig {
            name: None,
            url,
            timeout: default_timeout(),
            max_concurrent_requests: default_max_concurrent_requests(),
            headers: BTreeMap::new(),
            pass_headers: Vec::new(),
            basic_auth: None,
            bearer_token: None,
            tls: TlsConfig::default(),
            queue: QueueConfig::default(),
            protocol: BackendProtocolConfig::default(),
            tenancy: None,
            native_histograms: NativeHistogramsConfig::default(),
        }
    }

    /// The tenant routing this backend uses: its own `tenancy`, else the global one;
    /// `None` when off.
    pub fn effective_tenancy<'a>(
        &'a self,
        global: Option<&'a TenancyConfig>,
    ) -> Option<&'a TenancyConfig> {
        self.tenancy.as_ref().or(global).filter(|t| t.enabled)
    }

    /// The name in promnorm's metrics and logs: `name`, else `default` for the first
    /// backend and `backend<i>` for the others.
    pub fn name_or_default(&self, index: usize) -> String {
        match &self.name {
            Some(n) => n.clone(),
            None if index == 0 => "default".into(),
            None => format!("backend{index}"),
        }
    }
}

/// A secret read from a file or an environment variable, never written inline in the
/// configuration. (A password written in a backend URL is held here too, taken out of
/// the URL; `Debug` never shows it.)
#[derive(Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Secret {
    /// Read the secret from this file (trailing newline removed), when it is read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
    /// Read the secret from this environment variable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    #[serde(skip)]
    inline: Option<String>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secret")
            .field("file", &self.file)
            .field("env", &self.env)
            .field("inline", &self.inline.as_ref().map(|_| "<secret>"))
            .finish()
    }
}

impl Secret {
    /// A secret that came from somewhere other than the configuration file.
    pub fn inline(value: String) -> Secret {
        Secret {
            file: None,
            env: None,
            inline: Some(value),
        }
    }

    /// The secret's value, read now (a file is read again on every call, so a rotated
    /// file takes effect at the next reload).
    pub fn read(&self) -> Result<String, SecretError> {
        if let Some(v) = &self.inline {
            return Ok(v.clone());
        }
        match (&self.file, &self.env) {
            (Some(f), None) => std::fs::read_to_string(f)
                .map(|s| s.trim_end_matches(['\n', '\r']).to_string())
                .map_err(|e| SecretError::Unreadable {
                    file: f.display().to_string(),
                    source: e,
                }),
            (None, Some(v)) => {
                std::env::var(v).map_err(|_| SecretError::EnvUnset { var: v.clone() })
            }
            _ => Err(SecretError::NoSource),
        }
    }
}

/// User name and password for HTTP basic auth.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BasicAuth {
    /// The user name (not secret).
    pub username: String,
    /// The password, from a file or an environment variable.
    pub password: Secret,
}

/// `backends[].tls`: how a backend's certificate is checked.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM file of the CAs that sign the backend's certificate (default: the Web PKI roots).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Accept any certificate (testing only; logged as a warning).
    #[serde(default)]
    pub insecure_skip_verify: bool,
}

/// Authentication of senders: a bearer token they must present.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct IngestAuth {
    /// The token senders must send as `Authorization: Bearer <token>`.
    pub bearer_token: Secret,
}

/// `packs`: which mapping packs run, and their per-pack options.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PacksConfig {
    /// `all`, `none`, or a map of pack name → on/off (unlisted packs keep their default:
    /// on, except packs declaring `default: off` such as `genai`).
    #[serde(default)]
    pub builtin: BuiltinPacks,
    /// Users' own mapping files, applied after the built-in packs.
    #[serde(default)]
    pub files: Vec<PathBuf>,
    /// Per-pack `keep_original` overrides.
    #[serde(default)]
    pub keep_original: BTreeMap<String, bool>,
    /// Per-pack overrides of `rank_dedup.sum_over_ranks` (e.g. `{sglang: true}`).
    #[serde(default)]
    pub sum_over_ranks: BTreeMap<String, bool>,
    /// The `genai` pack's values of the attributes the OpenTelemetry GenAI conventions
    /// require (`gen_ai_operation_name`, `gen_ai_provider_name`).
    #[serde(default)]
    pub genai: GenaiOptions,
}

/// `otel_names`: how names (and attribute label names) of OpenTelemetry instruments that
/// packs declare are spelt on the way out, whichever of the four spellings they arrive in.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct OtelNamesConfig {
    /// The spelling (default: Prometheus' `underscore_with_suffixes`).
    pub strategy: OtelNamesStrategy,
}

/// Prometheus' OTLP translation strategies, by what they write: `_` for every character
/// outside `[a-zA-Z0-9_:]` or the name as it is (UTF-8), with or without the unit and
/// `_total` suffixes. The default is Prometheus 2.x's and 3.x's
/// (`UnderscoreEscapingWithSuffixes`).
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OtelNamesStrategy {
    /// `_` for other characters, unit and `_total` suffixes added.
    #[default]
    UnderscoreWithSuffixes,
    /// `_` for other characters, no suffixes added.
    UnderscoreWithoutSuffixes,
    /// The names as they are (UTF-8, needs 2.0 or quoting), suffixes added.
    Utf8WithSuffixes,
    /// The names as they are (UTF-8), no suffixes added.
    Utf8WithoutSuffixes,
}

/// Values of the `genai` copies' required attributes that no engine series carries.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct GenaiOptions {
    /// `gen_ai_operation_name` of copies whose engine series say nothing of the endpoint
    /// (every engine today: their latency histograms carry no endpoint label).
    #[serde(default = "default_genai_operation")]
    pub operation_name: String,
    /// Engine (`vllm`, `sglang`, `dynamo`, …) → `gen_ai_provider_name`; an engine not
    /// listed is its own provider name.
    #[serde(default)]
    pub provider_names: BTreeMap<String, String>,
}

impl Default for GenaiOptions {
    fn default() -> Self {
        GenaiOptions {
            operation_name: default_genai_operation(),
            provider_names: BTreeMap::new(),
        }
    }
}

fn default_genai_operation() -> String {
    "chat".into()
}

impl Default for PacksConfig {
    fn default() -> Self {
        PacksConfig {
            builtin: BuiltinPacks::All,
            files: Vec::new(),
            keep_original: BTreeMap::new(),
            sum_over_ranks: BTreeMap::new(),
            genai: GenaiOptions::default(),
        }
    }
}

/// `packs.builtin`: `all`, `none`, or a map of pack name → on/off.
#[derive(Debug, Clone, Default)]
pub enum BuiltinPacks {
    /// Every built-in pack with its default (`default: off` packs stay off).
    #[default]
    All,
    /// No built-in pack.
    None,
    /// Listed packs as given; unlisted ones keep their default.
    Select(BTreeMap<String, bool>),
}

impl Serialize for BuiltinPacks {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            BuiltinPacks::All => s.serialize_str("all"),
            BuiltinPacks::None => s.serialize_str("none"),
            BuiltinPacks::Select(m) => m.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for BuiltinPacks {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Word(String),
            Map(BTreeMap<String, bool>),
        }
        match Raw::deserialize(d)? {
            Raw::Word(w) if w == "all" => Ok(BuiltinPacks::All),
            Raw::Word(w) if w == "none" => Ok(BuiltinPacks::None),
            Raw::Word(w) => Err(serde::de::Error::custom(format!(
                "builtin must be all, none or a map of pack: true|false, not {w:?}"
            ))),
            Raw::Map(m) => Ok(BuiltinPacks::Select(m)),
        }
    }
}

fn default_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_max_concurrent_requests() -> usize {
    64
}

fn se_duration<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_duration(*d))
}

fn se_opt_duration<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_str(&format_duration(*d)),
        None => s.serialize_none(),
    }
}

/// Reads a duration inside the deserializer's own call, so that serde_yaml puts the
/// value's line and column (not its mapping's) on a refused one.
struct DurationVisitor;

impl serde::de::Visitor<'_> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a duration such as 500ms, 30s, 1m30s")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Duration, E> {
        parse_duration(v).map_err(E::custom)
    }
}

fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    d.deserialize_str(DurationVisitor)
}

fn de_opt_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    struct OptVisitor;
    impl<'de> serde::de::Visitor<'de> for OptVisitor {
        type Value = Option<Duration>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a duration such as 500ms, 30s, 1m30s, or nothing")
        }

        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            de_duration(d).map(Some)
        }
    }
    d.deserialize_option(OptVisitor)
}

fn default_true() -> bool {
    true
}
