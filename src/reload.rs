//! Hot reload (docs/operations.md): `SIGHUP` and `POST /-/reload` re-read the
//! configuration file and the mapping files it names, validate and compile them exactly
//! as `serve` does at start-up ([`crate::app::Assemble`]), and swap the server's state
//! whole ([`crate::server::Live`]): a request in flight finishes on the rules it started
//! with, the next one uses the new ones. A configuration that fails keeps the running
//! one.
//!
//! What survives a reload:
//! - derived-series state (and sums over ranks, and the counter families the metadata
//!   `_total` fix learnt): the deriver is kept when the derived settings and the rules
//!   that produce its inputs (packs, their files and options) are unchanged;
//! - backends: one whose resolved options (URL, timeout, headers, credentials, TLS, the
//!   CA file's contents) are unchanged keeps its client and its connections;
//! - settings fixed at start-up (`listen`, `write_paths`, `log_format`,
//!   `shutdown_timeout`, the listener's `server.*` keys) keep their running value and a
//!   warning says a restart is needed.
//!
//! Reloads are serialised: one runs at a time, the next waits for it.

use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::app::{Assemble, BuildError, backend_options, queue_options, server_options};
use crate::config::{BackendConfig, Config, ConfigError, LogFormat, yaml};
use crate::derive::DeriveSettings;
use crate::forward::queue::{Halted, QueueOptions, QueuedSink};
use crate::forward::{BackendOptions, Forwarder, HttpBackend, Sink};
use crate::server::{AppState, Live, ReloadHook};
use crate::telemetry;

/// Where `serve` reads its configuration, again on every reload: the file (none: the
/// embedded default) and the command-line flags that override it.
#[derive(Clone, Debug, Default)]
pub struct Source {
    pub file: Option<PathBuf>,
    pub listen: Option<String>,
    /// `--backend` URLs: they replace the configured backends.
    pub backends: Vec<String>,
    pub log_format: Option<LogFormat>,
}

impl Source {
    /// Reads the configuration and applies the flags.
    pub fn load(&self) -> Result<Config, ConfigError> {
        let mut cfg = match &self.file {
            Some(p) => Config::load(p)?,
            None => Config::embedded_default(),
        };
        if let Some(l) = &self.listen {
            cfg.listen = l.clone();
        }
        if !self.backends.is_empty() {
            cfg.backends = self
                .backends
                .iter()
                .cloned()
                .map(BackendConfig::from_url)
                .collect();
        }
        if let Some(f) = self.log_format {
            cfg.log_format = f;
        }
        Ok(cfg)
    }
}

/// A backend as built, kept across reloads while its options are the same.
struct Backend {
    options: BackendOptions,
    /// The backend's queue (`None`: unqueued): a changed queue is a changed backend.
    queue: Option<QueueOptions>,
    /// The CA file's contents: a renewed CA file is a changed backend.
    ca: Option<Vec<u8>>,
    sink: Arc<dyn Sink>,
}

/// What the running configuration was built from.
struct Running {
    cfg: Config,
    backends: Vec<Backend>,
    derive: Option<DeriveSettings>,
    rules_key: String,
    writer: Option<tokio::task::JoinHandle<()>>,
    /// Queues replaced by a reload whose records are still being delivered through
    /// their successor (a backend without a queue, or a queue without room for them).
    retired: Vec<Arc<QueuedSink>>,
}

/// An old queue's records on their way to the backend of the same name in the new
/// configuration.
struct Handover {
    from: Halted,
    /// Resumed with `from` when the reload fails.
    back: Arc<dyn Sink>,
    /// `back` when it is a queue retired by an earlier reload.
    retired: Option<Arc<QueuedSink>>,
    successor: Arc<dyn Sink>,
}

/// Owns the running configuration and replaces it on request.
pub struct Reloader {
    source: Source,
    live: Arc<Live>,
    running: tokio::sync::Mutex<Running>,
}

/// Backends for `cfg`, reusing those of `old` whose options did not change.
fn build_backends(cfg: &Config, old: &[Backend]) -> Result<Vec<Backend>, BuildError> {
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
        let same = |o: &&Backend| o.options == options && o.ca == ca && o.queue == queue;
        let sink = match old.iter().find(same) {
            Some(o) => o.sink.clone(),
            None => {
                let http = HttpBackend::new(options.clone())?;
                match &queue {
                    None => Arc::new(http) as Arc<dyn Sink>,
                    Some(q) => {
                        Arc::new(QueuedSink::new(Arc::new(http), q.clone())) as Arc<dyn Sink>
                    }
                }
            }
        };
        out.push(Backend {
            options,
            queue,
            ca,
            sink,
        });
    }
    Ok(out)
}

fn forwarder(backends: &[Backend]) -> Forwarder {
    // The same sinks serve every configuration that keeps them.
    Forwarder::new(backends.iter().map(|b| b.sink.clone()).collect())
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

impl Reloader {
    /// Builds the state of `cfg` (as `app::app_state` does, backends kept for reuse) and
    /// starts its derived-series writer. `adjust` may change the first state before it
    /// serves (e.g. lower the connection limit).
    pub fn start(
        cfg: Config,
        source: Source,
        lifecycle: bool,
        adjust: impl FnOnce(&mut AppState),
    ) -> Result<Arc<Reloader>, BuildError> {
        let rules = cfg.validate()?;
        let backends = build_backends(&cfg, &[])?;
        let derive = cfg.derive_settings()?;
        let rules_key = rules_key(&cfg)?;
        let pipeline = cfg.pipeline_with(rules)?;
        let mut state = AppState::new(pipeline, forwarder(&backends), server_options(&cfg)?);
        adjust(&mut state);
        let state = Arc::new(state);
        state.start_queues().map_err(BuildError::Queue)?;
        let writer = state.spawn_background();
        let running = Running {
            cfg,
            backends,
            derive,
            rules_key,
            writer,
            retired: Vec::new(),
        };
        Ok(Arc::new_cyclic(|me: &Weak<Reloader>| {
            let me = me.clone();
            let hook: ReloadHook = Arc::new(move || {
                let me = me.clone();
                Box::pin(async move {
                    match me.upgrade() {
                        Some(r) => r.reload().await,
                        None => Err("promnorm is shutting down".into()),
                    }
                })
            });
            Reloader {
                source,
                live: Arc::new(Live::new(state).with_reload(lifecycle, hook)),
                running: tokio::sync::Mutex::new(running),
            }
        }))
    }

    /// The swappable state the router serves.
    pub fn live(&self) -> Arc<Live> {
        self.live.clone()
    }

    /// The configuration now serving.
    pub async fn config(&self) -> Config {
        self.running.lock().await.cfg.clone()
    }

    /// Reloads: `Ok` once the new configuration serves; `Err` (why, with file:line:column
    /// where the error has one) when the running configuration stays. Sets the
    /// `promnorm_config_last_reload_*` gauges and logs either way.
    pub async fn reload(&self) -> Result<(), String> {
        let mut running = self.running.lock().await;
        // Gauges first, then the log line: whoever reads the line sees the gauges.
        match self.replace(&mut running).await {
            Ok(kept) => {
                telemetry::config_loaded(true);
                tracing::info!(
                    derived_state_kept = kept.derived_state,
                    backends_kept = kept.backends,
                    "configuration reloaded"
                );
                Ok(())
            }
            Err(e) => {
                telemetry::config_loaded(false);
                tracing::error!(
                    "configuration reload failed; the running configuration stays: {e}"
                );
                Err(e.to_string())
            }
        }
    }

    async fn replace(&self, running: &mut Running) -> Result<Kept, BuildError> {
        let mut cfg = self.source.load()?;
        let rules = cfg.validate()?;
        // Restart-only settings keep their running value before anything is built from
        // them (e.g. server.throttle_status, which the queues answer with).
        let restart_only = keep_restart_settings(&running.cfg, &mut cfg);
        let backends = build_backends(&cfg, &running.backends)?;
        let derive = cfg.derive_settings()?;
        let rules_key = rules_key(&cfg)?;
        let old = self.live.current();
        rules.inherit_renames(old.pipeline.rules());
        let mut pipeline = cfg.pipeline_with(rules)?;
        let keep_deriver = derive == running.derive && rules_key == running.rules_key;
        let mut kept = Kept {
            derived_state: false,
            backends: backends
                .iter()
                .filter(|b| {
                    running
                        .backends
                        .iter()
                        .any(|o| Arc::ptr_eq(&o.sink, &b.sink))
                })
                .count(),
        };
        if keep_deriver
            && pipeline.deriver().is_some()
            && let Some(d) = old.pipeline.deriver()
        {
            pipeline = pipeline.with_deriver(d.clone());
            kept.derived_state = true;
        }
        pipeline = pipeline.with_counter_families_of(&old.pipeline);
        // Validated and built: from here on nothing fails.
        for key in restart_only {
            tracing::warn!(
                "{key} changed: it takes effect only after a restart; the running value stays"
            );
        }
        for w in cfg.warnings() {
            tracing::warn!("{w}");
        }
        let mut state = AppState::new(pipeline, forwarder(&backends), server_options(&cfg)?);
        state.ready = old.ready.clone();
        state.connection_limits = old.connection_limits.clone();
        // The listener keeps the TLS source it started with (server.* needs a restart);
        // the overload budget carries its reservations over unless its limits changed.
        state.tls = old.tls.clone();
        // Compared as resolved: an `auto` budget follows the other sizes.
        if state.budget.max_bytes() == old.budget.max_bytes()
            && cfg.limits.max_concurrent_requests == running.cfg.limits.max_concurrent_requests
        {
            state.budget = old.budget.clone();
        }
        let state = Arc::new(state);
        // A changed backend's queue hands what it holds to the new backend of the same
        // name: it halts at once (a disk queue's directory is held by one queue at a
        // time, so it closes when the successor reopens the same directory and replays
        // it); once the successor is open its records move into the successor's queue,
        // ahead of anything new, or, when the successor has no queue (or no room), a
        // retired queue delivers them through it. A removed backend's queue delivers a
        // memory queue's records within shutdown_timeout, a disk queue's stay on disk.
        // Meanwhile the old configuration answers 503 for it, so senders retry.
        let old_sinks: Vec<Arc<dyn Sink>> =
            running.backends.iter().map(|b| b.sink.clone()).collect();
        let is_new = |sink: &Arc<dyn Sink>| !old_sinks.iter().any(|o| Arc::ptr_eq(o, sink));
        let successor_of = |name: &str| {
            backends
                .iter()
                .find(|n| n.sink.name() == name && is_new(&n.sink))
                .map(|n| n.sink.clone())
        };
        let mut stopped = Vec::new();
        let mut handovers: Vec<Handover> = Vec::new();
        let same_dir = |h: &Halted, succ: &Arc<dyn Sink>| {
            h.dir().is_some() && h.dir() == succ.as_queue().and_then(|q| q.dir())
        };
        for b in &running.backends {
            if backends.iter().any(|n| Arc::ptr_eq(&n.sink, &b.sink)) {
                continue;
            }
            if let (Some(q), Some(successor)) = (b.sink.as_queue(), successor_of(b.sink.name())) {
                if let Some(h) = q.halt().await {
                    if same_dir(&h, &successor) {
                        h.close();
                        stopped.push(b.sink.clone());
                    } else {
                        handovers.push(Handover {
                            from: h,
                            back: b.sink.clone(),
                            retired: None,
                            successor,
                        });
                    }
                }
                continue;
            }
            if let Some(q) = b.sink.queue_state() {
                let within = if q.durable {
                    Duration::ZERO
                } else {
                    running.cfg.shutdown_timeout
                };
                b.sink.stop(within).await;
                stopped.push(b.sink.clone());
            }
        }
        // Queues retired by an earlier reload move on to this configuration's backend
        // of their name, unless it is the one they already deliver through.
        let mut retired = Vec::new();
        for r in std::mem::take(&mut running.retired) {
            if !r.is_running() {
                continue;
            }
            let successor = backends
                .iter()
                .find(|n| n.sink.name() == r.name())
                .map(|n| n.sink.clone());
            match successor {
                Some(succ) if !Arc::ptr_eq(&succ, r.target()) => {
                    if let Some(h) = r.halt().await {
                        if same_dir(&h, &succ) {
                            h.close();
                        } else {
                            handovers.push(Handover {
                                from: h,
                                back: r.clone(),
                                retired: Some(r.clone()),
                                successor: succ,
                            });
                        }
                    }
                }
                _ => retired.push(r),
            }
        }
        if let Err(e) = state.start_queues() {
            // Undo: close the queues this attempt opened, reopen the ones it stopped
            // (a stopped queue starts again, replaying its directory), so the running
            // configuration keeps every backend it had.
            for b in &backends {
                if is_new(&b.sink) {
                    b.sink.stop(Duration::ZERO).await;
                }
            }
            for h in handovers {
                if let Some(q) = h.back.as_queue() {
                    q.resume(h.from);
                }
                retired.extend(h.retired);
            }
            running.retired = retired;
            for sink in stopped {
                if let Err(again) = sink.start() {
                    tracing::error!(
                        backend = sink.name(),
                        "reopening the queue after a failed reload: {again}"
                    );
                }
            }
            return Err(BuildError::Queue(e));
        }
        for h in handovers {
            let requests = h.from.requests();
            if let Some(q) = h.successor.as_queue() {
                match q.adopt(&h.from) {
                    Ok(moved) if moved > 0 => {
                        tracing::info!(
                            backend = q.name(),
                            requests = moved,
                            "queued requests handed to the new queue"
                        );
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(
                        backend = q.name(),
                        requests,
                        "handing the old queue to the new one: {e}; the rest is delivered through it as room allows"
                    ),
                }
            }
            let r = QueuedSink::retire_into(h.from, h.successor);
            if r.is_running() {
                retired.push(r);
            }
        }
        let old = self.live.swap(state.clone());
        // The old writer flushes what it holds a last time (to the old backends), then
        // the new one starts: one writer at a time keeps each derived series in order.
        old.stop_background(running.writer.take(), running.cfg.shutdown_timeout)
            .await;
        let writer = state.spawn_background();
        *running = Running {
            cfg,
            backends,
            derive,
            rules_key,
            writer,
            retired,
        };
        Ok(kept)
    }

    /// Stops the derived-series writer after a last flush (shutdown).
    pub async fn stop(&self, within: Duration) {
        let mut running = self.running.lock().await;
        let writer = running.writer.take();
        let state = self.live.current();
        state.stop_background(writer, within).await;
        // Retired queues stop alongside the live ones, within the same time.
        let retired: Vec<_> = std::mem::take(&mut running.retired)
            .into_iter()
            .map(|r| tokio::spawn(async move { r.stop(within).await }))
            .collect();
        state.stop_queues(within).await;
        for r in retired {
            let _ = r.await;
        }
    }

    /// Reloads on every `SIGHUP` from `hangups` until the process ends.
    #[cfg(unix)]
    pub async fn on_hangup(self: Arc<Self>, mut hangups: tokio::signal::unix::Signal) {
        while hangups.recv().await.is_some() {
            tracing::info!("SIGHUP received; reloading the configuration");
            // The outcome is logged and in the metrics.
            let _ = self.reload().await;
        }
    }
}

/// What a reload kept of the running configuration.
struct Kept {
    derived_state: bool,
    backends: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(Arc::ptr_eq(&first[0].sink, &second[0].sink));
        assert!(!Arc::ptr_eq(&first[1].sink, &second[1].sink));
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
