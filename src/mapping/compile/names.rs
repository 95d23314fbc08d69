//! Series and family names: suffixes, the series a family covers, the outputs of a plan.

use super::*;

/// The output name of the series (its first unconditional rename) and of each
/// unconditional copy (its last rename: the copy rule's).
pub(super) fn output_names(plan: &Plan) -> Vec<String> {
    let mut out = Vec::new();
    for s in &plan.steps {
        match &s.action {
            Action::SetName(n) if s.when.is_empty() => out.push(n.to_string()),
            _ => {}
        }
    }
    out.truncate(1);
    for c in plan.copies.iter().map(|c| &c.plan) {
        if c.steps.iter().any(|s| matches!(s.action, Action::OnlyIf)) {
            continue;
        }
        let name = c.steps.iter().rev().find_map(|s| match &s.action {
            Action::SetName(n) if s.when.is_empty() => Some(n.to_string()),
            _ => None,
        });
        out.extend(name);
    }
    out
}

/// The family name without the `_total` a counter may carry.
pub(super) fn family_base(f: &str, t: FamilyType) -> &str {
    match t {
        FamilyType::Counter => f.strip_suffix("_total").unwrap_or(f),
        _ => f,
    }
}

/// The series name of kind `kind` in family `base` of type `t`.
pub(super) fn series_name(base: &str, t: FamilyType, kind: Kind) -> String {
    match (t, kind) {
        (FamilyType::Counter, Kind::Plain | Kind::Total) => {
            format!("{}_total", base.strip_suffix("_total").unwrap_or(base))
        }
        (FamilyType::Info, Kind::Plain) => base.to_string(),
        _ => format!("{base}{}", kind.suffix()),
    }
}

/// Every series name a family of type `t` consists of.
pub(super) fn covered_names(f: &str, t: FamilyType) -> Vec<(String, Kind)> {
    let base = family_base(f, t);
    let with = |k: Kind| (format!("{base}{}", k.suffix()), k);
    match t {
        FamilyType::Counter => vec![
            (base.to_string(), Kind::Total),
            with(Kind::Total),
            with(Kind::Created),
        ],
        FamilyType::Gauge => vec![(base.to_string(), Kind::Plain)],
        FamilyType::Info => vec![
            (base.to_string(), Kind::Plain),
            (format!("{base}_info"), Kind::Plain),
        ],
        FamilyType::Histogram => vec![
            with(Kind::Bucket),
            with(Kind::Sum),
            with(Kind::Count),
            with(Kind::Created),
        ],
        FamilyType::Summary => vec![
            (base.to_string(), Kind::Plain),
            with(Kind::Sum),
            with(Kind::Count),
            with(Kind::Created),
        ],
        FamilyType::Any => vec![
            (base.to_string(), Kind::Plain),
            with(Kind::Total),
            with(Kind::Bucket),
            with(Kind::Sum),
            with(Kind::Count),
            with(Kind::Created),
        ],
    }
}

/// For pattern rules: the (kind, family base) readings of a series name.
pub(super) fn candidates(name: &str, t: FamilyType) -> Vec<(Kind, &str)> {
    let mut out = Vec::with_capacity(6);
    let strip = |k: Kind| name.strip_suffix(k.suffix()).map(|b| (k, b));
    match t {
        FamilyType::Counter => {
            out.extend(strip(Kind::Total));
            out.extend(strip(Kind::Created));
            out.push((Kind::Total, name));
        }
        FamilyType::Histogram => {
            out.extend(
                [Kind::Bucket, Kind::Sum, Kind::Count, Kind::Created]
                    .into_iter()
                    .filter_map(strip),
            );
        }
        FamilyType::Summary => {
            out.extend(
                [Kind::Sum, Kind::Count, Kind::Created]
                    .into_iter()
                    .filter_map(strip),
            );
            out.push((Kind::Plain, name));
        }
        FamilyType::Gauge | FamilyType::Info => out.push((Kind::Plain, name)),
        FamilyType::Any => {
            out.extend(
                [
                    Kind::Bucket,
                    Kind::Sum,
                    Kind::Count,
                    Kind::Created,
                    Kind::Total,
                ]
                .into_iter()
                .filter_map(strip),
            );
            out.push((Kind::Plain, name));
        }
    }
    out
}
