//! Metadata plans: what happens to a family's metadata, and which units it ends in.

use super::*;

/// A split's (value, name) pairs and, per pair, its own type, unit and factor.
type SplitNames<'a> = (&'a [(Box<str>, Box<str>)], &'a [SplitOutput]);

/// What one linear plan (a series' own, or a copy's) makes of its family's metadata:
/// `None` when it drops the family. Only unconditional steps count: metadata carries no
/// labels to match. `strip` is the series suffix the family was probed with; `unit` and
/// `help` the rule's `unit:` and `help:`, if any.
pub(super) fn metadata_outputs(
    steps: &[Step],
    family: &str,
    strip: &str,
    unit: Option<&str>,
    help: Option<&str>,
) -> Option<Vec<MetadataOutput>> {
    let mut name: Option<&str> = None;
    let mut split: Option<SplitNames<'_>> = None;
    let mut factor = Factor::ONE;
    for s in steps.iter().filter(|s| s.when.is_empty()) {
        match &s.action {
            Action::Drop(_) => return None,
            // A later rename renames split series too.
            Action::SetName(n) => (name, split) = (Some(&**n), None),
            Action::SplitByLabel { names, outputs, .. } => split = Some((names, outputs)),
            Action::Scale { factor: f, .. } => factor = factor.then(*f),
            _ => {}
        }
    }
    let strip = |n: &str| -> Box<str> { n.strip_suffix(strip).unwrap_or(n).into() };
    let none = SplitOutput::default();
    let names: Vec<(Box<str>, &SplitOutput)> = match (split, name) {
        // Each family a split produces; a series with a value the split does not
        // name keeps the old name, but carries no metadata of its own.
        (Some((split, outs)), _) => split
            .iter()
            .enumerate()
            .map(|(i, (_, n))| (strip(n), outs.get(i).unwrap_or(&none)))
            .collect(),
        (None, Some(n)) => vec![(strip(n), &none)],
        (None, None) => vec![(family.into(), &none)],
    };
    let outputs = names
        .into_iter()
        .map(|(name, out)| {
            let factor = out.scale.map_or(factor, |f| factor.then(f));
            let rescale = (!factor.is_one()).then_some(factor);
            let unit = out.unit.as_deref().or(unit);
            let help_unit = rescale.and_then(|_| {
                crate::mapping::meta::unit_of_name(&name)
                    .or_else(|| unit.and_then(crate::mapping::meta::unit_named))
            });
            // A rescaled family's old unit is wrong: the rule's, else the name's, else none.
            let unit = match (unit, rescale) {
                (Some(u), _) => Some(u.into()),
                (None, Some(_)) => Some(help_unit.map_or("", |u| u.unit).into()),
                (None, None) => None,
            };
            MetadataOutput {
                name,
                unit,
                rescale,
                help_unit,
                family_type: out.family_type,
                help: help.map(Into::into),
            }
        })
        .collect();
    Some(outputs)
}

impl Rules {
    /// What forwarded metadata of `family` becomes, or `None` when no rule changes it.
    /// Tries the family as a series name, then as a histogram/counter base. Only
    /// unconditional steps count: metadata carries no labels to match.
    pub fn metadata_plan(&self, family: &str) -> Option<MetadataPlan> {
        for (suffix, strip) in [("", ""), ("_bucket", "_bucket"), ("_total", "")] {
            let probe = format!("{family}{suffix}");
            let plan = match self.lookup(&probe) {
                Some(Resolution::Plan(p)) => Some(p.clone()),
                Some(Resolution::OutputName) => None,
                None if self.needs_pattern_lookup() => self.plan_for(&probe).map(Arc::new),
                None => None,
            };
            let Some(plan) = plan else { continue };
            let unit = self.unit_for(&probe);
            let help = self.help_for(&probe);
            let Some(main) =
                metadata_outputs(&plan.steps, family, strip, unit.as_deref(), help.as_deref())
            else {
                return Some(MetadataPlan::default());
            };
            // The series' own metadata is unchanged: forwarded as it is, beside the copies'.
            let unchanged = main.len() == 1
                && main[0].unit.is_none()
                && main[0].help.is_none()
                && main[0].rescale.is_none()
                && &*main[0].name == family;
            if unchanged && plan.copies.is_empty() {
                continue;
            }
            let mut outputs = if unchanged { Vec::new() } else { main };
            for c in &plan.copies {
                let unit = c.unit.as_deref().or(unit.as_deref());
                outputs.extend(
                    metadata_outputs(&c.plan.steps, family, strip, unit, c.help.as_deref())
                        .unwrap_or_default(),
                );
            }
            return Some(MetadataPlan {
                keep_input: plan.keep_original || unchanged,
                outputs,
            });
        }
        None
    }

    /// The `_bucket`, `_sum` and `_count` series that rules match as members of the
    /// histogram or summary family `family` (the name `# TYPE` lines and dashboards use).
    pub fn family_members(&self, family: &str) -> Vec<String> {
        [Kind::Bucket, Kind::Sum, Kind::Count]
            .into_iter()
            .map(|kind| (kind, format!("{family}{}", kind.suffix())))
            .filter(|(kind, name)| {
                self.rules.iter().any(|r| {
                    !matches!(r.matcher, Matcher::Prefix(_))
                        && self.cover(r, name).is_some_and(|(k, _)| k == *kind)
                })
            })
            .map(|(_, name)| name)
            .collect()
    }

    pub(super) fn unit_for(&self, name: &str) -> Option<String> {
        self.rules
            .iter()
            .find(|r| r.unit.is_some() && !r.copy && self.cover(r, name).is_some())
            .and_then(|r| r.unit.clone())
    }

    /// The `help:` of the (non-copy) rule covering `name`, if any.
    pub(super) fn help_for(&self, name: &str) -> Option<String> {
        self.rules
            .iter()
            .find(|r| r.help.is_some() && !r.copy && self.cover(r, name).is_some())
            .and_then(|r| r.help.clone())
    }
}
