//! Plans: the steps a series name goes through, rule by rule and phase by phase.

use super::*;

impl Rules {
    /// Builds the plan for a series name by walking the phases; a rename in one phase
    /// makes later phases match the new name.
    pub fn plan_for(&self, name: &str) -> Option<Plan> {
        let mut plan = self.plan_with(name, true)?;
        if plan.native_only {
            // What a float series of this name (no native histograms) goes through.
            plan.without_native = self.plan_with(name, false).map(|mut p| {
                p.note_label_keeping();
                Arc::new(p)
            });
        }
        plan.note_label_keeping();
        Some(plan)
    }

    /// [`Rules::plan_for`], with histogram rules covering the plain name (the native
    /// histogram series) or not.
    fn plan_with(&self, name: &str, native: bool) -> Option<Plan> {
        let mut plan = Plan::default();
        let (mut by_native, mut by_other) = (false, false);
        let mut cur = name.to_string();
        if self.drop_created && name.ends_with("_created") {
            plan.steps.push(Step {
                when: Vec::new(),
                action: Action::Drop(self.created_reason),
                pack: u16::MAX,
            });
            plan.trace
                .push("drop_created_series: dropped (holds a timestamp, not a value)".into());
            return Some(plan);
        }
        let mut phase_done_dedup = false;
        for r in &self.rules {
            if r.phase > PHASE_DEDUP && !phase_done_dedup {
                self.add_dedup(&cur, &mut plan);
                phase_done_dedup = true;
            }
            let Some((kind, target_base)) = self.cover(r, &cur) else {
                continue;
            };
            if kind == Kind::Native {
                if !native {
                    continue;
                }
                by_native = true;
            } else {
                by_other = true;
            }
            if r.native_keep_unit && matches!(kind, Kind::Native | Kind::Plain) {
                plan.native_keep_unit = true;
            }
            if r.copy {
                let copy = self.copy_plan(r, kind, &target_base, &cur, &plan);
                plan.trace.extend(copy.trace.last().cloned());
                plan.copies.push(CopyPlan {
                    plan: copy,
                    unit: r.unit.as_deref().map(Into::into),
                    help: r.help.as_deref().map(Into::into),
                });
                continue;
            }
            if let Some(reason) = r.drop {
                plan.steps.push(Step {
                    when: r.when.clone(),
                    action: Action::Drop(reason),
                    pack: r.pack,
                });
                plan.trace.push(format!(
                    "{}: drop ({})",
                    r.describe, self.reasons[reason as usize]
                ));
                continue;
            }
            let when = r.when.clone();
            self.rule_steps(r, kind, &target_base, &when, &mut cur, &mut plan);
        }
        if !phase_done_dedup {
            self.add_dedup(&cur, &mut plan);
        }
        plan.native_only = by_native && !by_other;
        if plan.steps.is_empty() && plan.copies.is_empty() {
            return None;
        }
        self.track_rename(name, &mut plan);
        self.track_family(name, &mut plan);
        Some(plan)
    }

    /// Appends the steps of rule `r` (already known to cover the series, of `kind`, new
    /// family base `target_base`) under the condition `when`, and its `explain` line.
    pub(super) fn rule_steps(
        &self,
        r: &CompiledRule,
        kind: Kind,
        target_base: &str,
        when: &[LabelCond],
        cur: &mut String,
        plan: &mut Plan,
    ) {
        let steps_before = plan.steps.len();
        // What this rule does, in words, for `explain`.
        let mut details: Vec<String> = Vec::new();
        if !r.when.is_empty() {
            let cond: Vec<String> = r.when.iter().map(LabelCond::to_string).collect();
            details.push(format!("only series with {}", cond.join(", ")));
        }
        let pack = r.pack;
        let push = |plan: &mut Plan, action: Action| {
            plan.steps.push(Step {
                when: when.to_vec(),
                action,
                pack,
            })
        };
        for (from, to) in &r.rename_labels {
            details.push(format!("label {from} → {to}"));
            push(
                plan,
                Action::RenameLabel {
                    from: from.clone(),
                    to: to.clone(),
                },
            );
        }
        for (label, from, to) in &r.label_values {
            details.push(format!("{label}=\"{from}\" → {label}=\"{to}\""));
            push(
                plan,
                Action::MapLabelValue {
                    label: label.clone(),
                    from: from.clone(),
                    to: to.clone(),
                },
            );
        }
        // Where the split's steps start: an implicit rename (a counter's `_total`) goes
        // before them, so that it names the series the split leaves alone and does not
        // overwrite the names the split gives.
        let split_at = plan.steps.len();
        if let Some((label, split)) = &r.split {
            let mut to: Vec<String> = Vec::with_capacity(split.len());
            let mut names: Vec<(Box<str>, Box<str>)> = Vec::with_capacity(split.len());
            for (v, base, out) in split {
                let t = out.family_type.unwrap_or(r.family_type);
                // A counter's `F_total` split into a gauge is the gauge's plain series.
                let k = if kind == Kind::Total && t != FamilyType::Counter {
                    Kind::Plain
                } else {
                    kind
                };
                let name = series_name(base, t, k);
                let mut words = format!("{v} → {name}");
                // This value's own factor: a Scale step only for series carrying it,
                // before the split removes the label.
                if let Some(factor) = out.scale
                    && let Some(target) = scale_target(kind)
                {
                    words.push_str(&format!(" ({factor})"));
                    let mut cond = when.to_vec();
                    cond.push(LabelCond {
                        name: label.clone(),
                        value: Some(v.clone()),
                    });
                    plan.steps.push(Step {
                        when: cond,
                        action: Action::Scale { factor, target },
                        pack,
                    });
                    plan.rescales = true;
                }
                to.push(words);
                names.push((v.clone(), name.into_boxed_str()));
            }
            details.push(format!(
                "split by {label}: {}; other values keep the name",
                to.join(", ")
            ));
            push(
                plan,
                Action::SplitByLabel {
                    label: label.clone(),
                    names,
                    outputs: split.iter().map(|(_, _, o)| o.clone()).collect(),
                },
            );
        }
        for (n, v) in &r.set_labels {
            details.push(format!("sets {n}=\"{v}\""));
            push(
                plan,
                Action::SetLabel {
                    name: n.clone(),
                    value: v.clone(),
                },
            );
        }
        for n in &r.drop_labels {
            details.push(format!("drops label {n}"));
            push(plan, Action::DropLabel(n.clone()));
        }
        if let Some(factor) = r.scale {
            let target = scale_target(kind);
            details.push(match target {
                _ if kind == Kind::Native => native_scale_words(factor),
                Some(ScaleTarget::Value) => format!("values {factor}"),
                Some(ScaleTarget::Le) => {
                    format!("le values {factor} (bucket counts unchanged)")
                }
                None if kind == Kind::Count => "a count: not rescaled".into(),
                None => "a timestamp: not rescaled".into(),
            });
            if let Some(target) = target {
                push(plan, Action::Scale { factor, target });
            }
            plan.rescales = true;
            if r.native_keep_unit && matches!(kind, Kind::Native | Kind::Plain) {
                details.push("native histograms: keep_unit (not renamed, counted)".into());
            } else if kind == Kind::Plain && r.family_type == FamilyType::Any {
                details.push(native_scale_words(factor));
            }
        }
        let new_name = series_name(target_base, r.family_type, kind);
        let renamed = new_name != *cur;
        if renamed {
            let step = Step {
                when: when.to_vec(),
                action: Action::SetName(new_name.as_str().into()),
                pack,
            };
            if r.split.is_some() && r.rename.is_none() {
                plan.steps.insert(split_at, step);
            } else {
                plan.steps.push(step);
            }
            if self.packs[pack as usize].keep_original && !r.copy {
                plan.keep_original = true;
            }
            *cur = new_name;
        }
        if plan.steps.len() > steps_before {
            // Prometheus 3's `__type__`/`__unit__`, where a series carries them, say what
            // the family is after this rule.
            let type_ = prometheus_type(r.family_type);
            let unit = match (&r.unit, r.scale) {
                (Some(u), _) => Some(u.as_str().into()),
                (None, Some(_)) => Some("".into()),
                (None, None) => None,
            };
            if type_.is_some() || unit.is_some() {
                plan.steps.push(Step {
                    when: when.to_vec(),
                    action: Action::TypeAndUnit {
                        type_: type_.map(Into::into),
                        unit,
                    },
                    pack,
                });
            }
            let mut line = r.describe.clone();
            if !details.is_empty() {
                line.push_str(": ");
                line.push_str(&details.join("; "));
            }
            if renamed {
                line.push_str(" → ");
                line.push_str(cur);
            }
            plan.trace.push(line);
        }
    }

    /// The plan of the copy that copy rule `r` makes of a series whose own plan so far is
    /// `main` (its name now `cur`): `main`'s steps, then the rule's, gated by its labels.
    pub(super) fn copy_plan(
        &self,
        r: &CompiledRule,
        kind: Kind,
        target_base: &str,
        cur: &str,
        main: &Plan,
    ) -> Plan {
        let mut copy = Plan {
            steps: main.steps.clone(),
            rescales: main.rescales,
            ..Plan::default()
        };
        if !r.when.is_empty() {
            copy.steps.push(Step {
                when: r.when.clone(),
                action: Action::OnlyIf,
                pack: r.pack,
            });
        }
        let mut name = cur.to_string();
        self.rule_steps(r, kind, target_base, &[], &mut name, &mut copy);
        let mut line = copy.trace.pop().unwrap_or_else(|| r.describe.clone());
        line.push_str(" (a copy, beside the series)");
        copy.trace = vec![line];
        copy
    }

    pub(super) fn add_dedup(&self, cur: &str, plan: &mut Plan) {
        for d in &self.dedups {
            if !d.prefixes.iter().any(|p| cur.starts_with(p.as_str())) {
                continue;
            }
            let physical = d.physical_names.contains(cur)
                || d.physical_prefixes
                    .iter()
                    .any(|p| cur.starts_with(p.as_str()))
                || d.physical_suffixes
                    .iter()
                    .any(|s| cur.ends_with(s.as_str()));
            if physical {
                plan.trace.push(format!(
                    "pack {}: physical per-rank family, every {} kept",
                    self.packs[d.pack as usize].name, d.label
                ));
                if d.sum_over_ranks {
                    plan.steps.push(Step {
                        when: Vec::new(),
                        action: Action::SumOverRanks(d.label.clone()),
                        pack: d.pack,
                    });
                    plan.trace.push(format!(
                        "pack {}: also summed over {} (a series without it)",
                        self.packs[d.pack as usize].name, d.label
                    ));
                }
                continue;
            }
            plan.steps.push(Step {
                when: Vec::new(),
                action: Action::RankDedup {
                    label: d.label.clone(),
                    keep: d.keep.clone(),
                },
                pack: d.pack,
            });
            plan.trace.push(format!(
                "pack {}: logical family, only {}=\"{}\" kept",
                self.packs[d.pack as usize].name, d.label, d.keep
            ));
        }
    }

    /// Does rule `r` cover series `name`? Returns its kind and the new family base.
    pub(super) fn cover(&self, r: &CompiledRule, name: &str) -> Option<(Kind, String)> {
        match &r.matcher {
            Matcher::Exact(fams) => {
                for f in fams {
                    for (n, kind) in covered_names(f, r.family_type) {
                        if n == name {
                            let base = r
                                .rename
                                .clone()
                                .unwrap_or_else(|| family_base(f, r.family_type).to_string());
                            return Some((kind, base));
                        }
                    }
                }
                None
            }
            Matcher::Prefix(p) => {
                let rest = name.strip_prefix(&**p)?;
                match &r.rename {
                    // A prefix rename replaces the prefix; the series keeps its suffix.
                    Some(to) => Some((Kind::Plain, format!("{to}{rest}"))),
                    None => Some((Kind::Plain, name.to_string())),
                }
            }
            Matcher::Regex(re) => {
                for (kind, base) in candidates(name, r.family_type) {
                    if let Some(caps) = re.captures(base) {
                        let target = match &r.rename {
                            Some(t) => {
                                let mut out = String::new();
                                caps.expand(t, &mut out);
                                out
                            }
                            None => family_base(base, r.family_type).to_string(),
                        };
                        return Some((kind, target));
                    }
                }
                None
            }
        }
    }

    /// Gives a plan its per-family counters' slot, under the pack of its first step.
    fn track_family(&self, name: &str, plan: &mut Plan) {
        let pack = plan
            .steps
            .iter()
            .chain(plan.copies.iter().flat_map(|c| c.plan.steps.iter()))
            .map(|s| s.pack)
            .find(|p| (*p as usize) < self.packs.len())
            .unwrap_or(0);
        let mut rule = plan.trace.join("; ");
        for c in &plan.copies {
            for t in &c.plan.trace {
                rule.push_str("; ");
                rule.push_str(t);
            }
        }
        plan.family_slot = Some(self.families.slot(pack, name, "", &rule));
    }

    /// Gives a plan that renames the series its cut-over tracking slot.
    fn track_rename(&self, name: &str, plan: &mut Plan) {
        let mut pack = None;
        let mut to: Vec<&str> = Vec::new();
        for s in &plan.steps {
            match &s.action {
                Action::SetName(n) => {
                    pack = Some(s.pack);
                    to.retain(|_| !s.when.is_empty());
                    to.push(n);
                }
                Action::SplitByLabel { names, .. } => {
                    pack = Some(s.pack);
                    to.extend(names.iter().map(|(_, n)| &**n));
                }
                _ => {}
            }
        }
        let Some(pack) = pack.filter(|p| (*p as usize) < self.packs.len()) else {
            return;
        };
        to.dedup();
        let rule = plan.trace.join("; ");
        plan.rename_slot = Some(self.renames.slot(pack, name, &to.join("|"), &rule));
    }
}

/// What a rescale does to a native histogram series, in `explain`'s words.
pub(super) fn native_scale_words(factor: Factor) -> String {
    let exp = match super::super::number::power_of_two(factor) {
        Some(k) => format!("exponential schemas: bucket indices shift by {k}·2^schema (exact)"),
        None => format!(
            "exponential schemas: re-bucketed into a float histogram ({factor} is no power \
             of two; a quantile moves by at most one bucket width)"
        ),
    };
    format!(
        "native histograms: custom bounds (NHCB) and sum {factor} (exact); {exp}; zero threshold {factor}; counts unchanged"
    )
}

/// What a factor rescales in a series of this kind (`None`: counts and timestamps).
fn scale_target(kind: Kind) -> Option<ScaleTarget> {
    match kind {
        // A native histogram series' float samples (if any) are values; its histograms
        // take the factor whatever the target (`apply::native`).
        Kind::Plain | Kind::Total | Kind::Sum | Kind::Native => Some(ScaleTarget::Value),
        Kind::Bucket => Some(ScaleTarget::Le),
        Kind::Count | Kind::Created => None,
    }
}

/// A family type as Prometheus 3 writes it in `__type__`; `None` for `any`.
fn prometheus_type(t: FamilyType) -> Option<&'static str> {
    match t {
        FamilyType::Any => None,
        FamilyType::Counter => Some("counter"),
        FamilyType::Gauge => Some("gauge"),
        FamilyType::Histogram => Some("histogram"),
        FamilyType::Summary => Some("summary"),
        FamilyType::Info => Some("info"),
    }
}
