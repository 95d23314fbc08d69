//! `promnorm-payloads`: writes remote-write request bodies of the synthetic LLM-inference
//! fleet of `promnorm::testkit::fleet` (the requests the tests and benches use) into a folder
//! laid out as the side-by-side benchmark tools read it:
//!
//! - `req-00000.pb.sz` ...: one POST body each (snappy block format of a
//!   `prometheus.WriteRequest`);
//! - `manifest.txt`: one absolute body path per line (read by wrk's `rw.lua`);
//! - `meta.json`: samples per request and sizes (read by `bench_rw.py` and
//!   `bench/latency.sh`).
//!
//! ```sh
//! promnorm-payloads --out /tmp/prw-payloads/default
//! promnorm-payloads --mode large --out /tmp/prw-payloads/large
//! promnorm-payloads --out /tmp/p --count 2 --verify
//! ```

use promnorm::testkit::fleet;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail, ensure};
use clap::{Parser, ValueEnum};
use fleet::{Fleet, FleetShape, Mode};
use promnorm::wire::proto::prometheus as pb;
use prost::Message;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ModeArg {
    /// 2,000 series per request, 100 requests
    Default,
    /// 10,000 series per request, 40 requests
    Large,
}

#[derive(Parser, Debug)]
#[command(
    name = "promnorm-payloads",
    about = "Write remote-write request bodies of a synthetic LLM-inference fleet \
             (vLLM V1, SGLang with tp_rank 0..7, DCGM, Mooncake) for the benchmark scripts"
)]
struct Args {
    /// Output folder [default: /tmp/prw-payloads/<mode>]
    #[arg(long)]
    out: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "default")]
    mode: ModeArg,
    /// Number of request files [default: 100, large: 40]
    #[arg(long)]
    count: Option<usize>,
    /// Series (= samples) per request [default: 2000, large: 10000]
    #[arg(long)]
    series_per_request: Option<usize>,
    /// 8-GPU nodes running vLLM
    #[arg(long, default_value_t = 16)]
    vllm_nodes: usize,
    /// 8-GPU nodes running SGLang (+ Mooncake)
    #[arg(long, default_value_t = 16)]
    sglang_nodes: usize,
    /// SGLang tp_rank count per node
    #[arg(long, default_value_t = 8)]
    tp: usize,
    #[arg(long, default_value = "llm-serving")]
    namespace: String,
    /// Scrape interval between rounds of the fleet
    #[arg(long, default_value_t = fleet::DEFAULT_INTERVAL_MS)]
    interval_ms: i64,
    /// First round's timestamp [default: so that the last request is about now]
    #[arg(long)]
    start_ms: Option<i64>,
    #[arg(long, default_value_t = fleet::DEFAULT_SEED)]
    seed: u64,
    /// Decode every file written and check series count, label order and timestamps
    #[arg(long)]
    verify: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mode = match args.mode {
        ModeArg::Default => Mode::Default,
        ModeArg::Large => Mode::Large,
    };
    let series_per_request = args.series_per_request.unwrap_or(mode.series_per_request());
    let count = args.count.unwrap_or(mode.request_count());
    ensure!(series_per_request > 0, "--series-per-request must be > 0");
    ensure!(count > 0, "--count must be > 0");
    ensure!(args.interval_ms > 0, "--interval-ms must be > 0");
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("/tmp/prw-payloads/{}", mode.name())));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let out = std::path::absolute(&out).with_context(|| format!("{}", out.display()))?;
    remove_old_bodies(&out)?;

    let shape = FleetShape {
        vllm_nodes: args.vllm_nodes,
        sglang_nodes: args.sglang_nodes,
        tensor_parallel: args.tp,
        namespace: args.namespace.clone(),
        seed: args.seed,
    };
    let now_ms = i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis())?;
    let mut fleet = Fleet::build(&shape, now_ms);
    let universe = fleet.series_count();
    ensure!(universe > 0, "the fleet has no series: add nodes or ranks");
    let rounds = fleet.rounds(count, series_per_request);
    let start_ms = match args.start_ms {
        Some(start) => {
            // Processes start relative to the requests' own clock, not to today's, so the
            // output follows from the arguments alone and counters stay positive.
            let end_ms = start + rounds as i64 * args.interval_ms;
            fleet = Fleet::build(&shape, end_ms);
            start
        }
        None => fleet.start_ms(now_ms, count, series_per_request, args.interval_ms),
    };

    let started = Instant::now();
    let mut requests = fleet.requests(series_per_request, start_ms, args.interval_ms);
    let mut files = Vec::with_capacity(count);
    let (mut raw_total, mut snappy_total) = (0usize, 0usize);
    let (mut first_ts_ms, mut last_ts_ms) = (i64::MAX, i64::MIN);
    for i in 0..count {
        let request = requests.next_request()?;
        let path = out.join(format!("req-{i:05}.pb.sz"));
        std::fs::write(&path, &request.body)
            .with_context(|| format!("writing {}", path.display()))?;
        files.push(path);
        raw_total += request.raw_len;
        snappy_total += request.body.len();
        first_ts_ms = first_ts_ms.min(request.first_ts_ms);
        last_ts_ms = last_ts_ms.max(request.last_ts_ms);
    }
    let mut manifest = String::new();
    for f in &files {
        writeln!(manifest, "{}", f.display())?;
    }
    std::fs::write(out.join("manifest.txt"), manifest).context("writing manifest.txt")?;

    let gen_seconds = started.elapsed().as_secs_f64();
    let (avg_raw, avg_snappy) = (raw_total / count, snappy_total / count);
    // The keys and layout of gen_payloads.py's meta.json (json.dump with indent=1).
    let meta = format!(
        "{{\n \"mode\": \"{mode}\",\n \"count\": {count},\n \"series_per_request\": {spr},\n \
         \"samples_per_request\": {spr},\n \"fleet_series\": {universe},\n \
         \"fleet_targets\": {targets},\n \"metric_families\": {families},\n \
         \"rounds\": {rounds},\n \"interval_ms\": {interval},\n \"first_ts_ms\": {first_ts_ms},\n \
         \"last_ts_ms\": {last_ts_ms},\n \"avg_raw_bytes\": {avg_raw},\n \
         \"avg_snappy_bytes\": {avg_snappy},\n \"total_snappy_bytes\": {snappy_total},\n \
         \"seed\": {seed},\n \"vllm_nodes\": {vllm},\n \"sglang_nodes\": {sglang},\n \
         \"generated_at\": \"{generated_at}\",\n \"gen_seconds\": {gen_seconds:.2},\n \
         \"generator\": \"promnorm-payloads\"\n}}",
        mode = mode.name(),
        spr = series_per_request,
        targets = fleet.target_count(),
        families = fleet.family_count(),
        interval = args.interval_ms,
        seed = args.seed,
        vllm = args.vllm_nodes,
        sglang = args.sglang_nodes,
        generated_at = utc_timestamp(now_ms / 1000),
    );
    std::fs::write(out.join("meta.json"), meta).context("writing meta.json")?;
    println!(
        "wrote {count} files to {}: {series_per_request} series/request, avg {avg_raw} B raw -> \
         {avg_snappy} B snappy ({:.1}x); fleet {universe} series in {} targets, {} families, \
         {rounds} rounds, {gen_seconds:.1}s",
        out.display(),
        avg_raw as f64 / avg_snappy.max(1) as f64,
        fleet.target_count(),
        fleet.family_count(),
    );
    if args.verify {
        verify(&files, series_per_request)?;
    }
    Ok(())
}

/// A shorter run must not leave bodies of a longer one behind.
fn remove_old_bodies(out: &Path) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(out).with_context(|| format!("reading {}", out.display()))? {
        let path = entry?.path();
        let is_body = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("req-") && n.ends_with(".pb.sz"));
        if is_body {
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    Ok(())
}

/// Decodes every body with the prost types (not the proxy's decoder) and checks what
/// a receiving TSDB relies on.
fn verify(files: &[PathBuf], series_per_request: usize) -> anyhow::Result<()> {
    let mut decoder = snap::raw::Decoder::new();
    let mut previous_max_ts = i64::MIN;
    for (i, path) in files.iter().enumerate() {
        let body = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let raw = decoder
            .decompress_vec(&body)
            .with_context(|| format!("{}: snappy", path.display()))?;
        let request = pb::WriteRequest::decode(raw.as_slice())
            .with_context(|| format!("{}: protobuf", path.display()))?;
        let series = request.timeseries.len();
        if series != series_per_request {
            bail!(
                "{}: {series} series, expected {series_per_request}",
                path.display()
            );
        }
        let sorted = request
            .timeseries
            .iter()
            .all(|ts| ts.labels.windows(2).all(|w| w[0].name < w[1].name));
        ensure!(sorted, "{}: labels not sorted by name", path.display());
        let timestamps = request
            .timeseries
            .iter()
            .flat_map(|ts| ts.samples.iter().map(|s| s.timestamp));
        let (lo, hi) = timestamps.fold((i64::MAX, i64::MIN), |(lo, hi), t| (lo.min(t), hi.max(t)));
        ensure!(
            lo >= previous_max_ts,
            "{}: timestamps go backwards",
            path.display()
        );
        previous_max_ts = hi;
        if i == 0 || i + 1 == files.len() {
            let names: std::collections::BTreeSet<&str> = request
                .timeseries
                .iter()
                .flat_map(|ts| ts.labels.iter())
                .filter(|l| l.name == "__name__")
                .map(|l| l.value.as_str())
                .collect();
            println!(
                "verify {}: {series} series, {} metric names, labels sorted, ts {lo}..{hi}, raw {} B",
                path.display(),
                names.len(),
                raw.len()
            );
        }
    }
    println!("verify: OK");
    Ok(())
}

/// `YYYY-MM-DDTHH:MM:SSZ` for seconds since the epoch (civil calendar from day count).
fn utc_timestamp(epoch_s: i64) -> String {
    let (days, secs) = (epoch_s.div_euclid(86_400), epoch_s.rem_euclid(86_400));
    // Howard Hinnant's days-to-civil: eras of 400 years starting on 0000-03-01.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}
