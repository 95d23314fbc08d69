//! Decode → map → encode round trips with prost's owned types as the oracle, property
//! tests on random requests, stale-marker bits, label order and malformed input.

use crate::common;

use std::sync::Arc;

use common::*;
use promnorm::app::Assemble;
use promnorm::config::Config;
use promnorm::mapping::{Rules, STALE_NAN_BITS};
use promnorm::pipeline::{Pipeline, PipelineLimits};
use promnorm::wire::proto::prometheus as pb;
use proptest::prelude::*;
use prost::Message;

fn passthrough() -> Pipeline {
    Pipeline::new(Arc::new(Rules::empty()), PipelineLimits::default())
}

fn round_trip(p: &Pipeline, req: &pb::WriteRequest) -> pb::WriteRequest {
    let mut ws = p.take_workspace();
    p.process(&mut ws, &encode(req)).expect("valid request");
    decode(ws.compressed())
}

fn rich_request() -> pb::WriteRequest {
    let mut ts = series(
        &[
            ("__name__", "http_request_duration_seconds_bucket"),
            ("le", "0.5"),
            ("job", "api"),
        ],
        &[
            (1.5, 1000),
            (f64::from_bits(STALE_NAN_BITS), 2000),
            (-3.25, 3000),
        ],
    );
    ts.exemplars.push(pb::Exemplar {
        labels: vec![label("trace_id", "abc123")],
        value: 0.42,
        timestamp: 999,
    });
    let mut native = series(&[("__name__", "rpc_latency_seconds"), ("svc", "x")], &[]);
    native.histograms.push(pb::Histogram {
        count: Some(pb::histogram::Count::CountInt(10)),
        sum: 3.5,
        schema: 3,
        zero_threshold: 1e-128,
        zero_count: Some(pb::histogram::ZeroCount::ZeroCountInt(1)),
        positive_spans: vec![pb::BucketSpan {
            offset: 0,
            length: 2,
        }],
        positive_deltas: vec![4, 1],
        negative_spans: vec![pb::BucketSpan {
            offset: -2,
            length: 1,
        }],
        negative_deltas: vec![2],
        reset_hint: 2,
        timestamp: 5000,
        ..Default::default()
    });
    pb::WriteRequest {
        timeseries: vec![
            ts,
            native,
            series(
                &[("__name__", "up"), ("instance", "a:1")],
                &[(1.0, 1), (0.0, 2)],
            ),
            series(
                &[("__name__", "big_int"), ("x", "y")],
                &[(9.007_199_254_740_993e15, i64::MAX)],
            ),
        ],
        metadata: vec![pb::MetricMetadata {
            r#type: 3,
            metric_family_name: "http_request_duration_seconds".into(),
            help: "Latency.".into(),
            unit: "seconds".into(),
        }],
    }
}

#[test]
fn untouched_requests_round_trip_exactly() {
    let req = rich_request();
    let got = round_trip(&passthrough(), &req);
    assert_eq!(got.timeseries.len(), req.timeseries.len());
    for (a, b) in got.timeseries.iter().zip(&req.timeseries) {
        assert_eq!(a.labels, b.labels);
        assert_eq!(a.exemplars, b.exemplars);
        assert_eq!(a.histograms, b.histograms);
        let bits = |s: &[pb::Sample]| {
            s.iter()
                .map(|x| (x.value.to_bits(), x.timestamp))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            bits(&a.samples),
            bits(&b.samples),
            "sample bits and order preserved"
        );
    }
    assert_eq!(got.metadata, req.metadata);
}

#[test]
fn stale_marker_bits_survive() {
    let got = round_trip(&passthrough(), &rich_request());
    assert_eq!(got.timeseries[0].samples[1].value.to_bits(), STALE_NAN_BITS);
}

#[test]
fn unsorted_labels_and_empty_values_are_fixed() {
    let ts = pb::TimeSeries {
        labels: vec![
            label("zone", "b"),
            label("__name__", "m"),
            label("empty", ""),
            label("Alpha", "1"),
        ],
        samples: vec![pb::Sample {
            value: 2.0,
            timestamp: 7,
        }],
        ..Default::default()
    };
    let got = round_trip(
        &passthrough(),
        &pb::WriteRequest {
            timeseries: vec![ts],
            metadata: vec![],
        },
    );
    let names: Vec<_> = got.timeseries[0]
        .labels
        .iter()
        .map(|l| l.name.as_str())
        .collect();
    assert_eq!(
        names,
        ["Alpha", "__name__", "zone"],
        "byte order, empty value removed"
    );
    assert_eq!(got.timeseries[0].samples[0].value, 2.0);
}

#[test]
fn malformed_inputs_are_errors_never_panics() {
    let p = passthrough();
    let mut ws = p.take_workspace();
    let good = rich_request().encode_to_vec();
    // Every truncation of a valid request.
    for cut in 0..good.len() {
        let _ = p.process(&mut ws, &compress(&good[..cut]));
    }
    // Bit flips.
    for i in 0..good.len() {
        let mut bad = good.clone();
        bad[i] ^= 0x5a;
        let _ = p.process(&mut ws, &compress(&bad));
    }
    // Invalid UTF-8 in a label value.
    let mut raw = Vec::new();
    pb::WriteRequest {
        timeseries: vec![series(&[("__name__", "x")], &[(1.0, 1)])],
        metadata: vec![],
    }
    .encode(&mut raw)
    .unwrap();
    let pos = raw.windows(1).position(|w| w == b"x").unwrap();
    raw[pos] = 0xff;
    assert!(p.process(&mut ws, &compress(&raw)).is_err());
}

fn arb_label_value() -> impl Strategy<Value = String> {
    prop_oneof!["[a-z0-9_]{1,8}", "\\PC{1,6}"]
}

fn arb_series() -> impl Strategy<Value = pb::TimeSeries> {
    (
        "[a-z_:][a-z0-9_:]{0,12}",
        proptest::collection::btree_map("[a-z_][a-z0-9_]{0,6}", arb_label_value(), 0..5),
        proptest::collection::vec((any::<f64>(), any::<i64>()), 0..5),
    )
        .prop_map(|(name, labels, samples)| {
            let mut l: Vec<pb::Label> = labels
                .into_iter()
                .filter(|(k, _)| k != "__name__")
                .map(|(k, v)| label(&k, &v))
                .collect();
            l.push(label("__name__", &name));
            l.sort_by(|a, b| a.name.cmp(&b.name));
            pb::TimeSeries {
                labels: l,
                samples: samples
                    .into_iter()
                    .map(|(value, timestamp)| pb::Sample { value, timestamp })
                    .collect(),
                ..Default::default()
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn random_requests_round_trip(ts in proptest::collection::vec(arb_series(), 0..20)) {
        let req = pb::WriteRequest { timeseries: ts, metadata: vec![] };
        let got = round_trip(&passthrough(), &req);
        prop_assert_eq!(got.timeseries.len(), req.timeseries.len());
        for (a, b) in got.timeseries.iter().zip(&req.timeseries) {
            prop_assert_eq!(&a.labels, &b.labels);
            // prost (the oracle's encoder) omits -0.0 as a default value, so the wire
            // never carried its sign; every other bit pattern must survive.
            let bits = |s: &[pb::Sample]| s.iter().map(|x| (if x.value == 0.0 { 0 } else { x.value.to_bits() }, x.timestamp)).collect::<Vec<_>>();
            prop_assert_eq!(bits(&a.samples), bits(&b.samples));
        }
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let p = passthrough();
        let mut ws = p.take_workspace();
        let _ = p.process(&mut ws, &bytes);
        let _ = p.process(&mut ws, &compress(&bytes));
    }
}

// The pipeline's fast path (issue 23): a request no rule touched leaves as the sender's
// own compressed body.
fn untouched_request(name: &str) -> Vec<u8> {
    let label = |n: &str, v: &str| pb::Label {
        name: n.into(),
        value: v.into(),
    };
    pb::WriteRequest {
        timeseries: (0..50)
            .map(|i| pb::TimeSeries {
                labels: vec![
                    label("__name__", name),
                    label("instance", &format!("node-{i}:8000")),
                    label("job", "vllm"),
                ],
                samples: vec![pb::Sample {
                    value: f64::from(i),
                    timestamp: 1_700_000_000_000,
                }],
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
    .encode_to_vec()
}

/// Valid snappy that no compressor writes (one literal, no back-references), so that
/// a body compressed again is told apart from the sender's own.
fn literal_snappy(raw: &[u8]) -> Vec<u8> {
    assert!((61..=65_536).contains(&raw.len()));
    let mut out = Vec::new();
    promnorm::wire::pb::put_varint(&mut out, raw.len() as u64);
    out.push(61 << 2); // literal, length - 1 in the next two bytes
    out.extend_from_slice(&((raw.len() - 1) as u16).to_le_bytes());
    out.extend_from_slice(raw);
    out
}

#[test]
fn a_request_no_rule_touches_is_forwarded_as_its_own_body() {
    let pipeline = Pipeline::new(Arc::new(Rules::empty()), PipelineLimits::default());
    let mut ws = pipeline.take_workspace();
    let raw = untouched_request("vllm:num_requests_running");
    let body = literal_snappy(&raw);
    pipeline.process(&mut ws, &body).unwrap();
    assert_eq!(ws.mapped(), raw);
    // (Not assert_eq: a failure would print both bodies.)
    assert!(
        ws.compressed() == &body[..],
        "the sender's body, not compressed again"
    );
    // A body the rules change: compressed from the output.
    let cfg = Config::embedded_default();
    let packs = cfg.pipeline().unwrap();
    let renamed = literal_snappy(&untouched_request("vllm:gpu_prefix_cache_hits_total"));
    packs.process(&mut ws, &renamed).unwrap();
    assert!(ws.compressed() != &renamed[..]);
    let out = snap::raw::Decoder::new()
        .decompress_vec(ws.compressed())
        .unwrap();
    assert_eq!(out, ws.mapped());
    assert!(
        out.windows(28)
            .any(|w| w == b"vllm:prefix_cache_hits_total")
    );
    // A 1.0 body the pipeline does not copy out (process_raw) is compressed.
    pipeline.process_raw(&mut ws, &raw).unwrap();
    let out = snap::raw::Decoder::new()
        .decompress_vec(ws.compressed())
        .unwrap();
    assert_eq!(out, raw);
}

/// `body` with the length of series `k` written as a two-byte varint (valid protobuf, as
/// no encoder writes it).
fn with_long_length(body: &[u8], k: usize) -> Vec<u8> {
    let req = pb::WriteRequest::decode(body).unwrap();
    let mut out = Vec::new();
    for (i, ts) in req.timeseries.iter().enumerate() {
        let bytes = ts.encode_to_vec();
        assert!(bytes.len() < 128);
        out.push(0x0a);
        if i == k {
            out.extend_from_slice(&[bytes.len() as u8 | 0x80, 0x00]);
        } else {
            out.push(bytes.len() as u8);
        }
        out.extend_from_slice(&bytes);
    }
    out
}

fn map_once(rules: &Rules, raw: &[u8]) -> (promnorm::mapping::MapOutcome, Vec<u8>) {
    use promnorm::mapping::{MapContext, Mapper};
    use promnorm::wire::decode::{DecodeLimits, DecodedRequest};
    let mut req = DecodedRequest::default();
    req.decode(raw, DecodeLimits::default()).unwrap();
    let ctx = MapContext {
        taps: None,
        counters: None,
    };
    let mut out = Vec::new();
    let mapped = Mapper::new().map_request_unless_same(rules, raw, &req, &mut out, &ctx);
    (mapped, out)
}

#[test]
fn a_request_of_untouched_series_is_not_copied_and_others_are_framed_as_written() {
    use promnorm::mapping::MapOutcome;
    let rules = Rules::empty();
    let raw = untouched_request("vllm:num_requests_running");
    let (mapped, out) = map_once(&rules, &raw);
    assert_eq!(mapped, MapOutcome::SameAsInput);
    assert!(out.is_empty(), "nothing copied");
    // A series framed with a longer length than the writer's: the request is written,
    // every series with the writer's framing, in the input's order.
    let canonical = pb::WriteRequest::decode(&raw[..]).unwrap().encode_to_vec();
    for k in [0, 1, 25, 49] {
        let odd = with_long_length(&raw, k);
        let (mapped, out) = map_once(&rules, &odd);
        assert_eq!(mapped, MapOutcome::Written, "series {k} framed long");
        assert!(
            out == canonical,
            "series {k} framed long: written as the writer would"
        );
    }
    // Series the rules change or drop between untouched ones: the untouched ones in
    // their order, runs and all, then the changed ones.
    let cfg = Config::embedded_default();
    let packs = cfg.pipeline().unwrap();
    let mut req = pb::WriteRequest::decode(&raw[..]).unwrap();
    for i in [3, 4, 20, 49] {
        req.timeseries[i].labels[0].value = "vllm:gpu_prefix_cache_hits_total".into();
    }
    let body = req.encode_to_vec();
    let (mapped, out) = map_once(packs.rules(), &body);
    assert_eq!(mapped, MapOutcome::Written);
    let got = pb::WriteRequest::decode(&out[..]).unwrap();
    let untouched: Vec<_> = req
        .timeseries
        .iter()
        .filter(|t| t.labels[0].value == "vllm:num_requests_running")
        .cloned()
        .collect();
    assert_eq!(got.timeseries[..untouched.len()], untouched[..]);
    assert_eq!(got.timeseries.len(), 50);
    assert!(
        got.timeseries[untouched.len()..]
            .iter()
            .all(|t| t.labels[0].value == "vllm:prefix_cache_hits_total")
    );
}
