//! A synthetic LLM-inference fleet and the remote-write requests Prometheus would send
//! for it, built in process so that tests, benches and the `promnorm-payloads` tool need
//! neither Python nor a snappy module.
//!
//! The fleet (default shape): 16 nodes running vLLM V1 (one to four engines each), 16
//! nodes running SGLang with `tp_rank` 0..7 and a Mooncake transfer engine, and a DCGM
//! exporter for the 8 GPUs of every node: about 30,000 series in 80 scrape targets and
//! about 100 metric names, with the label sets, bucket layouts and value ranges the real
//! exporters ship.
//!
//! Requests walk the fleet target by target, round after round, the way a Prometheus
//! remote-write queue shards it (`max_samples_per_send: 2000`, or 10,000 in
//! [`Mode::Large`]), one sample per series. Round `r` of target `k` is stamped
//! `start + r·interval + k·interval/targets`, so no request is older than the one before
//! and every series moves forward from request to request. Counters and histogram buckets
//! only grow. Like the requests of a real queue they carry no metadata and, since no
//! target disappears, no stale markers.
//!
//! Everything follows from the seed: the same arguments give the same bytes.
//!
//! Part of the library only with the `testkit` feature (on by default, for the
//! `promnorm-payloads` and `promnorm-bench` tools); the proxy's own code never imports it
//! (`tests/it/architecture.rs` checks).

use std::collections::BTreeSet;
use std::f64::consts::PI;

use crate::wire::proto::prometheus as pb;
use prost::Message;

pub const DEFAULT_SEED: u64 = 42;
pub const DEFAULT_INTERVAL_MS: i64 = 15_000;
/// The clock of [`request_bodies`]: 2023-11-14T22:13:00Z (a multiple of the interval), so
/// tests and benches see the same bytes on every run.
pub const FIXED_END_MS: i64 = 1_699_999_980_000;

/// Request size and default request count, as in the benchmark payloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// 2,000 series per request: Prometheus' default `max_samples_per_send`.
    Default,
    /// 10,000 series per request: a queue tuned for throughput.
    Large,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Default => "default",
            Mode::Large => "large",
        }
    }

    pub fn series_per_request(self) -> usize {
        match self {
            Mode::Default => 2_000,
            Mode::Large => 10_000,
        }
    }

    pub fn request_count(self) -> usize {
        match self {
            Mode::Default => 100,
            Mode::Large => 40,
        }
    }
}

/// How many nodes of each kind, and the seed that fixes everything random.
#[derive(Clone, Debug)]
pub struct FleetShape {
    pub vllm_nodes: usize,
    pub sglang_nodes: usize,
    /// `tp_rank`s per SGLang node.
    pub tensor_parallel: usize,
    pub namespace: String,
    pub seed: u64,
}

impl Default for FleetShape {
    fn default() -> Self {
        FleetShape {
            vllm_nodes: 16,
            sglang_nodes: 16,
            tensor_parallel: 8,
            namespace: "llm-serving".into(),
            seed: DEFAULT_SEED,
        }
    }
}

/// `count` snappy-compressed request bodies of the default fleet on the fixed clock
/// [`FIXED_END_MS`]: the payloads of the zero-allocation test and the benches.
pub fn request_bodies(mode: Mode, count: usize) -> Vec<Vec<u8>> {
    request_bodies_of(&FleetShape::default(), mode, count)
}

/// [`request_bodies`] of a fleet of another shape (a wider one for the `/federate`
/// benchmark: about 940 series per node).
pub fn request_bodies_of(shape: &FleetShape, mode: Mode, count: usize) -> Vec<Vec<u8>> {
    let fleet = Fleet::build(shape, FIXED_END_MS);
    let series_per_request = mode.series_per_request();
    let start_ms = fleet.start_ms(FIXED_END_MS, count, series_per_request, DEFAULT_INTERVAL_MS);
    let mut requests = fleet.requests(series_per_request, start_ms, DEFAULT_INTERVAL_MS);
    (0..count)
        .map(|_| requests.next_request().expect("a request under 4 GiB").body)
        .collect()
}

// Bucket bounds as the exporters ship them.
const VLLM_TTFT: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const VLLM_ITL: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
const VLLM_E2E: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
const VLLM_TOKENS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0,
    50000.0, 100000.0,
];
const VLLM_ITER_TOKENS: &[f64] = &[
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];
const SGL_TTFT: &[f64] = &[
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
    400.0,
];
const SGL_ITL: &[f64] = &[
    0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2,
    0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0,
];
const SGL_E2E: &[f64] = &[
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
    400.0, 800.0,
];
const SGL_KV_MS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0,
];
const MOONCAKE_US: &[f64] = &[
    125.0, 150.0, 200.0, 250.0, 300.0, 400.0, 500.0, 750.0, 1000.0, 1500.0, 2000.0, 3000.0, 5000.0,
    7000.0, 15000.0, 20000.0, 50000.0, 100000.0, 200000.0, 500000.0, 1000000.0,
];

/// (model_name, short name for pods, tensor parallelism, engines per 8-GPU node)
const VLLM_MODELS: &[(&str, &str, usize, usize)] = &[
    (
        "meta-llama/Llama-3.1-70B-Instruct",
        "llama-3-1-70b-instruct",
        4,
        2,
    ),
    ("Qwen/Qwen3-32B", "qwen3-32b", 2, 4),
    (
        "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8",
        "qwen3-235b-a22b-fp8",
        8,
        1,
    ),
];
const SGLANG_MODELS: &[(&str, &str)] = &[
    ("deepseek-ai/DeepSeek-V3-0324", "deepseek-v3"),
    ("moonshotai/Kimi-K2-Instruct", "kimi-k2-instruct"),
];
/// (modelName as DCGM reports it, framebuffer MiB, short name for node names)
const GPU_MODELS: &[(&str, f64, &str)] = &[
    ("NVIDIA H100 80GB HBM3", 81559.0, "h100"),
    ("NVIDIA H200", 143771.0, "h200"),
];
const PCI_BUS_IDS: [&str; 8] = [
    "00000000:18:00.0",
    "00000000:2A:00.0",
    "00000000:3A:00.0",
    "00000000:5D:00.0",
    "00000000:9A:00.0",
    "00000000:AB:00.0",
    "00000000:BA:00.0",
    "00000000:DB:00.0",
];
/// The alphabet of Kubernetes' random name suffixes.
const POD_SUFFIX_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// SplitMix64: tiny and identical on every platform, which is all a fixture needs.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [lo, hi).
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        let unit = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        lo + (hi - lo) * unit
    }

    /// Uniform in [lo, hi], both ends included.
    fn int_between(&mut self, lo: u64, hi: u64) -> u64 {
        // Multiply-shift: the bias over a span this small is far below what a fixture notices.
        lo + ((u128::from(self.next_u64()) * u128::from(hi - lo + 1)) >> 64) as u64
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.int_between(0, items.len() as u64 - 1) as usize]
    }
}

/// How a series' value follows the clock (`t` in seconds).
#[derive(Clone, Copy, Debug)]
enum Value {
    Constant(f64),
    /// A sine between `mid - amp` and `mid + amp`; `whole` rounds it (counts, clocks).
    Wave {
        mid: f64,
        amp: f64,
        period_s: f64,
        phase: f64,
        whole: bool,
    },
    /// Whole events since the process started at `start_s`, `rate` per second.
    Counter {
        rate: f64,
        start_s: f64,
    },
    /// A histogram's `_sum`: its `_count` (events at `rate` per second) times `mean`.
    Sum {
        rate: f64,
        start_s: f64,
        mean: f64,
    },
}

impl Value {
    fn at(self, t: f64) -> f64 {
        match self {
            Value::Constant(v) => v,
            Value::Wave {
                mid,
                amp,
                period_s,
                phase,
                whole,
            } => {
                let v = mid + amp * (2.0 * PI * t / period_s + phase).sin();
                if whole { v.round_ties_even() } else { v }
            }
            Value::Counter { rate, start_s } => (rate * (t - start_s)).trunc(),
            Value::Sum {
                rate,
                start_s,
                mean,
            } => (rate * (t - start_s)).trunc() * mean,
        }
    }
}

struct Series {
    /// Sorted by name, `__name__` included, as Prometheus sends them.
    labels: Vec<pb::Label>,
    value: Value,
}

/// The `le` label of client_python (`floatToGoString`): 1 → `1.0`, ∞ → `+Inf`.
fn le_label(bound: f64) -> String {
    if bound == f64::INFINITY {
        "+Inf".into()
    } else if bound.fract() == 0.0 {
        format!("{bound:.1}")
    } else {
        format!("{bound}")
    }
}

/// Abramowitz–Stegun 7.1.26 (error under 1.5e-7): std has no `erf` yet, and bucket shares
/// need no more precision than that.
fn erf(x: f64) -> f64 {
    let sign = if x < 0.0 { -1.0 } else { 1.0 };
    let x = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * x);
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    sign * (1.0 - poly * (-x * x).exp())
}

/// The labels of one scrape target that every series of it carries.
type BaseLabels = Vec<(&'static str, String)>;

/// Builds the series of one target after another.
struct FleetBuilder {
    rng: Rng,
    /// Seconds; every process started between 2 and 72 hours before this.
    t_ref_s: f64,
    targets: Vec<Vec<Series>>,
    families: BTreeSet<String>,
}

impl FleetBuilder {
    fn process_start(&mut self) -> f64 {
        self.t_ref_s - self.rng.uniform(2.0 * 3600.0, 72.0 * 3600.0)
    }

    fn wave(&mut self, lo: f64, hi: f64) -> Value {
        self.wave_shaped(lo, hi, false)
    }

    fn whole_wave(&mut self, lo: f64, hi: f64) -> Value {
        self.wave_shaped(lo, hi, true)
    }

    fn wave_shaped(&mut self, lo: f64, hi: f64, whole: bool) -> Value {
        Value::Wave {
            mid: (lo + hi) / 2.0,
            amp: (hi - lo) / 2.0,
            period_s: self.rng.uniform(300.0, 3600.0),
            phase: self.rng.uniform(0.0, 2.0 * PI),
            whole,
        }
    }

    fn add(
        &mut self,
        series: &mut Vec<Series>,
        base: &BaseLabels,
        name: &str,
        value: Value,
        extra: &[(&str, &str)],
    ) {
        self.families.insert(name.to_string());
        let mut labels: Vec<pb::Label> = base
            .iter()
            .map(|(n, v)| (*n, v.as_str()))
            .chain(std::iter::once(("__name__", name)))
            .chain(extra.iter().copied())
            .map(|(n, v)| pb::Label {
                name: n.into(),
                value: v.into(),
            })
            .collect();
        labels.sort_by(|a, b| a.name.cmp(&b.name));
        series.push(Series { labels, value });
    }

    fn counter(
        &mut self,
        series: &mut Vec<Series>,
        base: &BaseLabels,
        name: &str,
        rate: f64,
        start_s: f64,
    ) {
        self.add(series, base, name, Value::Counter { rate, start_s }, &[]);
    }

    /// `_bucket`, `_sum` and `_count` of a log-normal latency (or size) distribution.
    #[allow(clippy::too_many_arguments)]
    fn histogram(
        &mut self,
        series: &mut Vec<Series>,
        base: &BaseLabels,
        family: &str,
        bounds: &[f64],
        rate: f64,
        start_s: f64,
        median: f64,
        sigma: f64,
    ) {
        let bucket = format!("{family}_bucket");
        // Cumulative shares never decrease, whatever the erf approximation does in its tail.
        let mut share: f64 = 0.0;
        for &bound in bounds.iter().chain(std::iter::once(&f64::INFINITY)) {
            let cdf = if bound == f64::INFINITY {
                1.0
            } else {
                0.5 * (1.0 + erf((bound.ln() - median.ln()) / (sigma * 2f64.sqrt())))
            };
            share = share.max(cdf);
            // rate·share, so that the +Inf bucket (share 1) equals `_count` exactly.
            let value = Value::Counter {
                rate: rate * share,
                start_s,
            };
            self.add(series, base, &bucket, value, &[("le", &le_label(bound))]);
        }
        let mean = median * (sigma * sigma / 2.0).exp();
        let sum = Value::Sum {
            rate,
            start_s,
            mean,
        };
        self.add(series, base, &format!("{family}_sum"), sum, &[]);
        self.counter(series, base, &format!("{family}_count"), rate, start_s);
    }

    fn vllm_engine(&mut self, series: &mut Vec<Series>, base: &BaseLabels, tp: usize) {
        let start = self.process_start();
        let rps = self.rng.uniform(0.5, 6.0);
        let prompt_tps = rps * self.rng.uniform(800.0, 3000.0);
        let gen_tps = rps * self.rng.uniform(150.0, 600.0);
        let hit_share = self.rng.uniform(0.2, 0.7);
        let v = self.whole_wave(0.0, 64.0 * tp as f64 / 4.0);
        self.add(series, base, "vllm:num_requests_running", v, &[]);
        let v = self.whole_wave(0.0, 12.0);
        self.add(series, base, "vllm:num_requests_waiting", v, &[]);
        let v = self.wave(0.05, 0.95);
        self.add(series, base, "vllm:kv_cache_usage_perc", v, &[]);
        let gpu_blocks = self.rng.int_between(20_000, 90_000).to_string();
        self.add(
            series,
            base,
            "vllm:cache_config_info",
            Value::Constant(1.0),
            &[
                ("block_size", "16"),
                ("cache_dtype", "auto"),
                ("calculate_kv_scales", "False"),
                ("cpu_offload_gb", "0"),
                ("enable_prefix_caching", "True"),
                ("gpu_memory_utilization", "0.9"),
                ("is_attention_free", "False"),
                ("num_cpu_blocks", "None"),
                ("num_gpu_blocks", &gpu_blocks),
                ("prefix_caching_hash_algo", "builtin"),
                ("sliding_window", "None"),
                ("swap_space", "4"),
                ("swap_space_bytes", "4294967296"),
            ],
        );
        self.counter(series, base, "vllm:prompt_tokens_total", prompt_tps, start);
        self.counter(series, base, "vllm:generation_tokens_total", gen_tps, start);
        self.counter(
            series,
            base,
            "vllm:prefix_cache_queries_total",
            prompt_tps,
            start,
        );
        let hits = prompt_tps * hit_share;
        self.counter(series, base, "vllm:prefix_cache_hits_total", hits, start);
        self.counter(
            series,
            base,
            "vllm:num_preemptions_total",
            rps * 0.002,
            start,
        );
        for (reason, share) in [("stop", 0.86), ("length", 0.12), ("abort", 0.02)] {
            let v = Value::Counter {
                rate: rps * share,
                start_s: start,
            };
            let extra = [("finished_reason", reason)];
            self.add(series, base, "vllm:request_success_total", v, &extra);
        }
        let flops = self.rng.uniform(2e14, 6e14);
        self.counter(
            series,
            base,
            "vllm:estimated_flops_per_gpu_total",
            flops,
            start,
        );
        let (read, write) = (flops / 80.0, flops / 900.0);
        self.counter(
            series,
            base,
            "vllm:estimated_read_bytes_per_gpu_total",
            read,
            start,
        );
        self.counter(
            series,
            base,
            "vllm:estimated_write_bytes_per_gpu_total",
            write,
            start,
        );
        for (family, bounds, rate, median, sigma) in [
            (
                "vllm:time_to_first_token_seconds",
                VLLM_TTFT,
                rps,
                0.18,
                1.1,
            ),
            (
                "vllm:inter_token_latency_seconds",
                VLLM_ITL,
                gen_tps,
                0.035,
                0.5,
            ),
            ("vllm:e2e_request_latency_seconds", VLLM_E2E, rps, 6.0, 0.9),
            ("vllm:request_queue_time_seconds", VLLM_E2E, rps, 0.05, 1.5),
            (
                "vllm:request_prefill_time_seconds",
                VLLM_E2E,
                rps,
                0.15,
                1.0,
            ),
            ("vllm:request_decode_time_seconds", VLLM_E2E, rps, 5.5, 0.9),
            ("vllm:request_prompt_tokens", VLLM_TOKENS, rps, 1500.0, 1.0),
            (
                "vllm:request_generation_tokens",
                VLLM_TOKENS,
                rps,
                300.0,
                0.9,
            ),
            (
                "vllm:iteration_tokens_total",
                VLLM_ITER_TOKENS,
                rps * 40.0,
                96.0,
                1.3,
            ),
        ] {
            self.histogram(series, base, family, bounds, rate, start, median, sigma);
        }
    }

    /// One tensor-parallel rank of an SGLang server; `load` is shared by all ranks.
    fn sglang_rank(
        &mut self,
        series: &mut Vec<Series>,
        base: &BaseLabels,
        load: &SglangLoad,
        start: f64,
    ) {
        let SglangLoad {
            rps,
            prompt_tps,
            gen_tps,
            hit_share,
        } = *load;
        for (name, lo, hi, whole) in [
            ("sglang:num_running_reqs", 0.0, 128.0, true),
            ("sglang:num_queue_reqs", 0.0, 20.0, true),
            ("sglang:num_used_tokens", 2000.0, 300000.0, true),
            ("sglang:token_usage", 0.02, 0.9, false),
            ("sglang:gen_throughput", 200.0, 4000.0, false),
            ("sglang:cache_hit_rate", 0.1, 0.8, false),
            ("sglang:utilization", 0.2, 1.0, false),
            ("sglang:num_decode_transfer_queue_reqs", 0.0, 8.0, true),
            ("sglang:num_prefill_inflight_queue_reqs", 0.0, 8.0, true),
        ] {
            let v = self.wave_shaped(lo, hi, whole);
            self.add(series, base, name, v, &[]);
        }
        // Logical counters: the same on every tp_rank (what rank dedup drops).
        for (name, rate) in [
            ("sglang:prompt_tokens_total", prompt_tps),
            ("sglang:generation_tokens_total", gen_tps),
            ("sglang:cached_tokens_total", prompt_tps * hit_share),
            ("sglang:num_requests_total", rps),
            ("sglang:num_aborted_requests_total", rps * 0.01),
            (
                "sglang:load_back_tokens_total",
                prompt_tps * hit_share * 0.3,
            ),
        ] {
            self.counter(series, base, name, rate, start);
        }
        // Physical counters: each rank moves its own share of the KV cache.
        let bytes_per_s =
            prompt_tps * hit_share * 0.3 * 70272.0 / 8.0 * self.rng.uniform(0.95, 1.05);
        self.counter(
            series,
            base,
            "sglang:load_back_bytes_total",
            bytes_per_s,
            start,
        );
        let failed = rps * 1e-4;
        self.counter(
            series,
            base,
            "sglang:num_transfer_failed_reqs_total",
            failed,
            start,
        );
        for (family, bounds, rate, median, sigma) in [
            (
                "sglang:time_to_first_token_seconds",
                SGL_TTFT,
                rps,
                0.6,
                0.9,
            ),
            (
                "sglang:inter_token_latency_seconds",
                SGL_ITL,
                gen_tps,
                0.03,
                0.5,
            ),
            ("sglang:e2e_request_latency_seconds", SGL_E2E, rps, 9.0, 0.8),
            ("sglang:queue_time_seconds", SGL_E2E, rps, 0.2, 1.4),
            ("sglang:kv_transfer_latency_ms", SGL_KV_MS, rps, 40.0, 0.9),
        ] {
            self.histogram(series, base, family, bounds, rate, start, median, sigma);
        }
    }

    fn dcgm_gpu(
        &mut self,
        series: &mut Vec<Series>,
        base: &BaseLabels,
        framebuffer_mib: f64,
        start: f64,
    ) {
        let watts = self.rng.uniform(350.0, 650.0);
        let v = self.whole_wave(1410.0, 1980.0);
        self.add(series, base, "DCGM_FI_DEV_SM_CLOCK", v, &[]);
        let v = Value::Constant(2619.0);
        self.add(series, base, "DCGM_FI_DEV_MEM_CLOCK", v, &[]);
        let v = self.whole_wave(38.0, 74.0);
        self.add(series, base, "DCGM_FI_DEV_GPU_TEMP", v, &[]);
        let v = self.whole_wave(40.0, 80.0);
        self.add(series, base, "DCGM_FI_DEV_MEMORY_TEMP", v, &[]);
        let v = self.wave(watts * 0.4, watts);
        self.add(series, base, "DCGM_FI_DEV_POWER_USAGE", v, &[]);
        // Millijoules since the driver loaded, a month before the workload.
        let energy = Value::Counter {
            rate: watts * 0.75 * 1000.0,
            start_s: start - 86400.0 * 30.0,
        };
        self.add(
            series,
            base,
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            energy,
            &[],
        );
        let v = Value::Constant(0.0);
        self.add(series, base, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", v, &[]);
        let v = self.whole_wave(0.0, 100.0);
        self.add(series, base, "DCGM_FI_DEV_GPU_UTIL", v, &[]);
        let v = self.whole_wave(0.0, 60.0);
        self.add(series, base, "DCGM_FI_DEV_MEM_COPY_UTIL", v, &[]);
        let v = Value::Constant(0.0);
        self.add(series, base, "DCGM_FI_DEV_XID_ERRORS", v, &[]);
        let used = self.rng.uniform(0.85, 0.93) * framebuffer_mib;
        let v = self.whole_wave(used - 300.0, used + 300.0);
        self.add(series, base, "DCGM_FI_DEV_FB_USED", v, &[]);
        let free = framebuffer_mib - used;
        let v = self.whole_wave(free - 300.0, free + 300.0);
        self.add(series, base, "DCGM_FI_DEV_FB_FREE", v, &[]);
        self.counter(
            series,
            base,
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
            3.2e7,
            start,
        );
        let v = self.wave(0.0, 0.99);
        self.add(series, base, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", v, &[]);
        let v = self.wave(0.0, 0.6);
        self.add(series, base, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", v, &[]);
        let v = self.wave(0.05, 0.9);
        self.add(series, base, "DCGM_FI_PROF_DRAM_ACTIVE", v, &[]);
        let v = self.whole_wave(1e7, 4e9);
        self.add(series, base, "DCGM_FI_PROF_PCIE_TX_BYTES", v, &[]);
        let v = self.whole_wave(1e7, 4e9);
        self.add(series, base, "DCGM_FI_PROF_PCIE_RX_BYTES", v, &[]);
    }

    fn mooncake(&mut self, series: &mut Vec<Series>, base: &BaseLabels, start: f64) {
        let bytes_per_s = self.rng.uniform(2e9, 2e10);
        self.counter(
            series,
            base,
            "mooncake_transfer_read_bytes",
            bytes_per_s,
            start,
        );
        let written = bytes_per_s * 0.7;
        self.counter(
            series,
            base,
            "mooncake_transfer_write_bytes",
            written,
            start,
        );
        let ops = self.rng.uniform(50.0, 400.0);
        for (family, rate, median, sigma) in [
            ("mooncake_transfer_get_latency", ops, 900.0, 1.0),
            ("mooncake_transfer_put_latency", ops * 0.7, 1200.0, 1.0),
            (
                "mooncake_transfer_batch_get_latency",
                ops / 8.0,
                2500.0,
                1.1,
            ),
            (
                "mooncake_transfer_batch_put_latency",
                ops / 10.0,
                3000.0,
                1.1,
            ),
        ] {
            self.histogram(
                series,
                base,
                family,
                MOONCAKE_US,
                rate,
                start,
                median,
                sigma,
            );
        }
    }

    /// `len` characters of a Kubernetes-style random suffix.
    fn pod_suffix(&mut self, len: usize) -> String {
        (0..len)
            .map(|_| char::from(*self.rng.pick(POD_SUFFIX_ALPHABET)))
            .collect()
    }

    fn gpu_uuid(&mut self) -> String {
        let hex = format!("{:016x}{:016x}", self.rng.next_u64(), self.rng.next_u64());
        format!(
            "GPU-{}-{}-{}-{}-{}",
            &hex[..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..]
        )
    }
}

/// Request rate and token rates of one SGLang server, shared by its ranks.
#[derive(Clone, Copy)]
struct SglangLoad {
    rps: f64,
    prompt_tps: f64,
    gen_tps: f64,
    hit_share: f64,
}

/// The fixed universe of series, grouped by scrape target in scrape order.
pub struct Fleet {
    targets: Vec<Vec<Series>>,
    families: BTreeSet<String>,
}

impl Fleet {
    /// Every process of the fleet started some hours before `t_ref_ms`.
    pub fn build(shape: &FleetShape, t_ref_ms: i64) -> Fleet {
        let mut b = FleetBuilder {
            rng: Rng(shape.seed),
            t_ref_s: t_ref_ms as f64 / 1000.0,
            targets: Vec::new(),
            families: BTreeSet::new(),
        };
        let ns = shape.namespace.clone();
        for i in 0..shape.vllm_nodes + shape.sglang_nodes {
            // Alternate engines so every request mixes exporters, as a real queue does.
            let is_vllm = (i % 2 == 0 && i / 2 < shape.vllm_nodes) || i / 2 >= shape.sglang_nodes;
            let (gpu_model, framebuffer_mib, gpu_short) = GPU_MODELS[i % GPU_MODELS.len()];
            let node = format!("gpu-{gpu_short}-{}{i:03}", ["a", "b", "c", "d"][i % 4]);
            let pod_ip = format!("10.244.{}.{}", i / 200, 2 + i % 200);
            let (pod, container) = if is_vllm {
                let (model, short, tp, engines) = VLLM_MODELS[i % VLLM_MODELS.len()];
                let replica_set = b.rng.next_u64() >> 28; // 36 bits: 9 hex digits
                let pod = format!("vllm-{short}-{replica_set:09x}-{}", b.pod_suffix(5));
                let mut series = Vec::new();
                for engine in 0..engines {
                    let base: BaseLabels = vec![
                        ("job", "vllm".into()),
                        ("instance", format!("{pod_ip}:8000")),
                        ("namespace", ns.clone()),
                        ("pod", pod.clone()),
                        ("model_name", model.into()),
                        ("engine", engine.to_string()),
                    ];
                    b.vllm_engine(&mut series, &base, tp);
                }
                b.targets.push(series);
                (pod, "vllm")
            } else {
                let (model, short) = SGLANG_MODELS[i % SGLANG_MODELS.len()];
                let role = ["prefill", "decode"][(i / 2) % 2];
                let pod = format!("sglang-{short}-{role}-{i}");
                let start = b.process_start();
                let rps = b.rng.uniform(1.0, 8.0);
                let load = SglangLoad {
                    rps,
                    prompt_tps: rps * b.rng.uniform(2000.0, 6000.0),
                    gen_tps: rps * b.rng.uniform(200.0, 800.0),
                    hit_share: b.rng.uniform(0.3, 0.8),
                };
                let mut series = Vec::new();
                for rank in 0..shape.tensor_parallel {
                    let base: BaseLabels = vec![
                        ("job", "sglang".into()),
                        ("instance", format!("{pod_ip}:30000")),
                        ("namespace", ns.clone()),
                        ("pod", pod.clone()),
                        ("model_name", model.into()),
                        ("engine_type", role.into()),
                        ("tp_rank", rank.to_string()),
                        ("pp_rank", "0".into()),
                    ];
                    b.sglang_rank(&mut series, &base, &load, start);
                }
                b.targets.push(series);
                let base: BaseLabels = vec![
                    ("job", "mooncake".into()),
                    ("instance", format!("{pod_ip}:9003")),
                    ("namespace", ns.clone()),
                    ("pod", pod.clone()),
                    ("cluster_id", format!("mooncake-{short}")),
                    ("model_name", model.into()),
                ];
                let mut series = Vec::new();
                b.mooncake(&mut series, &base, start);
                b.targets.push(series);
                (pod, "sglang")
            };
            // dcgm-exporter on the node, its GPUs mapped to the workload's pod.
            let start = b.process_start();
            let mut series = Vec::new();
            for (gpu, pci_bus_id) in PCI_BUS_IDS.iter().enumerate() {
                let base: BaseLabels = vec![
                    ("job", "dcgm-exporter".into()),
                    (
                        "instance",
                        format!("10.244.{}.{}:9400", 100 + i / 200, 2 + i % 200),
                    ),
                    ("namespace", ns.clone()),
                    ("pod", pod.clone()),
                    ("container", container.into()),
                    ("gpu", gpu.to_string()),
                    ("UUID", b.gpu_uuid()),
                    ("device", format!("nvidia{gpu}")),
                    ("modelName", gpu_model.into()),
                    ("Hostname", node.clone()),
                    ("pci_bus_id", (*pci_bus_id).into()),
                    ("DCGM_FI_DRIVER_VERSION", "550.90.07".into()),
                ];
                b.dcgm_gpu(&mut series, &base, framebuffer_mib, start);
            }
            b.targets.push(series);
        }
        Fleet {
            targets: b.targets,
            families: b.families,
        }
    }

    pub fn series_count(&self) -> usize {
        self.targets.iter().map(Vec::len).sum()
    }

    pub fn target_count(&self) -> usize {
        self.targets.len()
    }

    /// Distinct metric names (`_bucket`, `_sum` and `_count` each count).
    pub fn family_count(&self) -> usize {
        self.families.len()
    }

    /// What one engine pod's `/metrics` would answer at `t_ms`: the first `series` series
    /// of the fleet (all of them, round after round with a `replica` label, when it has
    /// fewer) in text format 0.0.4, grouped by metric name, without the `job` and
    /// `instance` labels a scraper adds. The body of the scrape benchmarks' targets.
    pub fn exposition(&self, series: usize, t_ms: i64) -> String {
        let all: Vec<&Series> = self.targets.iter().flatten().collect();
        if all.is_empty() {
            return String::new();
        }
        let mut picked: Vec<(usize, &Series)> = (0..series)
            .map(|i| (i / all.len(), all[i % all.len()]))
            .collect();
        let name = |s: &Series| {
            s.labels
                .iter()
                .find(|l| l.name == "__name__")
                .map_or(String::new(), |l| l.value.clone())
        };
        picked.sort_by_cached_key(|(_, s)| name(s));
        let t_s = t_ms as f64 / 1000.0;
        let mut out = String::with_capacity(series * 160);
        for (replica, s) in picked {
            out.push_str(&name(s));
            let mut sep = '{';
            let labels = s
                .labels
                .iter()
                .filter(|l| !matches!(l.name.as_str(), "__name__" | "job" | "instance"));
            for l in labels {
                out.push(sep);
                sep = ',';
                out.push_str(&l.name);
                out.push_str("=\"");
                for c in l.value.chars() {
                    match c {
                        '\\' => out.push_str("\\\\"),
                        '"' => out.push_str("\\\""),
                        '\n' => out.push_str("\\n"),
                        c => out.push(c),
                    }
                }
                out.push('"');
            }
            if replica > 0 {
                out.push(sep);
                sep = ',';
                out.push_str(&format!("replica=\"{replica}\""));
            }
            if sep == ',' {
                out.push('}');
            }
            let v = s.value.at(t_s);
            out.push(' ');
            match v {
                v if v.is_nan() => out.push_str("NaN"),
                f64::INFINITY => out.push_str("+Inf"),
                f64::NEG_INFINITY => out.push_str("-Inf"),
                v => out.push_str(&v.to_string()),
            }
            out.push('\n');
        }
        out
    }

    /// Rounds of the fleet that `count` requests of `series_per_request` cover.
    pub fn rounds(&self, count: usize, series_per_request: usize) -> usize {
        (count * series_per_request).div_ceil(self.series_count().max(1))
    }

    /// The first round's timestamp for requests whose last round falls on `end_ms`
    /// (rounded down to the interval), as the benchmark payloads are stamped.
    pub fn start_ms(
        &self,
        end_ms: i64,
        count: usize,
        series_per_request: usize,
        interval_ms: i64,
    ) -> i64 {
        let rounds = self.rounds(count, series_per_request) as i64;
        end_ms.div_euclid(interval_ms) * interval_ms - rounds * interval_ms
    }

    /// The endless request stream, from the first series of round 0 at `start_ms`.
    pub fn requests(
        &self,
        series_per_request: usize,
        start_ms: i64,
        interval_ms: i64,
    ) -> Requests<'_> {
        Requests {
            fleet: self,
            series_per_request,
            start_ms,
            interval_ms,
            round: 0,
            target: 0,
            series: 0,
            encoder: snap::raw::Encoder::new(),
        }
    }
}

/// One request body and what `meta.json` reports about it.
pub struct Request {
    /// Snappy block format of a `prometheus.WriteRequest`: a remote-write POST body.
    pub body: Vec<u8>,
    /// Length of the protobuf before compression.
    pub raw_len: usize,
    pub first_ts_ms: i64,
    pub last_ts_ms: i64,
}

/// Walks the fleet like a remote-write queue: target by target, round after round.
pub struct Requests<'a> {
    fleet: &'a Fleet,
    series_per_request: usize,
    start_ms: i64,
    interval_ms: i64,
    round: i64,
    target: usize,
    series: usize,
    encoder: snap::raw::Encoder,
}

impl Requests<'_> {
    /// The next series and its timestamp; the fleet is endless, round after round.
    fn next_series(&mut self) -> (&Series, i64) {
        let targets = &self.fleet.targets;
        while self.series >= targets[self.target].len() {
            self.series = 0;
            self.target += 1;
            if self.target == targets.len() {
                self.target = 0;
                self.round += 1;
            }
        }
        let n = targets.len() as i64;
        let ts = self.start_ms
            + self.round * self.interval_ms
            + (self.target as i64 * self.interval_ms) / n;
        let series = &targets[self.target][self.series];
        self.series += 1;
        (series, ts)
    }

    /// Fails only for a request over snappy's 4 GiB input limit.
    pub fn next_request(&mut self) -> Result<Request, snap::Error> {
        let mut request = pb::WriteRequest {
            timeseries: Vec::with_capacity(self.series_per_request),
            ..Default::default()
        };
        let (mut first_ts_ms, mut last_ts_ms) = (i64::MAX, i64::MIN);
        for _ in 0..self.series_per_request {
            let (series, ts) = self.next_series();
            first_ts_ms = first_ts_ms.min(ts);
            last_ts_ms = last_ts_ms.max(ts);
            request.timeseries.push(pb::TimeSeries {
                labels: series.labels.clone(),
                samples: vec![pb::Sample {
                    value: series.value.at(ts as f64 / 1000.0),
                    timestamp: ts,
                }],
                ..Default::default()
            });
        }
        let raw = request.encode_to_vec();
        let body = self.encoder.compress_vec(&raw)?;
        Ok(Request {
            body,
            raw_len: raw.len(),
            first_ts_ms,
            last_ts_ms,
        })
    }
}
