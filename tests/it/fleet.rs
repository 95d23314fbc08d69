//! The synthetic fleet of `promnorm::testkit::fleet` has the shape the zero-allocation test
//! and the benches rely on: about 30,000 series and 100 metric names, 2,000-series
//! requests, sorted labels, time moving forward and counters that only grow. The bodies
//! are read back with the prost types, not with the proxy's own decoder.

use promnorm::testkit::fleet;

use std::collections::{BTreeSet, HashMap};

use fleet::{Fleet, FleetShape, Mode};
use promnorm::wire::proto::prometheus as pb;
use prost::Message;

/// A series' labels as (name, value) pairs, in the order sent.
type LabelSet = Vec<(String, String)>;

fn decode(body: &[u8]) -> pb::WriteRequest {
    let raw = snap::raw::Decoder::new()
        .decompress_vec(body)
        .expect("snappy block format");
    pb::WriteRequest::decode(raw.as_slice()).expect("a prometheus.WriteRequest")
}

fn label<'a>(ts: &'a pb::TimeSeries, name: &str) -> Option<&'a str> {
    ts.labels
        .iter()
        .find(|l| l.name == name)
        .map(|l| l.value.as_str())
}

#[test]
fn fleet_has_the_benchmark_shape() {
    let fleet = Fleet::build(&FleetShape::default(), fleet::FIXED_END_MS);
    let series = fleet.series_count();
    assert!(
        (28_000..32_000).contains(&series),
        "{series} series in the fleet"
    );
    // 16 vLLM + 16 SGLang + 16 Mooncake + 32 DCGM exporters.
    assert_eq!(fleet.target_count(), 80);
    let families = fleet.family_count();
    assert!((90..=130).contains(&families), "{families} metric names");
    eprintln!(
        "fleet: {series} series in {} targets, {families} metric names",
        fleet.target_count()
    );
}

#[test]
fn requests_look_like_a_prometheus_queue() {
    let bodies = fleet::request_bodies(Mode::Default, 40);
    assert_eq!(
        bodies,
        fleet::request_bodies(Mode::Default, 40),
        "deterministic"
    );

    let mut names = BTreeSet::new();
    let mut jobs = BTreeSet::new();
    let mut ranks = BTreeSet::new();
    let mut last: HashMap<LabelSet, (i64, f64)> = HashMap::new();
    for body in &bodies {
        let request = decode(body);
        assert_eq!(request.timeseries.len(), Mode::Default.series_per_request());
        assert!(request.metadata.is_empty());
        for ts in &request.timeseries {
            assert!(
                ts.labels.windows(2).all(|w| w[0].name < w[1].name),
                "labels sorted and unique: {:?}",
                ts.labels
            );
            assert_eq!(ts.samples.len(), 1);
            let sample = &ts.samples[0];
            let name = label(ts, "__name__").expect("a metric name").to_string();
            jobs.insert(label(ts, "job").expect("a job").to_string());
            if let Some(rank) = label(ts, "tp_rank") {
                ranks.insert(rank.to_string());
            }
            let key: LabelSet = ts
                .labels
                .iter()
                .map(|l| (l.name.clone(), l.value.clone()))
                .collect();
            if let Some((ts_before, value_before)) =
                last.insert(key, (sample.timestamp, sample.value))
            {
                assert!(sample.timestamp > ts_before, "{name}: time moves forward");
                let cumulative = name.ends_with("_total")
                    || name.ends_with("_bucket")
                    || name.ends_with("_count")
                    || name.ends_with("_sum");
                if cumulative {
                    assert!(
                        sample.value >= value_before,
                        "{name}: {value_before} then {}",
                        sample.value
                    );
                }
            }
            names.insert(name);
        }
    }
    assert!(
        names.contains("vllm:prefix_cache_hits_total")
            && names.contains("sglang:time_to_first_token_seconds_bucket")
            && names.contains("DCGM_FI_DEV_POWER_USAGE")
            && names.contains("mooncake_transfer_get_latency_count"),
        "{names:?}"
    );
    assert_eq!(
        jobs.into_iter().collect::<Vec<_>>(),
        ["dcgm-exporter", "mooncake", "sglang", "vllm"]
    );
    assert_eq!(ranks.len(), 8, "tp_rank 0..7");
}

#[test]
fn timestamps_never_go_back_between_requests() {
    let mut previous_max = i64::MIN;
    for body in fleet::request_bodies(Mode::Default, 30) {
        let request = decode(&body);
        let stamps = request
            .timeseries
            .iter()
            .flat_map(|ts| ts.samples.iter().map(|s| s.timestamp));
        let (lo, hi) = stamps.fold((i64::MAX, i64::MIN), |(lo, hi), t| (lo.min(t), hi.max(t)));
        assert!(
            lo >= previous_max,
            "request starts at {lo}, before {previous_max}"
        );
        previous_max = hi;
    }
}

#[test]
fn histogram_buckets_are_cumulative() {
    let request = decode(&fleet::request_bodies(Mode::Large, 1)[0]);
    // Buckets grouped by family and labels, in the order they were sent.
    let mut buckets: HashMap<LabelSet, Vec<(f64, f64)>> = HashMap::new();
    let mut counts: HashMap<LabelSet, f64> = HashMap::new();
    for ts in &request.timeseries {
        let name = label(ts, "__name__").unwrap_or_default();
        let Some(family) = name
            .strip_suffix("_bucket")
            .or_else(|| name.strip_suffix("_count"))
        else {
            continue;
        };
        let mut key: LabelSet = ts
            .labels
            .iter()
            .filter(|l| l.name != "__name__" && l.name != "le")
            .map(|l| (l.name.clone(), l.value.clone()))
            .collect();
        key.push(("family".into(), family.into()));
        if name.ends_with("_count") {
            counts.insert(key, ts.samples[0].value);
        } else {
            let le = label(ts, "le").expect("buckets have le");
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().expect("a number")
            };
            buckets
                .entry(key)
                .or_default()
                .push((bound, ts.samples[0].value));
        }
    }
    assert!(buckets.len() > 50, "{} histograms", buckets.len());
    for (key, list) in &buckets {
        assert!(
            list.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
            "{key:?}: {list:?}"
        );
        if let (Some(count), Some(&(bound, inf))) = (counts.get(key), list.last()) {
            if bound == f64::INFINITY {
                assert_eq!(*count, inf, "{key:?}: +Inf bucket equals _count");
            }
        }
    }
}

#[test]
fn exposition_is_one_scrape_of_distinct_series() {
    use promnorm::scrape::text::{self, Format, Line, SampleLine};
    let fleet = Fleet::build(&FleetShape::default(), fleet::FIXED_END_MS);
    // More series than the fleet holds: the rest repeat with a `replica` label.
    let want = fleet.series_count() + 500;
    let body = fleet.exposition(want, fleet::FIXED_END_MS);
    let mut line = SampleLine::default();
    let (mut series, mut names) = (BTreeSet::new(), Vec::<String>::new());
    text::parse(body.as_bytes(), Format::Text004, &mut line, |kind, s| {
        if let Line::Sample = kind {
            let b = body.as_bytes();
            let name = String::from_utf8_lossy(&b[s.name.clone()]).into_owned();
            let labels: Vec<(String, String)> = s
                .labels
                .iter()
                .map(|(n, v)| {
                    let n = String::from_utf8_lossy(&b[n.clone()]).into_owned();
                    (n, String::from_utf8_lossy(s.resolve(b, v)).into_owned())
                })
                .collect();
            assert!(
                !labels.iter().any(|(n, _)| n == "job" || n == "instance"),
                "{name}: target labels belong to the scraper"
            );
            assert!(s.value.is_finite(), "{name}");
            if names.last() != Some(&name) {
                assert!(!names.contains(&name), "{name}: not grouped");
                names.push(name.clone());
            }
            series.insert((name, labels));
        }
        Ok(())
    })
    .expect("the exposition parses");
    assert_eq!(series.len(), want, "distinct series");
    assert!(
        series
            .iter()
            .any(|(_, l)| l.iter().any(|(n, _)| n == "replica"))
    );
}
