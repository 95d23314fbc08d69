//! Range answers (`resultType: "matrix"`) restored and merged with their points borrowed
//! from the upstream's bytes: a six-hour panel of 64 series is ~90,000 points, and as a
//! `serde_json::Value` tree each would be three allocations parsed, copied and freed.
//! Here a point is a slice of the answer it came in, looked at only for its timestamp,
//! and written once into the merged answer. Label sets (one per series) are restored
//! with [`translate::restore_labels`], as in every other answer.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::collections::btree_map::Entry;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::translate::{self, LeStyle, Translation};

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    status: Cow<'a, str>,
    #[serde(borrow)]
    data: Option<&'a RawValue>,
    #[serde(default)]
    warnings: Vec<String>,
    #[serde(default)]
    infos: Vec<String>,
}

#[derive(Deserialize)]
struct Data<'a> {
    #[serde(rename = "resultType", borrow)]
    result_type: Cow<'a, str>,
    #[serde(borrow)]
    result: &'a RawValue,
}

#[derive(Deserialize)]
struct Series<'a> {
    #[serde(default)]
    metric: Map<String, Value>,
    #[serde(borrow, default)]
    values: Vec<&'a RawValue>,
    #[serde(borrow, default)]
    histograms: Vec<&'a RawValue>,
}

/// One successful range answer, its points borrowed from `body`.
pub struct Matrix<'a> {
    series: Vec<Series<'a>>,
    pub warnings: Vec<String>,
    pub infos: Vec<String>,
}

/// `body` as a successful matrix answer; `None` for anything else (an error, another
/// result type, JSON this does not read), which the general path then handles.
pub fn parse(body: &[u8]) -> Option<Matrix<'_>> {
    let env: Envelope = serde_json::from_slice(body).ok()?;
    if env.status != "success" {
        return None;
    }
    let data: Data = serde_json::from_str(env.data?.get()).ok()?;
    if data.result_type != "matrix" {
        return None;
    }
    let series: Vec<Series> = serde_json::from_str(data.result.get()).ok()?;
    Some(Matrix {
        series,
        warnings: env.warnings,
        infos: env.infos,
    })
}

/// The answer to a translated range query: `new` (the rewritten query's answer) put back
/// into the query's terms and merged with `old` (the original query's, the history under
/// the old names) per label set and timestamp, the new side winning. Without `old` and
/// with the query's text unchanged, one answer read both periods and its series are
/// parted as [`translate::split_sides`] parts them. Returns the answer's JSON.
pub fn restore_and_merge(
    t: &Translation,
    new: Matrix<'_>,
    old: Option<Matrix<'_>>,
    own_warnings: &[String],
) -> String {
    let (mut new_series, old_series, notes) = match old {
        Some(o) => (
            new.series,
            o.series,
            [(new.warnings, new.infos), (o.warnings, o.infos)],
        ),
        None => {
            let (mut n, mut o) = (Vec::new(), Vec::new());
            let split = !t.text_changed();
            for s in new.series {
                if !split || translate::is_new_side(t, &s.metric) {
                    n.push(s);
                } else {
                    o.push(s);
                }
            }
            (n, o, [(new.warnings, new.infos), (Vec::new(), Vec::new())])
        }
    };
    let mut style = LeStyle::default();
    for s in new_series.iter().chain(&old_series) {
        if let Some(le) = s.metric.get("le").and_then(Value::as_str) {
            style.learn(le);
        }
    }
    for s in &mut new_series {
        translate::restore_labels(t, &mut s.metric, style);
    }
    let mut by_key: BTreeMap<Vec<(String, String)>, Series> = BTreeMap::new();
    for s in old_series {
        add(&mut by_key, s, false);
    }
    for s in new_series {
        add(&mut by_key, s, true);
    }
    let mut warnings: Vec<String> = own_warnings.to_vec();
    let mut infos: Vec<String> = Vec::new();
    for (w, i) in notes {
        for x in w {
            if !warnings.contains(&x) {
                warnings.push(x);
            }
        }
        for x in i {
            if !infos.contains(&x) {
                infos.push(x);
            }
        }
    }
    write(by_key.values(), &warnings, &infos)
}

/// Adds a series to `by_key`, merged with one of the same label set; with `wins` its
/// points replace the other's at a timestamp both have (a float and a histogram at one
/// timestamp are one point).
fn add<'a>(by_key: &mut BTreeMap<Vec<(String, String)>, Series<'a>>, s: Series<'a>, wins: bool) {
    match by_key.entry(translate::label_key(&s.metric)) {
        Entry::Vacant(v) => {
            v.insert(s);
        }
        Entry::Occupied(mut o) => {
            let other = std::mem::replace(
                o.get_mut(),
                Series {
                    metric: Map::new(),
                    values: Vec::new(),
                    histograms: Vec::new(),
                },
            );
            let (mut winner, loser) = if wins { (s, other) } else { (other, s) };
            let taken: std::collections::HashSet<i64> = winner
                .values
                .iter()
                .chain(&winner.histograms)
                .filter_map(|p| ts_ms(p))
                .collect();
            let keep = |p: &&RawValue| ts_ms(p).is_none_or(|t| !taken.contains(&t));
            let values: Vec<&RawValue> = loser.values.into_iter().filter(keep).collect();
            let histograms: Vec<&RawValue> = loser.histograms.into_iter().filter(keep).collect();
            winner.values = merge_sorted(std::mem::take(&mut winner.values), values);
            winner.histograms = merge_sorted(std::mem::take(&mut winner.histograms), histograms);
            *o.get_mut() = winner;
        }
    }
}

/// Two lists of points, each sorted by timestamp, as one sorted list.
fn merge_sorted<'a>(a: Vec<&'a RawValue>, b: Vec<&'a RawValue>) -> Vec<&'a RawValue> {
    if b.is_empty() {
        return a;
    }
    if a.is_empty() {
        return b;
    }
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        if ts_ms(a[i]).unwrap_or(i64::MIN) <= ts_ms(b[j]).unwrap_or(i64::MIN) {
            out.push(a[i]);
            i += 1;
        } else {
            out.push(b[j]);
            j += 1;
        }
    }
    out.extend_from_slice(&a[i..]);
    out.extend_from_slice(&b[j..]);
    out
}

/// A point's timestamp (`[1700000000.5,"1"]`) in milliseconds, read off its text.
fn ts_ms(point: &RawValue) -> Option<i64> {
    let text = point.get().trim_start();
    let text = text.strip_prefix('[')?;
    let end = text.find(',')?;
    let t: f64 = text[..end].trim().parse().ok()?;
    Some((t * 1000.0).round() as i64)
}

fn write<'s, 'a: 's>(
    series: impl Iterator<Item = &'s Series<'a>>,
    warnings: &[String],
    infos: &[String],
) -> String {
    let mut out = String::with_capacity(4096);
    out.push_str(r#"{"status":"success","data":{"resultType":"matrix","result":["#);
    for (i, s) in series.enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(r#"{"metric":"#);
        out.push_str(&Value::Object(s.metric.clone()).to_string());
        for (field, points) in [("values", &s.values), ("histograms", &s.histograms)] {
            if points.is_empty() {
                continue;
            }
            out.push_str(",\"");
            out.push_str(field);
            out.push_str("\":[");
            for (k, p) in points.iter().enumerate() {
                if k > 0 {
                    out.push(',');
                }
                out.push_str(p.get());
            }
            out.push(']');
        }
        out.push('}');
    }
    out.push_str("]}");
    for (field, list) in [("warnings", warnings), ("infos", infos)] {
        if !list.is_empty() {
            out.push_str(",\"");
            out.push_str(field);
            out.push_str("\":");
            out.push_str(&Value::from(list.to_vec()).to_string());
        }
    }
    out.push('}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn merged(new: &str, old: &str) -> Value {
        let rules = crate::migrate::test_rules("pack: t\nrules: []\n");
        let t = translate::translate(&rules, "x").unwrap();
        let out = restore_and_merge(
            &t,
            parse(new.as_bytes()).unwrap(),
            Some(parse(old.as_bytes()).unwrap()),
            &["own".to_string()],
        );
        serde_json::from_str(&out).unwrap()
    }

    #[test]
    fn only_a_successful_matrix_is_read_here() {
        assert!(parse(br#"{"status":"error","errorType":"bad_data","error":"x"}"#).is_none());
        assert!(
            parse(br#"{"status":"success","data":{"resultType":"vector","result":[]}}"#).is_none()
        );
        assert!(parse(b"not json").is_none());
        assert!(
            parse(br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#).is_some()
        );
    }

    #[test]
    fn points_merge_per_label_set_and_timestamp_the_new_side_winning() {
        let old = r#"{"status":"success","data":{"resultType":"matrix","result":[
            {"metric":{"a":"1"},"values":[[1,"1"],[2,"2"],[3,"3"]]},
            {"metric":{"a":"only-old"},"values":[[1.5,"1"]]}]},"warnings":["w-old"]}"#;
        let new = r#"{"status":"success","data":{"resultType":"matrix","result":[
            {"metric":{"a":"1"},"values":[[3,"30"],[4,"40"]],"histograms":[[2,{"count":"9"}]]}]},
            "infos":["i-new"]}"#;
        assert_eq!(
            merged(new, old),
            serde_json::json!({"status": "success", "data": {"resultType": "matrix", "result": [
                {"metric": {"a": "1"}, "values": [[1, "1"], [3, "30"], [4, "40"]],
                 "histograms": [[2, {"count": "9"}]]},
                {"metric": {"a": "only-old"}, "values": [[1.5, "1"]]}
            ]}, "warnings": ["own", "w-old"], "infos": ["i-new"]})
        );
    }

    #[test]
    fn new_series_are_restored_and_one_answer_of_both_periods_is_parted() {
        let rules = crate::migrate::test_rules(
            "pack: t\nrules:\n  - match: {prefix: \"gpu_\"}\n    rename_labels: {Hostname: hostname}\n",
        );
        // The name stays: the rewritten query asks `hostname!=""`, the original `hostname=""`.
        let t = translate::translate(&rules, "gpu_util").unwrap();
        let new = r#"{"status":"success","data":{"resultType":"matrix","result":[
            {"metric":{"__name__":"gpu_util","hostname":"h1"},"values":[[2,"20"]]}]}}"#;
        let old = r#"{"status":"success","data":{"resultType":"matrix","result":[
            {"metric":{"__name__":"gpu_util","Hostname":"h1"},"values":[[1,"10"]]}]}}"#;
        let out = restore_and_merge(
            &t,
            parse(new.as_bytes()).unwrap(),
            Some(parse(old.as_bytes()).unwrap()),
            &[],
        );
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            v["data"]["result"],
            serde_json::json!([{"metric": {"__name__": "gpu_util", "Hostname": "h1"},
                                "values": [[1, "10"], [2, "20"]]}])
        );
    }

    #[test]
    fn timestamps_are_read_off_the_text() {
        let p: Box<RawValue> = serde_json::from_str(r#"[ 1700000000.123 , "1"]"#).unwrap();
        assert_eq!(ts_ms(&p), Some(1_700_000_000_123));
        let bad: Box<RawValue> = serde_json::from_str(r#"{"a":1}"#).unwrap();
        assert_eq!(ts_ms(&bad), None);
    }
}
