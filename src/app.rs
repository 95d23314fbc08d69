//! Assembly: turns a validated [`Config`] into the running parts — compiled packs,
//! derive stage, pipeline, backends and server state. `config` stays plain data plus
//! validation; the stages never see configuration types. This is the only module that
//! knows both.

use std::sync::Arc;

use crate::config::{
    AutoCount, BUILTIN_PACKS, BackendConfig, BackendProtocolConfig, BuiltinPacks, Config,
    ConfigError, NativeHistogramsConfig, OtelNamesStrategy, QueueConfig, QueueType, TenancyConfig,
    WhenFullConfig, yaml,
};
use crate::forward::queue::{QueueKind, QueueOptions, QueuedSink, WhenFull};
use crate::forward::{
    BackendError, BackendOptions, BackendProtocol, BasicCredentials, HttpBackend,
    NativeHistogramsPolicy, Sink, TenancyOptions, TlsOptions,
};
use crate::mapping::{CompileError, GlobalOptions, PackOptions, PackSpec, Rules};

/// Why a configuration could not be turned into a running proxy.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Rules(#[from] CompileError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A backend's queue could not be opened (its directory held or unwritable).
    #[error("{0}")]
    Queue(String),
    #[error(transparent)]
    ServerTls(#[from] crate::server::tls::TlsError),
}

/// What a [`Config`] becomes: rules, derived-series settings, the pipeline.
pub trait Assemble {
    /// Everything `serve` checks before it starts: the configuration itself, the
    /// derived series and the packs (compiled).
    fn validate(&self) -> Result<Rules, BuildError>;
    /// The derived-series settings, peaks resolved; `None` when derived series are off.
    fn derive_settings(&self) -> Result<Option<crate::derive::DeriveSettings>, BuildError>;
    /// The pipeline this configuration describes: compiled packs plus derived series.
    fn pipeline(&self) -> Result<crate::pipeline::Pipeline, BuildError>;
    /// The pipeline around already compiled rules.
    fn pipeline_with(&self, rules: Rules) -> Result<crate::pipeline::Pipeline, BuildError>;
    /// Loads the enabled packs (built-in, then users' files) and compiles them.
    fn compile_rules(&self) -> Result<Rules, BuildError>;
}

impl Assemble for Config {
    fn validate(&self) -> Result<Rules, BuildError> {
        self.check()?;
        self.derive_settings()?;
        self.compile_rules()
    }

    /// The derived-series settings, peaks resolved; `None` when derived series are off.
    fn derive_settings(&self) -> Result<Option<crate::derive::DeriveSettings>, BuildError> {
        let d = &self.derived;
        if !d.enabled {
            return Ok(None);
        }
        let sizing = self.sizing();
        if d.max_series == AutoCount::Set(0) || d.max_pending_samples == AutoCount::Set(0) {
            let key = if d.max_series == AutoCount::Set(0) {
                "max_series"
            } else {
                "max_pending_samples"
            };
            return Err(BuildError::from(self.invalid_at(
                key,
                "0",
                "derived: max_series and max_pending_samples must be positive",
            )));
        }
        if d.window.is_some_and(|w| w.is_zero()) {
            return Err(BuildError::from(self.invalid_at(
                "window",
                "0",
                "derived: window must be positive",
            )));
        }
        let mut peaks = Vec::new();
        for (i, p) in d.peaks.iter().enumerate() {
            let gpu = match &p.gpu {
                None => None,
                Some(model) => Some(crate::derive::gpus::lookup(model).ok_or_else(|| {
                    ConfigError::UnknownGpu {
                        at: self.position("gpu", model),
                        index: i,
                        model: model.clone(),
                        known: crate::derive::gpus::known_names().join(", "),
                    }
                })?),
            };
            let flops = p.flops.or(gpu.map(|g| g.flops));
            let bandwidth = p.bandwidth.or(gpu.map(|g| g.bandwidth));
            for (what, v) in [("flops", flops), ("bandwidth", bandwidth)] {
                if let Some(v) = v
                    && !(v.is_finite() && v > 0.0)
                {
                    return Err(BuildError::from(self.invalid_at(
                        what,
                        &v.to_string(),
                        format!("derived.peaks[{i}]: {what} must be a positive number, not {v}"),
                    )));
                }
            }
            if flops.is_none() && bandwidth.is_none() {
                return Err(BuildError::from(self.invalid_at(
                    "peaks",
                    "",
                    format!("derived.peaks[{i}]: needs gpu, flops or bandwidth"),
                )));
            }
            peaks.push(crate::derive::Peak {
                matchers: p
                    .matchers
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                flops,
                bandwidth,
            });
        }
        Ok(Some(crate::derive::DeriveSettings {
            derived_series: true,
            window: d.window,
            stale_after: d.stale_after,
            max_series: sizing.derived_max_series,
            max_pending_samples: sizing.derived_max_pending_samples,
            peaks,
            otel_names: otel_names(self.otel_names.strategy),
        }))
    }

    /// The pipeline this configuration describes: compiled packs plus derived series.
    fn pipeline(&self) -> Result<crate::pipeline::Pipeline, BuildError> {
        self.pipeline_with(self.compile_rules()?)
    }

    /// The pipeline around already compiled rules.
    fn pipeline_with(&self, rules: Rules) -> Result<crate::pipeline::Pipeline, BuildError> {
        // Read once: the sizing reads the cgroup files.
        let max_decoded_bytes = usize_of(self.sizing().max_decoded_bytes);
        let mut p = crate::pipeline::Pipeline::new(
            std::sync::Arc::new(rules),
            crate::pipeline::PipelineLimits {
                max_decoded_bytes,
                decode: crate::wire::DecodeLimits {
                    max_series: self.limits.max_series_per_request,
                    max_labels_per_series: self.limits.max_labels_per_series,
                    max_label_value_bytes: self.limits.max_label_value_bytes.as_usize(),
                    // A 2.0 request spelled out is held like a decoded body.
                    max_expanded_bytes: max_decoded_bytes,
                },
            },
        );
        let sums = p.rules().sums_over_ranks();
        match self.derive_settings()? {
            Some(settings) => {
                p = p.with_deriver(std::sync::Arc::new(crate::derive::Deriver::new(&settings)));
            }
            // Sums over ranks are stateful too: they need the derive stage alone.
            None if sums => {
                let settings = crate::derive::DeriveSettings {
                    derived_series: false,
                    ..Default::default()
                };
                p = p.with_deriver(std::sync::Arc::new(crate::derive::Deriver::new(&settings)));
            }
            None => {}
        }
        if self.metadata_total_fix {
            p = p.with_metadata_total_fix();
        }
        Ok(p)
    }

    /// Loads the enabled packs (built-in, then users' files) and compiles them.
    fn compile_rules(&self) -> Result<Rules, BuildError> {
        let mut packs = Vec::new();
        let known: Vec<&str> = BUILTIN_PACKS.iter().map(|(n, _)| *n).collect();
        if let BuiltinPacks::Select(m) = &self.packs.builtin {
            for name in m.keys() {
                if !known.contains(&name.as_str()) {
                    return Err(BuildError::Config(ConfigError::UnknownPack {
                        at: self.position("builtin", name),
                        name: name.clone(),
                        known: known.join(", "),
                    }));
                }
            }
        }
        for (name, text) in BUILTIN_PACKS {
            if matches!(self.packs.builtin, BuiltinPacks::None) {
                break;
            }
            let spec = parse_pack(text, &format!("mappings/{name}.yaml"))?;
            // `all` and unlisted packs: the pack's own `default` (off for `genai`).
            let on = match &self.packs.builtin {
                BuiltinPacks::Select(m) => m.get(*name).copied(),
                _ => None,
            }
            .unwrap_or(spec.default.is_on());
            if on {
                let mut spec = spec;
                if *name == "genai" {
                    genai_options(self, &mut spec)?;
                }
                packs.push(spec);
            }
        }
        for (i, f) in self.packs.files.iter().enumerate() {
            let text = self.read_pack_file(i)?;
            packs.push(parse_pack(&text, &f.display().to_string())?);
        }
        let mut seen = std::collections::BTreeSet::new();
        for p in &packs {
            if !seen.insert(p.pack.clone()) {
                return Err(BuildError::from(ConfigError::DuplicatePack {
                    name: p.pack.clone(),
                }));
            }
        }
        let with_opts = packs
            .into_iter()
            .map(|p| {
                let keep = self
                    .packs
                    .keep_original
                    .get(&p.pack)
                    .copied()
                    .unwrap_or(self.keep_original);
                let opts = PackOptions {
                    name: p.pack.clone(),
                    keep_original: keep,
                    sum_over_ranks: self.packs.sum_over_ranks.get(&p.pack).copied(),
                };
                (p, opts)
            })
            .collect::<Vec<_>>();
        Ok(Rules::compile(
            &with_opts,
            &GlobalOptions {
                drop_created_series: self.drop_created_series,
                otel_names: otel_names(self.otel_names.strategy),
            },
        )?)
    }
}

/// Writes `packs.genai` into the `genai` pack's copy rules: every
/// `gen_ai_operation_name` the pack sets becomes `operation_name` (no engine's latency
/// histograms carry an endpoint label), every `gen_ai_provider_name` (the engine's name
/// in the pack) its entry in `provider_names`, if any. Both are required attributes of
/// the conventions: an empty value (no label) is refused, as is an engine the pack does
/// not know (a misspelt key would otherwise be silently ignored).
fn genai_options(cfg: &Config, spec: &mut PackSpec) -> Result<(), ConfigError> {
    const PROVIDER: &str = "gen_ai_provider_name";
    let o = &cfg.packs.genai;
    if o.operation_name.trim().is_empty() {
        return Err(cfg.invalid_at(
            "operation_name",
            "",
            "packs.genai.operation_name: empty (gen_ai_operation_name is a required attribute)",
        ));
    }
    let engines: std::collections::BTreeSet<&str> = spec
        .rules
        .iter()
        .filter_map(|r| r.set_labels.get(PROVIDER).map(String::as_str))
        .collect();
    for (engine, provider) in &o.provider_names {
        if !engines.contains(engine.as_str()) {
            let known: Vec<&str> = engines.iter().copied().collect();
            return Err(cfg.invalid_at(
                "provider_names",
                engine,
                format!(
                    "packs.genai.provider_names: unknown engine {engine:?} (known: {})",
                    known.join(", ")
                ),
            ));
        }
        if provider.trim().is_empty() {
            return Err(cfg.invalid_at(
                "provider_names",
                engine,
                format!(
                    "packs.genai.provider_names.{engine}: empty (gen_ai_provider_name is a required attribute)"
                ),
            ));
        }
    }
    for r in &mut spec.rules {
        if let Some(v) = r.set_labels.get_mut("gen_ai_operation_name") {
            v.clone_from(&o.operation_name);
        }
        if let Some(v) = r.set_labels.get_mut(PROVIDER)
            && let Some(p) = o.provider_names.get(v.as_str())
        {
            v.clone_from(p);
        }
    }
    // The copies are spelt like the instruments they stand for (`otel_names`): the pack
    // writes them as Prometheus does by default.
    let (from, to) = (
        crate::mapping::OtelNames::default(),
        otel_names(cfg.otel_names.strategy),
    );
    if from == to {
        return Ok(());
    }
    let names: std::collections::BTreeMap<String, String> = spec
        .otel
        .iter()
        .map(|i| {
            let unit = i.unit.as_deref();
            (from.spell(&i.name, unit), to.spell(&i.name, unit))
        })
        .collect();
    let labels: std::collections::BTreeMap<String, String> = spec
        .otel
        .iter()
        .flat_map(|i| &i.attributes)
        .map(|a| (from.label(a), to.label(a)))
        .collect();
    let respell = |l: String| labels.get(&l).cloned().unwrap_or(l);
    for r in &mut spec.rules {
        if let Some(n) = r.rename.as_mut()
            && let Some(t) = names.get(n.as_str())
        {
            n.clone_from(t);
        }
        for v in r.rename_labels.values_mut() {
            *v = respell(std::mem::take(v));
        }
        r.set_labels = std::mem::take(&mut r.set_labels)
            .into_iter()
            .map(|(k, v)| (respell(k), v))
            .collect();
    }
    Ok(())
}

/// The mapping stage's spelling for `otel_names.strategy`.
fn otel_names(s: OtelNamesStrategy) -> crate::mapping::OtelNames {
    use crate::mapping::OtelNames;
    match s {
        OtelNamesStrategy::UnderscoreWithSuffixes => OtelNames::UnderscoreWithSuffixes,
        OtelNamesStrategy::UnderscoreWithoutSuffixes => OtelNames::UnderscoreWithoutSuffixes,
        OtelNamesStrategy::Utf8WithSuffixes => OtelNames::Utf8WithSuffixes,
        OtelNamesStrategy::Utf8WithoutSuffixes => OtelNames::Utf8WithoutSuffixes,
    }
}

/// A size as the stages take it (saturating on 32-bit targets).
fn usize_of(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

pub fn parse_pack(text: &str, file: &str) -> Result<PackSpec, ConfigError> {
    yaml::from_str(text).map_err(|source| ConfigError::Yaml {
        file: file.to_string(),
        source,
    })
}

/// The backend options `forward` needs, resolved from configuration (secrets read).
pub fn backend_options(
    cfg: &BackendConfig,
    index: usize,
    global_tenancy: Option<&TenancyConfig>,
    throttle_status: u16,
) -> Result<BackendOptions, BuildError> {
    let name = cfg.name_or_default(index);
    let url = crate::config::parse_backend_url(&cfg.url).map_err(|source| ConfigError::Url {
        at: String::new(),
        source,
    })?;
    let secret_error = |source| ConfigError::Secret {
        at: String::new(),
        owner: format!("backend {name}"),
        source,
    };
    // Credentials written in the URL become basic auth: the URL itself is then safe to
    // log, and hyper never sees them.
    let basic = match (&cfg.basic_auth, url.userinfo) {
        (Some(b), _) => Some(BasicCredentials {
            username: b.username.clone(),
            password: b.password.read().map_err(secret_error)?,
        }),
        (None, Some((username, password))) => Some(BasicCredentials { username, password }),
        (None, None) => None,
    };
    let bearer_token = cfg
        .bearer_token
        .as_ref()
        .map(|t| t.read().map(|t| t.trim().to_string()))
        .transpose()
        .map_err(secret_error)?;
    let tenancy = cfg
        .effective_tenancy(global_tenancy)
        .map(|t| tenancy_options(t, &name, cfg))
        .transpose()?;
    Ok(BackendOptions {
        name,
        url: url.uri,
        timeout: cfg.timeout,
        headers: cfg
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        pass_headers: cfg.pass_headers.clone(),
        basic,
        bearer_token,
        tls: TlsOptions {
            ca_file: cfg.tls.ca_file.clone(),
            insecure_skip_verify: cfg.tls.insecure_skip_verify,
        },
        protocol: match cfg.protocol {
            BackendProtocolConfig::V1 => BackendProtocol::V1,
            BackendProtocolConfig::V2 => BackendProtocol::V2,
            BackendProtocolConfig::Auto => BackendProtocol::Auto,
        },
        tenancy,
        native_histograms: match cfg.native_histograms {
            NativeHistogramsConfig::Auto => NativeHistogramsPolicy::Auto,
            NativeHistogramsConfig::AsIs => NativeHistogramsPolicy::AsIs,
            NativeHistogramsConfig::Classic => NativeHistogramsPolicy::Classic,
        },
        max_concurrent_requests: cfg.max_concurrent_requests,
        saturated_status: http::StatusCode::from_u16(throttle_status)
            .unwrap_or(http::StatusCode::TOO_MANY_REQUESTS),
    })
}

/// A tenancy block as `forward` takes it (check-config validated it).
fn tenancy_options(
    t: &TenancyConfig,
    backend: &str,
    cfg: &BackendConfig,
) -> Result<TenancyOptions, BuildError> {
    let header = http::HeaderName::from_bytes(t.header.as_bytes()).map_err(|_| {
        BuildError::Backend(BackendError::Header {
            backend: backend.to_string(),
            what: format!("bad tenancy.header {:?}", t.header),
        })
    })?;
    Ok(TenancyOptions {
        label: t.label.clone(),
        header,
        default: t.default.clone(),
        keep_label: t.keep_label,
        max_tenants_per_request: t.max_tenants_per_request,
        fixed_header: cfg
            .headers
            .keys()
            .any(|k| k.eq_ignore_ascii_case(&t.header)),
    })
}

/// The HTTP backends of a configuration.
pub fn backends(cfg: &Config) -> Result<Vec<Arc<dyn Sink>>, BuildError> {
    let mut sinks: Vec<Arc<dyn Sink>> = Vec::new();
    let sizing = cfg.sizing();
    for (i, b) in cfg.backends.iter().enumerate() {
        let http = HttpBackend::new(backend_options(
            b,
            i,
            cfg.tenancy.as_ref(),
            cfg.server.throttle_status,
        )?)?;
        let max_bytes = sizing.queue_max_bytes.get(i).copied().unwrap_or(0);
        match queue_options(&b.queue, max_bytes, cfg.server.throttle_status) {
            None => sinks.push(Arc::new(http)),
            Some(q) => sinks.push(Arc::new(QueuedSink::new(Arc::new(http), q))),
        }
    }
    Ok(sinks)
}

/// A backend's queue settings; `None` for `type: none`. `max_bytes`: the queue's size
/// with `auto` resolved (`Sizing::queue_max_bytes`).
pub fn queue_options(
    q: &QueueConfig,
    max_bytes: u64,
    throttle_status: u16,
) -> Option<QueueOptions> {
    let kind = match q.kind {
        QueueType::None => return None,
        QueueType::Memory => QueueKind::Memory,
        QueueType::Disk => QueueKind::Disk {
            dir: q.dir.clone()?,
            fsync_interval: q.fsync_interval,
        },
    };
    Some(QueueOptions {
        kind,
        max_bytes,
        max_age: q.max_age,
        shards: q.shards,
        when_full: match q.when_full {
            WhenFullConfig::Reject => WhenFull::Reject,
            WhenFullConfig::DropOldest => WhenFull::DropOldest,
        },
        full_status: http::StatusCode::from_u16(throttle_status)
            .unwrap_or(http::StatusCode::TOO_MANY_REQUESTS),
        first_backoff: std::time::Duration::from_millis(250),
        max_backoff: std::time::Duration::from_secs(30),
    })
}

/// The server's state for a configuration, with HTTP backends.
pub fn app_state(cfg: &Config) -> Result<crate::server::AppState, BuildError> {
    let rules = cfg.validate()?;
    let forwarder = crate::forward::Forwarder::new(backends(cfg)?);
    app_state_with(cfg, rules, forwarder)
}

/// The server's state around any forwarder (tests use in-process sinks).
pub fn app_state_with(
    cfg: &Config,
    rules: Rules,
    forwarder: crate::forward::Forwarder,
) -> Result<crate::server::AppState, BuildError> {
    let pipeline = cfg.pipeline_with(rules)?;
    Ok(crate::server::AppState::new(
        pipeline,
        forwarder,
        server_options(cfg)?,
    ))
}

/// The web UI's settings of a configuration (its credentials read).
pub fn web_options(cfg: &Config) -> Result<crate::web::WebOptions, BuildError> {
    let secret = |s: &crate::config::Secret| {
        s.read().map_err(|source| ConfigError::Secret {
            at: String::new(),
            owner: "web.auth".into(),
            source,
        })
    };
    let auth = match &cfg.web.auth {
        None => None,
        Some(a) => match (&a.bearer_token, &a.basic) {
            (Some(t), _) => Some(crate::web::WebAuth::Bearer(secret(t)?.trim().to_string())),
            (None, Some(b)) => Some(crate::web::WebAuth::Basic {
                username: b.username.clone(),
                password: secret(&b.password)?,
            }),
            (None, None) => None,
        },
    };
    Ok(crate::web::WebOptions {
        enabled: cfg.web.enabled,
        debug: cfg.web.enable_debug,
        route_prefix: cfg.web.route_prefix.clone().unwrap_or_default(),
        auth,
    })
}

/// The server's own settings of a configuration (the ingest token read).
pub fn server_options(cfg: &Config) -> Result<crate::server::ServerOptions, BuildError> {
    crate::telemetry::set_tenant_limit(cfg.limits.max_tenants_in_metrics);
    let sizing = cfg.sizing();
    let ingest_token = cfg
        .ingest_auth
        .as_ref()
        .map(|a| a.bearer_token.read().map(|t| t.trim().to_string()))
        .transpose()
        .map_err(|source| ConfigError::Secret {
            at: String::new(),
            owner: "ingest_auth".into(),
            source,
        })?;
    Ok(crate::server::ServerOptions {
        derived_flush: cfg.derived.flush_interval,
        max_body_bytes: usize_of(sizing.max_body_bytes),
        ingest_token,
        connection_limits: crate::server::listener::ConnectionLimits {
            header_read_timeout: cfg.server.header_read_timeout,
            idle_timeout: cfg.server.idle_timeout,
            max_connections: cfg.server.max_connections,
        },
        body_read_timeout: cfg.server.body_read_timeout,
        budget: crate::server::budget::Budget::new(
            usize_of(sizing.max_inflight_bytes),
            cfg.limits.max_concurrent_requests,
        ),
        max_decoded_bytes: usize_of(sizing.max_decoded_bytes),
        tls: cfg
            .server
            .tls
            .as_ref()
            .map(|t| {
                crate::server::tls::TlsSource::load(crate::server::tls::TlsFiles {
                    cert_file: t.cert_file.clone(),
                    key_file: t.key_file.clone(),
                    client_ca_file: t.client_ca_file.clone(),
                })
                .map(Arc::new)
            })
            .transpose()?,
        throttle_status: http::StatusCode::from_u16(cfg.server.throttle_status)
            .unwrap_or(http::StatusCode::TOO_MANY_REQUESTS),
        config_text: cfg
            .to_annotated_yaml(&sizing)
            .unwrap_or_else(|e| format!("# the configuration cannot be printed: {e}\n")),
    })
}

/// A backend URL's host and port (the scheme's port when none is written).
fn backend_address(url: &str) -> Option<(String, u16)> {
    let uri: http::Uri = url.parse().ok()?;
    let port = uri
        .port_u16()
        .unwrap_or(if uri.scheme_str() == Some("https") {
            443
        } else {
            80
        });
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    Some((host.to_string(), port))
}

/// Says at start, once and without stopping anything, when a backend cannot be
/// connected: otherwise a wrong port or a receiver that is not up yet shows only when
/// the first request fails.
async fn probe_backend(name: String, host: String, port: u16) {
    const WITHIN: std::time::Duration = std::time::Duration::from_secs(5);
    let connect = tokio::net::TcpStream::connect((host.as_str(), port));
    let cause = match tokio::time::timeout(WITHIN, connect).await {
        Ok(Ok(_)) => {
            tracing::debug!(backend = %name, address = %format!("{host}:{port}"), "backend reachable");
            return;
        }
        Ok(Err(e)) => {
            let (causes, _) = crate::forward::http_backend::error_causes(Some(&e));
            causes.join(": ")
        }
        Err(_) => format!("timed out after {WITHIN:?}"),
    };
    tracing::warn!(
        backend = %name,
        address = %format!("{host}:{port}"),
        %cause,
        "backend cannot be connected at start; its requests fail (or wait in its queue) until it is up"
    );
}

/// `promnorm serve`: builds everything, listens, runs until SIGTERM/SIGINT, drains.
/// `SIGHUP` (and `POST /-/reload` when `lifecycle` is on) reloads the configuration from
/// `source` ([`crate::reload`]).
pub async fn serve(source: crate::reload::Source, lifecycle: bool) -> anyhow::Result<()> {
    // SIGHUP's default action ends the process: take it over before anything else.
    #[cfg(unix)]
    let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| anyhow::anyhow!("installing the SIGHUP handler: {e}"))?;
    crate::server::budget::return_large_buffers_to_the_kernel();
    let cfg = source.load()?;
    let addr = crate::config::parse_listen(&cfg.listen)
        .map_err(|e| anyhow::anyhow!("listen {:?}: {e}", cfg.listen))?;
    let fit = crate::server::listener::connections_allowed_by_fd_limit()
        .filter(|fit| *fit < cfg.server.max_connections);
    let reloader = crate::reload::Reloader::start(cfg.clone(), source, lifecycle, |state| {
        if let Some(fit) = fit {
            tracing::warn!(
                configured = cfg.server.max_connections,
                allowed = fit,
                "server.max_connections lowered to stay below the open-file limit"
            );
            state.connection_limits.max_connections = fit;
        }
    })?;
    // The memory limit and the sizes derived from it, once.
    let sizing = cfg.sizing();
    tracing::info!(
        limit = sizing.limit.map(|l| l.bytes),
        source = sizing.limit.map(|l| l.source.to_string()),
        allowed = sizing.allowed,
        max_inflight_bytes = sizing.max_inflight_bytes,
        max_body_bytes = sizing.max_body_bytes,
        max_decoded_bytes = sizing.max_decoded_bytes,
        derived_max_series = sizing.derived_max_series,
        queue_max_bytes = ?sizing.queue_max_bytes,
        bound = sizing.bound,
        "{}",
        sizing.summary()
    );
    for w in cfg.warnings_with(&sizing) {
        tracing::warn!("{w}");
    }
    let listener = crate::server::listener::bind(addr, cfg.server.listen_backlog)
        .map_err(|e| anyhow::anyhow!("listening on {addr}: {e}"))?;
    crate::telemetry::config_loaded(true);
    let live = reloader.live();
    let state = live.current();
    tracing::info!(
        listen = %addr,
        backends = ?cfg
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| format!("{}={}", b.name_or_default(i), crate::config::redact_url(&b.url)))
            .collect::<Vec<_>>(),
        packs = ?state.pipeline.rules().packs().iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        lifecycle,
        "promnorm serving"
    );
    for (i, b) in cfg.backends.iter().enumerate() {
        if let Some((host, port)) = backend_address(&b.url) {
            tokio::spawn(probe_backend(b.name_or_default(i), host, port));
        }
    }
    #[cfg(unix)]
    let hangup_task = tokio::spawn(reloader.clone().on_hangup(hangups));
    let app = crate::server::router_live(live.clone(), &cfg.write_paths)
        .merge(crate::web::router(live, &web_options(&cfg)?));
    crate::server::run(
        listener,
        state,
        app,
        crate::server::shutdown_signal(),
        cfg.shutdown_timeout,
    )
    .await?;
    #[cfg(unix)]
    hangup_task.abort();
    reloader.stop(cfg.shutdown_timeout).await;
    tracing::info!("stopped");
    Ok(())
}
