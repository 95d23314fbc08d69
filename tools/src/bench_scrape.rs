//! `promnorm-bench scrape`: the pull-side benchmark. This process serves `--targets`
//! scrape targets, each on a port of its own answering `/metrics` with
//! `--series-per-target` series of the synthetic fleet in text format 0.0.4 (values move
//! every second), and runs the null sink; the system under test scrapes the targets
//! (listed in `{tmp}/targets.json`, Prometheus' `file_sd` format, so that promnorm and
//! vmagent read the same file) and forwards to the sink. Per run one JSON line: scrapes
//! answered in the window, the SUT's CPU and peak RSS, CPU-s per million scraped
//! samples (the scrapes the targets answered × the series each holds).
//! `scrape-report` prints the per-case medians and each case's ratio to a baseline.

use super::*;

#[derive(Args)]
pub(crate) struct ScrapeArgs {
    /// Label stored with the results
    #[arg(long)]
    case: String,
    /// Shell command of the SUT; {port} {sink_url} {tmp} are filled in, and
    /// {tmp}/targets.json lists the targets (file_sd, label job="bench")
    #[arg(long)]
    sut_cmd: String,
    /// Path answering 2xx once the SUT is ready
    #[arg(long, default_value = "/-/ready")]
    ready_path: String,
    #[arg(long, default_value_t = 20)]
    targets: usize,
    #[arg(long, default_value_t = 10_000)]
    series_per_target: usize,
    /// The scrape interval the SUT's configuration sets, in seconds (for the scrapes
    /// expected in the window)
    #[arg(long, default_value_t = 5.0)]
    interval: f64,
    /// Unmeasured seconds after the SUT is ready (at least two intervals: every
    /// target scraped, its series known)
    #[arg(long, default_value_t = 15.0)]
    warmup: f64,
    /// Measured seconds
    #[arg(long, default_value_t = 60.0)]
    duration: f64,
    /// CPU list for the SUT (`taskset -c`); empty: not pinned
    #[arg(long, default_value = "1")]
    sut_cpu: String,
    /// CPU list for this process (targets + sink); empty: not pinned
    #[arg(long, default_value = "0")]
    pub(crate) load_cpu: String,
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Append one JSON line per run here
    #[arg(long)]
    results: Option<PathBuf>,
}

#[derive(Serialize, Deserialize)]
struct ScrapeResult {
    case: String,
    run: usize,
    targets: usize,
    series_per_target: usize,
    interval_s: f64,
    window_s: f64,
    /// Scrapes the targets answered in the window, and how many the interval asks for.
    scrapes: u64,
    scrapes_expected: f64,
    samples_scraped: f64,
    body_bytes: u64,
    sut_cpu_s: f64,
    sut_cpu_cores: f64,
    cpu_s_per_m: f64,
    rss_peak_mb: f64,
    /// What reached the sink in the window (the SUT's series, `up` and the other
    /// per-scrape series, derived series).
    sink: SinkCounts,
    harness_cpu_cores: f64,
    other_cpu_cores: f64,
    commit: String,
    ts: String,
}

/// The targets: one listener each, one shared body that is rendered again when the
/// second changes.
struct Targets {
    addrs: Vec<SocketAddr>,
    scrapes: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
    /// One scrape's body, as first rendered.
    body_bytes: usize,
}

type BodyCache = Arc<Mutex<(u64, Bytes)>>;

fn render(fleet: &fleet::Fleet, series: usize, second: u64) -> Bytes {
    Bytes::from(fleet.exposition(series, second as i64 * 1000))
}

async fn start_targets(n: usize, series: usize) -> anyhow::Result<Targets> {
    let fleet = Arc::new(fleet::Fleet::build(
        &fleet::FleetShape::default(),
        fleet::FIXED_END_MS,
    ));
    let now_s = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    };
    let first = render(&fleet, series, now_s());
    let body_bytes = first.len();
    let cache: BodyCache = Arc::new(Mutex::new((now_s(), first)));
    let scrapes = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let mut addrs = Vec::with_capacity(n);
    for _ in 0..n {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        addrs.push(listener.local_addr()?);
        let (fleet, cache, scrapes, bytes) =
            (fleet.clone(), cache.clone(), scrapes.clone(), bytes.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (fleet, cache, scrapes, bytes) =
                    (fleet.clone(), cache.clone(), scrapes.clone(), bytes.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(
                        move |_req: http::Request<hyper::body::Incoming>| {
                            let body = {
                                let mut guard = cache.lock().unwrap_or_else(|e| e.into_inner());
                                let second = now_s();
                                if guard.0 != second {
                                    *guard = (second, render(&fleet, series, second));
                                }
                                guard.1.clone()
                            };
                            scrapes.fetch_add(1, Ordering::Relaxed);
                            bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
                            let resp = http::Response::builder()
                                .header(
                                    http::header::CONTENT_TYPE,
                                    "text/plain; version=0.0.4; charset=utf-8",
                                )
                                .body(Full::new(body));
                            async move { resp }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
    }
    Ok(Targets {
        addrs,
        scrapes,
        bytes,
        body_bytes,
    })
}

pub(crate) async fn scrape_run(args: ScrapeArgs) -> anyhow::Result<()> {
    ensure!(
        args.targets > 0 && args.series_per_target > 0,
        "--targets and --series-per-target must be > 0"
    );
    let targets = start_targets(args.targets, args.series_per_target).await?;
    let sink = Sink::start("127.0.0.1:0".parse()?, SinkCount::Samples).await?;
    let sink_url = format!("http://{}/api/v1/write", sink.addr);
    let file_sd = serde_json::json!([{
        "targets": targets.addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        "labels": {"job": "bench"},
    }])
    .to_string();
    eprintln!(
        "[bench] {} targets of {} series ({} B a scrape)",
        args.targets, args.series_per_target, targets.body_bytes
    );
    for run in 0..args.runs {
        let sut = start_sut_with(
            &args.sut_cmd,
            &args.sut_cpu,
            &args.ready_path,
            &sink_url,
            |dir| Ok(std::fs::write(dir.join("targets.json"), &file_sd)?),
        )
        .await?;
        let result = scrape_measure(&args, &targets, &sink, &sut, run).await;
        sut.stop();
        let r = result?;
        let line = serde_json::to_string(&r)?;
        if let Some(path) = &args.results {
            append_line(path, &line)?;
        }
        eprintln!(
            "[bench] {} run {run}: {} scrapes of {:.0} expected, SUT {:.3} cores, \
             {:.3} CPU-s per M samples, RSS {:.0} MB, sink {} samples, other CPU {:.2}",
            r.case,
            r.scrapes,
            r.scrapes_expected,
            r.sut_cpu_cores,
            r.cpu_s_per_m,
            r.rss_peak_mb,
            r.sink.samples,
            r.other_cpu_cores
        );
        println!("{line}");
    }
    Ok(())
}

async fn scrape_measure(
    args: &ScrapeArgs,
    targets: &Targets,
    sink: &Sink,
    sut: &Sut,
    run: usize,
) -> anyhow::Result<ScrapeResult> {
    let pid = sut.pid();
    tokio::time::sleep(Duration::from_secs_f64(args.warmup)).await;
    ensure!(
        targets.scrapes.load(Ordering::Relaxed) > 0,
        "{}: no target was scraped in the {} s warm-up",
        args.case,
        args.warmup
    );
    let (scrapes0, bytes0, sink0) = (
        targets.scrapes.load(Ordering::Relaxed),
        targets.bytes.load(Ordering::Relaxed),
        sink.counts(),
    );
    let (cpu0, busy0, self0) = (
        cpu_seconds(pid),
        machine_busy_seconds(),
        cpu_seconds(std::process::id()),
    );
    let t0 = Instant::now();
    let mut rss_peak_kb = 0.0f64;
    while t0.elapsed().as_secs_f64() < args.duration {
        rss_peak_kb = rss_peak_kb.max(status_kb(pid, "VmRSS"));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let window_s = t0.elapsed().as_secs_f64();
    let (cpu1, busy1, self1) = (
        cpu_seconds(pid),
        machine_busy_seconds(),
        cpu_seconds(std::process::id()),
    );
    let (scrapes1, bytes1, sink1) = (
        targets.scrapes.load(Ordering::Relaxed),
        targets.bytes.load(Ordering::Relaxed),
        sink.counts(),
    );
    let scrapes = scrapes1 - scrapes0;
    let samples = (scrapes * args.series_per_target as u64) as f64;
    let sut_cpu_s = cpu1 - cpu0;
    let harness = self1 - self0;
    Ok(ScrapeResult {
        case: args.case.clone(),
        run,
        targets: args.targets,
        series_per_target: args.series_per_target,
        interval_s: args.interval,
        window_s,
        scrapes,
        scrapes_expected: args.targets as f64 * window_s / args.interval,
        samples_scraped: samples,
        body_bytes: bytes1 - bytes0,
        sut_cpu_s,
        sut_cpu_cores: sut_cpu_s / window_s,
        cpu_s_per_m: if samples > 0.0 {
            sut_cpu_s / (samples / 1e6)
        } else {
            f64::NAN
        },
        rss_peak_mb: rss_peak_kb / 1024.0,
        sink: SinkCounts {
            requests: sink1.requests - sink0.requests,
            bytes: sink1.bytes - sink0.bytes,
            samples: sink1.samples - sink0.samples,
            undecodable: sink1.undecodable - sink0.undecodable,
        },
        harness_cpu_cores: harness / window_s,
        other_cpu_cores: ((busy1 - busy0) - sut_cpu_s - harness) / window_s,
        commit: std::env::var("BENCH_COMMIT").unwrap_or_default(),
        ts: utc_now(),
    })
}

/// Per-case medians of `scrape` results; with `baseline`, each case's CPU per million
/// samples as a share of the baseline's.
pub(crate) fn scrape_report(files: &[PathBuf], baseline: Option<&str>) -> anyhow::Result<()> {
    let mut by_case: BTreeMap<String, Vec<ScrapeResult>> = BTreeMap::new();
    let mut order = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
        for (n, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let r: ScrapeResult = serde_json::from_str(line)
                .with_context(|| format!("{}:{}", path.display(), n + 1))?;
            if !by_case.contains_key(&r.case) {
                order.push(r.case.clone());
            }
            by_case.entry(r.case.clone()).or_default().push(r);
        }
    }
    let med = |case: &str, f: &dyn Fn(&ScrapeResult) -> f64| {
        median(
            by_case
                .get(case)
                .map_or(vec![], |rs| rs.iter().map(f).collect()),
        )
    };
    let base = baseline
        .map(|b| med(b, &|r| r.cpu_s_per_m))
        .filter(|b| b.is_finite());
    println!(
        "| case | runs | targets × series | scrapes / expected | CPU-s per M samples | \
         share of baseline | SUT cores | peak RSS MB | sink samples / scraped | other CPU |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for case in order {
        let rs = &by_case[&case];
        let cpu = med(&case, &|r| r.cpu_s_per_m);
        println!(
            "| {case} | {} | {} × {} | {:.3} | {:.3} | {} | {:.3} | {:.0} | {:.3} | {:.2} |",
            rs.len(),
            rs[0].targets,
            rs[0].series_per_target,
            med(&case, &|r| r.scrapes as f64 / r.scrapes_expected.max(1e-9)),
            cpu,
            base.map_or("-".into(), |b| format!("{:.2}", cpu / b)),
            med(&case, &|r| r.sut_cpu_cores),
            med(&case, &|r| r.rss_peak_mb),
            med(&case, &|r| r.sink.samples as f64
                / r.samples_scraped.max(1.0)),
            med(&case, &|r| r.other_cpu_cores),
        );
    }
    Ok(())
}
