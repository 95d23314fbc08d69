//! Assembly: turns a validated [`Config`] into the running parts — compiled packs,
//! derive stage, pipeline, backends and server state — through one function, [`build`],
//! which `serve`, `check-config`, a reload and the tests all use. `config` stays plain
//! data plus validation; the stages never see configuration types. With `reload` (which
//! builds through this module, never the other way round), the only module that knows
//! both.

use std::sync::Arc;

use crate::config::{
    AutoCount, BUILTIN_PACKS, BackendConfig, BackendProtocolConfig, BuiltinPacks, Config,
    ConfigError, NativeHistogramsConfig, OtelNamesStrategy, QueueConfig, QueueType, TenancyConfig,
    WhenFullConfig, yaml,
};
use crate::derive::DeriveSettings;
use crate::forward::queue::{QueueError, QueueKind, QueueOptions, WhenFull};
use crate::forward::{
    Backend, BackendError, BackendOptions, BackendProtocol, BasicCredentials, Forwarder,
    HttpBackend, NativeHistogramsPolicy, TenancyOptions, TlsOptions,
};
use crate::mapping::{CompileError, GlobalOptions, PackOptions, PackSpec, Rules};
use crate::server::AppState;

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
    #[error(transparent)]
    Queue(#[from] QueueError),
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
        let sizing = self.sizing();
        let max_decoded_bytes = usize_of(sizing.max_decoded_bytes);
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
                // Idle workspaces: the memory bound's W × 64 MiB.
                pool_bytes: usize_of(
                    sizing
                        .workers
                        .saturating_mul(crate::config::memory::WORKER_BYTES),
                ),
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
        p = p.with_guard(std::sync::Arc::new(crate::guard::Guard::new(
            guard_options(self),
        )));
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
        max_samples_per_send: q.max_samples_per_send,
        disk_cache_bytes: crate::config::memory::DISK_QUEUE_CACHE_BYTES,
    })
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

/// The exposition sink's settings (`exposition`); `None` when it is off. Its tenancy
/// is the backends' (the top-level `tenancy`, else the first backend's own).
pub fn exposition_options(
    cfg: &Config,
) -> Result<Option<crate::forward::exposition::ExpositionOptions>, BuildError> {
    let Some(e) = &cfg.exposition else {
        return Ok(None);
    };
    let tenancy = cfg
        .tenancy
        .iter()
        .chain(cfg.backends.iter().filter_map(|b| b.tenancy.as_ref()))
        .find(|t| t.enabled);
    // `check_tenancy` refused a header that is no header name before this runs.
    let tenancy = tenancy.and_then(|t| {
        Some(crate::forward::exposition::ExpositionTenancy {
            label: t.label.clone(),
            header: http::HeaderName::try_from(t.header.as_str()).ok()?,
            default: t.default.clone(),
            keep_label: t.keep_label,
        })
    });
    Ok(Some(crate::forward::exposition::ExpositionOptions {
        ttl: e.ttl,
        max_series: e.max_series,
        tenancy,
    }))
}

/// The scraper's settings (`scrape`); `None` when it is off.
pub fn scrape_options(cfg: &Config) -> Option<crate::scrape::ScrapeOptions> {
    let sc = cfg.scrape.as_ref()?;
    Some(crate::scrape::ScrapeOptions {
        interval: sc.interval,
        timeout: sc.timeout,
        max_body_bytes: usize::try_from(sc.max_body_bytes.0).unwrap_or(usize::MAX),
        honor_labels: sc.honor_labels,
        honor_timestamps: sc.honor_timestamps,
        targets: sc
            .targets
            .iter()
            .map(|t| crate::scrape::TargetSpec {
                url: t.url.clone(),
                labels: t.labels.clone(),
                params: crate::scrape::merge_params(&sc.params, &t.params),
            })
            .collect(),
        file_sd: sc.file_sd.clone(),
        file_sd_refresh: sc.file_sd_refresh,
        parse_groups: parse_file_sd,
        params: sc.params.clone(),
    })
}

/// A `file_sd` file (JSON or YAML: one parser, since JSON is YAML) → its groups.
fn parse_file_sd(text: &str) -> Result<Vec<crate::scrape::sd::TargetGroup>, String> {
    let groups: Vec<crate::config::FileSdGroup> =
        crate::config::yaml::from_str(text).map_err(|e| e.to_string())?;
    Ok(groups
        .into_iter()
        .map(|g| crate::scrape::sd::TargetGroup {
            targets: g.targets,
            labels: g.labels,
        })
        .collect())
}

/// The cardinality guard's settings (`limits.*`, and the tenancy it counts tenants by:
/// `Config::guard_tenancy`).
pub fn guard_options(cfg: &Config) -> crate::guard::GuardOptions {
    let l = &cfg.limits;
    let tenancy = cfg.guard_tenancy();
    crate::guard::GuardOptions {
        max_series_per_metric: l.max_series_per_metric,
        max_series_per_tenant: l.max_series_per_tenant,
        window: l.active_series_window,
        series_max_labels: l.series_max_labels,
        series_max_label_value_bytes: l.series_max_label_value_bytes.as_usize(),
        max_tracked_series: cfg.sizing().max_tracked_series,
        overrides: l
            .tenant_overrides
            .iter()
            .map(|(t, o)| {
                (
                    t.as_bytes().into(),
                    (o.max_series_per_metric, o.max_series_per_tenant),
                )
            })
            .collect(),
        tenant_label: tenancy.map(|t| t.label.as_bytes().into()),
        tenant_default: tenancy.and_then(|t| t.default.as_deref().map(|d| d.as_bytes().into())),
        tenant_header: tenancy.map(|t| t.header.clone()),
    }
}

/// The exposition sink: the previous parts' one (its series kept, its options
/// replaced) or a new one.
fn exposition_store(
    cfg: &Config,
    previous: Option<&Running>,
) -> Result<Option<Arc<crate::forward::exposition::ExpositionStore>>, BuildError> {
    let Some(opts) = exposition_options(cfg)? else {
        return Ok(None);
    };
    if let Some(old) = previous.and_then(|p| p.state.forwarder.exposition()) {
        old.reconfigure(opts);
        return Ok(Some(old.clone()));
    }
    Ok(Some(Arc::new(
        crate::forward::exposition::ExpositionStore::new(opts),
    )))
}

/// The query API's settings (`query`), its credentials read; `None` when it is off.
pub fn query_options(cfg: &Config) -> Result<Option<crate::query::QueryOptions>, BuildError> {
    let Some(q) = &cfg.query else {
        return Ok(None);
    };
    let secret_error = |source| ConfigError::Secret {
        at: String::new(),
        owner: "query".into(),
        source,
    };
    let url = crate::config::parse_backend_url(&q.upstream).map_err(|source| ConfigError::Url {
        at: String::new(),
        source,
    })?;
    let mut headers: Vec<(String, String)> = q
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let basic = match (&q.basic_auth, url.userinfo) {
        (Some(b), _) => Some((b.username.clone(), b.password.read().map_err(secret_error)?)),
        (None, userinfo) => userinfo,
    };
    if let Some((username, password)) = basic {
        let token = crate::forward::http_backend::base64_encode(
            format!("{username}:{password}").as_bytes(),
        );
        headers.push(("authorization".into(), format!("Basic {token}")));
    }
    if let Some(t) = &q.bearer_token {
        let token = t.read().map_err(secret_error)?;
        headers.push(("authorization".into(), format!("Bearer {}", token.trim())));
    }
    Ok(Some(crate::query::QueryOptions {
        upstream: crate::query::upstream::UpstreamOptions {
            base: url.uri.to_string().trim_end_matches('/').to_string(),
            timeout: q.timeout,
            max_response_bytes: usize_of(q.max_response_bytes.bytes()),
            headers,
            tls: TlsOptions {
                ca_file: q.tls.ca_file.clone(),
                insecure_skip_verify: q.tls.insecure_skip_verify,
            },
        },
        max_concurrent: q.max_concurrent,
        merge_old_names: q.merge_old_names,
    }))
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

/// A backend as built, kept across reloads while its options are the same.
struct BuiltBackend {
    options: BackendOptions,
    /// The backend's queue (`None`: unqueued): a changed queue is a changed backend.
    queue: Option<QueueOptions>,
    /// The CA file's contents: a renewed CA file is a changed backend.
    ca: Option<Vec<u8>>,
    backend: Arc<Backend>,
}

/// A configuration built into the parts that serve it ([`build`]). Nothing runs yet:
/// [`Running::start`] opens the queues and starts the derived-series writer.
pub struct Running {
    /// What it was built from, restart-only keys at their running value.
    pub cfg: Config,
    /// What the server serves: pipeline, forwarder, server settings.
    pub state: Arc<AppState>,
    backends: Vec<BuiltBackend>,
    derive: Option<DeriveSettings>,
    rules_key: String,
    /// What the build took over from the previous parts.
    pub kept: Kept,
}

/// What a build took over from the parts it replaces.
#[derive(Clone, Debug, Default)]
pub struct Kept {
    /// The deriver (and its state) of the previous parts.
    pub derived_state: bool,
    /// Backends shared with the previous parts (client, connections, queue).
    pub backends: usize,
    /// Keys that need a restart and changed: they kept their running value.
    pub restart_only: Vec<String>,
}

impl Running {
    /// Opens the backends' queues (a queue already open, of a backend kept across a
    /// reload, stays as it is) and starts the derived-series writer, on the current
    /// runtime.
    pub fn start(&self) -> Result<Option<tokio::task::JoinHandle<()>>, BuildError> {
        self.state.start_queues()?;
        Ok(self.state.spawn_background())
    }
}

/// The one assembly: `cfg` validated, then built into running parts. With `previous`
/// (a reload) it keeps what the running parts hold that the new configuration does not
/// change: the restart-only settings' values, each backend whose resolved options, queue
/// and CA file are unchanged (client, connections, queue), the rename trackers' counts,
/// the deriver when its settings and the rules' inputs are unchanged, the counter
/// families the metadata `_total` fix learnt, the readiness flag, the listener's
/// connection limits and TLS source, and the overload budget (with its reservations)
/// when its limits are unchanged.
pub fn build(cfg: &Config, previous: Option<&Running>) -> Result<Running, BuildError> {
    let rules = cfg.validate()?;
    let mut cfg = cfg.clone();
    // Restart-only settings keep their running value before anything is built from
    // them (e.g. server.throttle_status, which the queues answer with).
    let restart_only = match previous {
        Some(p) => keep_restart_settings(&p.cfg, &mut cfg),
        None => Vec::new(),
    };
    let backends = build_backends(&cfg, previous.map_or(&[][..], |p| &p.backends))?;
    let derive = cfg.derive_settings()?;
    let rules_key = rules_key(&cfg)?;
    if let Some(p) = previous {
        rules.inherit_renames(p.state.pipeline.rules());
    }
    let mut pipeline = cfg.pipeline_with(rules)?;
    let mut kept = Kept {
        restart_only,
        ..Kept::default()
    };
    if let Some(p) = previous {
        let old = &p.state;
        kept.backends = backends
            .iter()
            .filter(|b| {
                p.backends
                    .iter()
                    .any(|o| Arc::ptr_eq(&o.backend, &b.backend))
            })
            .count();
        if derive == p.derive
            && rules_key == p.rules_key
            && pipeline.deriver().is_some()
            && let Some(d) = old.pipeline.deriver()
        {
            pipeline = pipeline.with_deriver(d.clone());
            kept.derived_state = true;
        }
        pipeline = pipeline.with_counter_families_of(&old.pipeline);
        // The active series stay counted across a reload; the new limits apply to them.
        if let Some(g) = old.pipeline.guard() {
            g.reconfigure(guard_options(&cfg));
            pipeline = pipeline.with_guard(g.clone());
        }
    }
    // The same backends serve every configuration that keeps them.
    let forwarder = Forwarder::new(backends.iter().map(|b| b.backend.clone()).collect())
        .with_exposition(exposition_store(&cfg, previous)?);
    let mut state = AppState::new(pipeline, forwarder, server_options(&cfg)?);
    state.scrape = scrape_options(&cfg).map(Arc::new);
    if let Some(opts) = query_options(&cfg)? {
        let usage = previous
            .and_then(|p| p.state.query.as_ref())
            .map(|q| q.usage().clone());
        state.query = Some(Arc::new(crate::query::QueryApi::new(opts, usage)?));
    }
    if let Some(p) = previous {
        let old = &p.state;
        state.ready = old.ready.clone();
        state.connection_limits = old.connection_limits.clone();
        // The listener keeps the TLS source it started with (server.* needs a restart);
        // the overload budget carries its reservations over unless its limits changed.
        state.tls = old.tls.clone();
        // Compared as resolved: an `auto` budget follows the other sizes.
        if state.budget.max_bytes() == old.budget.max_bytes()
            && cfg.limits.max_concurrent_requests == p.cfg.limits.max_concurrent_requests
        {
            state.budget = old.budget.clone();
        }
    }
    Ok(Running {
        cfg,
        state: Arc::new(state),
        backends,
        derive,
        rules_key,
        kept,
    })
}

/// Backends for `cfg`, reusing those of `old` whose options did not change.
fn build_backends(cfg: &Config, old: &[BuiltBackend]) -> Result<Vec<BuiltBackend>, BuildError> {
    let mut out = Vec::with_capacity(cfg.backends.len());
    let sizing = cfg.sizing();
    for (i, b) in cfg.backends.iter().enumerate() {
        let options = backend_options(b, i, cfg.tenancy.as_ref(), cfg.server.throttle_status)?;
        let ca = match &options.tls.ca_file {
            None => None,
            Some(f) => Some(std::fs::read(f).map_err(|e| ConfigError::Io {
                file: f.display().to_string(),
                source: e,
            })?),
        };
        let max_bytes = sizing.queue_max_bytes.get(i).copied().unwrap_or(0);
        let queue = queue_options(&b.queue, max_bytes, cfg.server.throttle_status);
        let same = |o: &&BuiltBackend| o.options == options && o.ca == ca && o.queue == queue;
        let backend = match old.iter().find(same) {
            Some(o) => o.backend.clone(),
            None => Arc::new(Backend::new(
                HttpBackend::new(options.clone())?,
                queue.clone(),
            )),
        };
        out.push(BuiltBackend {
            options,
            queue,
            ca,
            backend,
        });
    }
    Ok(out)
}

fn yaml_text<T: serde::Serialize>(v: &T) -> Result<String, ConfigError> {
    yaml::to_string(v).map_err(|source| ConfigError::Yaml {
        file: "<configuration>".into(),
        source,
    })
}

/// Everything the compiled rules depend on: when it is unchanged, so is every derived
/// series' input (the packs' settings, the packs' files' text).
fn rules_key(cfg: &Config) -> Result<String, ConfigError> {
    let mut key = yaml_text(&(
        &cfg.packs,
        cfg.keep_original,
        cfg.drop_created_series,
        cfg.metadata_total_fix,
    ))?;
    for f in &cfg.packs.files {
        key.push_str(&std::fs::read_to_string(f).map_err(|e| ConfigError::Io {
            file: f.display().to_string(),
            source: e,
        })?);
    }
    Ok(key)
}

/// Top-level keys of a serialised mapping with the text of each one's value.
fn keyed_blocks(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        match out.last_mut() {
            Some((_, block)) if line.starts_with([' ', '-']) => {
                block.push_str(line);
                block.push('\n');
            }
            _ => {
                let key = line.split(':').next().unwrap_or(line).to_string();
                out.push((key, format!("{line}\n")));
            }
        }
    }
    out
}

/// The keys of `new` that need a restart and differ from `running`: each is set back to
/// its running value; returns their names.
pub fn keep_restart_settings(running: &Config, new: &mut Config) -> Vec<String> {
    let mut changed = Vec::new();
    if new.listen != running.listen {
        changed.push("listen".to_string());
        new.listen = running.listen.clone();
    }
    if new.write_paths != running.write_paths {
        changed.push("write_paths".to_string());
        new.write_paths = running.write_paths.clone();
    }
    if new.log_format != running.log_format {
        changed.push("log_format".to_string());
        new.log_format = running.log_format;
    }
    if new.shutdown_timeout != running.shutdown_timeout {
        changed.push("shutdown_timeout".to_string());
        new.shutdown_timeout = running.shutdown_timeout;
    }
    // The web UI's routes are built once, with the listener.
    if let (Ok(a), Ok(b)) = (yaml_text(&running.web), yaml_text(&new.web))
        && a != b
    {
        changed.push("web".to_string());
        new.web = running.web.clone();
    }
    // Every `server.*` key belongs to the listener, bound once, except
    // `body_read_timeout`, read per request.
    let body_read_timeout = new.server.body_read_timeout;
    new.server.body_read_timeout = running.server.body_read_timeout;
    let (old_text, new_text) = (yaml_text(&running.server), yaml_text(&new.server));
    if let (Ok(old_text), Ok(new_text)) = (old_text, new_text)
        && old_text != new_text
    {
        let old_blocks = keyed_blocks(&old_text);
        for (key, block) in keyed_blocks(&new_text) {
            if !old_blocks.iter().any(|(k, b)| *k == key && *b == block) {
                changed.push(format!("server.{key}"));
            }
        }
        new.server = running.server.clone();
    }
    new.server.body_read_timeout = body_read_timeout;
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn cfg(text: &str) -> Config {
        Config::parse(text, "t.yaml").unwrap()
    }

    #[test]
    fn restart_settings_keep_their_running_value() {
        let running = cfg("listen: 127.0.0.1:1\nserver:\n  idle_timeout: 5s\n");
        let mut new = cfg(
            "listen: 127.0.0.1:2\nserver:\n  idle_timeout: 6s\n  body_read_timeout: 7s\nkeep_original: true\n",
        );
        let changed = keep_restart_settings(&running, &mut new);
        assert_eq!(changed, ["listen", "server.idle_timeout"]);
        assert_eq!(new.listen, "127.0.0.1:1");
        assert_eq!(new.server.idle_timeout, Duration::from_secs(5));
        // Per request: reloadable.
        assert_eq!(new.server.body_read_timeout, Duration::from_secs(7));
        assert!(new.keep_original);
        let mut same = running.clone();
        assert!(keep_restart_settings(&running, &mut same).is_empty());
    }

    #[test]
    fn unchanged_backends_are_reused_and_changed_ones_rebuilt() {
        let a = cfg(
            "backends:\n  - url: http://127.0.0.1:1/api/v1/write\n  - url: http://127.0.0.1:2/api/v1/write\n",
        );
        let first = build_backends(&a, &[]).unwrap();
        let b = cfg(
            "backends:\n  - url: http://127.0.0.1:1/api/v1/write\n  - url: http://127.0.0.1:2/api/v1/write\n    headers: {X-Tenant: t}\n",
        );
        let second = build_backends(&b, &first).unwrap();
        assert!(Arc::ptr_eq(&first[0].backend, &second[0].backend));
        assert!(!Arc::ptr_eq(&first[1].backend, &second[1].backend));
    }

    /// Issue 24: a build with the previous parts keeps what they hold (backends, the
    /// deriver, the readiness flag) and sets restart-only keys back; a build without
    /// them shares nothing.
    #[test]
    fn a_build_on_previous_parts_keeps_what_did_not_change() {
        let a = cfg(
            "listen: 127.0.0.1:1\nderived:\n  enabled: true\nbackends:\n  - url: http://127.0.0.1:1/api/v1/write\n",
        );
        let first = build(&a, None).unwrap();
        assert_eq!(first.kept.backends, 0);
        let b = cfg(
            "listen: 127.0.0.1:2\nderived:\n  enabled: true\nbackends:\n  - url: http://127.0.0.1:1/api/v1/write\n",
        );
        let second = build(&b, Some(&first)).unwrap();
        assert_eq!(second.kept.backends, 1);
        assert!(second.kept.derived_state);
        assert_eq!(second.kept.restart_only, ["listen"]);
        assert_eq!(second.cfg.listen, "127.0.0.1:1");
        assert!(Arc::ptr_eq(&first.state.ready, &second.state.ready));
        let fresh = build(&b, None).unwrap();
        assert!(!fresh.kept.derived_state);
        assert!(!Arc::ptr_eq(&first.state.ready, &fresh.state.ready));
    }

    #[test]
    fn rules_key_follows_packs_and_their_files() {
        let dir = std::env::temp_dir().join(format!("promnorm-reload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pack = dir.join("p.yaml");
        std::fs::write(&pack, "pack: p\nrules: []\n").unwrap();
        let text = format!("packs:\n  files: [{}]\n", pack.display());
        let one = rules_key(&cfg(&text)).unwrap();
        assert_eq!(one, rules_key(&cfg(&text)).unwrap());
        std::fs::write(&pack, "pack: p\nrules: []\n# changed\n").unwrap();
        assert_ne!(one, rules_key(&cfg(&text)).unwrap());
        let other = format!("{text}keep_original: true\n");
        assert_ne!(
            rules_key(&cfg(&text)).unwrap(),
            rules_key(&cfg(&other)).unwrap()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
