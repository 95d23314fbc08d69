//! Configuration: the YAML schema, its defaults and validation.

mod error;
pub mod memory;
mod size;
pub mod yaml;

pub use error::{ByteSizeError, ConfigError, DurationError, ListenError, SecretError, UrlError};
pub use memory::{LimitSource, MemoryLimit, Sizing};
pub use size::{AutoCount, AutoSize, ByteSize, format_byte_size, human_bytes, parse_byte_size};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The embedded default configuration.
pub const DEFAULT_CONFIG: &str = include_str!("default.yaml");

// The built-in packs (`BUILTIN_PACKS`), embedded at build time from `mappings/` by build.rs.
include!(concat!(env!("OUT_DIR"), "/builtin_packs.rs"));

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
    pub limits: Limits,
    pub server: ServerConfig,
    /// Where normalised data goes. Omitted: one backend, `http://127.0.0.1:9090/api/v1/write`.
    pub backends: Vec<BackendConfig>,
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
    pub derived: DerivedConfig,
    /// Tenant routing for every backend (docs/tenancy.md); a backend's own `tenancy`
    /// replaces it. Omitted: no routing, each request goes whole.
    pub tenancy: Option<TenancyConfig>,
    /// The web UI and its dry-run APIs (docs/ui.md).
    pub web: WebConfig,
    /// Where this configuration was read from, for error positions.
    #[serde(skip)]
    pub source: Option<ConfigSource>,
}

/// The file a configuration came from and its text.
#[derive(Debug, Clone, Default)]
pub struct ConfigSource {
    pub file: String,
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
            source: None,
        }
    }
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

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WebAuth {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token: Option<Secret>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic: Option<BasicAuth>,
}

/// Derived series (docs/derived.md).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DerivedConfig {
    pub enabled: bool,
    /// Compute against the oldest point within this window instead of the previous one.
    #[serde(
        deserialize_with = "de_opt_duration",
        serialize_with = "se_opt_duration"
    )]
    pub window: Option<Duration>,
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
    #[serde(rename = "match", default)]
    pub matchers: BTreeMap<String, String>,
    #[serde(default)]
    pub gpu: Option<String>,
    #[serde(default)]
    pub flops: Option<f64>,
    #[serde(default)]
    pub bandwidth: Option<f64>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

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
    /// metrics; later ones are counted as `other`.
    pub max_tenants_in_metrics: usize,
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

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    #[serde(default)]
    pub name: Option<String>,
    pub url: String,
    #[serde(
        default = "default_timeout",
        deserialize_with = "de_duration",
        serialize_with = "se_duration"
    )]
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
    #[serde(default)]
    pub basic_auth: Option<BasicAuth>,
    #[serde(default)]
    pub bearer_token: Option<Secret>,
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
    #[default]
    Auto,
    AsIs,
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
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueType {
    #[default]
    None,
    Memory,
    Disk,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WhenFullConfig {
    #[default]
    Reject,
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

/// Headers a sender's request cannot lend a backend request: they describe the framing
/// of the sender's body or the sender's hop, not the re-encoded body promnorm sends.
pub const UNPASSABLE_HEADERS: &[&str] = &[
    "content-length",
    "content-encoding",
    "content-type",
    "transfer-encoding",
    "connection",
    "host",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "x-prometheus-remote-write-version",
];

/// Why `pass_headers` may not name `header`, if it may not.
pub fn unpassable_header_reason(header: &str) -> Option<&'static str> {
    let h = header.to_ascii_lowercase();
    if h.starts_with("proxy-") || UNPASSABLE_HEADERS.contains(&h.as_str()) {
        Some(
            "framing, hop-by-hop and remote-write protocol headers are set by promnorm for the body it sends",
        )
    } else {
        None
    }
}

/// A backend URL as promnorm uses it: credentials written in it (`user:pass@`) are
/// taken out, to become basic auth, so the URL can be logged and labelled safely.
#[derive(Clone, Debug)]
pub struct BackendUrl {
    pub uri: http::Uri,
    pub userinfo: Option<(String, String)>,
}

/// Parses a backend URL: `http://` or `https://` with a host. Errors never repeat
/// credentials written in the URL.
pub fn parse_backend_url(raw: &str) -> Result<BackendUrl, UrlError> {
    let (without_userinfo, userinfo) = split_userinfo(raw);
    let shown = redact_url(raw);
    if userinfo.is_some_and(|u| u.contains(['/', '?', '#'])) {
        // Unencoded, these would move the credentials into the host or the path, and
        // the password into logs.
        return Err(UrlError::UnencodedCredentials { url: shown });
    }
    // Without a scheme, `host:port/path` is no URI form at all ("invalid format"):
    // say what is missing instead.
    if !without_userinfo.contains("://") {
        return Err(UrlError::NotHttp { url: shown });
    }
    let uri: http::Uri = without_userinfo
        .parse()
        .map_err(|e: http::uri::InvalidUri| UrlError::Unparsable {
            url: shown.clone(),
            reason: e.to_string(),
        })?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err(UrlError::NotHttp { url: shown });
    }
    let authority = uri.authority().map_or("", |a| a.as_str());
    let after_host = authority.rfind(']').unwrap_or(0);
    let port = authority[after_host..]
        .rfind(':')
        .map(|c| &authority[after_host + c + 1..]);
    if port.is_some_and(|p| p.parse::<u16>().map_or(true, |p| p == 0)) {
        return Err(UrlError::BadPort { url: shown });
    }
    let userinfo = userinfo.map(|u| {
        let (user, pass) = u.split_once(':').unwrap_or((u, ""));
        (percent_decode(user), percent_decode(pass))
    });
    Ok(BackendUrl { uri, userinfo })
}

/// `raw` with any credentials written in it replaced by `<secret>`, for logs and errors:
/// `scheme://user:<secret>@host/…`, or `scheme://<secret>@host/…` when the user part
/// alone (a token) or anything ambiguous is written there.
pub fn redact_url(raw: &str) -> String {
    match split_userinfo(raw) {
        (_, None) => raw.to_string(),
        (rest, Some(u)) => {
            let (scheme, after) = rest.split_once("://").unwrap_or(("", rest.as_str()));
            let shown_user = match u.split_once(':') {
                Some((user, _)) if !user.is_empty() && !user.contains(['/', '?', '#']) => {
                    format!("{user}:<secret>")
                }
                _ => "<secret>".to_string(),
            };
            if scheme.is_empty() {
                format!("{shown_user}@{after}")
            } else {
                format!("{scheme}://{shown_user}@{after}")
            }
        }
    }
}

/// Splits `scheme://user:pass@host/...` into the URL without `user:pass@` and it. The
/// last `@` ends the credentials, wherever it stands: a password may hold `@`, and an
/// unencoded `/`, `?` or `#` in it must not hide it (such URLs are then refused).
fn split_userinfo(raw: &str) -> (String, Option<&str>) {
    let (prefix, rest) = match raw.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), raw),
    };
    match rest.rfind('@') {
        Some(at) => (format!("{prefix}{}", &rest[at + 1..]), Some(&rest[..at])),
        None => (raw.to_string(), None),
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && let (Some(h), Some(l)) = (
                b.get(i + 1).copied().and_then(hex),
                b.get(i + 2).copied().and_then(hex),
            )
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A secret read from a file or an environment variable, never written inline in the
/// configuration. (A password written in a backend URL is held here too, taken out of
/// the URL; `Debug` never shows it.)
#[derive(Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Secret {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
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

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BasicAuth {
    pub username: String,
    pub password: Secret,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    #[serde(default)]
    pub insecure_skip_verify: bool,
}

/// Authentication of senders: a bearer token they must present.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct IngestAuth {
    pub bearer_token: Secret,
}

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
    pub strategy: OtelNamesStrategy,
}

/// Prometheus' OTLP translation strategies, by what they write: `_` for every character
/// outside `[a-zA-Z0-9_:]` or the name as it is (UTF-8), with or without the unit and
/// `_total` suffixes. The default is Prometheus 2.x's and 3.x's
/// (`UnderscoreEscapingWithSuffixes`).
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OtelNamesStrategy {
    #[default]
    UnderscoreWithSuffixes,
    UnderscoreWithoutSuffixes,
    Utf8WithSuffixes,
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

#[derive(Debug, Clone, Default)]
pub enum BuiltinPacks {
    #[default]
    All,
    None,
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

/// Free bytes on the filesystem holding `dir` (for the start-up check of `max_bytes`).
pub fn free_bytes(dir: &Path) -> Option<u64> {
    crate::sys::free_bytes(dir)
}

/// Bytes of the files under `dir` (what a disk queue already holds).
fn disk_usage(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

fn default_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_max_concurrent_requests() -> usize {
    64
}

/// Parses a listen address as Prometheus and vmagent take it: `host:port`, `:port`
/// (every IPv4 interface), `[::]:port`, or a name such as `localhost:port`.
pub fn parse_listen(text: &str) -> Result<std::net::SocketAddr, ListenError> {
    let t = text.trim();
    let full = if t.starts_with(':') {
        format!("0.0.0.0{t}")
    } else {
        t.to_string()
    };
    if let Ok(a) = full.parse() {
        return Ok(a);
    }
    if !full.contains(':') {
        return Err(ListenError::NoPort);
    }
    use std::net::ToSocketAddrs;
    full.to_socket_addrs()
        .map_err(ListenError::Resolve)?
        .next()
        .ok_or(ListenError::NoAddress)
}

/// Parses `500ms`, `30s`, `1m`, `1h`, `1m30s`.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(DurationError::Empty);
    }
    let mut total = 0f64;
    let mut rest = t;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| DurationError::NoUnit { text: t.into() })?;
        let (num, after) = rest.split_at(num_len);
        let n: f64 = num
            .parse()
            .map_err(|_| DurationError::BadNumber { text: t.into() })?;
        let unit_len = after
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let secs = match unit {
            "ms" => n / 1000.0,
            "s" => n,
            "m" => n * 60.0,
            "h" => n * 3600.0,
            _ => {
                return Err(DurationError::BadUnit {
                    unit: unit.into(),
                    text: t.into(),
                });
            }
        };
        total += secs;
        rest = after;
    }
    Duration::try_from_secs_f64(total).map_err(|_| DurationError::OutOfRange { text: t.into() })
}

/// Writes a duration as `parse_duration` reads it (`30s`, `5m`, `1h`, `250ms`).
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms % 1000 != 0 {
        format!("{ms}ms")
    } else if ms % 3_600_000 == 0 && ms > 0 {
        format!("{}h", ms / 3_600_000)
    } else if ms % 60_000 == 0 && ms > 0 {
        format!("{}m", ms / 60_000)
    } else {
        format!("{}s", ms / 1000)
    }
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

impl Config {
    pub fn embedded_default() -> Config {
        let mut cfg = Config::parse(DEFAULT_CONFIG, "<embedded default>")
            .expect("embedded default configuration is valid");
        // Errors about defaults or flags have no position to show.
        cfg.source = None;
        cfg
    }

    pub fn parse(text: &str, file: &str) -> Result<Config, ConfigError> {
        let mut cfg: Config = yaml::from_str(text).map_err(|source| ConfigError::Yaml {
            file: file.to_string(),
            source,
        })?;
        cfg.source = Some(ConfigSource {
            file: file.to_string(),
            text: text.to_string(),
        });
        Ok(cfg)
    }

    /// `file:line:column: ` of the first value `value` written after `key:` in the
    /// configuration's text (`file: ` when it is not written there, e.g. a default or a
    /// command-line flag), to put in front of an error about that value.
    pub fn position(&self, key: &str, value: &str) -> String {
        self.position_nth(key, value, 0)
    }

    /// Like [`Config::position`], for the `nth` (from 0) such value.
    pub fn position_nth(&self, key: &str, value: &str, mut nth: usize) -> String {
        let Some(src) = &self.source else {
            return String::new();
        };
        if !value.is_empty() {
            let mut after_key = false;
            for (i, line) in src.text.lines().enumerate() {
                let code = line.split(" #").next().unwrap_or(line);
                let key_col = code.find(&format!("{key}:"));
                if key_col.is_some() {
                    after_key = true;
                }
                // The value on the key's line, or (lists) on a later line.
                let from = key_col.map_or(0, |k| k + key.len() + 1);
                if after_key && let Some(col) = code.get(from..).and_then(|r| r.find(value)) {
                    if nth == 0 {
                        return format!("{}:{}:{}: ", src.file, i + 1, from + col + 1);
                    }
                    nth -= 1;
                    after_key = false;
                }
            }
        }
        format!("{}: ", src.file)
    }

    /// The text of the mapping file `packs.files[index]`; an error names where the entry
    /// is written and the absolute path that was tried.
    pub fn read_pack_file(&self, index: usize) -> Result<String, ConfigError> {
        let Some(f) = self.packs.files.get(index) else {
            return Err(self.invalid_at(
                "files",
                "",
                format!("packs.files[{index}]: no such entry"),
            ));
        };
        std::fs::read_to_string(f).map_err(|source| {
            // `load` joined a relative entry to the configuration's directory: find the
            // entry as written.
            let dir = self
                .source
                .as_ref()
                .and_then(|s| Path::new(&s.file).parent());
            let written = dir
                .and_then(|d| f.strip_prefix(d).ok())
                .filter(|w| !w.as_os_str().is_empty())
                .unwrap_or(f);
            ConfigError::PackFile {
                at: self.position("files", &written.display().to_string()),
                index,
                path: std::path::absolute(f)
                    .unwrap_or_else(|_| f.clone())
                    .display()
                    .to_string(),
                source,
            }
        })
    }

    /// An error about the value `value` of `key`, with its position.
    pub fn invalid_at(
        &self,
        key: &str,
        value: &str,
        message: impl std::fmt::Display,
    ) -> ConfigError {
        ConfigError::Value {
            at: self.position(key, value),
            key: key.to_string(),
            reason: message.to_string(),
        }
    }

    /// Where a secret's source (`file:` or `env:`) is written.
    fn check_web(&self) -> Result<(), ConfigError> {
        if let Some(p) = &self.web.route_prefix {
            let ok = p.starts_with('/')
                && !p.ends_with('/')
                && !p.contains("//")
                && p.bytes().all(|b| {
                    b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b'_' | b'.' | b'~')
                });
            if !ok {
                return Err(self.invalid_at(
                    "route_prefix",
                    p,
                    "web.route_prefix must start with '/', not end with one, and use only \
                     letters, digits, '/', '-', '_', '.', '~' (e.g. /promnorm)",
                ));
            }
        }
        if let Some(auth) = &self.web.auth {
            let secrets: Vec<&Secret> = auth
                .bearer_token
                .iter()
                .chain(auth.basic.iter().map(|b| &b.password))
                .collect();
            if secrets.len() != 1 {
                return Err(self.invalid_at(
                    "auth",
                    "",
                    "web.auth needs exactly one of bearer_token or basic",
                ));
            }
            for secret in secrets {
                if let Err(source) = secret.read() {
                    return Err(ConfigError::Secret {
                        at: self.secret_position(secret),
                        owner: "web.auth".into(),
                        source,
                    });
                }
            }
        }
        Ok(())
    }

    fn secret_position(&self, secret: &Secret) -> String {
        match (&secret.file, &secret.env) {
            (Some(f), _) => self.position("file", &f.display().to_string()),
            (_, Some(v)) => self.position("env", v),
            _ => self.position("bearer_token", ""),
        }
    }

    /// Reads what `serve` will read for a backend (credentials, CA file), so a
    /// configuration that check-config accepts, serve accepts; errors name the position.
    fn check_backend_files(&self, name: &str, b: &BackendConfig) -> Result<(), ConfigError> {
        let secrets = b
            .bearer_token
            .iter()
            .chain(b.basic_auth.as_ref().map(|a| &a.password));
        for secret in secrets {
            if let Err(source) = secret.read() {
                return Err(ConfigError::Secret {
                    at: self.secret_position(secret),
                    owner: format!("backend {name}"),
                    source,
                });
            }
        }
        if let Some(ca) = &b.tls.ca_file
            && let Err(e) = std::fs::metadata(ca)
        {
            let shown = ca.display().to_string();
            return Err(self.invalid_at(
                "ca_file",
                &shown,
                format!("backend {name}: cannot read ca_file {shown}: {e}"),
            ));
        }
        Ok(())
    }

    /// A backend's queue: a `disk` queue needs a directory of its own that promnorm can
    /// create and write.
    fn check_queue(
        &self,
        name: &str,
        b: &BackendConfig,
        dirs: &mut std::collections::BTreeSet<PathBuf>,
    ) -> Result<(), ConfigError> {
        let q = &b.queue;
        if q.kind == QueueType::None {
            return Ok(());
        }
        if q.shards == 0 || q.shards > 256 {
            return Err(self.invalid_at(
                "shards",
                &q.shards.to_string(),
                format!("backend {name}: queue.shards must be from 1 to 256"),
            ));
        }
        if q.shards > 1 && b.protocol != BackendProtocolConfig::V1 {
            return Err(self.invalid_at(
                "shards",
                &q.shards.to_string(),
                format!("backend {name}: queue.shards above 1 needs protocol: v1 (a queue splits 1.0 bodies by series; 2.0 bodies go whole through one shard)"),
            ));
        }
        if let Some(n) = q.max_bytes.set()
            && n < 1 << 20
        {
            return Err(ConfigError::Value {
                at: self.size_position("max_bytes", n),
                key: "max_bytes".into(),
                reason: format!("backend {name}: queue.max_bytes must be at least 1MiB"),
            });
        }
        if q.max_age.is_some_and(|a| a.is_zero()) {
            return Err(self.invalid_at(
                "max_age",
                "0",
                format!("backend {name}: queue.max_age must be positive (omit it to keep requests until delivered)"),
            ));
        }
        if q.when_full == WhenFullConfig::DropOldest && q.kind != QueueType::Memory {
            return Err(self.invalid_at(
                "when_full",
                "drop_oldest",
                format!("backend {name}: when_full: drop_oldest needs type: memory (a disk queue keeps what it answered 204 for)"),
            ));
        }
        if q.kind != QueueType::Disk {
            return Ok(());
        }
        let Some(dir) = &q.dir else {
            return Err(self.invalid_at(
                "type",
                "disk",
                format!("backend {name}: a disk queue needs queue.dir"),
            ));
        };
        let shown = dir.display().to_string();
        if !dirs.insert(dir.clone()) {
            return Err(self.invalid_at(
                "dir",
                &shown,
                format!("backend {name}: queue.dir {shown} is used by another backend"),
            ));
        }
        // The nearest existing ancestor must be a writable directory.
        let existing = dir
            .ancestors()
            .find(|a| a.exists())
            .unwrap_or(Path::new("."));
        let writable =
            std::fs::metadata(existing).is_ok_and(|m| m.is_dir()) && existing.exists() && {
                let probe = existing.join(format!(".promnorm-probe-{}", std::process::id()));
                let ok = std::fs::write(&probe, b"").is_ok();
                let _ = std::fs::remove_file(&probe);
                ok
            };
        if !writable {
            return Err(self.invalid_at(
                "dir",
                &shown,
                format!("backend {name}: queue.dir {shown} cannot be created or written ({} is not a writable directory)", existing.display()),
            ));
        }
        Ok(())
    }

    /// The memory settings and the request limits as they will run (`auto` resolved).
    fn check_sizes(&self) -> Result<(), ConfigError> {
        let pct = self.limits.memory_allowed_percent;
        if !(1..=100).contains(&pct) {
            return Err(self.invalid_at(
                "memory_allowed_percent",
                &pct.to_string(),
                "limits.memory_allowed_percent must be from 1 to 100",
            ));
        }
        memory::limit_from_env().map_err(|e| ConfigError::Value {
            at: String::new(),
            key: memory::LIMIT_ENV.into(),
            reason: format!("{}: {e}", memory::LIMIT_ENV),
        })?;
        let s = self.sizing();
        let shown = |v: u64, setting: AutoSize| match setting {
            AutoSize::Auto => format!("auto = {}", format_byte_size(v)),
            AutoSize::Set(_) => format_byte_size(v),
        };
        let l = &self.limits;
        for (key, v, setting) in [
            ("max_body_bytes", s.max_body_bytes, l.max_body_bytes),
            (
                "max_decoded_bytes",
                s.max_decoded_bytes,
                l.max_decoded_bytes,
            ),
        ] {
            if v == 0 {
                return Err(ConfigError::Value {
                    at: self.size_position(key, v),
                    key: key.into(),
                    reason: format!(
                        "limits.{key} ({}) must be positive (limits.max_inflight_bytes is {})",
                        shown(v, setting),
                        shown(s.max_inflight_bytes, l.max_inflight_bytes)
                    ),
                });
            }
        }
        let largest = s.max_body_bytes.saturating_add(s.max_decoded_bytes);
        if s.max_inflight_bytes < largest {
            return Err(ConfigError::Value {
                at: self.size_position("max_inflight_bytes", s.max_inflight_bytes),
                key: "max_inflight_bytes".into(),
                reason: format!(
                    "limits.max_inflight_bytes ({}) must be at least max_body_bytes + max_decoded_bytes ({} + {} = {}): a request at the limits could never be admitted",
                    shown(s.max_inflight_bytes, l.max_inflight_bytes),
                    shown(s.max_body_bytes, l.max_body_bytes),
                    shown(s.max_decoded_bytes, l.max_decoded_bytes),
                    format_byte_size(largest),
                ),
            });
        }
        Ok(())
    }

    /// Where the size `n` of `key` is written, however it is spelt (`1048576`, `1MiB`,
    /// `1024 KiB`).
    pub fn size_position(&self, key: &str, n: u64) -> String {
        let fallback = self.position(key, "");
        for text in [n.to_string(), format_byte_size(n)] {
            let p = self.position(key, &text);
            if p != fallback {
                return p;
            }
        }
        let Some(src) = &self.source else {
            return fallback;
        };
        let pattern = format!("{key}:");
        for (i, line) in src.text.lines().enumerate() {
            let code = line.split(" #").next().unwrap_or(line);
            if let Some(k) = code.find(&pattern) {
                let after = &code[k + pattern.len()..];
                let col = k + pattern.len() + (after.len() - after.trim_start().len());
                return format!("{}:{}:{}: ", src.file, i + 1, col + 1);
            }
        }
        fallback
    }

    /// A tenancy block: a label name, a header promnorm may set, a default that can be
    /// a header value.
    fn check_tenancy(&self, owner: &str, t: &TenancyConfig) -> Result<(), ConfigError> {
        let valid_label = t
            .label
            .chars()
            .enumerate()
            .all(|(i, c)| c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit()));
        if t.label.is_empty() || !valid_label || t.label == "__name__" {
            return Err(self.invalid_at(
                "label",
                &t.label,
                format!(
                    "{owner}tenancy.label {:?} is not a label name promnorm can route by",
                    t.label
                ),
            ));
        }
        if http::HeaderName::from_bytes(t.header.as_bytes()).is_err() {
            return Err(self.invalid_at(
                "header",
                &t.header,
                format!("{owner}tenancy.header {:?} is not a header name", t.header),
            ));
        }
        let lower = t.header.to_ascii_lowercase();
        if unpassable_header_reason(&t.header).is_some()
            || lower == "authorization"
            || lower == "user-agent"
        {
            return Err(self.invalid_at(
                "header",
                &t.header,
                format!(
                    "{owner}tenancy.header may not be {:?}: promnorm sets it itself",
                    t.header
                ),
            ));
        }
        if let Some(d) = &t.default
            && (d.is_empty() || http::HeaderValue::from_str(d).is_err())
        {
            return Err(self.invalid_at(
                "default",
                d,
                format!("{owner}tenancy.default {d:?} cannot be a header value"),
            ));
        }
        if t.max_tenants_per_request == 0 {
            return Err(self.invalid_at(
                "max_tenants_per_request",
                "0",
                format!("{owner}tenancy.max_tenants_per_request must be positive"),
            ));
        }
        Ok(())
    }

    /// Loads what `serve` will load for `server.tls`; errors name the file's position.
    fn check_server_tls(&self, tls: &ServerTlsConfig) -> Result<(), ConfigError> {
        let at = |key: &str, p: &Path, e: String| {
            self.invalid_at(
                key,
                &p.display().to_string(),
                format!("server.tls.{key}: {e}"),
            )
        };
        let certs = crate::pem::read_certs(&tls.cert_file)
            .map_err(|e| at("cert_file", &tls.cert_file, e))?;
        let key =
            crate::pem::read_key(&tls.key_file).map_err(|e| at("key_file", &tls.key_file, e))?;
        crate::pem::check_pair(certs, key).map_err(|e| at("key_file", &tls.key_file, e))?;
        if let Some(ca) = &tls.client_ca_file {
            crate::pem::read_certs(ca).map_err(|e| at("client_ca_file", ca, e))?;
        }
        Ok(())
    }

    /// Non-fatal remarks about the configuration (printed by check-config, logged by serve).
    pub fn warnings(&self) -> Vec<String> {
        self.warnings_with(&self.sizing())
    }

    /// [`Config::warnings`] for given sizes.
    pub fn warnings_with(&self, sizing: &Sizing) -> Vec<String> {
        let mut out = Vec::new();
        out.extend(self.memory_warning(sizing));
        for (i, b) in self.backends.iter().enumerate() {
            let queue_bytes = sizing.queue_max_bytes.get(i).copied().unwrap_or(0);
            if let Ok(u) = parse_backend_url(&b.url)
                && (u.uri.path().is_empty() || u.uri.path() == "/")
            {
                out.push(format!(
                    "{}backend {}: url {} has no path; receivers listen on /api/v1/write (Prometheus, VictoriaMetrics), /api/v1/push (Mimir, Cortex) or /_prometheus/api/v1/write (Elastic)",
                    self.position("url", &b.url),
                    b.name_or_default(i),
                    redact_url(&b.url)
                ));
            }
            if b.queue.kind != QueueType::None && queue_bytes < sizing.max_body_bytes {
                out.push(format!(
                    "{}backend {}: queue.max_bytes {} is below limits.max_body_bytes {}: a request larger than the queue is refused with 413",
                    self.size_position("max_bytes", queue_bytes),
                    b.name_or_default(i),
                    format_byte_size(queue_bytes),
                    format_byte_size(sizing.max_body_bytes)
                ));
            }
            if let Some(t) = b.effective_tenancy(self.tenancy.as_ref())
                && t.default.is_none()
                && !b.headers.keys().any(|k| k.eq_ignore_ascii_case(&t.header))
            {
                out.push(format!(
                    "{}backend {}: tenancy without default: series without the {:?} label go with the sender's {} header, or with none when it sent none (a gateway requiring it answers 401 and the sender retries); metadata sent alone goes to the tenants seen with its family, else is dropped (promnorm_metadata_dropped_total). Set tenancy.default",
                    self.position("tenancy", ""),
                    b.name_or_default(i),
                    t.label,
                    t.header
                ));
            }
            if b.queue.kind == QueueType::Disk
                && let Some(dir) = &b.queue.dir
                && let Some(existing) = dir.ancestors().find(|a| a.exists())
                && let Some(free) = free_bytes(existing)
            {
                let held = disk_usage(dir);
                if free + held < queue_bytes {
                    out.push(format!(
                        "{}backend {}: queue.dir {} has {} bytes free (plus {} held by the queue), less than queue.max_bytes {}: the queue will refuse data (429) when the disk fills",
                        self.position("dir", &dir.display().to_string()),
                        b.name_or_default(i),
                        dir.display(),
                        free,
                        held,
                        queue_bytes
                    ));
                }
            }
        }
        out
    }

    /// The configuration as `check-config --print` shows it: every key, defaults filled
    /// in, credentials replaced by `<secret>`.
    pub fn to_redacted_yaml(&self) -> Result<String, ConfigError> {
        let mut c = self.clone();
        for b in &mut c.backends {
            b.url = redact_url(&b.url);
            for (k, v) in b.headers.iter_mut() {
                let k = k.to_ascii_lowercase();
                if ["auth", "token", "key", "secret", "password", "cookie"]
                    .iter()
                    .any(|w| k.contains(w))
                {
                    *v = "<secret>".into();
                }
            }
        }
        yaml::to_string(&c).map_err(|source| ConfigError::Yaml {
            file: "<printed configuration>".into(),
            source,
        })
    }

    /// [`Config::to_redacted_yaml`] with the memory limit in a comment on top and, beside
    /// each `auto` key, the value it resolves to (`max_inflight_bytes: auto # 21MiB`).
    /// Comments only: the printed text reads back as the same configuration.
    pub fn to_annotated_yaml(&self, sizing: &Sizing) -> Result<String, ConfigError> {
        let text = self.to_redacted_yaml()?;
        let mut out = format!("# {}\n", sizing.summary());
        let mut section = "";
        let mut queue = 0;
        for line in text.lines() {
            out.push_str(line);
            if !line.starts_with([' ', '-']) {
                section = line.trim_end_matches(':');
            }
            let t = line.trim_start().trim_start_matches("- ");
            let size = |n: u64| format!(" # {}", format_byte_size(n));
            let comment = match (section, t.split_once(": ")) {
                ("limits", Some((key, "auto"))) => match key {
                    "max_body_bytes" => Some(size(sizing.max_body_bytes)),
                    "max_decoded_bytes" => Some(size(sizing.max_decoded_bytes)),
                    "max_inflight_bytes" => Some(size(sizing.max_inflight_bytes)),
                    _ => None,
                },
                ("derived", Some(("max_series", "auto"))) => {
                    Some(format!(" # {}", sizing.derived_max_series))
                }
                ("derived", Some(("max_pending_samples", "auto"))) => {
                    Some(format!(" # {}", sizing.derived_max_pending_samples))
                }
                ("backends", Some(("max_bytes", v))) => {
                    queue += 1;
                    let n = sizing.queue_max_bytes.get(queue - 1).copied();
                    (v == "auto").then(|| n.map(size)).flatten()
                }
                _ => None,
            };
            out.push_str(&comment.unwrap_or_default());
            out.push('\n');
        }
        Ok(out)
    }

    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Io {
            file: path.display().to_string(),
            source: e,
        })?;
        let mut cfg = Config::parse(&text, &path.display().to_string())?;
        // Mapping files and queue directories are relative to the configuration file.
        if let Some(dir) = path.parent() {
            let queue_dirs = cfg.backends.iter_mut().filter_map(|b| b.queue.dir.as_mut());
            for f in cfg.packs.files.iter_mut().chain(queue_dirs) {
                if f.is_relative() {
                    *f = dir.join(&*f);
                }
            }
        }
        Ok(cfg)
    }

    /// Checks everything that can be checked without the network: backends, packs, rules.
    /// Checks what can be checked on the configuration itself, with positions: paths,
    /// listen address, backends (URLs, credentials and CA files readable, header
    /// pass-through, names). `app::Assemble::validate` adds packs and derived series.
    pub fn check(&self) -> Result<(), ConfigError> {
        if let Some(p) = self.write_paths.iter().find(|p| !p.starts_with('/')) {
            return Err(self.invalid_at(
                "write_paths",
                p,
                format!("write path {p:?} must be absolute (start with /)"),
            ));
        }
        if self.write_paths.is_empty() {
            return Err(self.invalid_at("write_paths", "", "write_paths is empty"));
        }
        parse_listen(&self.listen).map_err(|source| ConfigError::Listen {
            at: self.position("listen", &self.listen),
            text: self.listen.clone(),
            source,
        })?;
        for (key, d) in [
            ("header_read_timeout", self.server.header_read_timeout),
            ("body_read_timeout", self.server.body_read_timeout),
            ("idle_timeout", self.server.idle_timeout),
            ("flush_interval", self.derived.flush_interval),
        ]
        .into_iter()
        .chain(self.backends.iter().map(|b| ("timeout", b.timeout)))
        {
            if d.is_zero() {
                return Err(self.invalid_at(key, "0", format!("{key} must be positive")));
            }
        }
        if ![429, 503].contains(&self.server.throttle_status) {
            return Err(self.invalid_at(
                "throttle_status",
                &self.server.throttle_status.to_string(),
                "server.throttle_status must be 429 or 503",
            ));
        }
        self.check_sizes()?;
        if self.limits.max_concurrent_requests == 0 {
            return Err(self.invalid_at(
                "max_concurrent_requests",
                "0",
                "limits.max_concurrent_requests must be positive",
            ));
        }
        if let Some(tls) = &self.server.tls {
            self.check_server_tls(tls)?;
        }
        if self.backends.is_empty() {
            return Err(self.invalid_at(
                "backends",
                "[]",
                "at least one backend is required (omit `backends` for the default one)",
            ));
        }
        if let Some(auth) = &self.ingest_auth
            && let Err(source) = auth.bearer_token.read()
        {
            return Err(ConfigError::Secret {
                at: self.secret_position(&auth.bearer_token),
                owner: "ingest_auth".into(),
                source,
            });
        }
        if let Some(t) = self.tenancy.as_ref().filter(|t| t.enabled) {
            self.check_tenancy("", t)?;
        }
        self.check_web()?;
        let mut names = std::collections::BTreeSet::new();
        let mut queue_dirs = std::collections::BTreeSet::new();
        for (i, b) in self.backends.iter().enumerate() {
            let name = b.name_or_default(i);
            let url = parse_backend_url(&b.url).map_err(|source| {
                // The URL's position, without repeating credentials written in it.
                let at = split_userinfo(&b.url).1.map_or(b.url.as_str(), |u| u);
                ConfigError::Url {
                    at: self.position("url", at),
                    source,
                }
            })?;
            if url.userinfo.is_some() && b.basic_auth.is_some() {
                return Err(self.invalid_at(
                    "basic_auth",
                    "",
                    format!("backend {name}: credentials both in the URL and in basic_auth"),
                ));
            }
            for h in &b.pass_headers {
                if let Some(why) = unpassable_header_reason(h) {
                    return Err(self.invalid_at(
                        "pass_headers",
                        h,
                        format!("backend {name}: pass_headers may not list {h:?}: {why}"),
                    ));
                }
            }
            if !(1..=10_000).contains(&b.max_concurrent_requests) {
                return Err(self.invalid_at(
                    "max_concurrent_requests",
                    &b.max_concurrent_requests.to_string(),
                    format!("backend {name}: max_concurrent_requests must be from 1 to 10000"),
                ));
            }
            self.check_backend_files(&name, b)?;
            self.check_queue(&name, b, &mut queue_dirs)?;
            if let Some(t) = b.effective_tenancy(self.tenancy.as_ref()) {
                self.check_tenancy(&format!("backend {name}: "), t)?;
            }
            if !names.insert(name.clone()) {
                return Err(ConfigError::DuplicateBackend {
                    at: self.position_nth("name", &name, 1),
                    name,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_default_is_valid() {
        let c = Config::embedded_default();
        assert_eq!(c.listen, "0.0.0.0:9201");
        assert_eq!(c.backends[0].url, "http://127.0.0.1:9090/api/v1/write");
        c.check().unwrap();
    }

    #[test]
    fn unknown_keys_are_rejected_with_position() {
        let err = Config::parse("listen: 0.0.0.0:1\nbogus: 1\n", "x.yaml").unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("x.yaml:2:"), "{msg}");
        assert!(msg.contains("bogus"), "{msg}");
    }

    #[test]
    fn credentials_in_urls_never_show() {
        for (raw, shown) in [
            ("http://u:p%40ss@h/api", "http://u:<secret>@h/api"),
            ("http://u:p@ss@h/api", "http://u:<secret>@h/api"),
            ("http://u:s3cr/et@h/api", "http://u:<secret>@h/api"),
            ("http://TOKEN@h/api", "http://<secret>@h/api"),
            ("u:pass@h:9090/api", "u:<secret>@h:9090/api"),
            ("http://h/api", "http://h/api"),
        ] {
            assert_eq!(redact_url(raw), shown, "{raw}");
        }
        let err = parse_backend_url("http://u:s3cr/et@h/api")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("percent-encode") && !err.contains("s3cr"),
            "{err}"
        );
        let err = parse_backend_url("u:pass@h:9090/api")
            .unwrap_err()
            .to_string();
        assert!(!err.contains("pass"), "{err}");
        assert!(parse_backend_url("http://h:99999/api").is_err());
        let ok = parse_backend_url("http://u:p%2Fw@h/api").unwrap();
        assert_eq!(ok.userinfo, Some(("u".into(), "p/w".into())));
        assert_eq!(ok.uri.host(), Some("h"));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("5d").is_err());
    }

    #[test]
    fn errors_are_typed_where_a_caller_can_act() {
        assert!(matches!(
            parse_duration("5"),
            Err(DurationError::NoUnit { .. })
        ));
        assert!(matches!(
            parse_duration("5d"),
            Err(DurationError::BadUnit { ref unit, .. }) if unit == "d"
        ));
        assert!(matches!(parse_duration(""), Err(DurationError::Empty)));
        assert!(matches!(
            parse_backend_url("http://h:99999/api"),
            Err(UrlError::BadPort { .. })
        ));
        assert!(matches!(
            parse_backend_url("ftp://h/api"),
            Err(UrlError::NotHttp { .. })
        ));
        assert!(matches!(parse_listen("9201"), Err(ListenError::NoPort)));

        let text = "backends:\n  - url: http://a/api/v1/write\n    name: x\n  - url: http://b/api/v1/write\n    name: x\n";
        let err = Config::parse(text, "dup.yaml")
            .unwrap()
            .check()
            .unwrap_err();
        assert!(
            matches!(err, ConfigError::DuplicateBackend { ref name, .. } if name == "x"),
            "{err:?}"
        );
        assert_eq!(err.key(), Some("name"));
        assert!(
            err.to_string().starts_with("dup.yaml:5:11: two backends"),
            "{err}"
        );

        let text = "listen: nowhere\n";
        let err = Config::parse(text, "l.yaml").unwrap().check().unwrap_err();
        assert!(matches!(err, ConfigError::Listen { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            "l.yaml:1:9: listen \"nowhere\": expected host:port or :port"
        );

        let text = "ingest_auth:\n  bearer_token: {env: PROMNORM_TEST_SURELY_UNSET}\n";
        let err = Config::parse(text, "s.yaml").unwrap().check().unwrap_err();
        assert!(
            matches!(
                err,
                ConfigError::Secret {
                    source: SecretError::EnvUnset { .. },
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn tenancy_without_default_warns_and_max_concurrent_requests_is_checked() {
        let warned = |text: &str| {
            Config::parse(text, "t.yaml")
                .unwrap()
                .warnings()
                .into_iter()
                .any(|w| w.contains("tenancy without default"))
        };
        let b = "backends:\n  - url: http://x/api/v1/push\n";
        assert!(warned(&format!("tenancy: {{label: tenant}}\n{b}")));
        assert!(!warned(&format!("tenancy: {{default: anonymous}}\n{b}")));
        assert!(!warned(b), "no tenancy");
        assert!(
            !warned(
                "tenancy: {}\nbackends:\n  - url: http://x/api/v1/push\n    headers: {x-scope-orgid: a}\n"
            ),
            "a fixed tenant header"
        );
        assert!(!warned(
            "tenancy: {}\nbackends:\n  - url: http://x/api/v1/push\n    tenancy: {enabled: false}\n"
        ));
        let c = Config::parse(b, "t.yaml").unwrap();
        assert_eq!(c.backends[0].max_concurrent_requests, 64);
        let err = Config::parse(
            "backends:\n  - url: http://x/api/v1/push\n    max_concurrent_requests: 0\n",
            "m.yaml",
        )
        .unwrap()
        .check()
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "m.yaml:3:30: backend default: max_concurrent_requests must be from 1 to 10000"
        );
    }
}
