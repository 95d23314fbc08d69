//! The single ordered writer of derived samples: drains the deriver's queues every
//! flush interval and sends them as requests of their own, one at a time, so the
//! samples of a series reach each backend in timestamp order. Retryable failures are
//! retried with backoff; a rejection (4xx) drops the batch for that backend and counts
//! it. The sender's own requests never wait for or depend on this.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use tokio::sync::Notify;

use super::{Deriver, Emitted};
use crate::forward::{Forwarder, Outcome, Payload, RetryPolicy, Sink};
use crate::telemetry;
use crate::wire::encode_v2::V2Encoder;

/// Samples per derived request, at most.
const MAX_SAMPLES_PER_REQUEST: usize = 5_000;
const SWEEP_EVERY: Duration = Duration::from_secs(30);

pub struct Writer {
    deriver: Arc<Deriver>,
    forwarder: Arc<Forwarder>,
    batch: Vec<Emitted>,
    encoded: Vec<u8>,
    scratch: Vec<u8>,
    encoder: snap::raw::Encoder,
    v2: V2Encoder,
    v2_raw: Vec<u8>,
    backoff_base: Duration,
}

impl Writer {
    pub fn new(deriver: Arc<Deriver>, forwarder: Arc<Forwarder>) -> Self {
        Writer {
            deriver,
            forwarder,
            batch: Vec::new(),
            encoded: Vec::new(),
            scratch: Vec::new(),
            encoder: snap::raw::Encoder::new(),
            v2: V2Encoder::new(),
            v2_raw: Vec::new(),
            backoff_base: RetryPolicy::default().first_backoff,
        }
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
            let body = match self.encoder.compress_vec(&self.encoded) {
                Ok(b) => Bytes::from(b),
                Err(e) => {
                    tracing::error!(error = %e, "compressing derived samples");
                    count_dropped("derived_undeliverable", chunk.len());
                    continue;
                }
            };
            let mut payload = Payload::v1(body).with_samples(chunk.len() as u64);
            // Backends that take 2.0 get the same chunk as 2.0.
            if self.forwarder.wants_v2() {
                let v2 = self
                    .v2
                    .encode(&self.encoded, None, &mut self.v2_raw)
                    .map_err(|e| e.to_string())
                    .and_then(|w| {
                        let b = self
                            .encoder
                            .compress_vec(&self.v2_raw)
                            .map_err(|e| e.to_string())?;
                        Ok((Bytes::from(b), w.series))
                    });
                match v2 {
                    Ok((b, series)) => {
                        payload.v2 = Some(b);
                        payload.v2_series = series;
                    }
                    Err(e) => tracing::error!(error = %e, "encoding derived samples as 2.0"),
                }
            }
            // Every backend at once: one slow or refusing backend does not hold up the
            // others (each still gets this chunk's requests in order).
            let policy = RetryPolicy {
                first_backoff: self.backoff_base,
                ..RetryPolicy::default()
            };
            let outcomes = self
                .forwarder
                .deliver_to_all(&payload, &HeaderMap::new(), policy)
                .await;
            for (sink, outcome) in self.forwarder.sinks().zip(outcomes) {
                account(sink, outcome, chunk.len());
            }
        }
        self.batch = batch;
        taken
    }
}

/// Counts what one backend did with one chunk of derived samples.
fn account(sink: &dyn Sink, outcome: Outcome, samples: usize) {
    if matches!(outcome, Outcome::Delivered) {
        telemetry::samples_forwarded(sink.name(), samples as u64);
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
