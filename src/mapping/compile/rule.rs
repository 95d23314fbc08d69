//! Compiling one rule of a pack, and the OpenTelemetry instrument shapes.

use super::*;

pub(super) fn compile_rule(
    pack: u16,
    index: usize,
    pack_name: &str,
    spec: &RuleSpec,
    reason_id: &mut dyn FnMut(&str) -> u16,
) -> Result<CompiledRule, CompileError> {
    let err = |msg: String| CompileError::Rule {
        pack: pack_name.to_string(),
        rule: index + 1,
        msg,
    };
    let m = &spec.matcher;
    let mut fams: Vec<Box<str>> = m.families.iter().map(|s| s.as_str().into()).collect();
    if let Some(f) = &m.family {
        fams.insert(0, f.as_str().into());
    }
    let kinds = usize::from(!fams.is_empty())
        + usize::from(m.prefix.is_some())
        + usize::from(m.regex.is_some());
    if kinds != 1 {
        return Err(err(
            "match needs exactly one of family/families, prefix, regex".into(),
        ));
    }
    let matcher = if !fams.is_empty() {
        if fams.iter().any(|f| f.is_empty()) {
            return Err(err("empty family name".into()));
        }
        Matcher::Exact(fams)
    } else if let Some(p) = &m.prefix {
        if p.is_empty() {
            return Err(err("empty prefix".into()));
        }
        Matcher::Prefix(p.as_str().into())
    } else {
        let src = m.regex.as_deref().unwrap_or_default();
        let re = Regex::new(&format!("^(?:{src})$")).map_err(|e| err(format!("bad regex: {e}")))?;
        Matcher::Regex(re)
    };
    if matches!(matcher, Matcher::Exact(ref f) if f.len() > 1) && spec.rename.is_some() {
        return Err(err(
            "a rename needs a single family (use one rule per family)".into(),
        ));
    }
    let scale = spec
        .scale
        .as_deref()
        .map(Factor::parse)
        .transpose()
        .map_err(err)?
        .filter(|f| !f.is_one());
    let mut split = None;
    if let Some(s) = &spec.split_by_label {
        if s.names.is_empty() {
            return Err(err("split_by_label needs names".into()));
        }
        let mut names = Vec::with_capacity(s.names.len());
        for (v, t) in &s.names {
            let mut out = SplitOutput::default();
            if let crate::mapping::spec::SplitTarget::Full(f) = t {
                out.family_type = f.family_type;
                out.unit = f.unit.as_deref().map(Into::into);
                out.scale = f
                    .scale
                    .as_deref()
                    .map(Factor::parse)
                    .transpose()
                    .map_err(|e| err(format!("split_by_label value {v:?}: {e}")))?
                    .filter(|f| !f.is_one());
            }
            if t.name().is_empty() {
                return Err(err(format!("split_by_label value {v:?}: empty name")));
            }
            names.push((v.as_str().into(), t.name().to_string(), out));
        }
        split = Some((s.label.as_str().into(), names));
    }
    for (k, v) in spec.rename_labels.iter().chain(spec.set_labels.iter()) {
        if k.is_empty() || (v.is_empty() && !spec.set_labels.contains_key(k)) {
            return Err(err("empty label name".into()));
        }
        if k == "__name__" {
            return Err(err("use rename to change __name__".into()));
        }
    }
    let has_label_actions = !spec.rename_labels.is_empty()
        || !spec.label_values.is_empty()
        || split.is_some()
        || !spec.set_labels.is_empty()
        || !spec.drop_labels.is_empty();
    if spec.copy {
        if spec.drop.is_some() || split.is_some() {
            return Err(err(
                "a copy rule cannot drop or split_by_label (it adds a series beside the original)"
                    .into(),
            ));
        }
        if spec.rename.is_none() {
            return Err(err(
                "a copy rule needs rename (a copy under the series' own name would collide with it)"
                    .into(),
            ));
        }
    }
    let phase = if spec.copy {
        PHASE_COPY
    } else if spec.drop.is_some() {
        PHASE_DROP
    } else if scale.is_some() {
        PHASE_UNIT
    } else if spec.rename.is_some() || has_label_actions {
        PHASE_MIGRATE
    } else if spec.family_type == FamilyType::Counter {
        PHASE_TOTAL
    } else {
        PHASE_MIGRATE
    };
    let describe = format!(
        "pack {pack_name} rule {}{}",
        index + 1,
        spec.description
            .as_deref()
            .map(|d| format!(" ({d})"))
            .unwrap_or_default()
    );
    Ok(CompiledRule {
        pack,
        index,
        phase,
        matcher,
        family_type: spec.family_type,
        when: m
            .labels
            .iter()
            .map(|(k, v)| LabelCond {
                name: k.as_str().into(),
                value: Some(v.as_str().into()),
            })
            .chain(m.has_labels.iter().map(|k| LabelCond {
                name: k.as_str().into(),
                value: None,
            }))
            .collect(),
        drop: spec.drop.as_deref().map(reason_id),
        rename: spec.rename.clone(),
        scale,
        unit: spec.unit.clone(),
        help: spec.help.clone(),
        rename_labels: spec
            .rename_labels
            .iter()
            .map(|(a, b)| (a.as_str().into(), b.as_str().into()))
            .collect(),
        label_values: spec
            .label_values
            .iter()
            .flat_map(|(l, m)| {
                m.iter()
                    .map(move |(a, b)| (l.as_str().into(), a.as_str().into(), b.as_str().into()))
            })
            .collect(),
        split,
        set_labels: spec
            .set_labels
            .iter()
            .map(|(a, b)| (a.as_str().into(), b.as_str().into()))
            .collect(),
        drop_labels: spec.drop_labels.iter().map(|s| s.as_str().into()).collect(),
        copy: spec.copy,
        native_keep_unit: spec.native_histograms == super::super::spec::NativeHistograms::KeepUnit,
        describe,
    })
}

/// Prometheus' escaping of an OpenTelemetry name or attribute key: `_` for every
/// character outside `[a-zA-Z0-9_:]`.
pub(crate) fn otel_escape(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == ':' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Expands one OpenTelemetry instrument into exact rules for each of the four spellings
/// exporters and collectors produce (escaped or UTF-8, with or without the unit and
/// `_total` suffixes), all landing on the one `strategy` names; its attributes' label
/// names follow (escaped, or as registered for a UTF-8 strategy).
pub(super) fn compile_otel(
    pack: u16,
    index: usize,
    o: &crate::mapping::spec::OtelSpec,
    strategy: super::OtelNames,
) -> Vec<CompiledRule> {
    let underscored = otel_escape(&o.name);
    let unit_suffix = o
        .unit
        .as_deref()
        .filter(|u| !u.is_empty())
        .map(|u| format!("_{u}"));
    let with_unit = |n: &str| match &unit_suffix {
        Some(u) if !n.ends_with(u.as_str()) => format!("{n}{u}"),
        _ => n.to_string(),
    };
    let target = match (strategy.utf8(), strategy.suffixes()) {
        (false, true) => with_unit(&underscored),
        (false, false) => underscored.clone(),
        (true, true) => with_unit(&o.name),
        (true, false) => o.name.clone(),
    };
    let mut shapes = vec![
        o.name.clone(),
        underscored.clone(),
        with_unit(&underscored),
        with_unit(&o.name),
    ];
    shapes.sort();
    shapes.dedup();
    // A counter without suffixes is written without `_total`: each shape, with or
    // without it, is matched as a plain name (a counter rule would add `_total`).
    let bare_counter = !strategy.suffixes() && o.family_type == FamilyType::Counter;
    let matchers: Vec<(Vec<Box<str>>, FamilyType)> = shapes
        .into_iter()
        .map(|shape| {
            if bare_counter {
                let total = format!("{shape}_total").into_boxed_str();
                (vec![shape.into_boxed_str(), total], FamilyType::Gauge)
            } else {
                (vec![shape.into_boxed_str()], o.family_type)
            }
        })
        .collect();
    let rename_labels: Vec<(Box<str>, Box<str>)> = o
        .attributes
        .iter()
        .map(|a| (a.as_str(), otel_escape(a)))
        .filter(|(a, e)| a != e)
        .map(|(a, e)| {
            if strategy.utf8() {
                (e.into_boxed_str(), a.into())
            } else {
                (a.into(), e.into_boxed_str())
            }
        })
        .collect();
    matchers
        .into_iter()
        .enumerate()
        .map(|(i, (names, family_type))| CompiledRule {
            pack,
            index: index * 16 + i,
            phase: PHASE_MIGRATE,
            matcher: Matcher::Exact(names),
            family_type,
            when: Vec::new(),
            drop: None,
            rename: Some(target.clone()),
            scale: None,
            unit: o.unit.clone(),
            help: None,
            rename_labels: rename_labels.clone(),
            label_values: Vec::new(),
            split: None,
            set_labels: Vec::new(),
            drop_labels: Vec::new(),
            copy: false,
            native_keep_unit: false,
            describe: format!(
                "otel instrument {} (otel_names: {})",
                o.name,
                strategy.name()
            ),
        })
        .collect()
}
