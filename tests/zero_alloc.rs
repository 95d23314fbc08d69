//! Allocation accounting with a counting global allocator (counts per thread, so tests
//! running in parallel do not disturb each other).
//!
//! - `zero_alloc_pipeline`: the full pipeline (snappy decode → protobuf → all built-in
//!   packs → derived series → encode → snappy encode) on 2,000-series requests of the
//!   synthetic fleet of `promnorm::testkit::fleet` allocates nothing once warm. Run:
//!   `cargo test --release --test zero_alloc -- --nocapture`.
//! - `zero_alloc_pipeline_remote_write_2_0`: the same for 2.0 requests (the fleet's
//!   requests as a 2.0 sender sends them), to a 1.0 and to a 2.0 backend (decode, map,
//!   derive, the 1.0 body and the 2.0 body with its symbols table), and for 1.0 requests
//!   to a 2.0 backend.
//! - `zero_alloc_native_histograms_under_rescale`: the fleet's requests with a quarter
//!   more series as native histograms under rescale rules (NHCB ÷1000, exponential
//!   ÷1000 re-bucketed, exponential ×2^20 shifted; 20 % of the series), 1.0 and 2.0.
//! - `derived_state_bytes_per_series`: heap held by the derived-series state per series.
//! - `zero_alloc_tenant_split`: tenant routing's split and per-tenant bodies (1.0 and 2.0),
//!   and a request all of one tenant, read off the input.
//! - `queues_allocate_per_request_not_per_sample`: storing a request in a memory or disk
//!   queue costs the same few allocations for 2,000- and 10,000-sample requests.
//! - `a_memory_queue_holds_no_more_heap_than_it_counts`: a memory queue's heap is what its
//!   budget counts, split into shards or not.

use promnorm::app::Assemble;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

use promnorm::config::Config;
use promnorm::derive::{DeriveSettings, Deriver, Emitted};
use promnorm::mapping::Rules;
use promnorm::pipeline::{InputProtocol, Pipeline, PipelineLimits};
use promnorm::wire::encode_v2::V2Encoder;
use promnorm::wire::proto::prometheus as pb;
use prost::Message;

use promnorm::testkit::fleet;
#[path = "common/native.rs"]
mod native;

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    static LIVE_BYTES: Cell<i64> = const { Cell::new(0) };
}

fn note(allocs: u64, bytes: i64) {
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + allocs));
    let _ = LIVE_BYTES.try_with(|c| c.set(c.get() + bytes));
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(1, layout.size() as i64);
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(1, layout.size() as i64);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(1, new_size as i64 - layout.size() as i64);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(0, -(layout.size() as i64));
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

fn live_bytes() -> i64 {
    LIVE_BYTES.with(Cell::get)
}

#[test]
fn zero_alloc_pipeline() {
    // Built before any counting starts: 100 requests, about 6.7 rounds of the fleet.
    let bodies = fleet::request_bodies(fleet::Mode::Default, 100);
    assert!(
        bodies.len() >= 60,
        "need at least 60 requests (4 rounds of the fleet)"
    );
    let v1_only = Flow {
        input: InputProtocol::V1,
        output_v2: false,
    };
    let default_bytes = check_zero_alloc(&bodies, Config::embedded_default(), "default", v1_only);
    // With the genai pack on, every engine latency histogram and token counter of the
    // fleet is also copied: the copies reuse the same buffers.
    let genai = Config::parse("packs:\n  builtin: {genai: true}\n", "genai.yaml").unwrap();
    let genai_bytes = check_zero_alloc(&bodies, genai, "genai", v1_only);
    assert!(genai_bytes > default_bytes, "genai added no series");
}

/// The golden scrapes of the engines of issue 22 (TGI, Triton with the TensorRT-LLM
/// backend, native TensorRT-LLM, llama.cpp with speculative decoding, the llm-d EPP,
/// LMDeploy, SGLang's occupancy and priority breakdown), which the synthetic fleet does
/// not send: 8 rounds of every case, one request per scrape, timestamps increasing.
fn new_engine_bodies() -> Vec<Vec<u8>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut scrapes = Vec::new();
    for case in [
        "tgi",
        "triton",
        "trtllm",
        "llamacpp",
        "llamacpp_spec",
        "llmd",
        "lmdeploy",
        "sglang_scheduler",
    ] {
        for i in 1..=4 {
            let path = dir.join(case).join(format!("{i}.prom"));
            if let Ok(text) = std::fs::read_to_string(&path) {
                scrapes.push(promnorm::exposition::parse(&text).unwrap_or_else(|e| panic!("{e}")));
            }
        }
    }
    let mut bodies = Vec::new();
    for round in 0..8i64 {
        for (i, scrape) in scrapes.iter().enumerate() {
            let ts = 1_700_000_000_000 + (round * scrapes.len() as i64 + i as i64) * 15_000;
            let req = promnorm::normalize::scrape_to_request(scrape, ts);
            bodies.push(
                snap::raw::Encoder::new()
                    .compress_vec(&req.encode_to_vec())
                    .unwrap(),
            );
        }
    }
    bodies
}

/// Every default pack on, over the new engines' series: nothing allocated once warm.
#[test]
fn zero_alloc_pipeline_new_engines() {
    let bodies = new_engine_bodies();
    assert!(bodies.len() >= 150, "{} requests", bodies.len());
    let v1_only = Flow {
        input: InputProtocol::V1,
        output_v2: false,
    };
    check_zero_alloc(&bodies, Config::embedded_default(), "new engines", v1_only);
    let genai = Config::parse("packs:\n  builtin: {genai: true}\n", "genai.yaml").unwrap();
    check_zero_alloc(&bodies, genai, "new engines, genai", v1_only);
}

/// The fleet's requests as a 2.0 sender would send them (converted before counting).
fn as_v2(bodies: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut enc = V2Encoder::new();
    let mut out = Vec::new();
    bodies
        .iter()
        .map(|b| {
            let raw = snap::raw::Decoder::new().decompress_vec(b).unwrap();
            enc.encode(&raw, None, &mut out).expect("valid 1.0 request");
            snap::raw::Encoder::new().compress_vec(&out).unwrap()
        })
        .collect()
}

#[test]
fn zero_alloc_pipeline_remote_write_2_0() {
    let bodies = fleet::request_bodies(fleet::Mode::Default, 100);
    let v2_bodies = as_v2(&bodies);
    // 2.0 in: the 1.0 body is always made; with a 2.0 backend, the 2.0 body too.
    for (output_v2, what) in [(false, "2.0 in, 1.0 out"), (true, "2.0 in, 2.0 out")] {
        let flow = Flow {
            input: InputProtocol::V2,
            output_v2,
        };
        check_zero_alloc(&v2_bodies, Config::embedded_default(), what, flow);
    }
    let flow = Flow {
        input: InputProtocol::V1,
        output_v2: true,
    };
    check_zero_alloc(&bodies, Config::embedded_default(), "1.0 in, 2.0 out", flow);
}

#[test]
fn zero_alloc_native_histograms_under_rescale() {
    let bodies = fleet::request_bodies(fleet::Mode::Default, 100);
    let (bodies, native) = native::with_native_histograms(&bodies);
    assert!(native > 1000);
    let v1 = Flow {
        input: InputProtocol::V1,
        output_v2: false,
    };
    check_zero_alloc(&bodies, Config::embedded_default(), "native, 1.0", v1);
    let v2_bodies = as_v2(&bodies);
    let v2 = Flow {
        input: InputProtocol::V2,
        output_v2: true,
    };
    check_zero_alloc(&v2_bodies, Config::embedded_default(), "native, 2.0", v2);
    // The histograms were rewritten, not forwarded as they came.
    let pipeline = Config::embedded_default().pipeline().unwrap();
    let mut ws = pipeline.take_workspace();
    pipeline.process(&mut ws, &bodies[0]).unwrap();
    let stats = pipeline.stats(&ws);
    assert!(stats.native_exact > 0 && stats.native_rebucketed.iter().sum::<u64>() > 0);
}

/// Which versions a run goes through.
#[derive(Clone, Copy)]
struct Flow {
    input: InputProtocol,
    output_v2: bool,
}

/// Asserts that the warm pipeline allocates nothing; returns the bytes it wrote.
fn check_zero_alloc(bodies: &[Vec<u8>], mut cfg: Config, what: &str, flow: Flow) -> usize {
    cfg.derived.peaks = vec![promnorm::config::PeakConfig {
        matchers: Default::default(),
        gpu: Some("H100-SXM".into()),
        flops: None,
        bandwidth: None,
    }];
    let pipeline = cfg.pipeline().expect("default configuration");
    let deriver = pipeline.deriver().expect("derived series on").clone();
    let mut ws = pipeline.take_workspace();
    let mut drained: Vec<Emitted> = Vec::new();
    let (mut encoded, mut scratch) = (Vec::new(), Vec::new());
    let mut out_bytes = 0;
    let mut tracked = 0usize;
    // Returns (samples, derived samples, allocations).
    let mut run = |bodies: &[Vec<u8>]| {
        let (mut samples, mut derived, mut count) = (0u64, 0usize, 0u64);
        for b in bodies {
            let before = allocations();
            let p = pipeline
                .process_as(&mut ws, b, flow.input)
                .expect("valid payload");
            if flow.output_v2 {
                let series = pipeline.encode_v2(&mut ws).expect("2.0 output");
                assert!(series > 0 && !ws.compressed_v2().is_empty());
            }
            drained.clear();
            deriver.drain(&mut drained);
            encoded.clear();
            deriver.encode(&mut drained, &mut encoded, &mut scratch);
            derived += drained.len();
            count += allocations() - before;
            // Cut-over tracking ran (old names such as DCGM_FI_DEV_FB_USED were renamed).
            tracked += pipeline.stats(&ws).renames.len();
            samples += (p.samples_in + p.histograms_in) as u64;
            out_bytes += ws.mapped().len();
        }
        (samples, derived, count)
    };
    // Warm: the first half covers the whole fleet at least twice (names, plans, state).
    let half = bodies.len() / 2;
    let (_, _, warm_allocs) = run(&bodies[..half]);
    let (samples, derived_measured, allocs) = run(&bodies[half..]);
    assert!(samples > 0);
    assert!(
        derived_measured > 0,
        "the measured requests produced derived samples"
    );
    let per_sample = allocs as f64 / samples as f64;
    println!("allocations per sample: {per_sample}");
    eprintln!(
        "zero_alloc_pipeline ({what}): {} warm requests ({warm_allocs} allocations), {} measured requests: {samples} samples, {derived_measured} derived samples, {allocs} allocations",
        half,
        bodies.len() - half
    );
    assert!(tracked > 0, "the old names were tracked ({what})");
    assert_eq!(allocs, 0, "the warm pipeline allocated ({what})");
    out_bytes
}

/// Heap held per derived series: 1,000,000 series (a vLLM engine each, with the labels
/// Prometheus adds) fed two scrapes of the prefix-cache counters.
#[test]
fn derived_state_bytes_per_series() {
    let series: usize = if cfg!(debug_assertions) {
        50_000
    } else {
        1_000_000
    };
    const PER_REQUEST: usize = 2_000;
    let settings = DeriveSettings {
        max_series: series,
        ..DeriveSettings::default()
    };
    let before = live_bytes();
    let deriver = Arc::new(Deriver::new(&settings));
    let pipeline = Pipeline::new(Arc::new(Rules::empty()), PipelineLimits::default())
        .with_deriver(deriver.clone());
    let mut ws = pipeline.take_workspace();
    let mut drained = Vec::new();
    let mut emitted = 0;
    for scrape in 0..2i64 {
        for chunk in 0..series.div_ceil(PER_REQUEST) {
            let mut req = pb::WriteRequest::default();
            for e in chunk * PER_REQUEST..((chunk + 1) * PER_REQUEST).min(series) {
                let node = format!("10.{}.{}.{}:8000", e >> 16, (e >> 8) & 255, e & 255);
                for (name, v) in [
                    ("vllm:prefix_cache_hits_total", 10 * scrape),
                    ("vllm:prefix_cache_queries_total", 40 * scrape),
                ] {
                    let mut labels = vec![
                        pb::Label {
                            name: "__name__".into(),
                            value: name.into(),
                        },
                        pb::Label {
                            name: "engine".into(),
                            value: "0".into(),
                        },
                        pb::Label {
                            name: "instance".into(),
                            value: node.clone(),
                        },
                        pb::Label {
                            name: "job".into(),
                            value: "vllm".into(),
                        },
                        pb::Label {
                            name: "model_name".into(),
                            value: "meta-llama/Llama-3.1-70B-Instruct".into(),
                        },
                    ];
                    labels.sort_by(|a, b| a.name.cmp(&b.name));
                    req.timeseries.push(pb::TimeSeries {
                        labels,
                        samples: vec![pb::Sample {
                            value: v as f64,
                            timestamp: 1_700_000_000_000 + scrape * 15_000,
                        }],
                        ..Default::default()
                    });
                }
            }
            pipeline
                .process_raw(&mut ws, &req.encode_to_vec())
                .expect("valid request");
            drained.clear();
            deriver.drain(&mut drained);
            emitted += drained.len();
        }
    }
    assert_eq!(deriver.series_count(), series);
    assert_eq!(
        emitted, series,
        "one derived sample per series at the second scrape"
    );
    pipeline.return_workspace(ws);
    drop(pipeline);
    drop(drained);
    let with_state = live_bytes();
    drop(deriver);
    let without = live_bytes();
    let per_series = (with_state - without) as f64 / series as f64;
    println!(
        "derived state: {series} series hold {} bytes: {per_series:.0} bytes per series (baseline {} bytes)",
        with_state - without,
        without - before
    );
    assert!(
        per_series < 512.0,
        "state per series over the documented bound of 512 bytes"
    );
}

/// Splitting the mapped requests by tenant (`wire::split`, one body per `instance`)
/// allocates nothing once warm, the memory of each name's tenants (for metadata sent
/// alone) included; nor does a request all of one tenant, which is not split.
#[test]
fn zero_alloc_tenant_split() {
    use promnorm::wire::bodies::{BodyEncoder, V2Output};
    use promnorm::wire::split::{FamilyTenants, Orphans, SplitOptions, TenantSplit};
    let bodies = fleet::request_bodies(fleet::Mode::Default, 60);
    let memory = std::sync::Mutex::new(FamilyTenants::new());
    let orphans = Orphans {
        memory: &memory,
        untenanted_ok: false,
    };
    let mut bodies_enc = BodyEncoder::default();
    let pipeline = Config::embedded_default().pipeline().unwrap();
    let mut ws = pipeline.take_workspace();
    let mut split = TenantSplit::new();
    let opts = SplitOptions {
        label: b"instance",
        default: Some(b"anonymous"),
        keep_label: false,
        max_tenants: 1000,
    };
    let mut run = |bodies: &[Vec<u8>]| {
        let (mut allocs, mut tenants, mut series) = (0u64, 0usize, 0usize);
        for b in bodies {
            pipeline.process(&mut ws, b).expect("valid payload");
            let before = allocations();
            let out = split
                .split_routed(ws.mapped(), &opts, &orphans)
                .expect("splits");
            // Each tenant's body compressed as 1.0 and encoded as 2.0 (what routing
            // does before it hands the bodies to the backends).
            for t in out {
                let b = bodies_enc
                    .encode(
                        t.bytes(ws.mapped()),
                        false,
                        None,
                        V2Output::Yes(None),
                        t.has_metadata,
                    )
                    .expect("encodes");
                assert!(!b.v1.is_empty() && b.v2.is_some_and(|(v2, n)| !v2.is_empty() && n > 0));
            }
            allocs += allocations() - before;
            tenants = tenants.max(out.len());
            series += out.iter().map(|t| t.series).sum::<usize>();
        }
        (allocs, tenants, series)
    };
    let half = bodies.len() / 2;
    run(&bodies[..half]);
    let (allocs, tenants, series) = run(&bodies[half..]);
    eprintln!(
        "zero_alloc_tenant_split: up to {tenants} tenants a request, {series} series, {allocs} allocations"
    );
    assert!(tenants >= 2 && series > 0);
    assert_eq!(
        allocs, 0,
        "the warm split and its per-tenant encoding allocated"
    );

    // A request whose series all name one tenant (`namespace`, as every fleet series
    // does), read off the decoded input and not split: that, the names remembered for
    // metadata sent alone and the body's compression.
    use promnorm::forward::InputLabels;
    let one_opts = SplitOptions {
        label: b"namespace",
        default: None,
        keep_label: true,
        max_tenants: 1000,
    };
    let mut run_one = |bodies: &[Vec<u8>]| {
        let mut allocs = 0u64;
        for b in bodies {
            pipeline.process(&mut ws, b).expect("valid payload");
            let stats = pipeline.stats(&ws);
            let samples = stats.samples_out + stats.histograms_out;
            assert_eq!(stats.metadata_out, 0);
            let input = ws.route_input();
            let before = allocations();
            let labels = InputLabels {
                decoded: input.decoded.0,
                buf: input.decoded.1,
                edited: pipeline.rules().edited_labels(),
            };
            let tenant = labels.one_tenant("namespace").expect("one tenant");
            let out = split
                .split_one_tenant(input.mapped, (tenant, samples), &one_opts, &orphans)
                .expect("splits")
                .expect("series in the mapper's shape");
            let b = bodies_enc
                .encode(out[0].bytes(input.mapped), false, None, V2Output::No, false)
                .expect("encodes");
            assert!(!b.v1.is_empty());
            allocs += allocations() - before;
        }
        allocs
    };
    run_one(&bodies[..half]);
    let allocs = run_one(&bodies[half..]);
    eprintln!("zero_alloc_one_tenant_split: {allocs} allocations");
    let remembered: Vec<Option<Vec<u8>>> = memory
        .lock()
        .unwrap()
        .recent(b"vllm:num_requests_running")
        .map(|t| t.map(<[u8]>::to_vec))
        .collect();
    assert!(
        remembered.contains(&Some(b"llm-serving".to_vec())),
        "names remembered for the tenant"
    );
    assert_eq!(allocs, 0, "the warm one-tenant routing allocated");
}

/// A backend whose answer never comes: the queue's senders hold their first record.
struct Never;

impl promnorm::forward::Transport for Never {
    fn name(&self) -> &str {
        "never"
    }
    fn send<'a>(
        &'a self,
        _: promnorm::forward::Payload,
        _: &'a http::HeaderMap,
    ) -> promnorm::forward::SendFuture<'a> {
        Box::pin(std::future::pending())
    }
}

/// Queues: storing a request costs the same few allocations whatever its size, so none
/// per sample. Memory and disk queues, 2,000- and 10,000-sample requests (the fleet's),
/// the allocations of `Queue::send` counted on this thread (a current-thread runtime:
/// the senders do not run while it stores).
#[test]
fn queues_allocate_per_request_not_per_sample() {
    use promnorm::forward::Payload;
    use promnorm::forward::queue::QueueKind;
    use std::time::Duration;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir =
        std::env::temp_dir().join(format!("promnorm-zero-alloc-queue-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    rt.block_on(async {
        let kinds = [
            ("memory", QueueKind::Memory),
            (
                "disk",
                QueueKind::Disk {
                    dir: dir.clone(),
                    fsync_interval: Duration::from_secs(1),
                },
            ),
        ];
        for (kind_name, kind) in kinds {
            let mut per_request = Vec::new();
            for (mode, samples) in [(fleet::Mode::Default, 2_000u64), (fleet::Mode::Large, 10_000)] {
                let bodies = fleet::request_bodies(mode, 40);
                let q = never_sending_queue(kind.clone(), 1);
                q.start().expect("queue opens");
                let headers = http::HeaderMap::new();
                let payloads: Vec<Payload> = bodies
                    .iter()
                    .map(|b| Payload::v1(bytes::Bytes::from(b.clone())).with_samples(samples))
                    .collect();
                let (warm, measured) = payloads.split_at(payloads.len() / 2);
                for p in warm {
                    assert!(matches!(q.send(p.clone(), &headers), promnorm::forward::Outcome::Queued));
                }
                let before = allocations();
                for p in measured {
                    assert!(matches!(q.send(p.clone(), &headers), promnorm::forward::Outcome::Queued));
                }
                let allocs = allocations() - before;
                let per = allocs as f64 / measured.len() as f64;
                eprintln!(
                    "queues_allocate_per_request_not_per_sample: {kind_name} queue, {samples}-sample requests: {per} allocations per request ({} per sample)",
                    per / samples as f64
                );
                per_request.push(per);
                q.stop(Duration::ZERO).await;
                let _ = std::fs::remove_dir_all(&dir);
            }
            // Five times the samples, not one allocation more per request.
            assert!(
                per_request[1] <= per_request[0] && per_request[0] <= 8.0,
                "{kind_name} queue: {per_request:?} allocations per request"
            );
        }
    });
}

#[test]
fn a_memory_queue_holds_no_more_heap_than_it_counts() {
    use promnorm::forward::Payload;
    use promnorm::forward::queue::QueueKind;
    use std::time::Duration;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let bodies = fleet::request_bodies(fleet::Mode::Default, 60);
    let payloads: Vec<Payload> = bodies
        .iter()
        .map(|b| Payload::v1(bytes::Bytes::from(b.clone())).with_samples(2_000))
        .collect();
    rt.block_on(async {
        for shards in [1usize, 2, 4] {
            let q = never_sending_queue(QueueKind::Memory, shards);
            q.start().expect("queue opens");
            let headers = http::HeaderMap::new();
            // Nothing is awaited in between: the queue's sender does not run, what is
            // measured is what the queue stores.
            let before = live_bytes();
            for p in &payloads {
                assert!(matches!(
                    q.send(p.clone(), &headers),
                    promnorm::forward::Outcome::Queued
                ));
            }
            let held = live_bytes() - before;
            let counted = q.state().expect("running").bytes as i64;
            eprintln!(
                "a_memory_queue_holds_no_more_heap_than_it_counts: shards {shards}: {counted} bytes counted, {held} bytes of heap held"
            );
            // The budget (`max_bytes`) bounds memory only if what it counts is what is
            // held: bodies at their length, plus the records' bookkeeping.
            assert!(
                held <= counted + counted / 4 + (64 << 10),
                "shards {shards}: {held} bytes held for {counted} counted"
            );
            q.stop(Duration::ZERO).await;
        }
    });
}

/// A queue in front of a backend that never answers (its sender holds the first request
/// for good), with room for everything the tests store.
fn never_sending_queue(
    kind: promnorm::forward::queue::QueueKind,
    shards: usize,
) -> promnorm::forward::queue::Queue {
    use promnorm::forward::queue::{Queue, QueueOptions, WhenFull};
    use std::time::Duration;
    Queue::new(
        Arc::new(Never),
        Vec::new(),
        None,
        Arc::new(promnorm::telemetry::BackendMetrics::new("never")),
        QueueOptions {
            kind,
            max_bytes: 1 << 30,
            max_age: None,
            shards,
            when_full: WhenFull::Reject,
            full_status: http::StatusCode::TOO_MANY_REQUESTS,
            first_backoff: Duration::from_secs(60),
            max_backoff: Duration::from_secs(60),
            max_samples_per_send: 10_000,
            disk_cache_bytes: 8 << 20,
        },
    )
}

/// The cardinality guard with its limits on: the fleet's series are tracked exactly,
/// and a warm pipeline still allocates nothing, those it leaves out (one metric over its
/// limit, counted and logged) included.
#[test]
fn zero_alloc_pipeline_with_series_limits() {
    let bodies = fleet::request_bodies(fleet::Mode::Default, 100);
    let v1_only = Flow {
        input: InputProtocol::V1,
        output_v2: false,
    };
    let limits = Config::parse(
        "limits:\n  max_series_per_tenant: 1000000\n  max_series_per_metric: 50\n  series_max_labels: 40\n",
        "limits.yaml",
    )
    .unwrap();
    let limited = check_zero_alloc(&bodies, limits, "series limits", v1_only);
    let unlimited = check_zero_alloc(&bodies, Config::embedded_default(), "default", v1_only);
    assert!(
        limited < unlimited,
        "a per-metric limit of 50 left series out ({limited} vs {unlimited} bytes)"
    );
}
