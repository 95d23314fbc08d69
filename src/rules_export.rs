//! `promnorm rules`: the derived series ([`crate::derive::defs`]) and the sums over ranks as
//! Prometheus recording rules, so that a backend's ruler computes them instead of the
//! proxy (docs/derived.md, "Recording rules").
//!
//! Each rule writes the name and the labels promnorm writes:
//!
//! - a ratio is `rate(num[w]) / (rate(den[w]) > 0)`: one-to-one matching on every label
//!   but `__name__` pairs the inputs as promnorm does, the result keeps the inputs' labels,
//!   and a denominator that did not increase gives no sample (never NaN or Inf);
//! - the mean acceptance length is `1 + rate(accepted[w]) / (rate(drafts[w]) > 0)`;
//! - MFU is `rate(flops[w]) / PEAK`, MBU `(rate(read[w]) + rate(write[w])) / PEAK`, one
//!   term per configured peak with that figure, its exact label matchers as the selector,
//!   joined in configuration order with `or`: `or` keeps a label set from its left side
//!   only, which is promnorm's "first matching peak wins". Without any peak with the
//!   figure there is no rule, as there is no series;
//! - a sum over ranks is `sum without (RANK) (NAME{RANK!=""})`, recorded under the
//!   family's own name, as promnorm emits it (the recorded series has no rank label, so
//!   the selector never reads it back).

use std::time::Duration;

use serde::Serialize;

use crate::app::{Assemble, BuildError};
use crate::config::{Config, ConfigError, format_duration};
use crate::derive::Peak;
use crate::derive::defs::{DEFINITIONS, Definition, Formula};
use crate::mapping::Rules;
use crate::mapping::compile::Action;

/// The rule group's name.
pub const GROUP_NAME: &str = "promnorm-derived";
/// The `rate()` window when neither `--window` nor `derived.window` gives one.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(60);

/// What `promnorm rules` was asked for.
#[derive(Clone, Debug, Default)]
pub struct ExportOptions {
    /// The `rate()` window; `None`: the configuration's `derived.window`, else 1m.
    pub window: Option<Duration>,
    /// The group's evaluation interval; `None`: the ruler's `evaluation_interval`.
    pub interval: Option<Duration>,
    /// Every selector reads this far back (`offset`): for a ruler that evaluates ahead
    /// of remote-write ingestion.
    pub offset: Option<Duration>,
    /// Physical per-rank families that only a pattern of a pack names, to sum too.
    pub sum_families: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RecordingRule {
    pub record: String,
    pub expr: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Build(#[from] BuildError),
}

/// The rule file for a configuration: its packs (which families are summed over ranks)
/// and its peaks. `derived.enabled` is not consulted: the file is for a proxy that has
/// it off.
pub fn rule_file(cfg: &Config, opts: &ExportOptions) -> Result<String, ExportError> {
    let rules = cfg.compile_rules()?;
    let mut enabled = cfg.clone();
    enabled.derived.enabled = true;
    let peaks = enabled
        .derive_settings()?
        .map(|s| s.peaks)
        .unwrap_or_default();
    let window = opts.window.or(cfg.derived.window).unwrap_or(DEFAULT_WINDOW);
    let promql = Promql::new(window, opts.offset)?;
    if let Some(i) = opts.interval {
        check_duration("--interval", i)?;
    }
    let mut notes = Vec::new();
    let mut out = sum_rules(&rules, &opts.sum_families, &promql)?;
    out.extend(derived_rules(&peaks, &promql, &mut notes)?);

    let mut text = String::new();
    text.push_str(&format!(
        "# Recording rules for promnorm's derived series (`promnorm rules`, promnorm {}).\n\
         # Load them into the ruler of the backend promnorm forwards to, and run promnorm\n\
         # with `derived.enabled: false` and without `packs.sum_over_ranks`: otherwise\n\
         # both write the same series.\n\
         # rate() window {}{}.\n",
        crate::VERSION,
        promql.window,
        match opts.offset {
            Some(o) => format!(", every selector offset {}", format_duration(o)),
            None => String::new(),
        }
    ));
    let patterns = rules.sum_over_ranks_patterns();
    if !patterns.is_empty() {
        text.push_str(
            "# Sums over ranks: the physical families the packs name. Families that only a\n\
             # pattern matches need --sum-family NAME:\n",
        );
        for p in patterns {
            text.push_str(&format!("#   {p}\n"));
        }
    }
    for n in notes {
        text.push_str(&format!("# {n}\n"));
    }
    text.push_str(&to_yaml(&out, opts.interval)?);
    Ok(text)
}

/// The rule file's YAML (no comments): one group, [`GROUP_NAME`].
pub fn to_yaml(rules: &[RecordingRule], interval: Option<Duration>) -> Result<String, ExportError> {
    #[derive(Serialize)]
    struct File<'a> {
        groups: [Group<'a>; 1],
    }
    #[derive(Serialize)]
    struct Group<'a> {
        name: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        interval: Option<String>,
        rules: &'a [RecordingRule],
    }
    let file = File {
        groups: [Group {
            name: GROUP_NAME,
            interval: interval.map(format_duration),
            rules,
        }],
    };
    crate::config::yaml::to_string(&file).map_err(|e| ExportError::Invalid(e.message))
}

/// PromQL text with the window and offset applied.
pub struct Promql {
    window: String,
    offset: String,
}

fn check_duration(what: &str, d: Duration) -> Result<(), ExportError> {
    if d.is_zero() || d.subsec_nanos() % 1_000_000 != 0 {
        return Err(ExportError::Invalid(format!(
            "{what} must be a positive whole number of milliseconds"
        )));
    }
    Ok(())
}

impl Promql {
    pub fn new(window: Duration, offset: Option<Duration>) -> Result<Promql, ExportError> {
        check_duration("the rate() window", window)?;
        if let Some(o) = offset {
            check_duration("--offset", o)?;
        }
        Ok(Promql {
            window: format_duration(window),
            offset: offset
                .map(|o| format!(" offset {}", format_duration(o)))
                .unwrap_or_default(),
        })
    }

    /// `rate(name{matchers}[window] offset …)`.
    fn rate(&self, name: &str, matchers: &str) -> String {
        format!("rate({name}{matchers}[{}]{})", self.window, self.offset)
    }
}

/// Label matchers `{a="b",…}` (empty text for none).
fn selector(matchers: &[(String, String)]) -> String {
    if matchers.is_empty() {
        return String::new();
    }
    let inner: Vec<String> = matchers
        .iter()
        .map(|(n, v)| format!("{n}=\"{}\"", escape(v)))
        .collect();
    format!("{{{}}}", inner.join(","))
}

/// A PromQL double-quoted string's contents.
fn escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out
}

fn is_label_name(n: &str) -> bool {
    let mut cs = n.chars();
    cs.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && cs.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn is_metric_name(n: &str) -> bool {
    let mut cs = n.chars();
    cs.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && cs.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// A number as PromQL reads it back exactly (shortest round-trip form).
fn number(v: f64) -> String {
    format!("{v:e}")
}

/// One rule per derived series: every ratio, and MFU/MBU where a peak gives the figure.
/// `notes` gets a line per peak left out.
pub fn derived_rules(
    peaks: &[Peak],
    promql: &Promql,
    notes: &mut Vec<String>,
) -> Result<Vec<RecordingRule>, ExportError> {
    // Peaks usable as PromQL selectors, in configuration order.
    let mut usable: Vec<(String, &Peak)> = Vec::new();
    for (i, p) in peaks.iter().enumerate() {
        if let Some((n, _)) = p
            .matchers
            .iter()
            .find(|(n, _)| !is_label_name(n) || n == "__name__")
        {
            return Err(ExportError::Invalid(format!(
                "derived.peaks[{i}]: {n:?} cannot be matched in PromQL (a label name such as model_name is needed)"
            )));
        }
        // promnorm never sees a label with an empty value (Prometheus drops them), so such
        // a peak matches nothing; PromQL's `a=""` would match every series without `a`.
        if p.matchers.iter().any(|(_, v)| v.is_empty()) {
            notes.push(format!(
                "derived.peaks[{i}] left out: it matches a label to \"\", which no series has"
            ));
            continue;
        }
        usable.push((selector(&p.matchers), p));
    }
    let mut out = Vec::new();
    for d in DEFINITIONS {
        if let Some(expr) = derived_expr(d, &usable, promql) {
            out.push(RecordingRule {
                record: d.name.to_string(),
                expr,
            });
        }
    }
    Ok(out)
}

fn derived_expr(d: &Definition, peaks: &[(String, &Peak)], q: &Promql) -> Option<String> {
    let ratio = || {
        format!(
            "{} / ({} > 0)",
            q.rate(d.inputs[0], ""),
            q.rate(d.inputs[1], "")
        )
    };
    let per_peak = |figure: fn(&Peak) -> Option<f64>, term: &dyn Fn(&str) -> String| {
        let terms: Vec<String> = peaks
            .iter()
            .filter_map(|(sel, p)| Some(format!("{} / {}", term(sel), number(figure(p)?))))
            .collect();
        (!terms.is_empty()).then(|| terms.join(" or "))
    };
    match d.formula {
        Formula::Ratio => Some(ratio()),
        Formula::OnePlusRatio => Some(format!("1 + {}", ratio())),
        Formula::ShareOfSum => Some(format!(
            "{a} / (({a} + {}) > 0)",
            q.rate(d.inputs[1], ""),
            a = q.rate(d.inputs[0], "")
        )),
        Formula::FlopsUtilisation => per_peak(|p| p.flops, &|sel| q.rate(d.inputs[0], sel)),
        Formula::BandwidthUtilisation => per_peak(|p| p.bandwidth, &|sel| {
            format!(
                "({} + {})",
                q.rate(d.inputs[0], sel),
                q.rate(d.inputs[1], sel)
            )
        }),
    }
}

/// The rank label a final series name is summed over, when promnorm sums it: a physical
/// family of a pack with `sum_over_ranks`, that no rule drops or renames further.
fn summed_over(rules: &Rules, name: &str) -> Option<String> {
    let plan = rules.plan_for(name)?;
    let mut label = None;
    for s in &plan.steps {
        match &s.action {
            Action::SumOverRanks(l) => label = Some(l.to_string()),
            Action::Drop(_) if s.when.is_empty() => return None,
            Action::SetName(n) if s.when.is_empty() && &**n != name => return None,
            _ => {}
        }
    }
    label
}

/// One rule per family summed over ranks: those the packs name, then `extra`.
pub fn sum_rules(
    rules: &Rules,
    extra: &[String],
    promql: &Promql,
) -> Result<Vec<RecordingRule>, ExportError> {
    let mut families: Vec<(String, String)> = rules
        .known_names()
        .filter_map(|n| summed_over(rules, n).map(|l| (n.to_string(), l)))
        .collect();
    families.sort();
    for name in extra {
        if families.iter().any(|(n, _)| n == name) {
            continue;
        }
        let label = is_metric_name(name)
            .then(|| summed_over(rules, name))
            .flatten()
            .ok_or_else(|| {
                ExportError::Invalid(format!(
                    "--sum-family {name:?}: not a physical per-rank family that the configuration sums over ranks (packs.sum_over_ranks)"
                ))
            })?;
        families.push((name.clone(), label));
    }
    Ok(families
        .into_iter()
        .map(|(name, label)| RecordingRule {
            expr: format!(
                "sum without ({label}) ({name}{{{label}!=\"\"}}{})",
                promql.offset
            ),
            record: name,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(yaml: &str) -> Config {
        Config::parse(yaml, "test.yaml").expect("parses")
    }

    fn rules_of(yaml: &str, opts: &ExportOptions) -> Vec<RecordingRule> {
        #[derive(serde::Deserialize)]
        struct File {
            groups: Vec<Group>,
        }
        #[derive(serde::Deserialize)]
        struct Group {
            name: String,
            rules: Vec<Rule>,
        }
        #[derive(serde::Deserialize)]
        struct Rule {
            record: String,
            expr: String,
        }
        let text = rule_file(&cfg(yaml), opts).expect("exports");
        let f: File = crate::config::yaml::from_str(&text).expect("the file is YAML");
        assert_eq!(f.groups.len(), 1);
        assert_eq!(f.groups[0].name, GROUP_NAME);
        f.groups
            .into_iter()
            .next()
            .unwrap()
            .rules
            .into_iter()
            .map(|r| RecordingRule {
                record: r.record,
                expr: r.expr,
            })
            .collect()
    }

    fn expr<'a>(rules: &'a [RecordingRule], name: &str) -> Option<&'a str> {
        rules
            .iter()
            .find(|r| r.record == name)
            .map(|r| r.expr.as_str())
    }

    #[test]
    fn ratios_filter_zero_denominators_and_utilisation_needs_a_peak() {
        let r = rules_of("", &ExportOptions::default());
        assert_eq!(
            expr(&r, "vllm:prefix_cache_hit_ratio"),
            Some(
                "rate(vllm:prefix_cache_hits_total[1m]) / (rate(vllm:prefix_cache_queries_total[1m]) > 0)"
            )
        );
        assert_eq!(
            expr(&r, "vllm:spec_decode_mean_acceptance_length"),
            Some(
                "1 + rate(vllm:spec_decode_num_accepted_tokens_total[1m]) / (rate(vllm:spec_decode_num_drafts_total[1m]) > 0)"
            )
        );
        assert_eq!(
            expr(&r, "nv_cache_hit_ratio"),
            Some(
                "rate(nv_cache_num_hits_per_model_total[1m]) / ((rate(nv_cache_num_hits_per_model_total[1m]) + rate(nv_cache_num_misses_per_model_total[1m])) > 0)"
            )
        );
        // Every ratio, no MFU/MBU without peaks, nothing summed by default.
        let ratios = DEFINITIONS
            .iter()
            .filter(|d| {
                matches!(
                    d.formula,
                    Formula::Ratio | Formula::OnePlusRatio | Formula::ShareOfSum
                )
            })
            .count();
        assert_eq!(r.len(), ratios, "{r:#?}");
    }

    #[test]
    fn peaks_become_selectors_and_constants_first_match_wins_through_or() {
        let yaml = r#"
derived:
  enabled: false
  window: 30s
  peaks:
    - match: {model_name: "llama", gpu_type: "h100"}
      gpu: H100-SXM
    - match: {gpu_type: "h200"}
      flops: 2.0e15
    - match: {model_name: "we\"ird\\"}
      bandwidth: 4.8e12
    - match: {}
      gpu: A100-80GB
"#;
        let r = rules_of(yaml, &ExportOptions::default());
        assert_eq!(
            expr(&r, "vllm:mfu_ratio"),
            Some(
                "rate(vllm:estimated_flops_per_gpu_total{gpu_type=\"h100\",model_name=\"llama\"}[30s]) / 9.89e14 \
                 or rate(vllm:estimated_flops_per_gpu_total{gpu_type=\"h200\"}[30s]) / 2e15 \
                 or rate(vllm:estimated_flops_per_gpu_total[30s]) / 3.12e14"
            )
        );
        // The flops-only peak gives no MBU term.
        assert_eq!(
            expr(&r, "sglang:mbu_ratio"),
            Some(
                "(rate(sglang:estimated_read_bytes_per_gpu_total{gpu_type=\"h100\",model_name=\"llama\"}[30s]) + rate(sglang:estimated_write_bytes_per_gpu_total{gpu_type=\"h100\",model_name=\"llama\"}[30s])) / 3.35e12 \
                 or (rate(sglang:estimated_read_bytes_per_gpu_total{model_name=\"we\\\"ird\\\\\"}[30s]) + rate(sglang:estimated_write_bytes_per_gpu_total{model_name=\"we\\\"ird\\\\\"}[30s])) / 4.8e12 \
                 or (rate(sglang:estimated_read_bytes_per_gpu_total[30s]) + rate(sglang:estimated_write_bytes_per_gpu_total[30s])) / 2.039e12"
            )
        );
        // --window overrides derived.window; --offset reaches every selector.
        let r = rules_of(
            "derived: {peaks: [{match: {}, flops: 1.0e15}]}",
            &ExportOptions {
                window: Some(Duration::from_millis(1500)),
                offset: Some(Duration::from_secs(120)),
                ..Default::default()
            },
        );
        assert_eq!(
            expr(&r, "vllm:mfu_ratio"),
            Some("rate(vllm:estimated_flops_per_gpu_total[1500ms] offset 2m) / 1e15")
        );
        assert_eq!(expr(&r, "vllm:mbu_ratio"), None, "no bandwidth, no MBU");
    }

    #[test]
    fn only_bandwidth_gives_mbu_only_and_empty_values_are_left_out() {
        let yaml =
            "derived: {peaks: [{match: {pod: \"\"}, gpu: H100}, {match: {}, bandwidth: 1.0e12}]}";
        let r = rules_of(yaml, &ExportOptions::default());
        assert_eq!(expr(&r, "vllm:mfu_ratio"), None);
        assert_eq!(
            expr(&r, "vllm:mbu_ratio"),
            Some(
                "(rate(vllm:estimated_read_bytes_per_gpu_total[1m]) + rate(vllm:estimated_write_bytes_per_gpu_total[1m])) / 1e12"
            )
        );
        let text = rule_file(&cfg(yaml), &ExportOptions::default()).unwrap();
        assert!(text.contains("# derived.peaks[0] left out"), "{text}");
    }

    #[test]
    fn sums_over_ranks_cover_the_named_physical_families_and_extra_ones() {
        let yaml = "packs: {sum_over_ranks: {sglang: true}}";
        let opts = ExportOptions {
            sum_families: vec!["sglang:hicache_backup_bytes_total".into()],
            interval: Some(Duration::from_secs(15)),
            ..Default::default()
        };
        let r = rules_of(yaml, &opts);
        assert_eq!(
            expr(&r, "sglang:kv_transfer_total_bytes"),
            Some("sum without (tp_rank) (sglang:kv_transfer_total_bytes{tp_rank!=\"\"})")
        );
        assert!(expr(&r, "sglang:kv_transfer_latency_seconds_bucket").is_some());
        assert!(expr(&r, "sglang:hicache_backup_bytes_total").is_some());
        // Not summed: the names before the rename, logical families, other packs.
        for name in [
            "sglang:kv_transfer_total_mb",
            "sglang:kv_transfer_latency_ms_bucket",
            "sglang:num_running_reqs",
            "vllm:kv_offload_load_bytes_total",
        ] {
            assert!(expr(&r, name).is_none(), "{name}");
        }
        let text = rule_file(&cfg(yaml), &opts).unwrap();
        assert!(text.contains("interval: 15s"), "{text}");
        assert!(text.contains("pack sglang: families under"), "{text}");

        // An extra family must be one the configuration sums.
        for bad in [
            "sglang:num_running_reqs",
            "vllm:x_bytes_total",
            "not a name",
        ] {
            let e = rule_file(
                &cfg(yaml),
                &ExportOptions {
                    sum_families: vec![bad.into()],
                    ..Default::default()
                },
            )
            .unwrap_err();
            assert!(e.to_string().contains("--sum-family"), "{e}");
        }
        // Without sum_over_ranks, nothing is summed.
        let r = rules_of("", &ExportOptions::default());
        assert!(r.iter().all(|r| !r.expr.starts_with("sum")), "{r:#?}");
    }

    #[test]
    fn bad_windows_and_matchers_are_errors() {
        for opts in [
            ExportOptions {
                window: Some(Duration::ZERO),
                ..Default::default()
            },
            ExportOptions {
                offset: Some(Duration::from_micros(1500)),
                ..Default::default()
            },
        ] {
            assert!(rule_file(&cfg(""), &opts).is_err());
        }
        let e = rule_file(
            &cfg("derived: {peaks: [{match: {\"a-b\": x}, flops: 1.0}]}"),
            &ExportOptions::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("derived.peaks[0]"), "{e}");
    }

    #[test]
    fn numbers_read_back_exactly() {
        for v in [989e12, 3.35e12, 362.05e12, 1307.4e12, 1.0 / 3.0] {
            assert_eq!(number(v).parse::<f64>().unwrap(), v);
        }
    }
}
