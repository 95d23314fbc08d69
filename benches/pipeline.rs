//! Criterion benches of the pipeline on payloads from `shared/tools/bench/gen_payloads.py`
//! (2,000-series requests, the shape Prometheus sends with max_samples_per_send: 2000).
//! Generate them first: `/usr/bin/python3 ../shared/tools/bench/gen_payloads.py`
//! (writes /tmp/prw-payloads/default); `PAYLOAD_DIR` overrides the folder.

use std::path::PathBuf;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use promnorm::config::Config;
use promnorm::mapping::Rules;
use promnorm::pipeline::{Pipeline, PipelineLimits};

fn payloads() -> Vec<Vec<u8>> {
    let dir = std::env::var_os("PAYLOAD_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/prw-payloads/default"));
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|p| p.to_string_lossy().ends_with(".pb.sz"));
    files.sort();
    files.truncate(10);
    files.iter().filter_map(|f| std::fs::read(f).ok()).collect()
}

fn bench(c: &mut Criterion) {
    let bodies = payloads();
    if bodies.is_empty() {
        eprintln!("no payloads found: run gen_payloads.py first (see the file header)");
        return;
    }
    let samples: u64 = {
        let p = Pipeline::new(Arc::new(Rules::empty()), PipelineLimits::default());
        let mut ws = p.take_workspace();
        p.process(&mut ws, &bodies[0])
            .map(|r| r.samples_in as u64)
            .unwrap_or(0)
    };
    let all_packs = Config::embedded_default()
        .compile_rules()
        .expect("built-in packs compile");
    let mut g = c.benchmark_group("pipeline_2000_series");
    g.throughput(Throughput::Elements(samples));
    for (name, rules) in [("passthrough", Rules::empty()), ("all_packs", all_packs)] {
        let p = Pipeline::new(Arc::new(rules), PipelineLimits::default());
        let mut ws = p.take_workspace();
        let mut i = 0;
        g.bench_with_input(
            BenchmarkId::new("decode_map_encode", name),
            &bodies,
            |b, bodies| {
                b.iter(|| {
                    i = (i + 1) % bodies.len();
                    p.process(&mut ws, &bodies[i]).expect("valid payload")
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
