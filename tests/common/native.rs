//! Native histogram series added to the fleet's requests (tests/zero_alloc.rs,
//! benches/pipeline.rs).
#![allow(dead_code)]

use promnorm::wire::proto::prometheus as pb;
use prost::Message;

/// The fleet's requests plus, per 4 series, one native histogram series under a
/// rescale rule of the built-in packs (20 % of the series): sglang's KV transfer
/// latency (`ms`, ÷1000) as NHCB and as an exponential histogram, and its transfer size
/// (`mb`, ×2^20) as an exponential histogram.
pub fn with_native_histograms(bodies: &[Vec<u8>]) -> (Vec<Vec<u8>>, u64) {
    let mut native = 0;
    let out = bodies
        .iter()
        .enumerate()
        .map(|(r, b)| {
            let raw = snap::raw::Decoder::new().decompress_vec(b).unwrap();
            let mut req = pb::WriteRequest::decode(raw.as_slice()).unwrap();
            let ts = req
                .timeseries
                .first()
                .and_then(|t| t.samples.first())
                .map_or(1_700_000_000_000, |s| s.timestamp);
            let n = req.timeseries.len() / 4;
            for i in 0..n {
                let kind = i % 3;
                let name = match kind {
                    2 => "sglang:kv_transfer_total_mb",
                    _ => "sglang:kv_transfer_latency_ms",
                };
                let c = (r * 7 + i) as i64;
                let h = pb::Histogram {
                    count: Some(pb::histogram::Count::CountInt(3 * c as u64 + 6)),
                    sum: 12.5 * c as f64,
                    schema: if kind == 0 { -53 } else { 3 },
                    zero_count: Some(pb::histogram::ZeroCount::ZeroCountInt(0)),
                    positive_spans: vec![pb::BucketSpan {
                        offset: if kind == 0 { 0 } else { 20 },
                        length: 3,
                    }],
                    positive_deltas: vec![c + 2, 0, 0],
                    custom_values: if kind == 0 {
                        vec![5.0, 50.0, 500.0]
                    } else {
                        Vec::new()
                    },
                    timestamp: ts,
                    ..Default::default()
                };
                let mut labels = vec![
                    pb::Label {
                        name: "__name__".into(),
                        value: name.into(),
                    },
                    pb::Label {
                        name: "instance".into(),
                        value: format!("10.0.{}.{}:30000", i / 250, i % 250),
                    },
                    pb::Label {
                        name: "schema".into(),
                        value: kind.to_string(),
                    },
                ];
                labels.sort_by(|a, b| a.name.cmp(&b.name));
                req.timeseries.push(pb::TimeSeries {
                    labels,
                    histograms: vec![h],
                    ..Default::default()
                });
                native += 1;
            }
            snap::raw::Encoder::new()
                .compress_vec(&req.encode_to_vec())
                .unwrap()
        })
        .collect();
    (out, native)
}
