//! `promnorm serve`: the process around the running parts. It builds them through
//! [`crate::reload::Reloader`] (which builds through [`crate::app::build`]), listens,
//! reloads on `SIGHUP`, and drains on `SIGTERM`/`SIGINT`. Above `app` and `reload`:
//! neither imports it.

use std::sync::Arc;

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
    let mut running = crate::app::build(&cfg, None)?;
    if let Some(fit) = fit
        && let Some(state) = Arc::get_mut(&mut running.state)
    {
        // Just built: nothing else holds the state yet.
        tracing::warn!(
            configured = cfg.server.max_connections,
            allowed = fit,
            "server.max_connections lowered to stay below the open-file limit"
        );
        state.connection_limits.max_connections = fit;
    }
    let reloader = crate::reload::Reloader::start(running, source, lifecycle)?;
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
        max_tracked_series = sizing.max_tracked_series,
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
    // The scraper follows the live configuration (a reload's `scrape:` applies within a
    // second); it stops with the listener, before the queues drain.
    let scrape_tls = crate::forward::tls::client_config(&Default::default())
        .map_err(|e| anyhow::anyhow!("scrape TLS: {e}"))?;
    let scraper = tokio::spawn(crate::scrape::run(
        live.clone() as Arc<dyn crate::scrape::Host>,
        scrape_tls,
    ));
    let app = crate::server::router_live(live.clone(), &cfg.write_paths)
        .merge(crate::query::router(
            live.clone() as Arc<dyn crate::query::Source>,
            cfg.web.route_prefix.as_deref().unwrap_or(""),
        ))
        .merge(crate::federate::router(
            live.clone() as Arc<dyn crate::federate::Source>,
            cfg.web.route_prefix.as_deref().unwrap_or(""),
        ))
        .merge(crate::web::router(live, &crate::app::web_options(&cfg)?));
    crate::server::run(
        listener,
        state,
        app,
        crate::server::shutdown_signal(),
        cfg.shutdown_timeout,
    )
    .await?;
    scraper.abort();
    #[cfg(unix)]
    hangup_task.abort();
    reloader.stop(cfg.shutdown_timeout).await;
    tracing::info!("stopped");
    Ok(())
}
