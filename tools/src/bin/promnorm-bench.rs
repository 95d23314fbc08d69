//! `promnorm-bench`: the benchmark harness of BENCHMARKS.md, with nothing outside this
//! repository (no wrk, no nginx, no Python). It holds pre-generated remote-write requests
//! of the synthetic fleet of `promnorm::testkit::fleet` (1.0, or 2.0 converted by
//! `tests/common/rw2_support.rs`) in memory and sends them to a target over C keep-alive
//! connections, closed loop (saturation) or open loop at a fixed rate (latency).
//!
//! - `run`: one case end to end: a null sink in this process (answers 204 and counts the
//!   samples it received), the system under test started from a command template (pinned
//!   with `taskset` where available), warm-up, the measured window, a bounded drain; per
//!   run it appends a JSON line to `--results` (samples/s, p50/p90/p99, the SUT's CPU-s per
//!   million samples and peak RSS, the sink's samples, neighbour CPU) and prints it.
//! - `report`: the markdown table of per-case medians of one or more results files.
//! - `load`: load alone against any URL; `sink`: the null sink alone.
//!
//! ```sh
//! taskset -c 0 promnorm-bench run --case promnorm-passthrough --sut-cpu 1 \
//!   --sut-cmd 'target/release/promnorm serve --config bench/passthrough.yaml --listen 127.0.0.1:{port} --backend {sink_url}' \
//!   --ingest-metric promnorm_samples_received_total --results bench/results/x.jsonl
//! promnorm-bench report bench/results/x.jsonl
//! ```
//!
//! The load process and the sink share one core (`taskset` the harness itself); the
//! sink decodes each body to count samples (`--sink-count requests` skips that).

#[path = "../bench_scrape.rs"]
mod bench_scrape;

use promnorm::testkit::fleet;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail, ensure};
use bytes::Bytes;
use clap::{Args, Parser, Subcommand, ValueEnum};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use promnorm::wire::proto::prometheus as pb;
use promnorm::wire::proto::write_v2 as v2;
use prost::Message;
use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, TcpStream};

#[derive(Parser)]
#[command(
    name = "promnorm-bench",
    about = "Remote-write load generator, null sink and side-by-side runner"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start a null sink and the system under test, load it, append JSON results
    Run(Box<RunArgs>),
    /// Load a remote-write URL and print one JSON object
    Load {
        /// Remote-write URL, e.g. http://127.0.0.1:9201/api/v1/write
        #[arg(long)]
        url: String,
        #[command(flatten)]
        load: LoadArgs,
    },
    /// Run the null sink until killed; prints its counts every second
    Sink {
        #[arg(long, default_value = "127.0.0.1:19201")]
        listen: SocketAddr,
    },
    /// Markdown table of per-case medians of results files
    Report { files: Vec<PathBuf> },
    /// Serve scrape targets and a null sink, start the SUT scraping them, append JSON
    /// results (CPU per million scraped samples)
    Scrape(Box<bench_scrape::ScrapeArgs>),
    /// Markdown table of per-case medians of `scrape` results files
    ScrapeReport {
        files: Vec<PathBuf>,
        /// Case whose CPU per million samples the others are compared with
        #[arg(long)]
        baseline: Option<String>,
    },
    /// The in-process pipeline alone (decode, rules, derive, encode, compress) over the
    /// fleet requests: CPU time per sample of this thread, so that other processes'
    /// load inflates it less than wall-clock time (for A/B runs on a busy machine)
    Pipeline {
        /// promnorm configuration (e.g. bench/all-packs.yaml, bench/passthrough.yaml)
        #[arg(long)]
        config: PathBuf,
        /// Passes over all requests; each is timed, the minimum and median are reported
        #[arg(long, default_value_t = 30)]
        rounds: usize,
        #[arg(long, value_enum, default_value = "1")]
        proto: Proto,
        #[arg(long, value_enum, default_value = "default")]
        mode: ModeArg,
        #[arg(long, default_value_t = 100)]
        count: usize,
        /// Output protocol: 1 (the 1.0 body) or 2 (the 2.0 body instead, as for a
        /// backend with `protocol: v2`)
        #[arg(long, value_enum, default_value = "1")]
        out: Proto,
        /// Worker threads on the one pipeline (2 on two cores: the scaling figure);
        /// `samples_per_s` is their aggregate throughput
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Tenant routing by this label: each request split into one body per tenant,
        /// each compressed (what the router does for a tenancy group); `--out 2`
        /// encodes each as 2.0
        #[arg(long)]
        tenancy: Option<String>,
        /// Before each request, write this many KiB of a scratch buffer (untimed): the
        /// request then runs on caches another program has used since the last one, as
        /// one does on a shared host's core between the requests of a partial load.
        /// With it, a pass's CPU and wall time are the sums of its requests' own times
        #[arg(long, default_value_t = 0)]
        evict_kib: usize,
        /// Instead of the pipeline, the floor any proxy pays for the same input: snappy
        /// decompression into a reused buffer and one walk over every field (series,
        /// labels, samples), nothing validated or kept. `--config` is then only checked
        #[arg(long)]
        floor: bool,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum, Serialize, Deserialize, PartialEq)]
enum Proto {
    #[value(name = "1")]
    #[serde(rename = "1.0")]
    V1,
    #[value(name = "2")]
    #[serde(rename = "2.0")]
    V2,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ModeArg {
    /// 2,000 series per request
    Default,
    /// 10,000 series per request
    Large,
}

#[derive(Args, Clone)]
struct LoadArgs {
    /// Remote-write version sent
    #[arg(long, value_enum, default_value = "1")]
    proto: Proto,
    #[arg(long, value_enum, default_value = "default")]
    mode: ModeArg,
    /// Distinct requests generated (sent round robin)
    #[arg(long, default_value_t = 100)]
    count: usize,
    /// vLLM nodes and SGLang nodes of the fleet, each (about 940 series a node)
    #[arg(long, default_value_t = 16)]
    nodes: usize,
    /// Connections (each one request in flight)
    #[arg(long, short = 'c', default_value_t = 8)]
    connections: usize,
    /// Measured seconds
    #[arg(long, short = 'd', default_value_t = 20.0)]
    duration: f64,
    /// Unmeasured seconds before
    #[arg(long, default_value_t = 5.0)]
    warmup: f64,
    /// Open loop: requests per second over all connections (latency is then measured
    /// from each request's scheduled time, so queueing counts); 0: closed loop
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Per-request timeout in seconds
    #[arg(long, default_value_t = 30.0)]
    timeout: f64,
}

#[derive(Args)]
struct RunArgs {
    /// Label stored with the results
    #[arg(long)]
    case: String,
    /// Shell command of the SUT; {port} {sink_url} {tmp} are filled in
    #[arg(long)]
    sut_cmd: String,
    /// Path answering 2xx once the SUT is ready
    #[arg(long, default_value = "/-/ready")]
    ready_path: String,
    #[arg(long, default_value = "/api/v1/write")]
    write_path: String,
    /// Counter of samples the SUT accepted, `name` or `name{label substring}`, summed
    #[arg(long)]
    ingest_metric: Option<String>,
    /// Counter of samples the SUT sent on
    #[arg(long)]
    sent_metric: Option<String>,
    /// CPU list for the SUT (`taskset -c`); empty: not pinned
    #[arg(long, default_value = "1")]
    sut_cpu: String,
    /// CPU list for this process (load + sink); empty: not pinned
    #[arg(long, default_value = "0")]
    load_cpu: String,
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Append one JSON line per run here
    #[arg(long)]
    results: Option<PathBuf>,
    /// What the sink counts: samples (decodes each body) or requests only
    #[arg(long, value_enum, default_value = "samples")]
    sink_count: SinkCount,
    /// Longest wait for the SUT to pass everything on after the load stops
    #[arg(long, default_value_t = 30.0)]
    drain_timeout: f64,
    #[command(flatten)]
    load: LoadArgs,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum SinkCount {
    Samples,
    Requests,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Cmd::Report { files } => report(&files),
        Cmd::Scrape(args) => {
            pin_self(&args.load_cpu)?;
            runtime()?.block_on(bench_scrape::scrape_run(*args))
        }
        Cmd::ScrapeReport { files, baseline } => {
            bench_scrape::scrape_report(&files, baseline.as_deref())
        }
        Cmd::Pipeline {
            config,
            rounds,
            proto,
            mode,
            count,
            out,
            threads,
            tenancy,
            evict_kib,
            floor,
        } => pipeline_cost(
            &config,
            rounds,
            (proto, out),
            (mode, threads),
            count,
            (tenancy.as_deref(), evict_kib, floor),
        ),
        Cmd::Run(args) => {
            pin_self(&args.load_cpu)?;
            runtime()?.block_on(run(*args))
        }
        Cmd::Load { url, load } => runtime()?.block_on(async move {
            let bodies = Arc::new(generate(&load)?);
            let spr = bodies.samples_per_request;
            let out = load_phase(&url, &load, &bodies, load.warmup).await?;
            ensure!(
                out.requests_ok > 0 || load.warmup == 0.0,
                "no request succeeded"
            );
            let out = load_phase(&url, &load, &bodies, load.duration).await?;
            println!("{}", serde_json::to_string(&out.summary(spr))?);
            Ok(())
        }),
        Cmd::Sink { listen } => runtime()?.block_on(async move {
            let sink = Sink::start(listen, SinkCount::Samples).await?;
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let c = sink.counts();
                println!(
                    "requests {} samples {} bytes {} undecodable {}",
                    c.requests, c.samples, c.bytes, c.undecodable
                );
            }
        }),
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    // Two workers: load and sink overlap, even when pinned to one core.
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

/// Pins this process (and so the threads it starts next) like `taskset -c LIST`.
fn pin_self(cpus: &str) -> anyhow::Result<()> {
    if cpus.is_empty() {
        return Ok(());
    }
    if !has_taskset() {
        eprintln!("[bench] taskset not found: not pinned");
        return Ok(());
    }
    let pid = std::process::id().to_string();
    let ok = Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &pid])
        .stdout(Stdio::null())
        .status()
        .context("taskset")?
        .success();
    ensure!(ok, "taskset -c {cpus} failed (is that CPU online?)");
    Ok(())
}

fn has_taskset() -> bool {
    Command::new("taskset")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

// ------------------------------------------------------------------ payloads --

struct Bodies {
    list: Vec<Bytes>,
    samples_per_request: u64,
    avg_body_bytes: u64,
    proto: Proto,
}

fn generate(load: &LoadArgs) -> anyhow::Result<Bodies> {
    ensure!(load.count > 0, "--count must be > 0");
    let mode = match load.mode {
        ModeArg::Default => fleet::Mode::Default,
        ModeArg::Large => fleet::Mode::Large,
    };
    let shape = fleet::FleetShape {
        vllm_nodes: load.nodes,
        sglang_nodes: load.nodes,
        ..fleet::FleetShape::default()
    };
    let v1 = fleet::request_bodies_of(&shape, mode, load.count);
    let mut list = Vec::with_capacity(v1.len());
    let mut samples = 0u64;
    let mut decoder = snap::raw::Decoder::new();
    for body in v1 {
        let raw = decoder.decompress_vec(&body)?;
        let req = pb::WriteRequest::decode(raw.as_slice())?;
        samples += req
            .timeseries
            .iter()
            .map(|t| t.samples.len() as u64)
            .sum::<u64>();
        list.push(Bytes::from(match load.proto {
            Proto::V1 => body,
            Proto::V2 => snap::raw::Encoder::new().compress_vec(&to_v2(&req).encode_to_vec())?,
        }));
    }
    let n = list.len() as u64;
    Ok(Bodies {
        avg_body_bytes: list.iter().map(|b| b.len() as u64).sum::<u64>() / n,
        samples_per_request: samples / n,
        list,
        proto: load.proto,
    })
}

/// The 2.0 request a 2.0 sender would send for `req` (the fleet's requests carry no
/// metadata): one symbols table, label references, the same samples.
fn to_v2(req: &pb::WriteRequest) -> v2::Request {
    let mut symbols = vec![String::new()];
    let mut index: std::collections::HashMap<String, u32> = std::collections::HashMap::new();
    let mut sym = |s: &str| -> u32 {
        if let Some(&i) = index.get(s) {
            return i;
        }
        let i = symbols.len() as u32;
        symbols.push(s.to_owned());
        index.insert(s.to_owned(), i);
        i
    };
    let timeseries = req
        .timeseries
        .iter()
        .map(|ts| v2::TimeSeries {
            labels_refs: ts
                .labels
                .iter()
                .flat_map(|l| [sym(&l.name), sym(&l.value)])
                .collect(),
            samples: ts
                .samples
                .iter()
                .map(|s| v2::Sample {
                    value: s.value,
                    timestamp: s.timestamp,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    v2::Request {
        symbols,
        timeseries,
    }
}

// ------------------------------------------------------------------ pipeline --

#[derive(Default)]
struct FloorBuffers {
    decoder: Option<snap::raw::Decoder>,
    raw: Vec<u8>,
}

/// The floor of a remote-write proxy's read side: `body` decompressed into a reused
/// buffer, then every field walked (each series, each label's and sample's field) in the
/// tightest loop that still reads every key and length, nothing validated or kept.
/// Returns the samples met.
fn floor_read(bufs: &mut FloorBuffers, body: &[u8]) -> anyhow::Result<u64> {
    let decoder = bufs.decoder.get_or_insert_with(snap::raw::Decoder::new);
    let n = promnorm::wire::snappy::decompress_into(decoder, body, 64 << 20, &mut bufs.raw)?;
    let raw = &bufs.raw[..n];
    let mut samples = 0u64;
    let mut p = 0;
    while p < raw.len() {
        let (key, at) = floor_varint(raw, p).ok_or_else(|| anyhow::anyhow!("bad key"))?;
        let (len, at) = floor_varint(raw, at).ok_or_else(|| anyhow::anyhow!("bad length"))?;
        anyhow::ensure!(key & 7 == 2, "unexpected wire type at {p}");
        let end = at + len as usize;
        if key == 0x0a {
            let mut q = at;
            while q < end {
                let k = raw[q];
                let (len, after) =
                    floor_varint(raw, q + 1).ok_or_else(|| anyhow::anyhow!("bad length"))?;
                samples += u64::from(k == 0x12);
                q = after + len as usize;
            }
        }
        p = end;
    }
    Ok(samples)
}

/// A varint at `b[p..]`: its value and the position after it.
#[inline(always)]
fn floor_varint(b: &[u8], mut p: usize) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let x = *b.get(p)?;
        p += 1;
        v |= u64::from(x & 0x7f) << shift;
        if x < 0x80 {
            return Some((v, p));
        }
    }
    None
}

/// CPU seconds this thread has run.
fn thread_cpu_seconds() -> f64 {
    promnorm::sys::thread_cpu_seconds()
}

fn pipeline_cost(
    config: &std::path::Path,
    rounds: usize,
    (proto, out): (Proto, Proto),
    (mode, threads): (ModeArg, usize),
    count: usize,
    (tenancy, evict_kib, floor): (Option<&str>, usize, bool),
) -> anyhow::Result<()> {
    ensure!(
        !floor || (proto == Proto::V1 && tenancy.is_none() && out == Proto::V1),
        "--floor reads 1.0 input only, without --tenancy or --out 2"
    );
    use promnorm::app::Assemble;
    use promnorm::pipeline::InputProtocol;
    let load = LoadArgs {
        proto,
        mode,
        count,
        nodes: 16,
        connections: 1,
        duration: 0.0,
        warmup: 0.0,
        rate: 0.0,
        timeout: 1.0,
    };
    let bodies = generate(&load)?;
    let cfg = promnorm::config::Config::load(config)?;
    let pipeline = cfg.pipeline()?;
    let input = match proto {
        Proto::V1 => InputProtocol::V1,
        Proto::V2 => InputProtocol::V2,
    };
    let samples = (bodies.list.len() as u64 * bodies.samples_per_request) as f64;
    // Each worker: its own workspace on the shared pipeline (rules, derived-series state,
    // counters), a warm pass, then the timed passes once every worker is warm.
    let start = std::sync::Barrier::new(threads.max(1));
    let finished = std::sync::atomic::AtomicUsize::new(0);
    // Every worker's eviction buffer, allocated before any starts: a worker that failed
    // here would leave the others waiting at the barrier.
    let evict_bytes = evict_kib
        .checked_mul(1024)
        .ok_or_else(|| anyhow::anyhow!("--evict-kib {evict_kib}: too large"))?;
    let scratches = (0..threads.max(1))
        .map(|_| {
            let mut scratch = Vec::new();
            scratch
                .try_reserve_exact(evict_bytes)
                .map_err(|e| anyhow::anyhow!("--evict-kib {evict_kib}: {e}"))?;
            scratch.resize(evict_bytes, 0u8);
            Ok(scratch)
        })
        .collect::<anyhow::Result<Vec<Vec<u8>>>>()?;
    let scratches = std::sync::Mutex::new(scratches);
    // Worker `w` starts its passes at request `w * n / threads` and wraps around: the
    // workers of a server take different requests at any moment (a sender's shards
    // carry different series), not the same series at the same instant.
    let worker = |w: usize| -> anyhow::Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
        let mut ws = pipeline.take_workspace();
        ws.skip_v1_body = out == Proto::V2 || tenancy.is_some();
        let mut drained = Vec::new();
        let family_tenants = std::sync::Mutex::new(promnorm::wire::split::FamilyTenants::new());
        let first = w * bodies.list.len() / threads.max(1);
        let (tail, head) = bodies.list.split_at(first);
        // Each request's CPU time in the timed passes, in µs: how far the slowest
        // request of a pass stands from the usual one (a latency tail's own cost).
        let mut request_us: Vec<f64> = Vec::new();
        let mut scratch = scratches
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop()
            .unwrap_or_default();
        let mut floor_buf = FloorBuffers::default();
        // A pass's requests' own CPU and wall time, in µs (without the evictions).
        let mut pass =
            |ws: &mut promnorm::pipeline::Workspace, timed: bool| -> anyhow::Result<(f64, f64)> {
                let (mut own_us, mut own_wall_us) = (0.0, 0.0);
                for b in head.iter().chain(tail) {
                    if !scratch.is_empty() {
                        evict(&mut scratch);
                    }
                    let (c0, w0) = if timed {
                        (thread_cpu_seconds(), Some(Instant::now()))
                    } else {
                        (0.0, None)
                    };
                    if floor {
                        std::hint::black_box(floor_read(&mut floor_buf, b)?);
                        continue;
                    }
                    pipeline.process_as(ws, b, input)?;
                    if let Some(label) = tenancy {
                        split_and_encode(&pipeline, ws, label, out, &family_tenants)?;
                    } else if out == Proto::V2 {
                        pipeline.encode_v2(ws)?;
                    }
                    if let Some(d) = pipeline.deriver() {
                        drained.clear();
                        d.drain(&mut drained);
                    }
                    if let Some(w0) = w0 {
                        let us = (thread_cpu_seconds() - c0) * 1e6;
                        own_us += us;
                        own_wall_us += w0.elapsed().as_secs_f64() * 1e6;
                        request_us.push(us);
                    }
                }
                Ok((own_us, own_wall_us))
            };
        pass(&mut ws, false)?; // warm: buffers grown, caches filled
        start.wait();
        let (mut cpu, mut wall) = (Vec::new(), Vec::new());
        for _ in 0..rounds.max(1) {
            let (c0, w0) = (thread_cpu_seconds(), Instant::now());
            let (own_us, own_wall_us) = pass(&mut ws, true)?;
            if evict_kib == 0 {
                cpu.push((thread_cpu_seconds() - c0) * 1e9 / samples);
                wall.push(w0.elapsed().as_secs_f64() * 1e9 / samples);
            } else {
                // The requests' own time, without the eviction between them.
                cpu.push(own_us * 1e3 / samples);
                wall.push(own_wall_us * 1e3 / samples);
            }
        }
        // Untimed passes until every worker is done: no timed pass runs alone, each
        // meets the others' load on the shared pipeline all through.
        finished.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        while finished.load(std::sync::atomic::Ordering::Acquire) < threads.max(1) {
            pass(&mut ws, false)?;
        }
        Ok((cpu, wall, request_us))
    };
    let (mut cpu, mut wall, mut request_us) = (Vec::new(), Vec::new(), Vec::new());
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let handles: Vec<_> = (0..threads.max(1))
            .map(|w| scope.spawn(move || worker(w)))
            .collect();
        for h in handles {
            let (c, w, r) = h
                .join()
                .map_err(|_| anyhow::anyhow!("a pipeline worker panicked"))??;
            cpu.extend(c);
            wall.extend(w);
            request_us.extend(r);
        }
        Ok(())
    })?;
    // Aggregate throughput: the sum of each worker's rate over its timed passes (all
    // run while every other worker was busy too), as in a server whose cores each take
    // the next request when free.
    let samples_per_s: f64 = wall
        .chunks(rounds.max(1))
        .map(|w| rounds.max(1) as f64 * samples / (w.iter().sum::<f64>() * samples / 1e9).max(1e-9))
        .sum();
    let min = |v: &[f64]| v.iter().cloned().fold(f64::INFINITY, f64::min);
    request_us.sort_by(f64::total_cmp);
    let request_quantile = |q: f64| {
        request_us
            .get(((request_us.len() as f64 * q) as usize).min(request_us.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0.0)
    };
    println!(
        "{}",
        serde_json::json!({
            "config": config.display().to_string(),
            "proto": proto,
            "out": out,
            "requests": bodies.list.len(),
            "samples_per_request": bodies.samples_per_request,
            "rounds": rounds,
            "threads": threads.max(1),
            "evict_kib": evict_kib,
            "samples_per_s": samples_per_s,
            "cpu_ns_per_sample_min": min(&cpu),
            "cpu_ns_per_sample_median": median(cpu.clone()),
            "wall_ns_per_sample_min": min(&wall),
            "wall_ns_per_sample_median": median(wall.clone()),
            "request_cpu_us_p50": request_quantile(0.5),
            "request_cpu_us_p99": request_quantile(0.99),
            "request_cpu_us_max": request_us.last().copied().unwrap_or(0.0),
            "commit": std::env::var("BENCH_COMMIT").unwrap_or_default(),
        })
    );
    Ok(())
}

/// Writes every cache line of `scratch` (a new value each call, so that no write is
/// skipped as unchanged), pushing what the caches held out of them.
fn evict(scratch: &mut [u8]) {
    static ROUND: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
    let v = ROUND.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    for line in scratch.chunks_mut(64) {
        line[0] = v;
    }
    std::hint::black_box(&scratch);
}

/// What the router does with a processed request for a tenancy group keyed by `label`
/// (the tenant label kept): split it by tenant, encode each tenant's body.
fn split_and_encode(
    pipeline: &promnorm::pipeline::Pipeline,
    ws: &mut promnorm::pipeline::Workspace,
    label: &str,
    out: Proto,
    family_tenants: &std::sync::Mutex<promnorm::wire::split::FamilyTenants>,
) -> anyhow::Result<()> {
    use promnorm::wire::bodies::V2Output;
    use promnorm::wire::split::{Orphans, SplitOptions};
    let stats = pipeline.stats(ws);
    let (samples, metadata) = (
        stats.samples_out + stats.histograms_out,
        stats.metadata_out > 0,
    );
    let input = ws.route_input();
    let opts = SplitOptions {
        label: label.as_bytes(),
        default: Some(b"anonymous"),
        keep_label: true,
        max_tenants: usize::MAX,
    };
    let orphans = Orphans {
        memory: family_tenants,
        untenanted_ok: true,
    };
    // As `forward::route` does: a body all of one tenant, the input says, is not split.
    let one_tenant = promnorm::forward::InputLabels {
        decoded: input.decoded.0,
        buf: input.decoded.1,
        edited: pipeline.rules().edited_labels(),
    }
    .one_tenant(label)
    .filter(|_| !metadata)
    .map(|t| (t, samples));
    input
        .split
        .split_routed_known(input.mapped, one_tenant, &opts, &orphans)?;
    for tb in input.split.tenant_bodies() {
        let (v1_done, v2) = match out {
            Proto::V1 => (None, V2Output::No),
            Proto::V2 => (Some(&[][..]), V2Output::Yes(None)),
        };
        input.bodies.encode(
            tb.bytes(input.mapped),
            input.has_start_timestamps,
            v1_done,
            v2,
            tb.has_metadata,
        )?;
    }
    Ok(())
}

// ---------------------------------------------------------------------- load --

#[derive(Default)]
struct LoadOutcome {
    requests_ok: u64,
    /// Answers other than 2xx.
    non2xx: u64,
    /// Connection errors and timeouts.
    errors: u64,
    /// Microseconds per successful request (open loop: from its scheduled time).
    latencies_us: Vec<u32>,
    /// The requests scheduled in each second of the phase: their longest latency (µs),
    /// whether a tail is one stall or spread over the run, and how many succeeded.
    by_second: Vec<Second>,
    elapsed_s: f64,
}

/// One second of a load phase (see `LoadOutcome::by_second`).
#[derive(Clone, Copy, Default)]
struct Second {
    max_us: u32,
    ok: u32,
}

impl LoadOutcome {
    fn note_latency(&mut self, second: usize, us: u32) {
        self.latencies_us.push(us);
        if self.by_second.len() <= second {
            self.by_second.resize(second + 1, Second::default());
        }
        let s = &mut self.by_second[second];
        s.max_us = s.max_us.max(us);
        s.ok += 1;
    }

    fn absorb(&mut self, o: LoadOutcome) {
        self.requests_ok += o.requests_ok;
        self.non2xx += o.non2xx;
        self.errors += o.errors;
        self.latencies_us.extend(o.latencies_us);
        if self.by_second.len() < o.by_second.len() {
            self.by_second.resize(o.by_second.len(), Second::default());
        }
        for (s, v) in self.by_second.iter_mut().zip(o.by_second) {
            s.max_us = s.max_us.max(v.max_us);
            s.ok += v.ok;
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Default)]
struct LoadSummary {
    requests_ok: u64,
    non2xx: u64,
    errors: u64,
    samples_per_request: u64,
    window_s: f64,
    samples_per_s: f64,
    lat_p50_ms: f64,
    lat_p90_ms: f64,
    lat_p99_ms: f64,
    lat_max_ms: f64,
    /// The longest latency of the requests scheduled in each second, ms.
    #[serde(default)]
    lat_max_ms_by_second: Vec<f64>,
    /// Requests answered 2xx, by the second they were scheduled in.
    #[serde(default)]
    ok_by_second: Vec<u32>,
}

impl LoadOutcome {
    fn summary(mut self, samples_per_request: u64) -> LoadSummary {
        self.latencies_us.sort_unstable();
        let q = |p: f64| -> f64 {
            if self.latencies_us.is_empty() {
                return 0.0;
            }
            let i = ((self.latencies_us.len() as f64 * p).ceil() as usize)
                .clamp(1, self.latencies_us.len());
            f64::from(self.latencies_us[i - 1]) / 1000.0
        };
        LoadSummary {
            requests_ok: self.requests_ok,
            non2xx: self.non2xx,
            errors: self.errors,
            samples_per_request,
            window_s: self.elapsed_s,
            samples_per_s: (self.requests_ok * samples_per_request) as f64
                / self.elapsed_s.max(1e-9),
            lat_p50_ms: q(0.50),
            lat_p90_ms: q(0.90),
            lat_p99_ms: q(0.99),
            lat_max_ms: q(1.0),
            lat_max_ms_by_second: self
                .by_second
                .iter()
                .map(|s| f64::from(s.max_us / 100) / 10.0)
                .collect(),
            ok_by_second: self.by_second.iter().map(|s| s.ok).collect(),
        }
    }
}

/// Sends for `seconds` over `load.connections` connections; requests still in flight
/// when the time is up are awaited (bounded by the timeout) but not counted.
async fn load_phase(
    url: &str,
    load: &LoadArgs,
    bodies: &Arc<Bodies>,
    seconds: f64,
) -> anyhow::Result<LoadOutcome> {
    if seconds <= 0.0 {
        return Ok(LoadOutcome::default());
    }
    let uri: http::Uri = url.parse().with_context(|| format!("URL {url}"))?;
    ensure!(
        uri.scheme_str() == Some("http"),
        "only http:// targets: {url}"
    );
    let authority = uri.authority().context("URL without host")?.clone();
    let addr = tokio::net::lookup_host(authority.as_str())
        .await?
        .next()
        .context("URL host does not resolve")?;
    let connections = load.connections.max(1);
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    // Open loop: connection k sends at start + (k + i * C) / rate.
    let interval =
        (load.rate > 0.0).then(|| Duration::from_secs_f64(connections as f64 / load.rate));
    let mut tasks = Vec::with_capacity(connections);
    for k in 0..connections {
        let (bodies, uri) = (bodies.clone(), uri.clone());
        let timeout = Duration::from_secs_f64(load.timeout);
        let offset = interval.map(|i| i.mul_f64(k as f64 / connections as f64));
        tasks.push(tokio::spawn(async move {
            let mut out = LoadOutcome::default();
            let mut sender = None;
            let mut next = k * bodies.list.len() / connections;
            let mut scheduled = offset.map(|o| started + o);
            loop {
                if let Some(at) = scheduled {
                    tokio::time::sleep_until(at.into()).await;
                }
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                if sender.is_none() {
                    match connect(addr).await {
                        Ok(s) => sender = Some(s),
                        Err(_) => {
                            out.errors += 1;
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    }
                }
                let Some(s) = sender.as_mut() else { continue };
                let body = bodies.list[next % bodies.list.len()].clone();
                next += 1;
                let from = scheduled.unwrap_or(now);
                match tokio::time::timeout(timeout, send(s, &uri, body, bodies.proto)).await {
                    Ok(Ok(status)) => {
                        let done = Instant::now();
                        if done > deadline {
                            break;
                        }
                        if (200..300).contains(&status) {
                            out.requests_ok += 1;
                            let us = done.duration_since(from).as_micros();
                            let second = from.duration_since(started).as_secs() as usize;
                            out.note_latency(second, u32::try_from(us).unwrap_or(u32::MAX));
                        } else {
                            out.non2xx += 1;
                        }
                    }
                    _ => {
                        out.errors += 1;
                        sender = None;
                    }
                }
                if let (Some(at), Some(i)) = (scheduled.as_mut(), interval) {
                    *at += i;
                }
            }
            out
        }));
    }
    let mut total = LoadOutcome::default();
    for t in tasks {
        total.absorb(t.await?);
    }
    total.elapsed_s = seconds.min(started.elapsed().as_secs_f64());
    Ok(total)
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(addr: SocketAddr) -> anyhow::Result<Sender> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

async fn send(s: &mut Sender, uri: &http::Uri, body: Bytes, proto: Proto) -> anyhow::Result<u16> {
    s.ready().await?;
    let (content_type, version) = match proto {
        Proto::V1 => ("application/x-protobuf", "0.1.0"),
        Proto::V2 => (
            "application/x-protobuf;proto=io.prometheus.write.v2.Request",
            "2.0.0",
        ),
    };
    let req = http::Request::post(uri.path())
        .header(
            http::header::HOST,
            uri.authority().map_or("", |a| a.as_str()),
        )
        .header(http::header::CONTENT_TYPE, content_type)
        .header(http::header::CONTENT_ENCODING, "snappy")
        .header("X-Prometheus-Remote-Write-Version", version)
        .body(Full::new(body))?;
    let resp = s.send_request(req).await?;
    let status = resp.status().as_u16();
    // Read the answer to its end so that the connection can carry the next request.
    resp.into_body().collect().await?;
    Ok(status)
}

// ---------------------------------------------------------------------- sink --

#[derive(Default)]
struct SinkCounters {
    requests: AtomicU64,
    bytes: AtomicU64,
    samples: AtomicU64,
    undecodable: AtomicU64,
}

#[derive(Clone, Copy, Default, Serialize, Deserialize)]
struct SinkCounts {
    requests: u64,
    bytes: u64,
    samples: u64,
    undecodable: u64,
}

struct Sink {
    addr: SocketAddr,
    counters: Arc<SinkCounters>,
}

impl Sink {
    async fn start(listen: SocketAddr, count: SinkCount) -> anyhow::Result<Sink> {
        let listener = TcpListener::bind(listen)
            .await
            .with_context(|| format!("sink: binding {listen}"))?;
        let addr = listener.local_addr()?;
        let counters = Arc::new(SinkCounters::default());
        let c = counters.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                let c = c.clone();
                tokio::spawn(async move {
                    // One request at a time per HTTP/1 connection: the lock is never contended.
                    let scratch = Arc::new(Mutex::new((snap::raw::Decoder::new(), Vec::new())));
                    let svc = hyper::service::service_fn(
                        move |req: http::Request<hyper::body::Incoming>| {
                            let c = c.clone();
                            let v2 = req
                                .headers()
                                .get(http::header::CONTENT_TYPE)
                                .and_then(|v| v.to_str().ok())
                                .is_some_and(|v| v.contains("io.prometheus.write.v2.Request"));
                            let scratch = scratch.clone();
                            async move {
                                let body = match req.into_body().collect().await {
                                    Ok(b) => b.to_bytes(),
                                    Err(e) => return Err(e),
                                };
                                c.requests.fetch_add(1, Ordering::Relaxed);
                                c.bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
                                if count == SinkCount::Samples {
                                    let mut guard =
                                        scratch.lock().unwrap_or_else(|e| e.into_inner());
                                    let (decoder, buf) = &mut *guard;
                                    match count_samples(decoder, buf, &body, v2) {
                                        Some(n) => c.samples.fetch_add(n, Ordering::Relaxed),
                                        None => c.undecodable.fetch_add(1, Ordering::Relaxed),
                                    };
                                }
                                let mut resp = http::Response::new(Full::new(Bytes::new()));
                                *resp.status_mut() = http::StatusCode::NO_CONTENT;
                                Ok::<_, hyper::Error>(resp)
                            }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok(Sink { addr, counters })
    }

    fn counts(&self) -> SinkCounts {
        let c = &self.counters;
        SinkCounts {
            requests: c.requests.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
            samples: c.samples.load(Ordering::Relaxed),
            undecodable: c.undecodable.load(Ordering::Relaxed),
        }
    }
}

/// Samples + histogram samples of a snappy remote-write body; None if it does not decode.
fn count_samples(
    decoder: &mut snap::raw::Decoder,
    buf: &mut Vec<u8>,
    body: &[u8],
    v2: bool,
) -> Option<u64> {
    let len = snap::raw::decompress_len(body).ok()?;
    // Bounded: the sink only sees what the SUT sends, but a wild length must not allocate.
    if len > 256 << 20 {
        return None;
    }
    buf.resize(len, 0);
    let n = decoder.decompress(body, buf).ok()?;
    // 1.0: WriteRequest.timeseries = 1; TimeSeries.samples = 2, histograms = 4.
    // 2.0: Request.timeseries = 5; TimeSeries.samples = 2, histograms = 3.
    let (series_field, histogram_field) = if v2 { (5, 3) } else { (1, 4) };
    let mut total = 0u64;
    for (field, series) in fields(&buf[..n])? {
        if field == series_field {
            for (f, _) in fields(series?)? {
                total += u64::from(f == 2 || f == histogram_field);
            }
        }
    }
    Some(total)
}

/// A field number and, for length-delimited fields, the payload.
type Field<'a> = (u64, Option<&'a [u8]>);

/// The fields of one message, in order.
fn fields(mut b: &[u8]) -> Option<Vec<Field<'_>>> {
    fn varint(b: &mut &[u8]) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = b.split_first()?;
            *b = rest;
            v |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Some(v);
            }
        }
        None
    }
    let mut out = Vec::new();
    while !b.is_empty() {
        let key = varint(&mut b)?;
        let payload = match key & 7 {
            0 => {
                varint(&mut b)?;
                None
            }
            1 => {
                b = b.get(8..)?;
                None
            }
            2 => {
                let len = usize::try_from(varint(&mut b)?).ok()?;
                let (p, rest) = (b.get(..len)?, b.get(len..)?);
                b = rest;
                Some(p)
            }
            5 => {
                b = b.get(4..)?;
                None
            }
            _ => return None,
        };
        out.push((key >> 3, payload));
    }
    Some(out)
}

// ----------------------------------------------------------------------- run --

#[derive(Serialize, Deserialize, Clone, Default)]
struct RunResult {
    case: String,
    run: usize,
    proto: Option<Proto>,
    avg_body_bytes: u64,
    connections: usize,
    rate_rps: f64,
    #[serde(flatten)]
    load: LoadSummary,
    /// Samples the SUT counted in (its ingest counter), else the load's accepted samples.
    sut_samples_in: f64,
    sut_samples_per_s: f64,
    sut_samples_sent: Option<f64>,
    sut_cpu_s: f64,
    sut_cpu_cores: f64,
    /// The SUT's CPU in each second of the window (cores): with `ok_by_second`, a second
    /// whose CPU per request rose is one where the machine ran the SUT slower.
    #[serde(default)]
    sut_cpu_cores_by_second: Vec<f64>,
    cpu_s_per_m: Option<f64>,
    rss_peak_mb: f64,
    vmhwm_mb: f64,
    /// What reached the sink in the window and the drain after it.
    sink: SinkCounts,
    /// Whether the sink decoded each body (`samples`) or counted requests only: decoding
    /// costs CPU on the load core, which delays the load's sends. None in older files.
    #[serde(default)]
    sink_count: Option<SinkCount>,
    sink_samples_per_s: f64,
    drain_s: f64,
    harness_cpu_cores: f64,
    /// Busy CPU of everything else on the machine (noise).
    other_cpu_cores: f64,
    sut_cpu_list: String,
    load_cpu_list: String,
    commit: String,
    ts: String,
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let bodies = Arc::new(generate(&args.load)?);
    eprintln!(
        "[bench] {} requests of {} samples, {} B snappy on average (remote-write {:?})",
        bodies.list.len(),
        bodies.samples_per_request,
        bodies.avg_body_bytes,
        args.load.proto
    );
    let sink = Sink::start("127.0.0.1:0".parse()?, args.sink_count).await?;
    let sink_url = format!("http://{}/api/v1/write", sink.addr);
    for i in 0..args.runs {
        let r = one_run(&args, &bodies, &sink, &sink_url, i).await?;
        let line = serde_json::to_string(&r)?;
        if let Some(path) = &args.results {
            append_line(path, &line)?;
        }
        eprintln!(
            "[bench] {} run {i}: {:.0} samples/s (sink {:.0}/s), SUT {:.2} cores, {:.3} CPU-s/M, \
             RSS {:.0} MB, p50 {:.2} ms p99 {:.2} ms, non-2xx {}, errors {}, other CPU {:.2}",
            r.case,
            r.sut_samples_per_s,
            r.sink_samples_per_s,
            r.sut_cpu_cores,
            r.cpu_s_per_m.unwrap_or(0.0),
            r.rss_peak_mb,
            r.load.lat_p50_ms,
            r.load.lat_p99_ms,
            r.load.non2xx,
            r.load.errors,
            r.other_cpu_cores
        );
        println!("{line}");
    }
    Ok(())
}

/// Appends one line to a results file, creating it and its directory when missing.
fn append_line(path: &std::path::Path, line: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("{}", path.display()))?;
    writeln!(f, "{line}")?;
    Ok(())
}

struct Sut {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Sut {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then SIGKILL after 15 s; only this child, by its PID.
    fn stop(mut self) {
        promnorm::sys::terminate(&self.child);
        let until = Instant::now() + Duration::from_secs(15);
        while Instant::now() < until {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                let _ = std::fs::remove_dir_all(&self.dir);
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

async fn start_sut(args: &RunArgs, sink_url: &str) -> anyhow::Result<Sut> {
    start_sut_with(
        &args.sut_cmd,
        &args.sut_cpu,
        &args.ready_path,
        sink_url,
        |_| Ok(()),
    )
    .await
}

/// Starts `cmd_template` with {port} {sink_url} {tmp} filled in; `prepare` gets the run's
/// temporary directory first (to write files the command reads).
async fn start_sut_with(
    cmd_template: &str,
    sut_cpu: &str,
    ready_path: &str,
    sink_url: &str,
    prepare: impl FnOnce(&std::path::Path) -> anyhow::Result<()>,
) -> anyhow::Result<Sut> {
    let port = free_port()?;
    let dir = std::env::temp_dir().join(format!("promnorm-bench-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    prepare(&dir)?;
    let cmd = cmd_template
        .replace("{port}", &port.to_string())
        .replace("{sink_url}", sink_url)
        .replace("{tmp}", &dir.to_string_lossy());
    let log = std::fs::File::create(dir.join("sut.log"))?;
    // `exec` all the way down: the PID we hold is the SUT's own (CPU and RSS are its).
    let mut command = if !sut_cpu.is_empty() && has_taskset() {
        let mut c = Command::new("taskset");
        c.args(["-c", sut_cpu, "sh", "-c", &format!("exec {cmd}")]);
        c
    } else {
        let mut c = Command::new("sh");
        c.args(["-c", &format!("exec {cmd}")]);
        c
    };
    let child = command
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {cmd}"))?;
    let mut sut = Sut { child, port, dir };
    let ready = format!("http://127.0.0.1:{port}{ready_path}");
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(status)) = sut.child.try_wait() {
            let log = std::fs::read_to_string(sut.dir.join("sut.log")).unwrap_or_default();
            bail!("the SUT exited ({status}) before it was ready: {cmd}\n{log}");
        }
        if http_get(&ready)
            .await
            .is_ok_and(|(s, _)| (200..300).contains(&s))
        {
            return Ok(sut);
        }
        if Instant::now() > until {
            sut.stop();
            bail!("the SUT did not answer {ready} within 30 s: {cmd}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn http_get(url: &str) -> anyhow::Result<(u16, String)> {
    let uri: http::Uri = url.parse()?;
    let addr = tokio::net::lookup_host(uri.authority().context("no host")?.as_str())
        .await?
        .next()
        .context("no address")?;
    let fut = async {
        let mut s = connect(addr).await?;
        let req = http::Request::get(uri.path())
            .header(
                http::header::HOST,
                uri.authority().map_or("", |a| a.as_str()),
            )
            .body(Full::new(Bytes::new()))?;
        let resp = s.send_request(req).await?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(Duration::from_secs(5), fut).await?
}

/// Sum over label sets of a counter given as `name` or `name{substring of the labels}`.
fn counter_sum(text: &str, spec: &str) -> f64 {
    let (name, filter) = match spec.split_once('{') {
        Some((n, f)) => (n, Some(f.trim_end_matches('}'))),
        None => (spec, None),
    };
    let mut sum = 0.0;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (n, labels) = series.split_once('{').unwrap_or((series, ""));
        if n == name && filter.is_none_or(|f| labels.contains(f)) {
            sum += value.parse::<f64>().unwrap_or(0.0);
        }
    }
    sum
}

async fn scrape(port: u16, specs: &[Option<&String>]) -> Vec<Option<f64>> {
    let text = match http_get(&format!("http://127.0.0.1:{port}/metrics")).await {
        Ok((200, text)) => Some(text),
        _ => None,
    };
    specs
        .iter()
        .map(|s| Some(counter_sum(text.as_ref()?, s.as_ref()?)))
        .collect()
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(vec![], |(_, r)| r.split_whitespace().collect());
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<f64>().ok())
        .sum();
    ticks / clock_ticks()
}

fn clock_ticks() -> f64 {
    let t = promnorm::sys::clock_ticks_per_second();
    if t > 0 { t as f64 } else { 100.0 }
}

/// Busy seconds of all CPUs together (from /proc/stat), for the neighbour-noise figure.
fn machine_busy_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().next() else {
        return 0.0;
    };
    let v: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: f64 = v.iter().take(8).sum();
    let idle = v.get(3).unwrap_or(&0.0) + v.get(4).unwrap_or(&0.0);
    (total - idle) / clock_ticks()
}

fn status_kb(pid: u32, key: &str) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

async fn one_run(
    args: &RunArgs,
    bodies: &Arc<Bodies>,
    sink: &Sink,
    sink_url: &str,
    run_idx: usize,
) -> anyhow::Result<RunResult> {
    let sut = start_sut(args, sink_url).await?;
    let result = measure(args, bodies, sink, &sut, run_idx).await;
    let hwm = status_kb(sut.pid(), "VmHWM");
    sut.stop();
    let mut r = result?;
    r.vmhwm_mb = hwm / 1024.0;
    Ok(r)
}

/// Bounded drain: waits until the sink's count stands still for 1 s (a queueing SUT
/// may still be sending); returns the seconds waited.
async fn sink_settle(sink: &Sink, timeout_s: f64) -> f64 {
    let started = Instant::now();
    let (mut last, mut still) = (sink.counts().requests, 0);
    while started.elapsed().as_secs_f64() < timeout_s && still < 5 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = sink.counts().requests;
        still = if now == last { still + 1 } else { 0 };
        last = now;
    }
    started.elapsed().as_secs_f64()
}

async fn measure(
    args: &RunArgs,
    bodies: &Arc<Bodies>,
    sink: &Sink,
    sut: &Sut,
    run_idx: usize,
) -> anyhow::Result<RunResult> {
    let url = format!("http://127.0.0.1:{}{}", sut.port, args.write_path);
    let pid = sut.pid();
    let specs = [args.ingest_metric.as_ref(), args.sent_metric.as_ref()];
    load_phase(&url, &args.load, bodies, args.load.warmup).await?;
    // A queueing SUT is still sending the warm-up's backlog: let it finish, so that
    // what the sink counts in the window is the window's.
    if args.load.warmup > 0.0 {
        sink_settle(sink, args.drain_timeout).await;
    }

    let before = scrape(sut.port, &specs).await;
    let sink_before = sink.counts();
    let (cpu_before, busy_before, self_before) = (
        cpu_seconds(pid),
        machine_busy_seconds(),
        cpu_seconds(std::process::id()),
    );
    let t0 = Instant::now();
    // Peak RSS sampled during the window (VmHWM also counts start-up).
    let stop = Arc::new(AtomicBool::new(false));
    let rss = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut peak = 0.0f64;
            while !stop.load(Ordering::Relaxed) {
                peak = peak.max(status_kb(pid, "VmRSS"));
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            peak
        })
    };
    // The SUT's CPU second by second (clock ticks: 1 % resolution), each second's CPU
    // divided by the time that actually passed (a late wake-up on the busy load core
    // would otherwise put part of one second into the next). Woken at once when the
    // window ends, so that the drain below is measured from then.
    let window_over = Arc::new(tokio::sync::Notify::new());
    let cpu_by_second = {
        let window_over = window_over.clone();
        tokio::spawn(async move {
            let mut out = Vec::new();
            let (mut last, mut last_at) = (cpu_before, t0);
            let mut at = t0;
            loop {
                at += Duration::from_secs(1);
                let over = tokio::select! {
                    biased;
                    _ = tokio::time::sleep_until(at.into()) => false,
                    _ = window_over.notified() => true,
                };
                let (now, now_at) = (cpu_seconds(pid), Instant::now());
                // The timer rounds up to the next millisecond: a window that ends just
                // after a whole second can wake this before the timer does, and that
                // second is still owed.
                if over && now_at < at {
                    break;
                }
                let elapsed = now_at.duration_since(last_at).as_secs_f64();
                // A SUT that exited reads as 0 CPU: no negative seconds.
                out.push((now - last).max(0.0) / elapsed.max(1e-3));
                (last, last_at) = (now, now_at);
                if over {
                    break;
                }
            }
            out
        })
    };
    let out = load_phase(&url, &args.load, bodies, args.load.duration).await?;
    let dt = t0.elapsed().as_secs_f64();
    window_over.notify_one();
    let (cpu_after, busy_after, self_after) = (
        cpu_seconds(pid),
        machine_busy_seconds(),
        cpu_seconds(std::process::id()),
    );
    let mid = scrape(sut.port, &specs).await;
    stop.store(true, Ordering::Relaxed);
    let rss_peak_kb = rss.await?;
    let mut sut_cpu_cores_by_second = cpu_by_second.await?;
    // Only whole seconds of the window.
    sut_cpu_cores_by_second.truncate(dt as usize);

    let drain_s = sink_settle(sink, args.drain_timeout).await;
    let after = scrape(sut.port, &specs).await;
    let sink_after = sink.counts();

    let spr = bodies.samples_per_request;
    let summary = out.summary(spr);
    let accepted = (summary.requests_ok * spr) as f64;
    let sut_in = match (before[0], mid[0]) {
        (Some(a), Some(b)) => b - a,
        _ => accepted,
    };
    let sut_cpu_s = cpu_after - cpu_before;
    let harness = self_after - self_before;
    let sink_delta = SinkCounts {
        requests: sink_after.requests - sink_before.requests,
        bytes: sink_after.bytes - sink_before.bytes,
        samples: sink_after.samples - sink_before.samples,
        undecodable: sink_after.undecodable - sink_before.undecodable,
    };
    Ok(RunResult {
        case: args.case.clone(),
        run: run_idx,
        proto: Some(bodies.proto),
        avg_body_bytes: bodies.avg_body_bytes,
        connections: args.load.connections,
        rate_rps: args.load.rate,
        sut_samples_in: sut_in,
        sut_samples_per_s: sut_in / dt,
        sut_samples_sent: match (before[1], after[1]) {
            (Some(a), Some(b)) => Some(b - a),
            _ => None,
        },
        sut_cpu_s,
        sut_cpu_cores: sut_cpu_s / dt,
        sut_cpu_cores_by_second,
        cpu_s_per_m: (sut_in > 0.0).then(|| sut_cpu_s / (sut_in / 1e6)),
        rss_peak_mb: rss_peak_kb / 1024.0,
        vmhwm_mb: 0.0,
        sink_samples_per_s: sink_delta.samples as f64 / dt,
        sink: sink_delta,
        sink_count: Some(args.sink_count),
        drain_s,
        harness_cpu_cores: harness / dt,
        other_cpu_cores: ((busy_after - busy_before) - sut_cpu_s - harness) / dt,
        sut_cpu_list: args.sut_cpu.clone(),
        load_cpu_list: args.load_cpu.clone(),
        commit: std::env::var("BENCH_COMMIT").unwrap_or_default(),
        ts: utc_now(),
        load: summary,
    })
}

fn utc_now() -> String {
    let s = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, secs) = ((s / 86_400) as i64, s % 86_400);
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

// -------------------------------------------------------------------- report --

fn report(files: &[PathBuf]) -> anyhow::Result<()> {
    let mut by_case: BTreeMap<(String, usize, u64), Vec<RunResult>> = BTreeMap::new();
    let mut order = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
        for (n, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let r: RunResult = serde_json::from_str(line)
                .with_context(|| format!("{}:{}", path.display(), n + 1))?;
            let key = (r.case.clone(), r.connections, r.load.samples_per_request);
            if !by_case.contains_key(&key) {
                order.push(key.clone());
            }
            by_case.entry(key).or_default().push(r);
        }
    }
    println!(
        "| case | conc | runs | samples/s accepted (median) | min–max | CPU-s per M samples | \
         SUT cores | peak RSS MB | p50 / p99 ms | sink samples / in | non-2xx + errors | other CPU |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for key in order {
        let rs = &by_case[&key];
        let med = |f: &dyn Fn(&RunResult) -> f64| median(rs.iter().map(f).collect());
        let sps: Vec<f64> = rs.iter().map(|r| r.sut_samples_per_s).collect();
        let lo = sps.iter().cloned().fold(f64::INFINITY, f64::min);
        let hi = sps.iter().cloned().fold(0.0, f64::max);
        println!(
            "| {} | {} | {} | {:.0} | {:.0}k–{:.0}k | {:.3} | {:.2} | {:.0} | {:.2} / {:.2} | {} | {} | {:.2} |",
            key.0,
            key.1,
            rs.len(),
            med(&|r| r.sut_samples_per_s),
            lo / 1e3,
            hi / 1e3,
            med(&|r| r.cpu_s_per_m.unwrap_or(f64::NAN)),
            med(&|r| r.sut_cpu_cores),
            med(&|r| r.rss_peak_mb),
            med(&|r| r.load.lat_p50_ms),
            med(&|r| r.load.lat_p99_ms),
            // A sink that counted requests only has no samples to compare.
            if rs.iter().any(|r| r.sink_count == Some(SinkCount::Requests)) {
                "-".to_string()
            } else {
                format!(
                    "{:.3}",
                    med(&|r| r.sink.samples as f64 / r.sut_samples_in.max(1.0))
                )
            },
            rs.iter()
                .map(|r| r.load.non2xx + r.load.errors)
                .sum::<u64>(),
            med(&|r| r.other_cpu_cores),
        );
    }
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(proto: Proto) -> LoadArgs {
        LoadArgs {
            proto,
            mode: ModeArg::Default,
            count: 2,
            nodes: 16,
            connections: 1,
            duration: 0.0,
            warmup: 0.0,
            rate: 0.0,
            timeout: 1.0,
        }
    }

    #[test]
    fn the_sink_counts_the_samples_of_both_versions() {
        for (proto, v2) in [(Proto::V1, false), (Proto::V2, true)] {
            let bodies = generate(&args(proto)).unwrap();
            assert_eq!(bodies.samples_per_request, 2000);
            let (mut d, mut buf) = (snap::raw::Decoder::new(), Vec::new());
            for b in &bodies.list {
                assert_eq!(count_samples(&mut d, &mut buf, b, v2), Some(2000));
            }
            // Read with the other version's field numbers, the series are not found.
            assert_eq!(
                count_samples(&mut d, &mut buf, &bodies.list[0], !v2),
                Some(0)
            );
        }
        let (mut d, mut buf) = (snap::raw::Decoder::new(), Vec::new());
        assert_eq!(count_samples(&mut d, &mut buf, b"not snappy", false), None);
        // Valid snappy, truncated protobuf (a length past the end).
        let bad = snap::raw::Encoder::new()
            .compress_vec(&[0x0a, 0x05, 0x12])
            .unwrap();
        assert_eq!(count_samples(&mut d, &mut buf, &bad, false), None);
    }

    #[test]
    fn counters_are_summed_over_matching_label_sets() {
        let text = "# HELP x\n\
                    vmagent_rows_inserted_total{type=\"promremotewrite\"} 10\n\
                    vmagent_rows_inserted_total{type=\"influx\"} 5\n\
                    vmagent_rows_inserted_total_other 7\n\
                    promnorm_samples_received_total{tenant=\"a\"} 1.5e3\n\
                    promnorm_samples_received_total 2\n";
        assert_eq!(
            counter_sum(
                text,
                "vmagent_rows_inserted_total{type=\"promremotewrite\"}"
            ),
            10.0
        );
        assert_eq!(counter_sum(text, "vmagent_rows_inserted_total"), 15.0);
        assert_eq!(counter_sum(text, "promnorm_samples_received_total"), 1502.0);
        assert_eq!(counter_sum(text, "absent"), 0.0);
    }

    #[test]
    fn latency_quantiles_and_rate() {
        let out = LoadOutcome {
            requests_ok: 100,
            latencies_us: (1..=100).rev().map(|i| i * 1000).collect(),
            elapsed_s: 2.0,
            ..Default::default()
        };
        let s = out.summary(2000);
        assert_eq!(s.samples_per_s, 100_000.0);
        assert_eq!(
            (s.lat_p50_ms, s.lat_p99_ms, s.lat_max_ms),
            (50.0, 99.0, 100.0)
        );
    }

    #[test]
    fn the_longest_latency_per_second_across_connections() {
        let (mut a, mut b) = (LoadOutcome::default(), LoadOutcome::default());
        a.note_latency(0, 1_250);
        a.note_latency(0, 900);
        a.note_latency(2, 30_000);
        b.note_latency(0, 4_000);
        b.note_latency(3, 2_000);
        a.absorb(b);
        assert_eq!(a.latencies_us.len(), 5);
        let s = a.summary(1);
        assert_eq!(s.lat_max_ms_by_second, [4.0, 0.0, 30.0, 2.0]);
    }
}
