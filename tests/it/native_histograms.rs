//! Native histogram series through the pipeline (docs/rules.md, "Native histograms"):
//! they follow the family's rules like its classic series (renames, label operations,
//! rank dedup, drops, copies, keep_original), rescaled exactly for NHCB and powers of
//! two, re-bucketed otherwise; 1.0 and 2.0 in and out.

use crate::common;

use crate::common::rw2_support as rw2;

use std::sync::Arc;

use common::{decode, encode, label, series};
use promnorm::app::Assemble;
use promnorm::config::Config;
use promnorm::mapping::STALE_NAN_BITS;
use promnorm::pipeline::{InputProtocol, Pipeline, PipelineLimits};
use promnorm::wire::proto::prometheus as pb;
use prost::Message;

const PACK: &str = "pack: nh
rules:
  - match: {family: lat_ms}
    type: histogram
    rename: lat_seconds
    scale: 1/1000
    unit: seconds
  - match: {family: mem_mib}
    type: histogram
    rename: mem_bytes
    scale: 2^20
    unit: bytes
  - match: {family: old_name}
    type: histogram
    rename: new_name
    rename_labels: {host: instance}
  - match: {family: kept_ms}
    type: histogram
    rename: kept_seconds
    scale: 1/1000
    native_histograms: keep_unit
  - match: {family: gone}
    type: histogram
    drop: unwanted
  - match: {family: any_ms}
    rename: any_seconds
    scale: 1/1000
  - match: {family: new_name}
    type: histogram
    copy: true
    rename: copied_name
";

fn pipeline(pack: &str, extra: &str) -> Pipeline {
    let dir = std::env::temp_dir().join(format!(
        "promnorm-native-{}-{}",
        std::process::id(),
        pack.len() + extra.len()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("nh.yaml"), pack).unwrap();
    std::fs::write(
        dir.join("cfg.yaml"),
        format!("listen: 127.0.0.1:0\n{extra}packs:\n  files: [nh.yaml]\n"),
    )
    .unwrap();
    let rules = Config::load(&dir.join("cfg.yaml"))
        .unwrap()
        .validate()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    Pipeline::new(Arc::new(rules), PipelineLimits::default())
}

/// The four ways through: (2.0 in, 2.0 out). Every output is read back as 1.0 types
/// (2.0 histograms share 1.0's field numbers).
const FLOWS: [(bool, bool); 4] = [(false, false), (true, false), (false, true), (true, true)];

fn run(p: &Pipeline, req: &pb::WriteRequest, (v2_in, v2_out): (bool, bool)) -> pb::WriteRequest {
    let mut ws = p.take_workspace();
    if v2_in {
        let body = rw2::encode_v2(&rw2::v1_to_v2(req));
        p.process_as(&mut ws, &body, InputProtocol::V2).unwrap();
    } else {
        p.process(&mut ws, &encode(req)).unwrap();
    }
    if !v2_out {
        return decode(ws.compressed());
    }
    p.encode_v2(&mut ws).unwrap();
    let out = rw2::decode_v2(ws.compressed_v2());
    pb::WriteRequest {
        timeseries: out
            .timeseries
            .iter()
            .map(|ts| pb::TimeSeries {
                labels: ts
                    .labels_refs
                    .chunks(2)
                    .map(|p| label(&out.symbols[p[0] as usize], &out.symbols[p[1] as usize]))
                    .collect(),
                samples: ts
                    .samples
                    .iter()
                    .map(|s| pb::Sample {
                        value: s.value,
                        timestamp: s.timestamp,
                    })
                    .collect(),
                histograms: ts
                    .histograms
                    .iter()
                    .map(|h| pb::Histogram::decode(h.encode_to_vec().as_slice()).unwrap())
                    .collect(),
                exemplars: ts
                    .exemplars
                    .iter()
                    .map(|e| pb::Exemplar {
                        labels: e
                            .labels_refs
                            .chunks(2)
                            .map(|p| {
                                label(&out.symbols[p[0] as usize], &out.symbols[p[1] as usize])
                            })
                            .collect(),
                        value: e.value,
                        timestamp: e.timestamp,
                    })
                    .collect(),
            })
            .collect(),
        metadata: vec![],
    }
}

fn name_of(ts: &pb::TimeSeries) -> &str {
    ts.labels
        .iter()
        .find(|l| l.name == "__name__")
        .map(|l| l.value.as_str())
        .unwrap_or("")
}

fn find<'a>(r: &'a pb::WriteRequest, name: &str) -> Vec<&'a pb::TimeSeries> {
    r.timeseries.iter().filter(|t| name_of(t) == name).collect()
}

fn native(labels: &[(&str, &str)], hs: Vec<pb::Histogram>) -> pb::TimeSeries {
    let mut ts = series(labels, &[]);
    ts.histograms = hs;
    ts
}

fn span(offset: i32, length: u32) -> pb::BucketSpan {
    pb::BucketSpan { offset, length }
}

/// An integer exponential histogram: buckets `offset..offset+deltas.len()`.
fn exp_hist(schema: i32, offset: i32, deltas: &[i64], ts: i64) -> pb::Histogram {
    let mut acc = 0;
    let total: i64 = deltas
        .iter()
        .map(|d| {
            acc += d;
            acc
        })
        .sum();
    pb::Histogram {
        count: Some(pb::histogram::Count::CountInt(total as u64 + 3 + 2)),
        sum: 4096.0,
        schema,
        zero_threshold: 0.25,
        zero_count: Some(pb::histogram::ZeroCount::ZeroCountInt(3)),
        positive_spans: vec![span(offset, deltas.len() as u32)],
        positive_deltas: deltas.to_vec(),
        negative_spans: vec![span(offset + 1, 1)],
        negative_deltas: vec![2],
        timestamp: ts,
        ..Default::default()
    }
}

/// An NHCB (schema -53) with bounds `bounds` and `counts[i]` in bucket i (the last: +Inf).
fn nhcb(bounds: &[f64], counts: &[i64], sum: f64, ts: i64) -> pb::Histogram {
    let mut prev = 0;
    pb::Histogram {
        count: Some(pb::histogram::Count::CountInt(
            counts.iter().sum::<i64>() as u64
        )),
        sum,
        schema: -53,
        zero_count: Some(pb::histogram::ZeroCount::ZeroCountInt(0)),
        positive_spans: vec![span(0, counts.len() as u32)],
        positive_deltas: counts
            .iter()
            .map(|c| {
                let d = c - prev;
                prev = *c;
                d
            })
            .collect(),
        custom_values: bounds.to_vec(),
        timestamp: ts,
        ..Default::default()
    }
}

fn count_of(h: &pb::Histogram) -> f64 {
    match h.count {
        Some(pb::histogram::Count::CountInt(c)) => c as f64,
        Some(pb::histogram::Count::CountFloat(c)) => c,
        None => 0.0,
    }
}

#[test]
fn native_histograms_follow_the_family_rules_in_every_protocol() {
    let p = pipeline(PACK, "");
    let stale = pb::Histogram {
        count: Some(pb::histogram::Count::CountInt(0)),
        sum: f64::from_bits(STALE_NAN_BITS),
        schema: 3,
        timestamp: 3000,
        ..Default::default()
    };
    let gauge = pb::Histogram {
        reset_hint: 3,
        ..exp_hist(0, 2, &[1, 1], 1000)
    };
    let float = pb::Histogram {
        count: Some(pb::histogram::Count::CountFloat(7.5)),
        sum: 12.25,
        schema: 1,
        zero_count: Some(pb::histogram::ZeroCount::ZeroCountFloat(0.5)),
        positive_spans: vec![span(-1, 1)],
        positive_counts: vec![7.0],
        timestamp: 1000,
        ..Default::default()
    };
    let mut lat = native(
        &[("__name__", "lat_ms"), ("job", "a")],
        vec![
            nhcb(&[1.0, 10.0, 250.0], &[1, 2, 3, 4], 900.0, 1000),
            stale.clone(),
        ],
    );
    lat.exemplars.push(pb::Exemplar {
        labels: vec![label("trace_id", "t1")],
        value: 7.0,
        timestamp: 999,
    });
    let req = pb::WriteRequest {
        timeseries: vec![
            lat,
            series(
                &[("__name__", "lat_ms_bucket"), ("job", "a"), ("le", "250")],
                &[(6.0, 1000)],
            ),
            native(
                &[("__name__", "lat_ms"), ("job", "exp")],
                vec![exp_hist(3, 10, &[5, 3, -2, 1], 1000)],
            ),
            native(
                &[("__name__", "mem_mib"), ("job", "a")],
                vec![gauge.clone(), exp_hist(-2, -1, &[4, 1], 2000)],
            ),
            native(
                &[("__name__", "old_name"), ("host", "h1")],
                vec![float.clone(), stale.clone()],
            ),
            native(&[("__name__", "kept_ms")], vec![exp_hist(3, 1, &[1], 1000)]),
            native(&[("__name__", "gone")], vec![exp_hist(3, 1, &[1], 1000)]),
            native(
                &[("__name__", "any_ms")],
                vec![nhcb(&[5.0], &[1, 1], 10.0, 1000)],
            ),
            // A float series under a histogram family's plain name is no native
            // histogram: it passes as before.
            series(&[("__name__", "lat_ms"), ("job", "plain")], &[(5.0, 1000)]),
        ],
        metadata: vec![],
    };
    for flow in FLOWS {
        let out = run(&p, &req, flow);
        let what = format!("{flow:?}");
        // NHCB ÷1000: bounds and sum, counts untouched; a bound equals the classic
        // bucket's rewritten `le` parsed; the stale marker's bits and the exemplar kept.
        let lat = find(&out, "lat_seconds");
        let lat_a = lat
            .iter()
            .find(|t| t.labels.contains(&label("job", "a")))
            .expect(&what);
        assert_eq!(lat_a.histograms.len(), 2, "{what}");
        let h = &lat_a.histograms[0];
        assert_eq!(h.custom_values, [0.001, 0.01, 0.25], "{what}");
        assert_eq!(h.sum, 0.9, "{what}");
        assert_eq!(h.positive_deltas, [1, 1, 1, 1], "{what}");
        assert_eq!(count_of(h), 10.0);
        assert_eq!(h.schema, -53);
        assert_eq!(
            lat_a.histograms[1].sum.to_bits(),
            STALE_NAN_BITS,
            "{what}: stale marker"
        );
        assert_eq!(lat_a.exemplars[0].value, 0.007, "{what}");
        let bucket = &find(&out, "lat_seconds_bucket")[0];
        let le = bucket.labels.iter().find(|l| l.name == "le").unwrap();
        assert_eq!(le.value.parse::<f64>().unwrap(), h.custom_values[2]);
        // Exponential ÷1000: a float histogram, counts conserved, sum scaled.
        let lat_exp = lat
            .iter()
            .find(|t| t.labels.contains(&label("job", "exp")))
            .expect(&what);
        let h = &lat_exp.histograms[0];
        assert!(
            matches!(h.count, Some(pb::histogram::Count::CountFloat(c)) if c == 31.0),
            "{what}: {h:?}"
        );
        assert_eq!(h.positive_counts.iter().sum::<f64>(), 26.0, "{what}");
        assert_eq!(h.negative_counts.iter().sum::<f64>(), 2.0, "{what}");
        assert_eq!((h.sum, h.zero_threshold), (4.096, 0.00025), "{what}");
        // The float series of the plain name: untouched.
        let plain = find(&out, "lat_ms");
        assert_eq!(plain.len(), 1, "{what}");
        assert_eq!(plain[0].samples[0].value, 5.0);
        // ×2^20 on schemas 0 (gauge histogram) and -2: indices shift by 20·2^schema.
        let mem = find(&out, "mem_bytes");
        assert_eq!(mem.len(), 1, "{what}");
        let (g, n) = (&mem[0].histograms[0], &mem[0].histograms[1]);
        assert_eq!(g.reset_hint, 3, "{what}: gauge histogram");
        assert_eq!(g.positive_spans, [span(22, 2)], "{what}");
        assert_eq!(g.positive_deltas, gauge.positive_deltas);
        assert_eq!(g.sum, 4096.0 * 1_048_576.0);
        assert_eq!(g.zero_threshold, 0.25 * 1_048_576.0);
        assert_eq!(n.positive_spans, [span(4, 2)], "{what}: schema -2");
        assert!(matches!(n.count, Some(pb::histogram::Count::CountInt(_))));
        // Rename and label rename, bytes otherwise as sent; the copy beside it.
        let renamed = find(&out, "new_name");
        assert_eq!(renamed.len(), 1, "{what}");
        assert!(renamed[0].labels.contains(&label("instance", "h1")));
        assert_eq!(renamed[0].histograms[0], float, "{what}");
        assert_eq!(
            renamed[0].histograms[1].sum.to_bits(),
            STALE_NAN_BITS,
            "{what}"
        );
        assert_eq!(find(&out, "copied_name")[0].histograms.len(), 2, "{what}");
        // keep_unit: unrenamed, as sent; a drop drops; `any` rescales too.
        assert_eq!(find(&out, "kept_ms").len(), 1, "{what}");
        assert!(find(&out, "kept_seconds").is_empty());
        assert!(find(&out, "gone").is_empty(), "{what}");
        let any = find(&out, "any_seconds");
        assert_eq!(any[0].histograms[0].custom_values, [0.005], "{what}");
    }
    let mut ws = p.take_workspace();
    p.process(&mut ws, &encode(&req)).unwrap();
    let stats = p.stats(&ws);
    assert_eq!(stats.native_unscaled, 1, "kept_ms");
    assert_eq!(stats.native_exact, 4, "two NHCB, two ×2^20");
    assert_eq!(stats.native_rebucketed.iter().sum::<u64>(), 1);
}

#[test]
fn rank_dedup_and_keep_original_apply_to_native_series() {
    // sglang's rank dedup keeps tp_rank="0" of a logical family; its label_values rule
    // renames a stage on the histogram family.
    let cfg = Config::parse("listen: 127.0.0.1:0\nkeep_original: true\n", "t.yaml").unwrap();
    let p = Pipeline::new(
        Arc::new(cfg.compile_rules().unwrap()),
        PipelineLimits::default(),
    );
    let req = pb::WriteRequest {
        timeseries: vec![
            native(
                &[
                    ("__name__", "sglang:per_stage_req_latency_seconds"),
                    ("stage", "dispatch"),
                    ("tp_rank", "0"),
                ],
                vec![exp_hist(3, 1, &[1], 1000)],
            ),
            native(
                &[
                    ("__name__", "sglang:per_stage_req_latency_seconds"),
                    ("stage", "dispatch"),
                    ("tp_rank", "1"),
                ],
                vec![exp_hist(3, 1, &[1], 1000)],
            ),
            native(
                &[
                    ("__name__", "sglang:kv_transfer_latency_ms"),
                    ("tp_rank", "1"),
                ],
                vec![nhcb(&[100.0], &[1, 0], 50.0, 1000)],
            ),
        ],
        metadata: vec![],
    };
    for flow in FLOWS {
        let out = run(&p, &req, flow);
        let stage = find(&out, "sglang:per_stage_req_latency_seconds");
        // Rank 0 renamed (stage value), rank 1 dropped, the original kept beside it.
        assert!(
            stage.iter().any(
                |t| t.labels.contains(&label("stage", "api_server_dispatch"))
                    && t.labels.contains(&label("tp_rank", "0"))
            ),
            "{flow:?}: {stage:?}"
        );
        assert!(
            !stage
                .iter()
                .any(|t| t.labels.contains(&label("tp_rank", "1"))
                    && t.labels.contains(&label("stage", "api_server_dispatch"))),
            "{flow:?}: rank 1 deduplicated"
        );
        // A physical per-rank family (kv_transfer_): every rank kept, renamed, rescaled;
        // keep_original leaves the original beside it.
        let kv = find(&out, "sglang:kv_transfer_latency_seconds");
        assert_eq!(kv.len(), 1, "{flow:?}");
        assert_eq!(kv[0].histograms[0].custom_values, [0.1]);
        assert_eq!(kv[0].histograms[0].sum, 0.05);
        let orig = find(&out, "sglang:kv_transfer_latency_ms");
        assert_eq!(orig[0].histograms[0].custom_values, [100.0], "{flow:?}");
    }
}

fn recorded_v1(rec: &common::Recorded) -> pb::WriteRequest {
    let reqs = rec.requests();
    assert_eq!(reqs.len(), 1, "one request");
    decode(&reqs[0].1)
}

fn recorded_v2(rec: &rw2::V2Recorded) -> pb::WriteRequest {
    let reqs = rec.lock().unwrap().clone();
    assert_eq!(reqs.len(), 1, "one request");
    let out = rw2::decode_v2(&reqs[0].1);
    pb::WriteRequest {
        timeseries: out
            .timeseries
            .iter()
            .map(|ts| pb::TimeSeries {
                labels: ts
                    .labels_refs
                    .chunks(2)
                    .map(|p| label(&out.symbols[p[0] as usize], &out.symbols[p[1] as usize]))
                    .collect(),
                samples: ts
                    .samples
                    .iter()
                    .map(|s| pb::Sample {
                        value: s.value,
                        timestamp: s.timestamp,
                    })
                    .collect(),
                histograms: ts
                    .histograms
                    .iter()
                    .map(|h| pb::Histogram::decode(h.encode_to_vec().as_slice()).unwrap())
                    .collect(),
                exemplars: vec![],
            })
            .collect(),
        // The 2.0 series' metadata types, by series name, as 1.0 entries.
        metadata: out
            .timeseries
            .iter()
            .filter_map(|ts| {
                let md = ts.metadata.as_ref()?;
                let name = ts
                    .labels_refs
                    .chunks(2)
                    .find(|p| out.symbols[p[0] as usize] == "__name__")?;
                Some(pb::MetricMetadata {
                    r#type: md.r#type,
                    metric_family_name: out.symbols[name[1] as usize].clone(),
                    ..Default::default()
                })
            })
            .collect(),
    }
}

/// The NHCB a 2.0 sender sends (Prometheus 3's `convert_classic_histograms_to_nhcb`):
/// unrolled into classic series for a 1.0 backend (`auto`), kept for 2.0; `as_is` and
/// `classic` override; tenant-routed backends too; counted per backend.
#[tokio::test]
async fn nhcb_is_unrolled_for_1_0_backends_and_kept_for_2_0() {
    use axum::http::StatusCode;
    let (auto_v1, auto_v1_log) = common::fake_backend(common::Reply::ok()).await;
    let (as_is, as_is_log) = common::fake_backend(common::Reply::ok()).await;
    let (tenanted, tenanted_log) = common::fake_backend(common::Reply::ok()).await;
    let (auto_v2, auto_v2_log) = rw2::versioned_backend(StatusCode::NO_CONTENT, true).await;
    let (classic_v2, classic_v2_log) = rw2::versioned_backend(StatusCode::NO_CONTENT, true).await;
    let yaml = format!(
        "listen: 127.0.0.1:0
backends:
  - {{name: auto_v1, url: {auto_v1}}}
  - {{name: as_is, url: {as_is}, native_histograms: as_is}}
  - {{name: tenanted, url: {tenanted}, tenancy: {{label: job}}}}
  - {{name: auto_v2, url: {auto_v2}, protocol: v2}}
  - {{name: classic_v2, url: {classic_v2}, protocol: v2, native_histograms: classic}}
"
    );
    let proxy = common::start_proxy_yaml(&yaml, std::time::Duration::from_secs(2)).await;
    let h = nhcb(&[0.1, 1.0, 2.5], &[3, 1, 0, 2], 4.25, 1000);
    let req = pb::WriteRequest {
        timeseries: vec![
            // sglang's KV transfer latency in ms: renamed and rescaled first.
            native(
                &[
                    ("__name__", "sglang:kv_transfer_latency_ms"),
                    ("job", "sgl"),
                ],
                vec![h.clone()],
            ),
            series(&[("__name__", "up"), ("job", "sgl")], &[(1.0, 1000)]),
        ],
        metadata: vec![],
    };
    let body = rw2::encode_v2(&rw2::v1_to_v2(&req));
    let r = common::post(&proxy.url(), body, rw2::RW2_HEADERS).await;
    assert_eq!(r.status, 204, "{}", r.body);

    let family = "sglang:kv_transfer_latency_seconds";
    for (what, got) in [
        ("auto_v1", recorded_v1(&auto_v1_log)),
        ("tenanted", recorded_v1(&tenanted_log)),
        ("classic_v2", recorded_v2(&classic_v2_log)),
    ] {
        assert!(find(&got, family).is_empty(), "{what}: no native series");
        let bucket = |le: &str| {
            got.timeseries
                .iter()
                .find(|t| {
                    name_of(t) == format!("{family}_bucket") && t.labels.contains(&label("le", le))
                })
                .unwrap_or_else(|| panic!("{what}: le={le} in {got:?}"))
                .samples[0]
                .value
        };
        // Bounds ÷1000 in promnorm's `le` text; cumulative counts; +Inf is the count.
        assert_eq!(
            [
                bucket("0.0001"),
                bucket("0.001"),
                bucket("0.0025"),
                bucket("+Inf")
            ],
            [3.0, 4.0, 4.0, 6.0],
            "{what}"
        );
        assert_eq!(
            find(&got, &format!("{family}_sum"))[0].samples[0].value,
            0.00425
        );
        assert_eq!(
            find(&got, &format!("{family}_count"))[0].samples[0].value,
            6.0
        );
        assert_eq!(find(&got, "up").len(), 1, "{what}");
        assert!(
            got.metadata
                .iter()
                .any(|m| m.r#type == 3 && m.metric_family_name.starts_with(family)),
            "{what}: HISTOGRAM metadata: {:?}",
            got.metadata
        );
    }
    for (what, got) in [
        ("as_is", recorded_v1(&as_is_log)),
        ("auto_v2", recorded_v2(&auto_v2_log)),
    ] {
        let native = find(&got, family);
        assert_eq!(native.len(), 1, "{what}");
        assert_eq!(
            native[0].histograms[0].custom_values,
            [0.0001, 0.001, 0.0025]
        );
        assert!(find(&got, &format!("{family}_bucket")).is_empty(), "{what}");
    }
    for (backend, want) in [
        ("auto_v1", 1.0),
        ("tenanted", 1.0),
        ("classic_v2", 1.0),
        ("as_is", 0.0),
        ("auto_v2", 0.0),
    ] {
        let n = proxy
            .metric(
                "promnorm_native_histograms_unrolled_total",
                &[&format!("backend=\"{backend}\"")],
            )
            .await;
        assert_eq!(n, want, "{backend}");
    }
    proxy.shut_down().await;
}

/// A 1.0 `Histogram` has no field 17, but 2.0's is `start_timestamp` (and the mapped body
/// numbers histograms like 2.0): a 1.0 sender's unknown field 17, of either wire type,
/// must reach neither output, whichever way the histogram goes through (as it came,
/// renamed, rescaled). Each output must be byte for byte the one of the same request
/// without the field.
#[test]
fn a_one_zero_histogram_field_unknown_to_one_zero_is_not_passed_on() {
    let p = pipeline(PACK, "");
    // Field 17 as fixed64 (key 0x89 0x01) and as a varint (key 0x88 0x01).
    let extras: [&[u8]; 2] = [&[0x89, 0x01, 1, 2, 3, 4, 5, 6, 7, 8], &[0x88, 0x01, 0x2a]];
    for family in ["plain_hist", "old_name", "lat_ms", "mem_mib"] {
        let labels = [("__name__", family), ("host", "a")];
        let hist = exp_hist(0, 1, &[2, 1], 1000);
        let body = |extra: &[u8]| {
            let mut series = Vec::new();
            for (n, v) in labels {
                let l = label(n, v).encode_to_vec();
                series.push(0x0a);
                prost::encoding::encode_varint(l.len() as u64, &mut series);
                series.extend_from_slice(&l);
            }
            let h = [hist.encode_to_vec().as_slice(), extra].concat();
            series.push(0x22);
            prost::encoding::encode_varint(h.len() as u64, &mut series);
            series.extend_from_slice(&h);
            let mut body = vec![0x0a];
            prost::encoding::encode_varint(series.len() as u64, &mut body);
            body.extend_from_slice(&series);
            common::compress(&body)
        };
        // Both outputs (1.0 raw, 2.0 raw) of one request.
        let outputs = |body: &[u8]| {
            let mut ws = p.take_workspace();
            p.process(&mut ws, body).expect("a valid 1.0 request");
            let v1 = snap::raw::Decoder::new()
                .decompress_vec(ws.compressed())
                .unwrap();
            p.encode_v2(&mut ws).expect("2.0 output");
            let v2 = snap::raw::Decoder::new()
                .decompress_vec(ws.compressed_v2())
                .unwrap();
            p.return_workspace(ws);
            (v1, v2)
        };
        let (want_v1, want_v2) = outputs(&body(&[]));
        let out = rw2::decode_v2(&common::compress(&want_v2));
        assert!(!out.timeseries.is_empty(), "{family}");
        for ts in &out.timeseries {
            assert_eq!(ts.histograms.len(), 1, "{family}");
        }
        for extra in extras {
            let (v1, v2) = outputs(&body(extra));
            assert_eq!(v1, want_v1, "{family}: 1.0 output, extra {extra:?}");
            assert_eq!(v2, want_v2, "{family}: 2.0 output, extra {extra:?}");
        }
    }
}
