//! What `GET /api/v1/cardinality` answers: per tenant, its active series and the
//! metrics with the most of them, each with its limit; for one metric, its labels by
//! number of distinct values (as Prometheus' `/api/v1/status/tsdb` and VictoriaMetrics'
//! cardinality explorer show them).

use serde::Serialize;

use super::Guard;

#[derive(Debug, Serialize, PartialEq)]
pub struct Report {
    /// `limits.active_series_window`, in seconds.
    pub active_series_window_seconds: u64,
    /// Series the tracker holds.
    pub tracked_series: usize,
    /// True when the counts are estimates: without limits, past `max_tracked_series`,
    /// one series in `1 / sample_rate` is tracked and the counts are scaled up.
    pub estimated: bool,
    pub sample_rate: f64,
    pub tenants: Vec<TenantReport>,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct TenantReport {
    /// The tenant (`""`: series without one, or no tenancy).
    pub tenant: String,
    pub active_series: u64,
    /// `max_series_per_tenant` for this tenant; `null`: off.
    pub limit: Option<usize>,
    /// Metrics of this tenant, beyond the ones listed.
    pub metrics_total: usize,
    pub metrics: Vec<MetricReport>,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct MetricReport {
    pub name: String,
    pub active_series: u64,
    /// `max_series_per_metric` for its tenant; `null`: off.
    pub limit: Option<usize>,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct LabelsReport {
    pub tenant: String,
    pub metric: String,
    pub active_series: u64,
    pub limit: Option<usize>,
    /// Each label with its estimated distinct values in the last one to two windows,
    /// most first; empty for a metric past the sketch budget.
    pub labels: Vec<LabelReport>,
    /// True when the metric had more label names than are sketched.
    pub labels_truncated: bool,
    pub estimated: bool,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct LabelReport {
    pub name: String,
    pub distinct_values: u64,
}

fn nonzero(n: usize) -> Option<usize> {
    (n > 0).then_some(n)
}

impl Guard {
    /// The tenants (only `tenant` when given), each with its `top` metrics with most
    /// series first.
    pub fn report(&self, tenant: Option<&str>, top: usize) -> Report {
        let opts = self.opts.load();
        let Ok(t) = self.tables.read() else {
            return Report {
                active_series_window_seconds: opts.window.as_secs(),
                tracked_series: 0,
                estimated: false,
                sample_rate: 1.0,
                tenants: Vec::new(),
            };
        };
        let scale = 1u64 << t.shift;
        let mut tenants: Vec<TenantReport> = t
            .tenants
            .iter()
            .flatten()
            .filter(|slot| tenant.is_none_or(|want| want.as_bytes() == &*slot.name))
            .map(|slot| {
                let (metric_limit, tenant_limit) = opts.limits_for(&slot.name);
                let mut metrics: Vec<(usize, &[u8])> = slot
                    .metrics
                    .values()
                    .filter_map(|&m| t.metrics[m as usize].as_ref())
                    .map(|m| (m.series, &*m.name))
                    .collect();
                metrics.sort_unstable_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
                let metrics_total = metrics.len();
                TenantReport {
                    tenant: String::from_utf8_lossy(&slot.name).into_owned(),
                    active_series: (slot.series as u64).saturating_mul(scale),
                    limit: nonzero(tenant_limit),
                    metrics_total,
                    metrics: metrics
                        .into_iter()
                        .take(top)
                        .map(|(n, name)| MetricReport {
                            name: String::from_utf8_lossy(name).into_owned(),
                            active_series: (n as u64).saturating_mul(scale),
                            limit: nonzero(metric_limit),
                        })
                        .collect(),
                }
            })
            .collect();
        tenants.sort_by(|a, b| {
            b.active_series
                .cmp(&a.active_series)
                .then_with(|| a.tenant.cmp(&b.tenant))
        });
        Report {
            active_series_window_seconds: opts.window.as_secs(),
            tracked_series: t.series.len(),
            estimated: t.shift > 0,
            sample_rate: 1.0 / scale as f64,
            tenants,
        }
    }

    /// The labels of `metric` of each tenant (only `tenant` when given) that has it.
    pub fn labels(&self, tenant: Option<&str>, metric: &str) -> Vec<LabelsReport> {
        let opts = self.opts.load();
        let Ok(t) = self.tables.read() else {
            return Vec::new();
        };
        let scale = 1u64 << t.shift;
        let generation = self.now() / opts.window_secs();
        let mut out: Vec<LabelsReport> = t
            .tenants
            .iter()
            .flatten()
            .filter(|slot| tenant.is_none_or(|want| want.as_bytes() == &*slot.name))
            .filter_map(|slot| {
                let id = *slot.metrics.get(metric.as_bytes())?;
                let m = t.metrics[id as usize].as_ref()?;
                let (labels, truncated) = match &m.labels {
                    Some(sk) => sk
                        .lock()
                        .map(|sk| sk.estimates(generation))
                        .unwrap_or_default(),
                    None => (Vec::new(), false),
                };
                Some(LabelsReport {
                    tenant: String::from_utf8_lossy(&slot.name).into_owned(),
                    metric: metric.to_string(),
                    active_series: (m.series as u64).saturating_mul(scale),
                    limit: nonzero(opts.limits_for(&slot.name).0),
                    labels: labels
                        .into_iter()
                        .map(|(name, n)| LabelReport {
                            name,
                            distinct_values: n,
                        })
                        .collect(),
                    labels_truncated: truncated,
                    estimated: true,
                })
            })
            .collect();
        out.sort_by_key(|r| std::cmp::Reverse(r.active_series));
        out
    }
}
