//! Checks of a parsed configuration that the schema cannot express (cross-key rules,
//! files and disk space, sizes against the memory limit), and its warnings.

use super::*;

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

impl Config {
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

    /// `query`: the upstream URL, the bounds, the headers and the secrets `serve` reads.
    fn check_query(&self, q: &QueryConfig) -> Result<(), ConfigError> {
        let url = parse_backend_url(&q.upstream).map_err(|source| {
            let at = split_userinfo(&q.upstream)
                .1
                .map_or(q.upstream.as_str(), |u| u);
            ConfigError::Url {
                at: self.position("upstream", at),
                source,
            }
        })?;
        if url.uri.query().is_some() {
            return Err(self.invalid_at(
                "upstream",
                &q.upstream,
                "query.upstream is the root of a query API (e.g. http://prometheus:9090): no query string",
            ));
        }
        if url.userinfo.is_some() && (q.basic_auth.is_some() || q.bearer_token.is_some()) {
            return Err(self.invalid_at(
                "upstream",
                "",
                "query: credentials both in the upstream URL and in basic_auth or bearer_token",
            ));
        }
        if q.basic_auth.is_some() && q.bearer_token.is_some() {
            return Err(self.invalid_at(
                "bearer_token",
                "",
                "query: basic_auth and bearer_token both set; choose one",
            ));
        }
        if q.timeout.is_zero() {
            return Err(self.invalid_at("timeout", "0", "query.timeout must be positive"));
        }
        if !(1..=10_000).contains(&q.max_concurrent) {
            return Err(self.invalid_at(
                "max_concurrent",
                &q.max_concurrent.to_string(),
                "query.max_concurrent must be from 1 to 10000",
            ));
        }
        if q.max_response_bytes.bytes() < 1024 {
            return Err(self.invalid_at(
                "max_response_bytes",
                &q.max_response_bytes.to_string(),
                "query.max_response_bytes must be at least 1KiB",
            ));
        }
        for (k, v) in &q.headers {
            if k.parse::<http::HeaderName>().is_err() || v.parse::<http::HeaderValue>().is_err() {
                return Err(self.invalid_at(
                    "headers",
                    k,
                    format!("query.headers: {k:?} is not a valid header"),
                ));
            }
        }
        let secrets = q
            .bearer_token
            .iter()
            .chain(q.basic_auth.iter().map(|b| &b.password));
        for secret in secrets {
            if let Err(source) = secret.read() {
                return Err(ConfigError::Secret {
                    at: self.secret_position(secret),
                    owner: "query".into(),
                    source,
                });
            }
        }
        if let Some(ca) = &q.tls.ca_file
            && let Err(e) = std::fs::read(ca)
        {
            return Err(ConfigError::Io {
                file: ca.display().to_string(),
                source: e,
            });
        }
        Ok(())
    }

    /// Reads what `serve` will read for a backend (credentials, CA file), so a
    /// configuration that check-config accepts, serve accepts; errors name the position.
    fn check_scrape(&self, sc: &ScrapeConfig) -> Result<(), ConfigError> {
        if sc.interval.is_zero() {
            return Err(self.invalid_at("interval", "0", "scrape.interval must be positive"));
        }
        if sc.timeout.is_zero() || sc.timeout > sc.interval {
            return Err(self.invalid_at(
                "timeout",
                &format_duration(sc.timeout),
                "scrape.timeout must be positive and at most scrape.interval",
            ));
        }
        if sc.max_body_bytes.0 == 0 {
            return Err(self.invalid_at(
                "max_body_bytes",
                "0",
                "scrape.max_body_bytes must be positive",
            ));
        }
        for t in &sc.targets {
            crate::config::scrape_target_url(&t.url)
                .map_err(|why| self.invalid_at("url", &t.url, why))?;
            for name in t.labels.keys() {
                if !crate::config::is_label_name(name) {
                    return Err(self.invalid_at(
                        name,
                        name,
                        format!("scrape target label {name:?} is not a valid label name"),
                    ));
                }
            }
        }
        for name in sc
            .params
            .keys()
            .chain(sc.targets.iter().flat_map(|t| t.params.keys()))
        {
            if name.is_empty() {
                return Err(self.invalid_at(
                    "params",
                    "",
                    "scrape params: a parameter name is empty",
                ));
            }
        }
        for pattern in &sc.file_sd {
            if pattern.is_empty() {
                return Err(self.invalid_at("file_sd", "", "scrape.file_sd: an empty path"));
            }
        }
        Ok(())
    }

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
        if q.max_samples_per_send == 0 {
            return Err(self.invalid_at(
                "max_samples_per_send",
                "0",
                format!("backend {name}: queue.max_samples_per_send must be at least 1 (1 sends each queued request as it came)"),
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

    /// The cardinality guard's settings (docs/limits.md).
    fn check_series_limits(&self) -> Result<(), ConfigError> {
        let l = &self.limits;
        if l.active_series_window < Duration::from_secs(1) {
            return Err(self.invalid_at(
                "active_series_window",
                &format!("{:?}", l.active_series_window),
                "limits.active_series_window must be at least 1s",
            ));
        }
        if l.max_tracked_series == AutoCount::Set(0) {
            return Err(self.invalid_at(
                "max_tracked_series",
                "0",
                "limits.max_tracked_series must be positive",
            ));
        }
        if !l.tenant_overrides.is_empty() && self.guard_tenancy().is_none() {
            return Err(self.invalid_at(
                "tenant_overrides",
                "",
                "limits.tenant_overrides needs tenancy (a global `tenancy`, or one on a backend): without it every series is one tenant's",
            ));
        }
        Ok(())
    }

    /// The tenant routing the cardinality guard counts tenants by: the global `tenancy`,
    /// else the first backend's own.
    pub fn guard_tenancy(&self) -> Option<&TenancyConfig> {
        self.tenancy.as_ref().filter(|t| t.enabled).or_else(|| {
            self.backends
                .iter()
                .find_map(|b| b.effective_tenancy(self.tenancy.as_ref()))
        })
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
        let at = |key: &str, p: &Path, e: crate::pem::PemError| {
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
        self.check_series_limits()?;
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
        if let Some(q) = &self.query {
            self.check_query(q)?;
        }
        if let Some(e) = &self.exposition {
            if e.ttl.is_zero() {
                return Err(self.invalid_at("ttl", "0", "exposition.ttl must be positive"));
            }
            if e.max_series == 0 {
                return Err(self.invalid_at(
                    "max_series",
                    "0",
                    "exposition.max_series must be positive",
                ));
            }
        }
        if let Some(sc) = &self.scrape {
            self.check_scrape(sc)?;
        }
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
