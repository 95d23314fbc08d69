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
        // The plain name is the family's native histogram series.
        FamilyType::Histogram => vec![
            with(Kind::Bucket),
            with(Kind::Sum),
            with(Kind::Count),
            with(Kind::Created),
            (base.to_string(), Kind::Native),
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
            out.push((Kind::Native, name));
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

impl Rules {
    /// Fills the exact-name map: every series name an exact rule covers, plus every name
    /// some rule writes.
    pub(super) fn precompute(&mut self) -> Result<(), CompileError> {
        let mut inputs: Vec<String> = Vec::new();
        for r in &self.rules {
            if let Matcher::Exact(fams) = &r.matcher {
                for f in fams {
                    for (name, _) in covered_names(f, r.family_type) {
                        inputs.push(name);
                    }
                }
            }
        }
        inputs.sort();
        inputs.dedup();
        let mut outputs: AHashMap<String, String> = AHashMap::new();
        for name in &inputs {
            let plan = self.plan_for(name);
            if let Some(plan) = plan {
                for out in output_names(&plan) {
                    if let Some(prev) = outputs.get(&out)
                        && prev != name
                        && !self.collision_allowed(prev, name)
                    {
                        return Err(CompileError::Conflict(format!(
                            "{prev:?} and {name:?} are both written as {out:?} by different rules \
                             without label matchers to tell them apart"
                        )));
                    }
                    outputs.insert(out, name.clone());
                }
                self.names
                    .insert(name.as_str().into(), Resolution::Plan(Arc::new(plan)));
            }
        }
        for (out, _) in outputs {
            if let Some(Resolution::Plan(plan)) = self.names.get_mut(out.as_str()) {
                Arc::make_mut(plan).mark_output();
                continue;
            }
            // A name rules write may itself be matched by prefix or regex rules (a label
            // rename over a whole prefix): it arrives already carrying that name and must
            // get those rules too, not only the collision merge.
            let resolution = match self.plan_for(&out) {
                Some(mut plan) => {
                    plan.mark_output();
                    Resolution::Plan(Arc::new(plan))
                }
                None => Resolution::OutputName,
            };
            self.names.entry(out.into_boxed_str()).or_insert(resolution);
        }
        Ok(())
    }

    /// Renames of several old names onto one new name are the point of migrations; they
    /// are allowed when they are declared in the same pack (merged at run time).
    fn collision_allowed(&self, a: &str, b: &str) -> bool {
        let packs = |p: Plan| -> Vec<u16> {
            let copies = p.copies.iter().flat_map(|c| c.plan.steps.iter());
            p.steps.iter().chain(copies).map(|s| s.pack).collect()
        };
        let pa = self.plan_for(a).map(packs);
        let pb = self.plan_for(b).map(packs);
        match (pa, pb) {
            (Some(pa), Some(pb)) => pa.iter().any(|p| pb.contains(p)),
            _ => true,
        }
    }
}
