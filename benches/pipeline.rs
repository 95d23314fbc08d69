//! Criterion benches of every pipeline stage and of the whole pipeline, on requests of the
//! synthetic LLM-inference fleet of `promnorm::testkit::fleet` (built in process before
//! measuring): 2,000-series requests (the shape Prometheus sends with
//! max_samples_per_send: 2000) and 10,000-series requests (`Mode::Large`). Throughput is
//! in samples; BENCHMARKS.md converts to bytes/s.
//!
//! Stages: `snappy_decode`, `protobuf_decode`, `name_lookup_all_packs` (the exact-name
//! table lookup of every series' name, alone: the first part of rule application),
//! `map_encode_passthrough` (re-encoding with no rules: the encode cost),
//! `map_encode_all_packs` (lookup + rules + encode), `derive`, `snappy_compress` (the all
//! packs output), `snappy_compress_passthrough` (the pass-through output, all series),
//! `end_to_end/passthrough` (`bench/passthrough.yaml`: no packs, no derived series) and
//! `end_to_end` (all of them, all packs, derived series on) for
//! 1.0 in → 1.0 out (`all_packs_derived`), 2.0 in → 1.0 out (`rw2_in_rw1_out`) and 2.0
//! in → 2.0 out (`rw2_in_rw2_out`, the 2.0 body with its symbols table made instead of
//! the 1.0 body, as `serve` does for `protocol: v2` backends), the 2.0 requests being the
//! same requests as a 2.0 sender sends them; and 1.0 in → one 1.0 body per tenant
//! (`tenants_by_instance`: tenant routing by the `instance` label, the split and each
//! tenant's compression instead of one compression of the whole request);
//! `native_histograms_2000_series/end_to_end`: the 2,000-series requests plus 500 native
//! histogram series under the packs' rescale rules (20 % of the series: NHCB ÷1000,
//! exponential ÷1000 re-bucketed, exponential ×2^20), 1.0 in → 1.0 out, the NHCB
//! unrolled for 1.0 backends as `serve` does.

use promnorm::app::Assemble;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use promnorm::config::{Config, PeakConfig};
use promnorm::derive::{DeriveScratch, Emitted};
use promnorm::mapping::{MapContext, Mapper, Rules};
use promnorm::pipeline::InputProtocol;
use promnorm::wire::bodies::{BodyEncoder, V2Output};
use promnorm::wire::encode_v2::V2Encoder;
use promnorm::wire::split::{SplitOptions, TenantSplit};
use promnorm::wire::{DecodeLimits, DecodedRequest, snappy};

use promnorm::testkit::fleet;
#[path = "../tests/common/native.rs"]
mod native;

fn decompress(bodies: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut d = snap::raw::Decoder::new();
    bodies
        .iter()
        .map(|b| d.decompress_vec(b).expect("valid snappy"))
        .collect()
}

fn config() -> Config {
    let mut cfg = Config::embedded_default();
    cfg.derived.peaks = vec![PeakConfig {
        matchers: Default::default(),
        gpu: Some("H100-SXM".into()),
        flops: None,
        bandwidth: None,
    }];
    cfg
}

fn bench_size(c: &mut Criterion, label: &str, bodies: &[Vec<u8>]) {
    assert!(!bodies.is_empty(), "no {label} payloads to measure");
    let raws = decompress(bodies);
    let limits = DecodeLimits::default();
    let samples = {
        let mut d = DecodedRequest::default();
        d.decode(&raws[0], limits).expect("valid payload");
        d.sample_count() as u64
    };
    let all_packs = Arc::new(config().compile_rules().expect("built-in packs compile"));
    let empty = Arc::new(Rules::empty());
    let no_taps = MapContext::default();
    let mut g = c.benchmark_group(format!("stages_{label}"));
    g.throughput(Throughput::Elements(samples));

    let mut i = 0;
    let mut next = |n: usize| {
        i = (i + 1) % n;
        i
    };

    let mut decoder = snap::raw::Decoder::new();
    let mut buf = Vec::new();
    g.bench_function("snappy_decode", |b| {
        b.iter(|| {
            let k = next(bodies.len());
            snappy::decompress_into(&mut decoder, &bodies[k], 1 << 30, &mut buf).expect("valid")
        })
    });

    let mut decoded = DecodedRequest::default();
    g.bench_function("protobuf_decode", |b| {
        b.iter(|| {
            let k = next(raws.len());
            decoded.decode(&raws[k], limits).expect("valid");
        })
    });

    // Mapping needs the decoded view of the same buffer: decode all requests up front.
    let views: Vec<DecodedRequest> = raws
        .iter()
        .map(|r| {
            let mut d = DecodedRequest::default();
            d.decode(r, limits).expect("valid");
            d
        })
        .collect();
    // The exact-name lookup alone (names the table lacks then go through the mapper's
    // per-name pattern cache, measured inside map_encode_all_packs only).
    g.bench_function("name_lookup_all_packs", |b| {
        b.iter(|| {
            let k = next(raws.len());
            let mut found = 0usize;
            for s in &views[k].series {
                found += usize::from(all_packs.lookup(s.name.str(&raws[k])).is_some());
            }
            std::hint::black_box(found)
        })
    });
    let mut mapper = Mapper::new();
    let mut out = Vec::new();
    for (name, rules) in [
        ("map_encode_passthrough", &empty),
        ("map_encode_all_packs", &all_packs),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                let k = next(raws.len());
                out.clear();
                mapper.map_request(rules, &raws[k], &views[k], &mut out, &no_taps);
            })
        });
    }

    // Derive: the mapper's taps of each request, fed to a warm deriver.
    let pipeline = config().pipeline().expect("valid configuration");
    let deriver = pipeline.deriver().expect("derived on").clone();
    let mut scratch = DeriveScratch::default();
    let mut drained: Vec<Emitted> = Vec::new();
    let mut mappers: Vec<Mapper> = Vec::new();
    for (k, raw) in raws.iter().enumerate() {
        let mut m = Mapper::new();
        out.clear();
        m.map_request(
            &all_packs,
            raw,
            &views[k],
            &mut out,
            &MapContext {
                taps: Some(deriver.taps()),
                counters: None,
            },
        );
        mappers.push(m);
    }
    g.bench_function("derive", |b| {
        b.iter(|| {
            let k = next(raws.len());
            deriver.observe(&mappers[k], &raws[k], &mut scratch);
            drained.clear();
            deriver.drain(&mut drained);
        })
    });

    let encoded: Vec<Vec<u8>> = raws
        .iter()
        .enumerate()
        .map(|(k, raw)| {
            let mut o = Vec::new();
            mapper.map_request(&all_packs, raw, &views[k], &mut o, &no_taps);
            o
        })
        .collect();
    let mut encoder = snap::raw::Encoder::new();
    let mut compressed = Vec::new();
    g.bench_function("snappy_compress", |b| {
        b.iter(|| {
            let k = next(encoded.len());
            snappy::compress_into(&mut encoder, &encoded[k], &mut compressed)
        })
    });
    let encoded_passthrough: Vec<Vec<u8>> = raws
        .iter()
        .enumerate()
        .map(|(k, raw)| {
            let mut o = Vec::new();
            mapper.map_request(&empty, raw, &views[k], &mut o, &no_taps);
            o
        })
        .collect();
    g.bench_function("snappy_compress_passthrough", |b| {
        b.iter(|| {
            let k = next(encoded_passthrough.len());
            snappy::compress_into(&mut encoder, &encoded_passthrough[k], &mut compressed)
        })
    });

    let passthrough = Config::parse(
        include_str!("../bench/passthrough.yaml"),
        "passthrough.yaml",
    )
    .expect("bench/passthrough.yaml parses")
    .pipeline()
    .expect("valid configuration");
    let mut pws = passthrough.take_workspace();
    g.bench_with_input(
        BenchmarkId::new("end_to_end", "passthrough"),
        bodies,
        |b, bodies| {
            b.iter(|| {
                let k = next(bodies.len());
                passthrough.process(&mut pws, &bodies[k]).expect("valid")
            })
        },
    );

    let mut ws = pipeline.take_workspace();
    g.bench_with_input(
        BenchmarkId::new("end_to_end", "all_packs_derived"),
        bodies,
        |b, bodies| {
            b.iter(|| {
                let k = next(bodies.len());
                let p = pipeline.process(&mut ws, &bodies[k]).expect("valid");
                drained.clear();
                deriver.drain(&mut drained);
                p
            })
        },
    );
    // The same requests as 2.0 (converted before measuring).
    let mut v2 = V2Encoder::new();
    let mut v2_raw = Vec::new();
    let v2_bodies: Vec<Vec<u8>> = raws
        .iter()
        .map(|raw| {
            v2.encode(raw, None, &mut v2_raw).expect("valid request");
            snap::raw::Encoder::new()
                .compress_vec(&v2_raw)
                .expect("compressible")
        })
        .collect();
    for (name, output_v2) in [("rw2_in_rw1_out", false), ("rw2_in_rw2_out", true)] {
        // A 2.0-only deployment makes no 1.0 body.
        ws.skip_v1_body = output_v2;
        g.bench_with_input(
            BenchmarkId::new("end_to_end", name),
            &v2_bodies,
            |b, bodies| {
                b.iter(|| {
                    let k = next(bodies.len());
                    let p = pipeline
                        .process_as(&mut ws, &bodies[k], InputProtocol::V2)
                        .expect("valid");
                    if output_v2 {
                        pipeline.encode_v2(&mut ws).expect("2.0 output");
                    }
                    drained.clear();
                    deriver.drain(&mut drained);
                    p
                })
            },
        );
    }
    ws.skip_v1_body = true;
    let mut split = TenantSplit::new();
    let mut tenant_bodies = BodyEncoder::default();
    let by_instance = SplitOptions {
        label: b"instance",
        default: Some(b"anonymous"),
        keep_label: false,
        max_tenants: 1000,
    };
    g.bench_with_input(
        BenchmarkId::new("end_to_end", "tenants_by_instance"),
        bodies,
        |b, bodies| {
            b.iter(|| {
                let k = next(bodies.len());
                let p = pipeline.process(&mut ws, &bodies[k]).expect("valid");
                let mut bytes = 0;
                for t in split.split(ws.mapped(), &by_instance).expect("splits") {
                    let out = tenant_bodies
                        .encode(
                            t.bytes(ws.mapped()),
                            false,
                            None,
                            V2Output::No,
                            t.has_metadata,
                        )
                        .expect("encodes");
                    bytes += out.v1.len();
                }
                drained.clear();
                deriver.drain(&mut drained);
                (p, bytes)
            })
        },
    );
    ws.skip_v1_body = false;
    g.finish();
}

/// The fleet's requests with 20 % native histogram series under rescale rules.
fn bench_native(c: &mut Criterion, bodies: &[Vec<u8>]) {
    let (bodies, _) = native::with_native_histograms(bodies);
    let pipeline = config().pipeline().expect("valid configuration");
    let deriver = pipeline.deriver().expect("derived on").clone();
    let mut drained: Vec<Emitted> = Vec::new();
    let mut ws = pipeline.take_workspace();
    let p = pipeline.process(&mut ws, &bodies[0]).expect("valid");
    let mut g = c.benchmark_group("native_histograms_2000_series");
    g.throughput(Throughput::Elements(
        (p.samples_in + p.histograms_in) as u64,
    ));
    let mut i = 0;
    g.bench_function("end_to_end", |b| {
        b.iter(|| {
            i = (i + 1) % bodies.len();
            let p = pipeline.process(&mut ws, &bodies[i]).expect("valid");
            drained.clear();
            deriver.drain(&mut drained);
            p
        })
    });
    g.finish();
}

fn bench(c: &mut Criterion) {
    let default = fleet::request_bodies(fleet::Mode::Default, 100);
    bench_size(c, "2000_series", &default);
    bench_native(c, &default);
    let large = fleet::request_bodies(fleet::Mode::Large, 30);
    bench_size(c, "10000_series", &large);
}

criterion_group!(benches, bench);
criterion_main!(benches);
