//! The single ordered writer of derived samples: drains the deriver's queues every
//! flush interval and sends them as requests of their own, one at a time, so the
//! samples of a series reach each backend in timestamp order. Retryable failures are
//! retried with backoff; a rejection (4xx) drops the batch for that backend and counts
//! it. The sender's own requests never wait for or depend on this.

use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use tokio::sync::Notify;

use super::{Deriver, Emitted};
use crate::forward::{Backend, Delivery, Forwarder, Mapped, Outcome, RetryPolicy};
use crate::guard::{Guard, GuardScratch};
use crate::telemetry;
use crate::wire::bodies::BodyEncoder;
use crate::wire::split::TenantSplit;

/// Samples per derived request, at most.
const MAX_SAMPLES_PER_REQUEST: usize = 5_000;
const SWEEP_EVERY: Duration = Duration::from_secs(30);

pub struct Writer {
    deriver: Arc<Deriver>,
    forwarder: Arc<Forwarder>,
    batch: Vec<Emitted>,
    encoded: Vec<u8>,
    scratch: Vec<u8>,
    split: TenantSplit,
    bodies: BodyEncoder,
    deliveries: Vec<Delivery>,
    backoff_base: Duration,
    /// The cardinality guard derived series pass like the sender's.
    guard: Option<Arc<Guard>>,
    guard_scratch: GuardScratch,
}

impl Writer {
    pub fn new(deriver: Arc<Deriver>, forwarder: Arc<Forwarder>) -> Self {
        Writer {
            deriver,
            forwarder,
            batch: Vec::new(),
            encoded: Vec::new(),
            scratch: Vec::new(),
            split: TenantSplit::new(),
            bodies: BodyEncoder::default(),
            deliveries: Vec::new(),
            backoff_base: RetryPolicy::default().first_backoff,
            guard: None,
            guard_scratch: GuardScratch::default(),
        }
    }

    /// Derived series count against the cardinality limits like any other series.
    pub fn with_guard(mut self, guard: Option<Arc<Guard>>) -> Self {
        self.guard = guard;
        self
    }

    /// Runs until `stop` is notified, then flushes once more.
    pub async fn run(mut self, flush_interval: Duration, stop: Arc<Notify>) {
        let mut last_sweep = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(flush_interval) => {}
                _ = stop.notified() => {
                    self.flush().await;
                    return;
                }
            }
            if last_sweep.elapsed() >= SWEEP_EVERY {
                self.deriver.sweep();
                last_sweep = tokio::time::Instant::now();
            }
            self.flush().await;
        }
    }

    /// Sends everything queued now; returns the number of derived samples taken.
    pub async fn flush(&mut self) -> usize {
        self.batch.clear();
        self.deriver.drain(&mut self.batch);
        let taken = self.batch.len();
        if taken == 0 {
            return 0;
        }
        let defs = self.deriver.definitions();
        let mut per_def = vec![0u64; defs.len()];
        let mut rank_sums = 0u64;
        for e in &self.batch {
            match per_def.get_mut(e.def as usize) {
                Some(n) => *n += 1,
                None => rank_sums += 1,
            }
        }
        for (d, n) in defs.iter().zip(per_def) {
            if n > 0 {
                telemetry::derived_samples(d.name, n);
            }
        }
        if rank_sums > 0 {
            telemetry::derived_samples("sum_over_ranks", rank_sums);
        }
        let mut batch = std::mem::take(&mut self.batch);
        for chunk in batch.chunks_mut(MAX_SAMPLES_PER_REQUEST) {
            self.encoded.clear();
            self.deriver
                .encode(chunk, &mut self.encoded, &mut self.scratch);
            let mut samples = chunk.len() as u64;
            if let Some(g) = &self.guard {
                match g.filter(&self.encoded, None, &mut self.guard_scratch) {
                    Ok(left_out) if left_out.series > 0 => {
                        std::mem::swap(&mut self.encoded, &mut self.guard_scratch.out);
                        samples = samples.saturating_sub(left_out.samples);
                    }
                    Ok(_) => {}
                    Err(e) => tracing::error!(error = %e, "checking derived series' limits"),
                }
                if self.encoded.is_empty() {
                    continue;
                }
            }
            // Derived series carry their inputs' labels, the tenant label too: tenant
            // routing sends them to their inputs' tenant.
            let mapped = Mapped {
                body: &self.encoded,
                has_start_timestamps: false,
                v1: None,
                samples,
                memory: None,
                // The deriver writes series only.
                metadata_in_body: false,
                limit_tenants: false,
                sender: None,
                classic: None,
                input: None,
            };
            let routed = self.forwarder.route(
                &mapped,
                &mut self.split,
                &mut self.bodies,
                &mut self.deliveries,
            );
            if let Err(e) = routed {
                tracing::error!(error = %e, "routing derived samples");
                count_dropped("derived_undeliverable", samples as usize);
                continue;
            }
            // Every backend (and tenant) at once: one slow or refusing backend does not
            // hold up the others (each still gets this chunk's requests in order).
            let policy = RetryPolicy {
                first_backoff: self.backoff_base,
                ..RetryPolicy::default()
            };
            let outcomes = self
                .forwarder
                .deliver_routed(&self.deliveries, &HeaderMap::new(), policy)
                .await;
            for (d, outcome) in self.deliveries.iter().zip(outcomes) {
                let sink = self.forwarder.backend(d.backend);
                account(sink, outcome, d.payload.samples as usize);
            }
        }
        self.batch = batch;
        taken
    }
}

/// Counts what one backend did with one chunk of derived samples.
fn account(sink: &Backend, outcome: Outcome, samples: usize) {
    if matches!(outcome, Outcome::Delivered) {
        sink.metrics().samples_forwarded(samples as u64);
    } else if matches!(outcome, Outcome::Queued) {
        // The queue counts them when the backend acknowledges them.
    } else if outcome.is_retryable() {
        tracing::warn!(
            backend = sink.name(),
            ?outcome,
            samples,
            "derived samples undeliverable after retries"
        );
        count_dropped("derived_undeliverable", samples);
    } else {
        tracing::warn!(
            backend = sink.name(),
            ?outcome,
            samples,
            "backend rejected derived samples"
        );
        count_dropped("derived_rejected", samples);
    }
}

fn count_dropped(reason: &'static str, n: usize) {
    telemetry::samples_dropped(reason, n as u64);
}
