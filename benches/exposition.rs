//! Criterion benches of the scrape side's text parsing (issue 55: the project's own
//! parser against a well-kept crate, the faster one kept), on one engine pod's scrape of
//! 10,000 series of the synthetic fleet in text 0.0.4 (`Fleet::exposition`, about 2 MB):
//!
//! - `parse/promnorm`: `scrape::text::parse`, label ranges into the body, every value read;
//! - `parse/prometheus_parse`: the `prometheus-parse` crate (0.2) over the same lines, as
//!   its API takes them (one `String` a line), every sample's value read. Its sample
//!   pattern takes `\w+` for a metric name, so it skips, without an error, every series
//!   whose name holds a `:` (all of vLLM's `vllm:*`, recording-rule names): on the fleet's
//!   scrape it reads about a fifth of the samples (checked below). It is timed on a copy
//!   of the body with `:` written as `_`, so that both parse the same number of samples;
//! - `scrape_encode/promnorm`: what a scrape costs promnorm before the pipeline: parse,
//!   target labels, staleness tracking and the remote-write 1.0 encoding, warm (the
//!   second and later scrapes of a target).
//!
//! Throughput is in samples (series per scrape).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use promnorm::scrape::encode::{Batches, EncodeOptions, TargetEncoder};
use promnorm::scrape::text::{self, Format, Line, SampleLine};
use promnorm::testkit::fleet;
use std::hint::black_box;

const SERIES: usize = 10_000;

fn body() -> String {
    let fleet = fleet::Fleet::build(&fleet::FleetShape::default(), fleet::FIXED_END_MS);
    fleet.exposition(SERIES, fleet::FIXED_END_MS)
}

fn promnorm_parse(body: &[u8], line: &mut SampleLine) -> (usize, f64) {
    let (mut n, mut sum) = (0, 0.0);
    text::parse(body, Format::Text004, line, |kind, s| {
        if let Line::Sample = kind {
            n += 1;
            sum += s.value + s.labels.len() as f64;
        }
        Ok(())
    })
    .expect("the fleet's exposition parses");
    (n, sum)
}

fn crate_parse(body: &str) -> (usize, f64) {
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_owned())))
        .expect("the fleet's exposition parses");
    let sum = scrape
        .samples
        .iter()
        .map(|s| {
            let v = match &s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => *v,
                _ => 0.0,
            };
            v + s.labels.len() as f64
        })
        .sum();
    (scrape.samples.len(), sum)
}

fn benches(c: &mut Criterion) {
    let body = body();
    let mut line = SampleLine::default();
    // Both read every sample: the comparison is of equal work.
    let (ours, _) = promnorm_parse(body.as_bytes(), &mut line);
    let (theirs, _) = crate_parse(&body);
    assert_eq!(ours, SERIES, "samples promnorm read");
    assert!(
        theirs < SERIES / 2,
        "prometheus-parse read {theirs} of {SERIES}: does it read `vllm:` names now? \
         Then time it on the body itself"
    );
    let colon_free = body.replace(':', "_");
    assert_eq!(crate_parse(&colon_free).0, SERIES, "samples the crate read");

    let mut g = c.benchmark_group("exposition_10k_series");
    g.throughput(Throughput::Elements(SERIES as u64));
    g.bench_function("parse/promnorm", |b| {
        b.iter(|| black_box(promnorm_parse(black_box(body.as_bytes()), &mut line)))
    });
    g.bench_function("parse/prometheus_parse", |b| {
        b.iter(|| black_box(crate_parse(black_box(&colon_free))))
    });
    let mut encoder = TargetEncoder::new(vec![
        ("instance".into(), "10.244.0.2:8000".into()),
        ("job".into(), "vllm".into()),
    ]);
    let opts = EncodeOptions {
        honor_labels: false,
        honor_timestamps: true,
    };
    let mut out = Batches::expecting(0);
    let mut now_ms = fleet::FIXED_END_MS;
    g.bench_function("scrape_encode/promnorm", |b| {
        b.iter(|| {
            now_ms += 15_000;
            out.bodies.clear();
            let counts = encoder
                .encode_scrape(body.as_bytes(), Format::Text004, now_ms, opts, &mut out)
                .expect("the fleet's exposition parses");
            black_box((counts, out.bodies.len()))
        })
    });
    g.finish();
}

criterion_group!(exposition, benches);
criterion_main!(exposition);
