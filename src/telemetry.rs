//! promnorm's own metrics (SPEC 4) and logging.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::config::LogFormat;
use crate::mapping::{MapStats, Rules};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the global metrics recorder once (idempotent) and returns its handle.
pub fn metrics_handle() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("promnorm_backend_request_duration_seconds".into()),
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
            handle
        })
        .clone()
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "promnorm_requests_total",
        "Remote-write requests answered, by status code."
    );
    describe_counter!(
        "promnorm_samples_received_total",
        "Samples (float and native histogram) received."
    );
    describe_counter!(
        "promnorm_samples_forwarded_total",
        "Samples delivered, by backend."
    );
    describe_counter!(
        "promnorm_samples_dropped_total",
        "Samples dropped by a configured rule, by reason."
    );
    describe_counter!(
        "promnorm_series_renamed_total",
        "Series renamed (name, label or label value), by pack."
    );
    describe_counter!(
        "promnorm_series_rescaled_total",
        "Series rescaled to base units, by pack."
    );
    describe_counter!(
        "promnorm_series_collisions_total",
        "Input series merged onto an existing output series."
    );
    describe_counter!(
        "promnorm_native_histograms_unscaled_total",
        "Native histograms forwarded unchanged under a rescale rule."
    );
    describe_counter!(
        "promnorm_derived_samples_total",
        "Derived samples emitted, by series."
    );
    describe_counter!(
        "promnorm_backend_requests_total",
        "Requests sent to backends, by backend and code."
    );
    describe_histogram!(
        "promnorm_backend_request_duration_seconds",
        "Backend request latency."
    );
    describe_gauge!(
        "promnorm_derived_state_series",
        "Series held in derived-series state."
    );
}

/// Adds one request's mapping counts to the global counters.
pub fn record_map_stats(rules: &Rules, stats: &MapStats) {
    for (i, n) in stats.dropped.iter().enumerate() {
        if *n > 0
            && let Some(reason) = rules.reasons().get(i)
        {
            metrics::counter!("promnorm_samples_dropped_total", "reason" => reason.clone())
                .increment(*n);
        }
    }
    for (i, n) in stats.renamed.iter().enumerate() {
        if *n > 0 {
            metrics::counter!("promnorm_series_renamed_total", "pack" => rules.packs()[i].name.clone()).increment(*n);
        }
    }
    for (i, n) in stats.rescaled.iter().enumerate() {
        if *n > 0 {
            metrics::counter!("promnorm_series_rescaled_total", "pack" => rules.packs()[i].name.clone()).increment(*n);
        }
    }
    if stats.collisions > 0 {
        metrics::counter!("promnorm_series_collisions_total").increment(stats.collisions);
    }
    if stats.metadata_total_fixes > 0 {
        metrics::counter!("promnorm_series_renamed_total", "pack" => "metadata_total_fix")
            .increment(stats.metadata_total_fixes);
    }
    if stats.native_unscaled > 0 {
        metrics::counter!("promnorm_native_histograms_unscaled_total")
            .increment(stats.native_unscaled);
    }
}

pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}
