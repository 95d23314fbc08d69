//! Hot reload (docs/operations.md): `SIGHUP` and `POST /-/reload` re-read the
//! configuration file and the mapping files it names, build them exactly as `serve` does
//! at start-up ([`crate::app::build`], given the running parts to keep), and swap the
//! server's state
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

use crate::app::{BuildError, Kept, Running};
use crate::config::{BackendConfig, Config, ConfigError, LogFormat};
use crate::forward::Backend;
use crate::forward::queue::{Halted, Queue};
use crate::server::{Live, ReloadHook, live::ReloadFailure};
use crate::telemetry;

/// Kept here too: the keys a reload cannot change (the web UI's status page and the
/// tests name them through `reload`).
pub use crate::app::keep_restart_settings;

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

/// Why a reload kept the running configuration.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Refused(#[from] BuildError),
    #[error("promnorm is shutting down")]
    ShuttingDown,
}

/// The running parts and what runs beside them.
struct Current {
    running: Running,
    writer: Option<tokio::task::JoinHandle<()>>,
    /// Queues replaced by a reload whose records are still being delivered through
    /// their successor (a backend without a queue, or a queue without room for them).
    retired: Vec<Arc<Queue>>,
}

/// Whose queue a hand-over halted: resumed there when the reload fails.
enum Owner {
    Backend(Arc<Backend>),
    /// A queue retired by an earlier reload.
    Retired(Arc<Queue>),
}

impl Owner {
    fn queue(&self) -> Option<&Queue> {
        match self {
            Owner::Backend(b) => b.queue(),
            Owner::Retired(q) => Some(q),
        }
    }
}

/// An old queue's records on their way to the backend of the same name in the new
/// configuration.
struct Handover {
    from: Halted,
    back: Owner,
    successor: Arc<Backend>,
}

/// Owns the running configuration and replaces it on request.
pub struct Reloader {
    source: Source,
    live: Arc<Live>,
    current: tokio::sync::Mutex<Current>,
}

impl Reloader {
    /// Starts `running` (its queues and derived-series writer, [`Running::start`]) and
    /// serves it until a reload replaces it.
    pub fn start(
        running: Running,
        source: Source,
        lifecycle: bool,
    ) -> Result<Arc<Reloader>, BuildError> {
        let writer = running.start()?;
        let state = running.state.clone();
        let current = Current {
            running,
            writer,
            retired: Vec::new(),
        };
        Ok(Arc::new_cyclic(|me: &Weak<Reloader>| {
            let me = me.clone();
            let hook: ReloadHook = Arc::new(move || {
                let me = me.clone();
                Box::pin(async move {
                    match me.upgrade() {
                        Some(r) => r.reload().await.map_err(ReloadFailure::from),
                        None => Err(ReloadError::ShuttingDown.into()),
                    }
                })
            });
            Reloader {
                source,
                live: Arc::new(Live::new(state).with_reload(lifecycle, hook)),
                current: tokio::sync::Mutex::new(current),
            }
        }))
    }

    /// The swappable state the router serves.
    pub fn live(&self) -> Arc<Live> {
        self.live.clone()
    }

    /// The configuration now serving.
    pub async fn config(&self) -> Config {
        self.current.lock().await.running.cfg.clone()
    }

    /// Reloads: `Ok` once the new configuration serves; `Err` (why, with file:line:column
    /// where the error has one) when the running configuration stays. Sets the
    /// `promnorm_config_last_reload_*` gauges and logs either way.
    pub async fn reload(&self) -> Result<(), ReloadError> {
        let mut current = self.current.lock().await;
        match self.replace(&mut current).await {
            Ok(kept) => {
                telemetry::config_reloaded(kept.derived_state, kept.backends);
                Ok(())
            }
            Err(e) => {
                telemetry::config_reload_failed(&e);
                Err(ReloadError::Refused(e))
            }
        }
    }

    async fn replace(&self, current: &mut Current) -> Result<Kept, BuildError> {
        let cfg = self.source.load()?;
        let next = crate::app::build(&cfg, Some(&current.running))?;
        // Validated and built: from here on nothing fails.
        for key in &next.kept.restart_only {
            tracing::warn!(
                "{key} changed: it takes effect only after a restart; the running value stays"
            );
        }
        for w in next.cfg.warnings() {
            tracing::warn!("{w}");
        }
        let state = next.state.clone();
        // A changed backend's queue hands what it holds to the new backend of the same
        // name: it halts at once (a disk queue's directory is held by one queue at a
        // time, so it closes when the successor reopens the same directory and replays
        // it); once the successor is open its records move into the successor's queue,
        // ahead of anything new, or, when the successor has no queue (or no room), a
        // retired queue delivers them through it. A removed backend's queue delivers a
        // memory queue's records within shutdown_timeout, a disk queue's stay on disk.
        // Meanwhile the old configuration answers 503 for it, so senders retry.
        let old: Vec<Arc<Backend>> = current
            .running
            .state
            .forwarder
            .backends()
            .cloned()
            .collect();
        let new: Vec<Arc<Backend>> = state.forwarder.backends().cloned().collect();
        let is_new = |b: &Arc<Backend>| !old.iter().any(|o| Arc::ptr_eq(o, b));
        let successor_of = |name: &str| new.iter().find(|n| n.name() == name && is_new(n)).cloned();
        let mut stopped = Vec::new();
        let mut handovers: Vec<Handover> = Vec::new();
        let same_dir = |h: &Halted, succ: &Backend| {
            h.dir().is_some() && h.dir() == succ.queue().and_then(|q| q.dir())
        };
        for b in &old {
            if new.iter().any(|n| Arc::ptr_eq(n, b)) {
                continue;
            }
            if let (Some(q), Some(successor)) = (b.queue(), successor_of(b.name())) {
                if let Some(h) = q.halt().await {
                    if same_dir(&h, &successor) {
                        h.close();
                        stopped.push(b.clone());
                    } else {
                        handovers.push(Handover {
                            from: h,
                            back: Owner::Backend(b.clone()),
                            successor,
                        });
                    }
                }
                continue;
            }
            if let Some(q) = b.queue_state() {
                let within = if q.durable {
                    Duration::ZERO
                } else {
                    current.running.cfg.shutdown_timeout
                };
                b.stop(within).await;
                stopped.push(b.clone());
            }
        }
        // Queues retired by an earlier reload move on to this configuration's backend
        // of their name, unless it is the one they already deliver through.
        let mut retired = Vec::new();
        for r in std::mem::take(&mut current.retired) {
            if !r.is_running() {
                continue;
            }
            let successor = new.iter().find(|n| n.name() == r.name()).cloned();
            match successor {
                Some(succ) if !r.delivers_through(&succ) => {
                    if let Some(h) = r.halt().await {
                        if same_dir(&h, &succ) {
                            h.close();
                        } else {
                            handovers.push(Handover {
                                from: h,
                                back: Owner::Retired(r.clone()),
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
            for b in &new {
                if is_new(b) {
                    b.stop(Duration::ZERO).await;
                }
            }
            for h in handovers {
                if let Some(q) = h.back.queue() {
                    q.resume(h.from);
                }
                if let Owner::Retired(r) = h.back {
                    retired.push(r);
                }
            }
            current.retired = retired;
            for b in stopped {
                if let Err(again) = b.start() {
                    tracing::error!(
                        backend = b.name(),
                        "reopening the queue after a failed reload: {again}"
                    );
                }
            }
            return Err(BuildError::Queue(e));
        }
        for h in handovers {
            let requests = h.from.requests();
            if let Some(q) = h.successor.queue() {
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
            let r = Queue::retire_into(h.from, h.successor);
            if r.is_running() {
                retired.push(r);
            }
        }
        let old = self.live.swap(state.clone());
        // The old writer flushes what it holds a last time (to the old backends), then
        // the new one starts: one writer at a time keeps each derived series in order.
        old.stop_background(current.writer.take(), current.running.cfg.shutdown_timeout)
            .await;
        let writer = state.spawn_background();
        let kept = next.kept.clone();
        *current = Current {
            running: next,
            writer,
            retired,
        };
        Ok(kept)
    }

    /// Stops the derived-series writer after a last flush (shutdown).
    pub async fn stop(&self, within: Duration) {
        let mut current = self.current.lock().await;
        let writer = current.writer.take();
        let state = self.live.current();
        state.stop_background(writer, within).await;
        // Retired queues stop alongside the live ones, within the same time.
        let retired: Vec<_> = std::mem::take(&mut current.retired)
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
