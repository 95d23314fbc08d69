use super::*;
use crate::wire::proto::prometheus::{Label, Sample, TimeSeries, WriteRequest};
use prost::Message;

fn series(labels: &[(&str, &str)]) -> TimeSeries {
    TimeSeries {
        labels: labels
            .iter()
            .map(|(n, v)| Label {
                name: n.to_string(),
                value: v.to_string(),
            })
            .collect(),
        samples: vec![Sample {
            value: 1.0,
            timestamp: 1,
        }],
        ..Default::default()
    }
}

fn body(series: Vec<TimeSeries>) -> Vec<u8> {
    WriteRequest {
        timeseries: series,
        ..Default::default()
    }
    .encode_to_vec()
}

fn names_and_pods(body: &[u8]) -> Vec<(String, String)> {
    WriteRequest::decode(body)
        .unwrap()
        .timeseries
        .iter()
        .map(|s| {
            let get = |n: &str| {
                s.labels
                    .iter()
                    .find(|l| l.name == n)
                    .map(|l| l.value.clone())
                    .unwrap_or_default()
            };
            (get("__name__"), get("pod"))
        })
        .collect()
}

fn many(name: &str, n: usize) -> Vec<TimeSeries> {
    (0..n)
        .map(|i| series(&[("__name__", name), ("pod", &format!("p{i:05}"))]))
        .collect()
}

fn run(g: &Guard, b: &[u8], now: u32) -> (Filtered, Vec<u8>) {
    let mut s = GuardScratch::default();
    let f = g.filter_at(b, None, None, &mut s, now).unwrap();
    let out = if f.series > 0 {
        s.out.clone()
    } else {
        b.to_vec()
    };
    (f, out)
}

#[test]
fn a_metric_over_its_limit_keeps_its_first_series_and_others_flow() {
    let g = Guard::new(GuardOptions {
        max_series_per_metric: 1000,
        ..Default::default()
    });
    let mut all = many("vllm:bad", 3000);
    all.extend(many("vllm:good", 10));
    let b = body(all);
    let (f, out) = run(&g, &b, 1);
    assert_eq!(f.series, 2000);
    assert_eq!(f.samples, 2000);
    let kept = names_and_pods(&out);
    assert_eq!(kept.len(), 1010);
    assert!(kept[..1000].iter().all(|(n, _)| n == "vllm:bad"));
    assert_eq!(kept[999].1, "p00999");
    // The next request: the same 1,000, nothing new admitted.
    let (f2, out2) = run(&g, &b, 2);
    assert_eq!(f2.series, 2000);
    assert_eq!(out2, out);
    let r = g.report(None, 10);
    assert_eq!(r.tenants[0].metrics[0].name, "vllm:bad");
    assert_eq!(r.tenants[0].metrics[0].active_series, 1000);
    assert_eq!(r.tenants[0].metrics[0].limit, Some(1000));
    assert_eq!(r.tenants[0].active_series, 1010);
}

#[test]
fn series_leave_the_window_and_free_their_place() {
    let g = Guard::new(GuardOptions {
        max_series_per_metric: 2,
        window: Duration::from_secs(100),
        ..Default::default()
    });
    let (f, _) = run(&g, &body(many("m", 2)), 1);
    assert_eq!(f.series, 0);
    let later = body(vec![series(&[("__name__", "m"), ("pod", "new")])]);
    assert_eq!(run(&g, &later, 50).0.series, 1);
    // Past the window the first two are gone: the new one gets a place.
    assert_eq!(run(&g, &later, 200).0.series, 0);
    assert_eq!(g.tracked().0, 1);
}

#[test]
fn label_limits_leave_out_only_the_series_over_them() {
    let g = Guard::new(GuardOptions {
        series_max_labels: 5,
        series_max_label_value_bytes: 100,
        ..Default::default()
    });
    let wide: Vec<(String, String)> = (0..40)
        .map(|i| (format!("l{i:02}"), "v".to_string()))
        .chain([("__name__".to_string(), "m".to_string())])
        .collect();
    let wide: Vec<(&str, &str)> = wide.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    let long = "x".repeat(5000);
    let b = body(vec![
        series(&[("__name__", "m"), ("pod", "a")]),
        series(&wide),
        series(&[("__name__", "m"), ("pod", &long)]),
        series(&[("__name__", "m"), ("pod", "b")]),
    ]);
    let (f, out) = run(&g, &b, 1);
    assert_eq!(f.series, 2);
    assert_eq!(
        names_and_pods(&out),
        vec![("m".into(), "a".into()), ("m".into(), "b".into())]
    );
}

#[test]
fn tenants_have_their_own_limits_and_overrides() {
    let mut overrides = HashMap::new();
    overrides.insert(Box::<[u8]>::from(&b"big"[..]), (None, Some(50)));
    let g = Guard::new(GuardOptions {
        max_series_per_tenant: 10,
        overrides,
        tenant_label: Some((*b"tenant").into()),
        tenant_default: Some((*b"anon").into()),
        ..Default::default()
    });
    let of = |tenant: &str, n: usize| -> Vec<TimeSeries> {
        (0..n)
            .map(|i| {
                series(&[
                    ("__name__", "m"),
                    ("pod", &format!("p{i}")),
                    ("tenant", tenant),
                ])
            })
            .collect()
    };
    let mut all = of("small", 30);
    all.extend(of("big", 60));
    all.extend(many("m", 20)); // no tenant label: the default's
    let (f, _) = run(&g, &body(all), 1);
    assert_eq!(f.series, 20 + 10 + 10);
    let r = g.report(None, 5);
    let by: HashMap<_, _> = r
        .tenants
        .iter()
        .map(|t| (t.tenant.as_str(), (t.active_series, t.limit)))
        .collect();
    assert_eq!(by["small"], (10, Some(10)));
    assert_eq!(by["big"], (50, Some(50)));
    assert_eq!(by["anon"], (10, Some(10)));
}

#[test]
fn without_limits_the_view_samples_past_its_capacity() {
    let g = Guard::new(GuardOptions {
        max_tracked_series: 1000,
        ..Default::default()
    });
    let (f, _) = run(&g, &body(many("m", 8000)), 1);
    assert_eq!(f.series, 0, "the view never leaves a series out");
    let (tracked, _) = g.tracked();
    assert!(tracked <= 1000, "{tracked}");
    let r = g.report(None, 1);
    assert!(r.estimated);
    let est = r.tenants[0].active_series as f64;
    assert!((est - 8000.0).abs() / 8000.0 < 0.25, "{est}");
}

#[test]
fn the_sample_rate_comes_back_once_the_burst_has_left_the_window() {
    let g = Guard::new(GuardOptions {
        max_tracked_series: 1000,
        ..Default::default()
    });
    run(&g, &body(many("burst", 8000)), 1);
    assert!(g.report(None, 1).sample_rate < 1.0);
    // The burst leaves the 10-minute window; a steady 100 series stay. Each sweep (a
    // tenth of the window) doubles the rate back while the sample is small.
    let steady = body(many("steady", 100));
    let mut now = 700;
    while now < 700 + 10 * 60 {
        run(&g, &steady, now);
        now += 60;
    }
    let r = g.report(None, 5);
    assert_eq!(r.sample_rate, 1.0);
    assert!(!r.estimated);
    run(&g, &steady, now);
    let r = g.report(None, 5);
    assert_eq!(
        r.tenants[0].active_series, 100,
        "every steady series counted again"
    );
}

#[test]
fn a_limit_on_tracks_exactly_and_refuses_past_capacity() {
    let g = Guard::new(GuardOptions {
        max_series_per_tenant: 100_000,
        max_tracked_series: 1000,
        ..Default::default()
    });
    let (f, _) = run(&g, &body(many("m", 1500)), 1);
    assert_eq!(f.series, 500);
    assert_eq!(g.tracked().0, 1000);
}

#[test]
fn labels_of_a_metric_by_distinct_values() {
    let g = Guard::new(GuardOptions::default());
    let all: Vec<TimeSeries> = (0..60)
        .map(|i| {
            series(&[
                ("__name__", "m"),
                ("model", if i % 2 == 0 { "a" } else { "b" }),
                ("pod", &format!("p{i}")),
            ])
        })
        .collect();
    run(&g, &body(all), 1);
    let r = g.labels(None, "m");
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].active_series, 60);
    let labels: Vec<(&str, u64)> = r[0]
        .labels
        .iter()
        .map(|l| (l.name.as_str(), l.distinct_values))
        .collect();
    assert_eq!(labels[0].0, "pod");
    assert!((50..=70).contains(&labels[0].1), "{labels:?}");
    assert_eq!(labels[1], ("model", 2));
}

#[test]
fn reconfigure_keeps_counts() {
    let g = Guard::new(GuardOptions {
        max_series_per_metric: 5,
        ..Default::default()
    });
    run(&g, &body(many("m", 5)), 1);
    g.reconfigure(GuardOptions {
        max_series_per_metric: 3,
        ..Default::default()
    });
    // Active ones keep flowing; a new one is over the lower limit.
    let mut b = many("m", 5);
    b.push(series(&[("__name__", "m"), ("pod", "x")]));
    assert_eq!(run(&g, &body(b), 2).0.series, 1);
}

#[test]
fn malformed_bodies_are_errors_not_panics() {
    let g = Guard::new(GuardOptions::default());
    let mut s = GuardScratch::default();
    for bad in [
        &[0x0a, 0x05, 0x0a][..],
        &[0x0a, 0xff][..],
        &[0x0a, 0x02, 0x0a, 0x09][..],
    ] {
        assert!(g.filter(bad, None, &mut s).is_err());
    }
}

#[test]
fn the_quick_scan_agrees_with_the_general_one() {
    let g = Guard::new(GuardOptions::default());
    let long = "v".repeat(300);
    let mut all = many("m", 3);
    all.push(series(&[
        ("__name__", "m"),
        ("pod", &long),
        ("tenant", "t"),
    ]));
    let mut h = series(&[("__name__", "h"), ("tenant", "")]);
    h.samples.push(Sample {
        value: 2.0,
        timestamp: 2,
    });
    all.push(h);
    let b = body(all);
    let mut r = Reader::new(&b, 0, b.len());
    let mut quick = 0;
    while !r.is_done() {
        let (_, _) = r.key().unwrap();
        let (s, e) = r.len_delimited().unwrap();
        let general = g.general_scan(&b, s, e, Some(b"tenant")).unwrap();
        if let Some(q) = g.quick_scan(&b, s, e, Some(b"tenant")) {
            quick += 1;
            assert_eq!(
                (
                    q.labels,
                    q.longest_value,
                    q.name,
                    q.tenant,
                    q.hash,
                    q.samples
                ),
                (
                    general.labels,
                    general.longest_value,
                    general.name,
                    general.tenant,
                    general.hash,
                    general.samples
                )
            );
        }
    }
    // The 300-byte value takes two length bytes, and prost leaves an empty value out:
    // both the general walk's.
    assert_eq!(quick, 3);
}

/// Runs `b` through the walk on one guard and through the decoder's view on another:
/// the same series left out, the same counts in the view.
fn walk_and_view_agree(opts: GuardOptions, b: &[u8]) -> usize {
    use crate::wire::decode::{DecodeLimits, DecodedRequest};
    let walk = Guard::new(opts.clone());
    let view = Guard::new(opts);
    let mut d = DecodedRequest::default();
    d.decode(b, DecodeLimits::default()).unwrap();
    let (mut sw, mut sv) = (GuardScratch::default(), GuardScratch::default());
    for now in [1, 2] {
        let fw = walk.filter_at(b, None, Some(b"hdr"), &mut sw, now).unwrap();
        let fv = view
            .filter_at(b, Some(&d), Some(b"hdr"), &mut sv, now)
            .unwrap();
        assert_eq!(fw, fv);
        if fw.series > 0 {
            assert_eq!(sw.out, sv.out);
        }
    }
    let (rw, rv) = (walk.report(None, 100), view.report(None, 100));
    assert_eq!(rw, rv);
    walk.filter_at(b, None, Some(b"hdr"), &mut sw, 3)
        .unwrap()
        .series
}

#[test]
fn the_decoders_view_and_the_walk_key_and_leave_out_alike() {
    let mut all = many("vllm:bad", 300);
    all.extend(many("vllm:good", 10));
    all.push(series(&[("__name__", "wide"), ("a", &"x".repeat(300))]));
    all.push(series(&[
        ("__name__", "tenanted"),
        ("namespace", "team-a"),
        ("pod", "p"),
    ]));
    let b = body(all);
    let left = walk_and_view_agree(
        GuardOptions {
            max_series_per_metric: 100,
            series_max_label_value_bytes: 200,
            tenant_label: Some(b"namespace".as_slice().into()),
            ..Default::default()
        },
        &b,
    );
    assert_eq!(left, 201);
    assert_eq!(walk_and_view_agree(GuardOptions::default(), &b), 0);
}

#[test]
fn a_series_length_written_long_is_walked_not_misplaced() {
    // The series left out has its length as a two-byte varint (valid protobuf, not
    // minimal): the view cannot find where its field starts, so the walk reads the
    // request; cut where the view would guess, a byte of it would stay in the body.
    let one = body(vec![series(&[("__name__", "n"), ("pod", "late")])]);
    assert!(one[1] < 0x80);
    let mut long = body(many("n", 2));
    long.extend_from_slice(&[0x0a, one[1] | 0x80, 0x00]);
    long.extend_from_slice(&one[2..]);
    let left = walk_and_view_agree(
        GuardOptions {
            max_series_per_metric: 2,
            ..Default::default()
        },
        &long,
    );
    assert_eq!(left, 1);
}
