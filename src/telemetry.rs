//! promnorm's own metrics and logging (docs/telemetry.md).

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::config::LogFormat;
use crate::mapping::{MapStats, Rules};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
static START_TIME: OnceLock<f64> = OnceLock::new();

/// Counters without labels exist from start-up, at 0: `rate()` and absence alerts need
/// a first sample before the first event.
fn register_at_zero() {
    for name in [
        "promnorm_samples_received_total",
        "promnorm_series_collisions_total",
        "promnorm_native_histograms_unscaled_total",
        "promnorm_derived_incomplete_points_total",
        "promnorm_derived_inputs_without_peak_total",
        "promnorm_derived_ranks_forgotten_total",
    ] {
        metrics::counter!(name).absolute(0);
    }
}

/// Labelled counters whose label values are known from the configuration exist from
/// start-up, at 0: drops per configured reason, renames and rescales per pack, derived
/// samples per derived series.
pub fn register_pipeline(rules: &Rules, derived_series: impl Iterator<Item = &'static str>) {
    for reason in rules.reasons() {
        metrics::counter!("promnorm_samples_dropped_total", "reason" => reason.clone())
            .increment(0);
    }
    for pack in rules.packs() {
        metrics::counter!("promnorm_series_renamed_total", "pack" => pack.name.clone())
            .increment(0);
        metrics::counter!("promnorm_series_rescaled_total", "pack" => pack.name.clone())
            .increment(0);
    }
    for series in derived_series {
        metrics::counter!("promnorm_derived_samples_total", "series" => series).increment(0);
    }
    for reason in ["stale", "max_series"] {
        metrics::counter!("promnorm_derived_evictions_total", "reason" => reason).increment(0);
    }
}

/// The standard `process_*` metrics (as Prometheus' client libraries write them), read
/// from `/proc` at scrape time, in text exposition format.
pub fn process_metrics_text() -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let mut put = |name: &str, kind: &str, help: &str, value: f64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    };
    if let Some(start) = START_TIME.get() {
        put(
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            *start,
        );
    }
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sysconf only reads a configuration value.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        if let Ok(stat) = std::fs::read_to_string("/proc/self/stat")
            && let Some((_, after_comm)) = stat.rsplit_once(") ")
        {
            // Fields after the command name start at field 3 (state).
            let f: Vec<&str> = after_comm.split_whitespace().collect();
            let num = |i: usize| f.get(i - 3).and_then(|v| v.parse::<f64>().ok());
            if let (Some(utime), Some(stime)) = (num(14), num(15))
                && ticks > 0
            {
                put(
                    "process_cpu_seconds_total",
                    "counter",
                    "Total user and system CPU time spent in seconds.",
                    (utime + stime) / ticks as f64,
                );
            }
            if let Some(vsize) = num(23) {
                put(
                    "process_virtual_memory_bytes",
                    "gauge",
                    "Virtual memory size in bytes.",
                    vsize,
                );
            }
            if let Some(rss) = num(24)
                && page > 0
            {
                put(
                    "process_resident_memory_bytes",
                    "gauge",
                    "Resident memory size in bytes.",
                    rss * page as f64,
                );
            }
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            put(
                "process_open_fds",
                "gauge",
                "Number of open file descriptors.",
                dir.count() as f64,
            );
        }
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit only writes the struct we pass.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
            put(
                "process_max_fds",
                "gauge",
                "Maximum number of open file descriptors.",
                lim.rlim_cur as f64,
            );
        }
    }
    out
}

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
            register_at_zero();
            metrics::gauge!(
                "promnorm_build_info",
                "version" => crate::VERSION,
                "revision" => crate::REVISION,
                "rustc" => crate::RUSTC_VERSION
            )
            .set(1.0);
            let _ = START_TIME.set(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64()),
            );
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

/// Logs to stderr: `level` (a `RUST_LOG`-style filter, e.g. `debug` or
/// `promnorm=debug,info`) wins over `RUST_LOG`, default `info`; colours only on a
/// terminal.
pub fn init_logging(format: LogFormat, level: Option<&str>) {
    use std::io::IsTerminal;
    let filter = match level {
        Some(l) => tracing_subscriber::EnvFilter::new(l),
        None => tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}
