//! The derived series computed two ways, end to end with real components: Debian's
//! Prometheus 2.42 scrapes live vLLM- and SGLang-like engines every second and
//! remote-writes the same samples
//!
//! - through promnorm with derived series on (peaks, `derived.window`, sums over ranks)
//!   into receiver A, a Prometheus with `--web.enable-remote-write-receiver`;
//! - through promnorm with `derived.enabled: false` (no sums over ranks) into receiver B,
//!   a Prometheus that evaluates, every second, the rule file `promnorm rules` printed for
//!   A's configuration (`promtool check rules` accepts it).
//!
//! After a steady period every derived series must exist in both with the same label
//! sets, and agree within [`TOLERANCE`] at every step of a range query; the measured
//! largest relative difference per series is printed. MFU/MBU values in A are also checked
//! against the engines' known rates and the peak that must win.
//!
//! Needs `PROMETHEUS_BIN` (scripts/test.sh fetches it), with `promtool` beside it; with
//! `PROMNORM_E2E=1` a missing binary is a failure.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::*;

/// Largest accepted relative difference between the proxy's and the ruler's value.
const TOLERANCE: f64 = 0.01;
/// How long the engines run before the comparison.
const STEADY: Duration = Duration::from_secs(30);
/// The rate window of both sides: `derived.window` in A, `rate(…[10s])` in B.
const WINDOW: &str = "10s";
/// The rules read this far back: samples reach receiver B up to a remote-write batch
/// later than their timestamp, and `rate()` extrapolates a window whose newest sample is
/// more than 1.1 scrape intervals old by half an interval only (docs/derived.md).
const OFFSET: &str = "3s";

/// A vLLM engine: per-second rates of its counters.
struct Vllm {
    labels: &'static str,
    /// V0 names (`vllm:gpu_prefix_cache_*`), migrated by the vllm pack on both paths.
    v0: bool,
    hit_ratio: f64,
    flops: f64,
    read_bytes: f64,
    write_bytes: f64,
}

const VLLM: &[Vllm] = &[
    Vllm {
        labels: r#"engine="0",gpu_type="h200",model_name="llama-70b""#,
        v0: false,
        hit_ratio: 0.3,
        flops: 4.0e14,
        read_bytes: 2.0e12,
        write_bytes: 1.0e11,
    },
    Vllm {
        labels: r#"engine="1",gpu_type="h200",model_name="qwen-7b""#,
        v0: true,
        hit_ratio: 0.5,
        flops: 5.0e14,
        read_bytes: 1.0e12,
        write_bytes: 5.0e10,
    },
    Vllm {
        labels: r#"engine="2",gpu_type="l4",model_name="mistral-7b""#,
        v0: false,
        hit_ratio: 0.7,
        flops: 3.0e13,
        read_bytes: 1.0e11,
        write_bytes: 1.0e10,
    },
];

const SGLANG: &str = r#"engine="3",model_name="sg-llama""#;
const SGLANG_FLOPS: f64 = 1.0e14;
const SGLANG_READ: f64 = 8.0e11;
const SGLANG_WRITE: f64 = 4.0e10;

/// Receiver A's promnorm (derived series on); `promnorm rules` reads the same file.
/// llama-70b matches the first two peaks: the first wins (989e12, 3.35e12). qwen-7b takes
/// FLOP/s from the second, bandwidth from the third; mistral-7b matches none.
const CONFIG_A: &str = r#"packs:
  sum_over_ranks: {sglang: true}
derived:
  window: 10s
  peaks:
    - match: {model_name: llama-70b}
      gpu: H100-SXM
    - match: {gpu_type: h200}
      flops: 2.0e15
    - match: {model_name: qwen-7b, gpu_type: h200}
      bandwidth: 4.8e12
    - match: {model_name: sg-llama}
      gpu: A100-80GB
"#;
const CONFIG_B: &str = "derived:\n  enabled: false\n";

/// Physical SGLang family that only a suffix pattern names: summed via --sum-family.
const HICACHE: &str = "sglang:hicache_backup_bytes_total";

type Families = BTreeMap<String, (&'static str, Vec<String>)>;

fn add(fams: &mut Families, family: &str, kind: &'static str, name: &str, labels: &str, v: f64) {
    fams.entry(family.to_string())
        .or_insert((kind, Vec::new()))
        .1
        .push(format!("{name}{{{labels}}} {v}"));
}

/// The engines' exposition at `t` seconds of uptime: every counter is rate × t.
fn exposition(t: f64) -> String {
    let mut fams = Families::new();
    let counter = |fams: &mut Families, name: &str, labels: &str, rate: f64| {
        let family = name.strip_suffix("_total").unwrap_or(name);
        add(fams, family, "counter", name, labels, rate * t);
    };
    for (i, e) in VLLM.iter().enumerate() {
        let k = (i + 1) as f64;
        let l = e.labels;
        let (hits, queries) = if e.v0 {
            (
                "vllm:gpu_prefix_cache_hits_total",
                "vllm:gpu_prefix_cache_queries_total",
            )
        } else {
            (
                "vllm:prefix_cache_hits_total",
                "vllm:prefix_cache_queries_total",
            )
        };
        counter(&mut fams, queries, l, 1000.0 * k);
        counter(&mut fams, hits, l, 1000.0 * k * e.hit_ratio);
        counter(
            &mut fams,
            "vllm:external_prefix_cache_queries_total",
            l,
            200.0 * k,
        );
        counter(
            &mut fams,
            "vllm:external_prefix_cache_hits_total",
            l,
            200.0 * k * e.hit_ratio / 2.0,
        );
        counter(&mut fams, "vllm:spec_decode_num_drafts_total", l, 50.0 * k);
        counter(
            &mut fams,
            "vllm:spec_decode_num_draft_tokens_total",
            l,
            200.0 * k,
        );
        counter(
            &mut fams,
            "vllm:spec_decode_num_accepted_tokens_total",
            l,
            200.0 * k * (0.4 + 0.1 * k),
        );
        counter(&mut fams, "vllm:prompt_tokens_total", l, 1500.0 * k);
        counter(
            &mut fams,
            "vllm:prompt_tokens_cached_total",
            l,
            1500.0 * k * 0.6,
        );
        counter(&mut fams, "vllm:estimated_flops_per_gpu_total", l, e.flops);
        counter(
            &mut fams,
            "vllm:estimated_read_bytes_per_gpu_total",
            l,
            e.read_bytes,
        );
        counter(
            &mut fams,
            "vllm:estimated_write_bytes_per_gpu_total",
            l,
            e.write_bytes,
        );
    }
    // LMCache beside the first engine.
    let l = VLLM[0].labels;
    counter(
        &mut fams,
        "lmcache_mp_lookup_requested_tokens_total",
        l,
        900.0,
    );
    counter(&mut fams, "lmcache_mp_lookup_hit_tokens_total", l, 300.0);
    counter(&mut fams, "lmcache:num_requested_tokens_total", l, 800.0);
    counter(&mut fams, "lmcache:num_hit_tokens_total", l, 200.0);
    counter(&mut fams, "lmcache:num_lookup_tokens_total", l, 700.0);
    counter(&mut fams, "lmcache:num_lookup_hits_total", l, 350.0);
    // llama.cpp's speculative decoding counters (no labels: llama.cpp sets none).
    counter(&mut fams, "llamacpp:spec_decode_num_drafts_total", "", 30.0);
    counter(
        &mut fams,
        "llamacpp:spec_decode_num_draft_tokens_total",
        "",
        120.0,
    );
    counter(
        &mut fams,
        "llamacpp:spec_decode_num_accepted_tokens_total",
        "",
        78.0,
    );
    // Triton's response cache: counters without `_total`, as Triton writes them (the
    // triton pack adds it); hit ratio 0.4.
    let l = "model=\"ensemble\",version=\"1\"";
    for (name, rate) in [
        ("nv_cache_num_hits_per_model", 40.0),
        ("nv_cache_num_misses_per_model", 60.0),
    ] {
        add(&mut fams, name, "counter", name, l, rate * t);
    }
    // SGLang with two tensor-parallel ranks: logical families repeat on every rank
    // (rank 0 kept), physical ones differ per rank (kept, and summed).
    for r in 0..2 {
        let l = format!("{SGLANG},tp_rank=\"{r}\"");
        let f = (r + 1) as f64;
        counter(
            &mut fams,
            "sglang:estimated_flops_per_gpu_total",
            &l,
            SGLANG_FLOPS,
        );
        counter(
            &mut fams,
            "sglang:estimated_read_bytes_per_gpu_total",
            &l,
            SGLANG_READ,
        );
        counter(
            &mut fams,
            "sglang:estimated_write_bytes_per_gpu_total",
            &l,
            SGLANG_WRITE,
        );
        add(
            &mut fams,
            "sglang:hicache_backup_bytes",
            "counter",
            HICACHE,
            &l,
            1e12 * f + 1e6 * f * t,
        );
        add(
            &mut fams,
            "sglang:kv_transfer_total_mb",
            "gauge",
            "sglang:kv_transfer_total_mb",
            &l,
            512.0 * f,
        );
    }
    let mut text = String::new();
    for (family, (kind, lines)) in fams {
        text.push_str(&format!("# TYPE {family} {kind}\n"));
        for line in lines {
            text.push_str(&line);
            text.push('\n');
        }
    }
    text
}

async fn target() -> std::net::SocketAddr {
    let start = Instant::now();
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || async move {
            // An hour of uptime before the test began.
            exposition(3600.0 + start.elapsed().as_secs_f64())
        }),
    );
    common::serve(app).await
}

/// Starts Prometheus with `config` on `port`; a receiver accepts remote writes.
fn start_prometheus(
    prom: &Path,
    dir: &Path,
    name: &str,
    config: &str,
    port: u16,
    receiver: bool,
) -> Killed {
    let file = dir.join(format!("{name}.yml"));
    std::fs::write(&file, config).unwrap();
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    let mut cmd = Command::new(prom);
    cmd.arg(format!("--config.file={}", file.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join(format!("{name}-data")).display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--log.level=warn")
        .stdout(Stdio::null())
        .stderr(log);
    if receiver {
        cmd.arg("--web.enable-remote-write-receiver");
    }
    Killed(cmd.spawn().expect("start prometheus"))
}

async fn wait_ready(base: &str) {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let ok = tokio::time::timeout(Duration::from_secs(2), async {
            let client: hyper_util::client::legacy::Client<
                _,
                http_body_util::Full<axum::body::Bytes>,
            > = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http();
            client
                .request(
                    axum::http::Request::get(format!("{base}/-/ready"))
                        .body(http_body_util::Full::new(axum::body::Bytes::new()))
                        .unwrap(),
                )
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await
        .unwrap_or(false);
        if ok {
            return;
        }
        assert!(Instant::now() < until, "{base} did not become ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Label set (without `__name__`) → (timestamp ms → value).
type Range = BTreeMap<Vec<(String, String)>, BTreeMap<i64, f64>>;

async fn query_range(base: &str, query: &str, start: f64, end: f64) -> Range {
    let url = format!(
        "{base}/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step=1",
        percent_encode(query)
    );
    let r = get(&url).await;
    let v: serde_json::Value =
        serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{url}: {e}: {}", r.body));
    assert_eq!(v["status"], "success", "{url}: {}", r.body);
    let mut out = Range::new();
    for item in v["data"]["result"].as_array().cloned().unwrap_or_default() {
        let mut labels: Vec<(String, String)> = item["metric"]
            .as_object()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|(k, _)| k != "__name__")
            .map(|(k, v)| (k, v.as_str().unwrap_or_default().to_string()))
            .collect();
        labels.sort();
        let points = out.entry(labels).or_default();
        for p in item["values"].as_array().cloned().unwrap_or_default() {
            let ts = (p[0].as_f64().unwrap_or_default() * 1000.0).round() as i64;
            let v = p[1]
                .as_str()
                .and_then(promnorm::mapping::number::parse_float)
                .unwrap_or(f64::NAN);
            points.insert(ts, v);
        }
    }
    out
}

fn label<'a>(labels: &'a [(String, String)], name: &str) -> &'a str {
    labels
        .iter()
        .find(|(n, _)| n == name)
        .map_or("", |(_, v)| v.as_str())
}

/// What receiver A must hold for a MFU/MBU series: the engine's rate over the peak that
/// must win.
fn expected_utilisation(name: &str, labels: &[(String, String)]) -> Option<f64> {
    let model = label(labels, "model_name");
    let (flops, bytes, peak_flops, peak_bw) = match model {
        "llama-70b" => (
            VLLM[0].flops,
            VLLM[0].read_bytes + VLLM[0].write_bytes,
            989e12,
            3.35e12,
        ),
        "qwen-7b" => (
            VLLM[1].flops,
            VLLM[1].read_bytes + VLLM[1].write_bytes,
            2.0e15,
            4.8e12,
        ),
        "sg-llama" => (SGLANG_FLOPS, SGLANG_READ + SGLANG_WRITE, 312e12, 2.039e12),
        _ => return None,
    };
    if name.ends_with("mfu_ratio") {
        Some(flops / peak_flops)
    } else if name.ends_with("mbu_ratio") {
        Some(bytes / peak_bw)
    } else {
        None
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ruler_computes_what_the_proxy_computes() {
    let Some(prom) = prometheus_bin() else {
        if std::env::var("PROMNORM_E2E").as_deref() == Ok("1") {
            panic!("PROMNORM_E2E=1 but PROMETHEUS_BIN is not set to an existing binary");
        }
        eprintln!("SKIPPED: set PROMETHEUS_BIN (scripts/test.sh does) to run the rules test");
        return;
    };
    let promtool = prom.with_file_name("promtool");
    assert!(
        promtool.exists(),
        "{} is missing (Debian's prometheus package has it beside prometheus)",
        promtool.display()
    );
    let began = Instant::now();
    let tmp = std::env::temp_dir().join(format!("promnorm-rules-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();

    // The rule file for A's configuration, printed by the binary and checked by promtool.
    std::fs::write(tmp.join("a.yaml"), CONFIG_A).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_promnorm"))
        .args(["rules", "--config"])
        .arg(tmp.join("a.yaml"))
        .args([
            "--window",
            WINDOW,
            "--offset",
            OFFSET,
            "--sum-family",
            HICACHE,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promnorm rules: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rule_file = tmp.join("rules.yml");
    std::fs::write(&rule_file, &out.stdout).unwrap();
    let check = Command::new(&promtool)
        .args(["check", "rules"])
        .arg(&rule_file)
        .output()
        .unwrap();
    let check_out = format!(
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(check.status.success(), "promtool check rules: {check_out}");
    println!(
        "promtool check rules: {}",
        check_out.trim().replace('\n', " ")
    );

    let target = target().await;
    let (port_a, port_b, port_s) = (free_port(), free_port(), free_port());
    let (base_a, base_b, base_s) = (
        format!("http://127.0.0.1:{port_a}"),
        format!("http://127.0.0.1:{port_b}"),
        format!("http://127.0.0.1:{port_s}"),
    );
    let proxy_a = start_proxy(&[format!("{base_a}/api/v1/write")], CONFIG_A).await;
    let proxy_b = start_proxy(&[format!("{base_b}/api/v1/write")], CONFIG_B).await;

    let receiver_cfg = |rules: Option<&Path>| {
        let mut config = String::from("global:\n  evaluation_interval: 1s\n");
        if let Some(r) = rules {
            config.push_str(&format!("rule_files:\n  - {}\n", r.display()));
        }
        config
    };
    let receiver_a = start_prometheus(&prom, &tmp, "receiver-a", &receiver_cfg(None), port_a, true);
    let receiver_b = start_prometheus(
        &prom,
        &tmp,
        "receiver-b",
        &receiver_cfg(Some(&rule_file)),
        port_b,
        true,
    );
    wait_ready(&base_a).await;
    wait_ready(&base_b).await;

    let queue =
        "    queue_config: {batch_send_deadline: 250ms, min_backoff: 100ms, max_backoff: 1s}\n";
    let sender_cfg = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: engines\n    static_configs:\n      - targets: ['{target}']\nremote_write:\n  - url: {}\n{queue}  - url: {}\n{queue}",
        proxy_a.url(),
        proxy_b.url()
    );
    let sender = start_prometheus(&prom, &tmp, "sender", &sender_cfg, port_s, false);
    wait_ready(&base_s).await;
    // The first scrape comes a few seconds after start-up (target discovery); the steady
    // period counts from it.
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let r = get(&format!("{base_s}/api/v1/query?query=up")).await;
        if r.body.contains("\"engines\"") {
            break;
        }
        assert!(
            Instant::now() < until,
            "the sender never scraped: {}",
            r.body
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(STEADY).await;

    // The last 10 s that both sides have had time to write: A's derived samples follow
    // a scrape by a remote-write batch and a derived-writer flush, B's rules read OFFSET
    // back already. Its start lies WINDOW + OFFSET + 4 s after the first scrape: rate()
    // over a window only partly covered by a new series reports a lower rate.
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let (start, end) = (now.floor() - 13.0, now.floor() - 3.0);

    // Series, and label sets expected in A.
    let mut checks: Vec<(String, String, usize)> = promnorm::derive::defs::DEFINITIONS
        .iter()
        .map(|d| {
            let n = match d.name {
                "vllm:mfu_ratio" | "vllm:mbu_ratio" => 2, // mistral-7b has no peak
                n if n.starts_with("sglang:")
                    || n.starts_with("lmcache")
                    || n.starts_with("llamacpp:")
                    || n.starts_with("nv_") =>
                {
                    1
                }
                _ => VLLM.len(),
            };
            (d.name.to_string(), d.name.to_string(), n)
        })
        .collect();
    for family in [HICACHE, "sglang:kv_transfer_total_bytes"] {
        checks.push((
            format!("{family} (sum over tp_rank)"),
            format!("{family}{{tp_rank=\"\"}}"),
            1,
        ));
    }
    let mut failures = Vec::new();
    println!(
        "window {WINDOW} both sides, rules offset {OFFSET}; steady {STEADY:?}; compared {start}..{end} s at 1 s steps; tolerance {TOLERANCE} relative"
    );
    for (shown, query, want) in &checks {
        let a = query_range(&base_a, query, start, end).await;
        let b = query_range(&base_b, query, start, end).await;
        let keys_a: BTreeSet<_> = a.keys().collect();
        let keys_b: BTreeSet<_> = b.keys().collect();
        if keys_a.len() != *want || keys_a != keys_b {
            failures.push(format!(
                "{shown}: label sets differ (want {want}):\n  proxy: {keys_a:?}\n  ruler: {keys_b:?}"
            ));
            continue;
        }
        let (mut max_rel, mut points, mut max_expected) = (0f64, 0usize, 0f64);
        let mut worst = Vec::new();
        for (labels, pa) in &a {
            let pb = &b[labels];
            for (ts, va) in pa {
                let Some(vb) = pb.get(ts) else { continue };
                points += 1;
                let rel = (va - vb).abs() / va.abs().max(vb.abs()).max(f64::MIN_POSITIVE);
                let rel = if rel.is_nan() { f64::INFINITY } else { rel };
                if rel > TOLERANCE && worst.len() < 5 {
                    worst.push(format!("{labels:?} at {ts}: proxy {va}, ruler {vb}"));
                }
                max_rel = max_rel.max(rel);
                if let Some(e) = expected_utilisation(query, labels) {
                    max_expected = max_expected.max((va - e).abs() / e);
                }
            }
        }
        println!(
            "{shown}: {} series, {points} points, max relative difference proxy vs ruler {max_rel:.3e}{}",
            a.len(),
            if query.ends_with("u_ratio") {
                format!(", proxy vs engine rate / winning peak {max_expected:.3e}")
            } else {
                String::new()
            }
        );
        if points < 5 * a.len() {
            failures.push(format!("{shown}: only {points} points compared"));
        }
        if max_rel > TOLERANCE {
            failures.push(format!(
                "{shown}: proxy and ruler differ by {max_rel:.3e}:\n  {}",
                worst.join("\n  ")
            ));
        }
        if max_expected > TOLERANCE {
            failures.push(format!(
                "{shown}: the proxy's value is {max_expected:.3e} off the engine's rate over its peak"
            ));
        }
    }
    println!("wall time {:?}", began.elapsed());
    // Stopped before their directory is removed (a running Prometheus writes on).
    drop(sender);
    drop((receiver_a, receiver_b, proxy_a, proxy_b));
    assert!(
        failures.is_empty(),
        "{}\n(logs in {})",
        failures.join("\n"),
        tmp.display()
    );
    let _ = std::fs::remove_dir_all(&tmp);
}
