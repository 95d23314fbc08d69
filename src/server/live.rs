//! The state requests read, swapped whole by a configuration reload: each request loads
//! it once, so a request in flight finishes on the rules it started with and the next
//! one sees the new ones. What a reload does is decided outside the server (the
//! `reload` module); the server only routes `/-/reload` to it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use arc_swap::ArcSwap;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::AppState;

/// Why a reload kept the running configuration (the `reload` module's typed error; the
/// server only shows it).
pub type ReloadFailure = Box<dyn std::error::Error + Send + Sync>;

/// Reloads the configuration; `Err` carries why the running one was kept.
pub type ReloadHook =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), ReloadFailure>> + Send>> + Send + Sync>;

pub struct Live {
    current: ArcSwap<AppState>,
    /// `serve --web.enable-lifecycle`: `POST /-/reload` is allowed.
    lifecycle: bool,
    reload: Option<ReloadHook>,
    /// The live tap (`/debug/tap`): outlives reloads, at most one open.
    tap: super::tap::Tap,
    /// The scrape targets' states (`/api/v1/targets`): outlive reloads, as the
    /// scraper's targets do.
    targets: crate::scrape::status::Targets,
}

impl Live {
    /// A state that `/-/reload` cannot change (403).
    pub fn new(state: Arc<AppState>) -> Live {
        Live {
            current: ArcSwap::new(state),
            lifecycle: false,
            reload: None,
            tap: Default::default(),
            targets: Default::default(),
        }
    }

    /// Routes `/-/reload` to `hook` when `lifecycle` is on (as Prometheus'
    /// `--web.enable-lifecycle`).
    pub fn with_reload(mut self, lifecycle: bool, hook: ReloadHook) -> Live {
        self.lifecycle = lifecycle;
        self.reload = Some(hook);
        self
    }

    /// The state a request uses from start to end.
    pub fn current(&self) -> Arc<AppState> {
        self.current.load_full()
    }

    /// The live tap.
    pub fn tap(&self) -> &super::tap::Tap {
        &self.tap
    }

    /// Swaps in a new state; requests already running keep the one they loaded.
    pub fn swap(&self, state: Arc<AppState>) -> Arc<AppState> {
        self.current.swap(state)
    }
}

impl crate::query::Source for Live {
    fn snapshot(&self) -> crate::query::Snapshot {
        let st = self.current();
        crate::query::Snapshot {
            api: st.query.clone(),
            rules: st.pipeline.rules_arc(),
            ingest_token: st.ingest_token.clone(),
        }
    }
}

impl crate::federate::Source for Live {
    fn federate(&self) -> crate::federate::FederateSnapshot {
        let st = self.current();
        crate::federate::FederateSnapshot {
            store: st.forwarder.exposition().cloned(),
            ingest_token: st.ingest_token.clone(),
        }
    }
}

impl crate::scrape::Host for Live {
    fn scrape_options(&self) -> Option<Arc<crate::scrape::ScrapeOptions>> {
        self.current().scrape.clone()
    }

    fn ingest<'a>(&'a self, body: &'a [u8]) -> crate::scrape::DeliverFuture<'a> {
        Box::pin(super::ingest_internal(self, body))
    }

    fn targets(&self) -> &crate::scrape::status::Targets {
        &self.targets
    }
}

fn text(status: StatusCode, line: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{}\n", line.replace('\n', " ")),
    )
        .into_response()
}

/// `POST`/`PUT /-/reload`: `200` once the new configuration serves, `500` with the
/// reason when it was refused (the running one stays), `403` without
/// `--web.enable-lifecycle`.
pub(super) async fn reload(State(live): State<Arc<Live>>) -> Response {
    let hook = match (&live.reload, live.lifecycle) {
        (Some(hook), true) => hook.clone(),
        _ => {
            return text(
                StatusCode::FORBIDDEN,
                "Lifecycle API is not enabled: start promnorm serve with --web.enable-lifecycle (or send SIGHUP)",
            );
        }
    };
    match hook().await {
        Ok(()) => text(StatusCode::OK, "promnorm configuration reloaded."),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("failed to reload config: {e}"),
        ),
    }
}
