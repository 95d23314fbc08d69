//! Per-backend delivery queues (`backends[].queue`, docs/queues.md). A queued
//! [`super::Backend`] holds a [`Queue`], whose `send` means "stored": the sender's request is answered once its
//! data is in every queued backend's queue, and each queue drains on its own, so a slow
//! or dead backend never holds up another backend or the sender.
//!
//! A queue has `shards` FIFOs. With more than one, each request is split by a hash of
//! each series' labels ([`crate::wire::shard`]): a series always uses the same shard, and
//! a shard has one request in flight, so each series' samples reach the backend in the
//! order they were received. Retries follow the answer classes of [`Outcome::class`]:
//! data errors are dropped and counted, everything else is retried with exponential
//! backoff and jitter (honouring `Retry-After`) until delivered or `max_age`.

pub mod record;
pub mod store;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use tokio::sync::Notify;

use super::{Backend, Backoff, Outcome, OutcomeClass, Payload, Transport};
use crate::telemetry;
use record::{Record, now_ms};
use store::{DiskStore, MemoryStore, Store, StoreError};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QueueKind {
    Memory,
    Disk {
        dir: PathBuf,
        /// Zero: fsync before answering the sender.
        fsync_interval: Duration,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WhenFull {
    /// Answer the sender 429: its write-ahead log keeps the data.
    Reject,
    /// Drop the oldest queued requests (counted) to make room for fresh data.
    DropOldest,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueOptions {
    pub kind: QueueKind,
    pub max_bytes: u64,
    /// Requests queued longer than this are dropped (counted) instead of sent.
    pub max_age: Option<Duration>,
    pub shards: usize,
    pub when_full: WhenFull,
    /// The sender's answer when the queue has no room: 429 or 503, with `Retry-After`.
    pub full_status: StatusCode,
    pub first_backoff: Duration,
    pub max_backoff: Duration,
    /// A backlog's consecutive 1.0 records are sent as one request of at most this
    /// many samples (a record holding more goes alone); 1: every record alone.
    pub max_samples_per_send: u64,
    /// A disk queue keeps up to this many bytes of the records it wrote in memory, over
    /// all its shards, to send them without reading them back.
    pub disk_cache_bytes: u64,
}

/// What the queue holds now, for the gauges read at scrape time and `/-/ready`.
#[derive(Clone, Copy, Debug, Default)]
pub struct QueueState {
    pub bytes: u64,
    pub max_bytes: u64,
    pub requests: u64,
    /// Age of the oldest queued request (its samples are at least this old).
    pub oldest_age: Option<Duration>,
    /// True after a request was refused for room, until the queue frees some.
    pub refusing: bool,
    /// A disk queue: what it holds survives a stop.
    pub durable: bool,
}

/// `Retry-After` on a 429 for a full queue: long enough for a shard to drain a little.
const FULL_RETRY_AFTER_SECS: &str = "5";

/// Why a queue could not open, or not take over another queue's records.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("backend {backend}: opening its queue: {source}")]
    Open {
        backend: String,
        #[source]
        source: StoreError,
    },
    #[error("the queue is not open")]
    NotOpen,
    #[error("reading the old queue: {0}")]
    ReadOld(#[source] StoreError),
    #[error("storing in the new queue: {0}")]
    Store(#[source] StoreError),
}

pub struct Queue {
    name: String,
    /// Where the senders deliver: the backend's client (for a retired queue: the new
    /// backend of its name).
    target: Arc<dyn Transport>,
    opts: QueueOptions,
    pass: Vec<HeaderName>,
    /// The tenant header of the backend's tenant routing, when it routes by tenant.
    tenant_header: Option<HeaderName>,
    metrics: Arc<telemetry::BackendMetrics>,
    /// Open between [`Queue::start`] and [`Queue::stop`]; a stopped queue can start again.
    running: Mutex<Option<Arc<Running>>>,
}

/// How long [`Queue::start`] waits for a disk queue's directory held by another process
/// (a promnorm still stopping while its successor starts).
pub const LOCK_WAIT: Duration = Duration::from_secs(30);

/// A queue stopped by [`Queue::halt`] with everything it held: given to a successor
/// ([`Queue::adopt`], [`Queue::retire_into`]), back to its queue
/// ([`Queue::resume`]), or closed ([`Halted::close`]). A disk queue's files (and
/// its directory's lock) stay open until it is dropped or closed.
pub struct Halted {
    name: String,
    opts: QueueOptions,
    run: Arc<Running>,
}

impl Halted {
    /// The directory of a halted disk queue.
    pub fn dir(&self) -> Option<&std::path::Path> {
        match &self.opts.kind {
            QueueKind::Disk { dir, .. } => Some(dir),
            QueueKind::Memory => None,
        }
    }

    pub fn requests(&self) -> u64 {
        self.run.requests.load(Ordering::Relaxed)
    }

    /// Closes the queue's files. A memory queue's records are lost: counted as dropped
    /// (`shutdown`); a disk queue's stay in its directory for the next queue that opens it.
    pub fn close(self) {
        let left = self.requests();
        let mut samples = 0;
        for s in &self.run.shards {
            let mut st = lock(&s.state);
            if let Err(e) = st.store.sync() {
                tracing::warn!(backend = %self.name, error = %e, "syncing the disk queue");
            }
            if matches!(self.opts.kind, QueueKind::Memory) {
                while let Some(r) = st.store.pop_front() {
                    samples += r.samples;
                }
            }
            // Close the disk queue's files (and its directory lock) now, not when the
            // last reference goes: a successor may open the directory.
            st.store = Box::new(MemoryStore::default());
        }
        if left > 0 {
            match &self.opts.kind {
                QueueKind::Memory => {
                    telemetry::memory_queue_lost_at_shutdown(&self.name, left, samples);
                }
                QueueKind::Disk { dir, .. } => {
                    tracing::info!(backend = %self.name, requests = left, dir = %dir.display(), "left in the disk queue; sent by the next disk queue that opens this directory");
                }
            }
        }
    }
}

struct Running {
    shards: Vec<Shard>,
    bytes: AtomicU64,
    requests: AtomicU64,
    refusing: AtomicBool,
    draining: AtomicBool,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

struct Shard {
    state: Mutex<ShardState>,
    wake: Notify,
}

struct ShardState {
    store: Box<dyn Store>,
    /// The front records being sent: `drop_oldest` must not remove them.
    in_flight: usize,
    /// Stopped: nothing may be pushed any more (checked under the lock, so a request
    /// racing a stop is refused, never stored where no sender drains it).
    closed: bool,
}

impl Queue {
    /// A queue in front of `target`, storing the sender's `pass` headers and, with tenant
    /// routing, its `tenant_header`. Nothing is opened until [`Queue::start`].
    pub fn new(
        target: Arc<dyn Transport>,
        pass: Vec<HeaderName>,
        tenant_header: Option<HeaderName>,
        metrics: Arc<telemetry::BackendMetrics>,
        opts: QueueOptions,
    ) -> Queue {
        Queue {
            name: target.name().to_string(),
            target,
            opts,
            pass,
            tenant_header,
            metrics,
            running: Mutex::new(None),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The directory of a disk queue.
    pub fn dir(&self) -> Option<&std::path::Path> {
        match &self.opts.kind {
            QueueKind::Disk { dir, .. } => Some(dir),
            QueueKind::Memory => None,
        }
    }

    /// True when the queue delivers through `backend` (a retired queue through its
    /// successor).
    pub fn delivers_through(&self, backend: &Arc<Backend>) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.target), Arc::as_ptr(backend))
    }

    /// True between a start (or a retirement) and a stop.
    pub fn is_running(&self) -> bool {
        self.running().is_some()
    }

    /// Stops the queue at once (its senders ended, nothing more accepted) and returns
    /// what it holds. `None` when it was not running.
    pub async fn halt(&self) -> Option<Halted> {
        let run = lock(&self.running).take()?;
        run.draining.store(true, Ordering::Relaxed);
        let tasks: Vec<_> = lock(&run.tasks).drain(..).collect();
        for t in &tasks {
            t.abort();
        }
        // Waited for: a sender that was finishing must not remove a record after its
        // queue was handed over.
        for t in tasks {
            let _ = t.await;
        }
        for s in &run.shards {
            let mut st = lock(&s.state);
            st.closed = true;
            st.in_flight = 0;
        }
        Some(Halted {
            name: self.name.clone(),
            opts: self.opts.clone(),
            run,
        })
    }

    /// Runs a halted queue again (a reload undone).
    pub fn resume(&self, h: Halted) {
        let mut slot = lock(&self.running);
        if slot.is_some() {
            return;
        }
        h.run.draining.store(false, Ordering::Relaxed);
        // The counters again from what the stores hold: a request that reserved bytes
        // just before the halt found no running queue to release them in.
        let (mut bytes, mut requests) = (0, 0);
        for s in &h.run.shards {
            let mut st = lock(&s.state);
            st.closed = false;
            bytes += st.store.bytes();
            requests += st.store.len() as u64;
        }
        h.run.bytes.store(bytes, Ordering::Release);
        h.run.requests.store(requests, Ordering::Release);
        self.spawn_tasks(&h.run);
        *slot = Some(h.run);
    }

    /// Moves every record `from` holds into this (running) queue, in order, ahead of
    /// anything sent to it later: a reload's hand-over from the queue this one replaces.
    /// Records are split again for this queue's shards; the budget may be exceeded
    /// until they are delivered. Returns the requests moved; on an error (a full disk)
    /// the rest stays in `from`.
    pub fn adopt(&self, from: &Halted) -> Result<u64, QueueError> {
        let Some(run) = self.running() else {
            return Err(QueueError::NotOpen);
        };
        let mut moved = 0u64;
        for shard in &from.run.shards {
            loop {
                let mut st = lock(&shard.state);
                let front = st.store.front();
                let corrupt = st.store.take_corrupt();
                if !corrupt.is_empty() {
                    telemetry::queue_corrupt_skipped(
                        &from.name,
                        corrupt.records,
                        corrupt.samples,
                        corrupt.bytes,
                    );
                }
                let rec = match front {
                    Ok(Some(r)) => r,
                    Ok(None) => break,
                    Err(e) => return Err(QueueError::ReadOld(e)),
                };
                self.store_whole(&run, &rec).map_err(QueueError::Store)?;
                if let Some(r) = st.store.pop_front() {
                    from.run.bytes.fetch_sub(r.bytes, Ordering::AcqRel);
                    from.run.requests.fetch_sub(1, Ordering::Relaxed);
                }
                moved += 1;
            }
        }
        for s in &run.shards {
            if let Err(e) = lock(&s.state).store.sync() {
                tracing::warn!(backend = %self.name, error = %e, "syncing the disk queue");
            }
        }
        Ok(moved)
    }

    /// Stores a record taken from another queue (split for this queue's shards), all
    /// parts or none, outside the budget.
    fn store_whole(&self, run: &Running, rec: &Record) -> Result<(), StoreError> {
        let parts = self
            .split(&rec.payload())
            .unwrap_or_else(|_| vec![(0, rec.v1.clone(), rec.v2.clone(), rec.samples)]);
        let records: Vec<(usize, Record)> = parts
            .into_iter()
            .map(|(shard, v1, v2, samples)| {
                (
                    shard,
                    Record {
                        v1,
                        v2,
                        samples,
                        ..rec.clone()
                    },
                )
            })
            .collect();
        // Every shard involved is locked while the parts are pushed (as in `enqueue`):
        // a sender must never gather a part that is then taken back.
        let mut guards: Vec<(usize, std::sync::MutexGuard<'_, ShardState>)> = Vec::new();
        for (i, _) in &records {
            if !guards.iter().any(|(g, _)| g == i) {
                guards.push((*i, lock(&run.shards[*i].state)));
            }
        }
        let mut pushed: Vec<usize> = Vec::new();
        for (i, r) in &records {
            let Some((_, st)) = guards.iter_mut().find(|(g, _)| g == i) else {
                continue;
            };
            if let Err(e) = st.store.push(r) {
                for j in pushed.iter().rev() {
                    if let Some((_, g)) = guards.iter_mut().find(|(g, _)| g == j) {
                        g.store.pop_back();
                    }
                }
                return Err(e);
            }
            pushed.push(*i);
        }
        drop(guards);
        let total: u64 = records.iter().map(|(_, r)| r.size()).sum();
        run.bytes.fetch_add(total, Ordering::AcqRel);
        run.requests
            .fetch_add(records.len() as u64, Ordering::Relaxed);
        for (i, _) in &records {
            run.shards[*i].wake.notify_one();
        }
        Ok(())
    }

    /// A queue that takes nothing new and delivers what `h` holds through `target` (a
    /// reload's successor that has no queue, or no room for it), then closes itself. A
    /// retired disk queue keeps its directory until every record in it is delivered.
    pub fn retire_into(h: Halted, target: Arc<Backend>) -> Arc<Queue> {
        let q = Arc::new(Queue {
            name: h.name.clone(),
            pass: target.pass_headers().to_vec(),
            tenant_header: target.tenancy().map(|t| t.header.clone()),
            metrics: target.http.metrics().clone(),
            target,
            opts: h.opts.clone(),
            running: Mutex::new(None),
        });
        if h.requests() == 0 {
            h.close();
            return q;
        }
        tracing::info!(backend = %h.name, requests = h.requests(), "the replaced queue delivers what it holds through the new backend");
        {
            let mut slot = lock(&q.running);
            q.spawn_tasks(&h.run);
            *slot = Some(h.run);
        }
        let watch = q.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let Some(run) = watch.running() else {
                    return;
                };
                if run.requests.load(Ordering::Relaxed) == 0 {
                    drop(run);
                    if let Some(h) = watch.halt().await {
                        tracing::info!(backend = %h.name, "the replaced queue is delivered");
                        h.close();
                    }
                    return;
                }
            }
        });
        q
    }

    /// Starts the senders of `run` (one per shard, and the periodic fsync).
    fn spawn_tasks(&self, run: &Arc<Running>) {
        let mut tasks = Vec::new();
        for i in 0..run.shards.len() {
            tasks.push(tokio::spawn(drain_shard(
                run.clone(),
                i,
                self.target.clone(),
                self.name.clone(),
                self.metrics.clone(),
                self.opts.clone(),
            )));
        }
        if let QueueKind::Disk { fsync_interval, .. } = &self.opts.kind
            && let Some(every) = store::sync_interval(*fsync_interval)
        {
            tasks.push(tokio::spawn(sync_periodically(run.clone(), every)));
        }
        *lock(&run.tasks) = tasks;
    }

    fn running(&self) -> Option<Arc<Running>> {
        lock(&self.running).clone()
    }

    fn open_stores(&self) -> Result<Vec<Box<dyn Store>>, StoreError> {
        let shards = self.opts.shards.max(1);
        let mut stores: Vec<Box<dyn Store>> = Vec::with_capacity(shards);
        let QueueKind::Disk {
            dir,
            fsync_interval,
        } = &self.opts.kind
        else {
            for _ in 0..shards {
                stores.push(Box::new(MemoryStore::default()));
            }
            return Ok(stores);
        };
        let segment = (self.opts.max_bytes / shards as u64 / 4).min(store::SEGMENT_BYTES);
        let open = |i: usize| {
            let mut store = DiskStore::open_waiting(
                &dir.join(format!("shard-{i}")),
                segment,
                fsync_interval.is_zero(),
                LOCK_WAIT,
            )?;
            store.cache_up_to(self.opts.disk_cache_bytes / shards as u64);
            Ok::<_, StoreError>(store)
        };
        // Series are assigned to shards by hash modulo their number: data queued under
        // another number of shards would be replayed out of order or not at all.
        std::fs::create_dir_all(dir)?;
        let layout = dir.join("SHARDS");
        let before = std::fs::read_to_string(&layout)
            .ok()
            .and_then(|t| t.trim().parse::<usize>().ok());
        if let Some(before) = before
            && before != shards
        {
            let mut held = 0;
            for i in 0..before {
                held += open(i)?.len();
            }
            if held > 0 {
                return Err(StoreError::Io(std::io::Error::other(format!(
                    "{} holds {held} requests queued with shards: {before}; set queue.shards back to {before} until they are delivered, or move the directory away",
                    dir.display()
                ))));
            }
            for i in shards..before {
                let _ = std::fs::remove_dir_all(dir.join(format!("shard-{i}")));
            }
        }
        std::fs::write(&layout, format!("{shards}\n"))?;
        for i in 0..shards {
            stores.push(Box::new(open(i)?));
        }
        Ok(stores)
    }

    /// The headers a record keeps: the sender's headers this backend passes through,
    /// and with tenant routing the tenant header (the payload's tenant, else the
    /// sender's), so a replayed record goes to the same tenant.
    fn record_headers(
        &self,
        payload: &Payload,
        incoming: &HeaderMap,
    ) -> Vec<(HeaderName, HeaderValue)> {
        // The payload's tenant, else (routing on) the sender's.
        let tenant: Option<(HeaderName, HeaderValue)> = match &payload.tenant {
            Some(t) => Some((t.name.clone(), t.value.clone())),
            None => self
                .tenant_header
                .as_ref()
                .and_then(|h| incoming.get(h).map(|v| (h.clone(), v.clone()))),
        };
        let tenant_name = tenant.as_ref().map(|(n, _)| n);
        let mut out: Vec<(HeaderName, HeaderValue)> = self
            .pass
            .iter()
            .filter(|n| Some(*n) != tenant_name)
            .flat_map(|n| {
                incoming
                    .get_all(n)
                    .iter()
                    .map(move |v| (n.clone(), v.clone()))
            })
            .collect();
        if let Some((name, value)) = tenant
            && let Ok(marker) = HeaderValue::from_str(name.as_str())
        {
            out.push((name, value));
            out.push((
                HeaderName::from_static(record::TENANT_HEADER_MARKER),
                marker,
            ));
        }
        out
    }

    /// Bytes a payload takes in this queue before it is split (the reservation).
    fn estimate(&self, payload: &Payload, incoming: &HeaderMap) -> u64 {
        record::framed_size(
            payload.v1.len(),
            payload.v2.as_ref().map_or(0, |b| b.len()),
            &self.record_headers(payload, incoming),
        )
    }

    /// Stores `payload` in its shards, all parts or none; `reserved` bytes of the budget
    /// were taken for it by [`Queue::reserve_bytes`].
    fn enqueue(
        &self,
        run: &Running,
        payload: Payload,
        incoming: &HeaderMap,
        reserved: u64,
    ) -> Outcome {
        let release = |b: u64| {
            run.bytes.fetch_sub(b, Ordering::AcqRel);
        };
        if run.draining.load(Ordering::Relaxed) {
            release(reserved);
            return unavailable("promnorm is shutting down");
        }
        let headers = self.record_headers(&payload, incoming);
        let enqueued_ms = now_ms();
        let parts = match self.split(&payload) {
            Ok(p) => p,
            Err(reason) => {
                release(reserved);
                return Outcome::Rejected {
                    status: StatusCode::BAD_REQUEST,
                    retry_after: None,
                    reason,
                };
            }
        };
        let records: Vec<(usize, Record)> = parts
            .into_iter()
            .map(|(shard, v1, v2, samples)| {
                let rec = Record {
                    v1,
                    v2,
                    v2_series: payload.v2_series as u32,
                    headers: headers.clone(),
                    samples,
                    enqueued_ms,
                };
                (shard, rec)
            })
            .collect();
        // Split parts compress a little differently: the budget follows what is stored.
        let total: u64 = records.iter().map(|(_, r)| r.size()).sum();
        if total > reserved {
            run.bytes.fetch_add(total - reserved, Ordering::AcqRel);
        } else {
            release(reserved - total);
        }
        // Every shard involved is locked (in index order, as nothing else takes two)
        // while the parts are pushed, so a sender never sees a part that is then taken
        // back, and a stop in between refuses all parts.
        let mut guards: Vec<(usize, std::sync::MutexGuard<'_, ShardState>)> = Vec::new();
        for (i, _) in &records {
            if guards.last().is_none_or(|(g, _)| *g != *i) {
                guards.push((*i, lock(&run.shards[*i].state)));
            }
        }
        if guards.iter().any(|(_, g)| g.closed) {
            drop(guards);
            release(total);
            return unavailable("the queue is closed (promnorm is stopping or reloading)");
        }
        let mut pushed: Vec<usize> = Vec::new();
        for (i, rec) in &records {
            let Some((_, g)) = guards.iter_mut().find(|(g, _)| *g == *i) else {
                continue;
            };
            if let Err(e) = g.store.push(rec) {
                // Take back what this request already pushed: all parts or none.
                for j in pushed.iter().rev() {
                    if let Some((_, g)) = guards.iter_mut().find(|(g, _)| *g == *j) {
                        g.store.pop_back();
                    }
                }
                drop(guards);
                release(total);
                return self.store_failed(run, e);
            }
            pushed.push(*i);
        }
        // Counted before the shards are unlocked: a reload halting the queue in between
        // must see these records (it hands over what the counter says is there).
        run.requests
            .fetch_add(records.len() as u64, Ordering::Relaxed);
        drop(guards);
        run.refusing.store(false, Ordering::Relaxed);
        for (i, _) in &records {
            run.shards[*i].wake.notify_one();
        }
        Outcome::Queued
    }

    /// Splits a payload into its shards' parts: `(shard, 1.0 body, 2.0 body, samples)`.
    /// A payload with a 2.0 body is not split (a 2.0 backend's queue has one shard,
    /// which check-config enforces).
    #[allow(clippy::type_complexity)]
    fn split(&self, payload: &Payload) -> Result<Vec<(usize, Bytes, Option<Bytes>, u64)>, String> {
        let n = self.opts.shards.max(1);
        if n == 1 || payload.v2.is_some() {
            return Ok(vec![(
                0,
                payload.v1.clone(),
                payload.v2.clone(),
                payload.samples,
            )]);
        }
        // One tenant's request stays whole, in its tenant's shard: a tenant the backend
        // throttles holds up only the tenants that share its shard.
        if let Some(t) = &payload.tenant {
            let shard = (crate::wire::shard::fnv1a(t.value.as_bytes()) % n as u64) as usize;
            return Ok(vec![(shard, payload.v1.clone(), None, payload.samples)]);
        }
        let raw = snap::raw::Decoder::new()
            .decompress_vec(&payload.v1)
            .map_err(|e| format!("queue {}: body is not snappy: {e}", self.name))?;
        let mut parts = vec![Vec::new(); n];
        let mut samples = vec![0u64; n];
        crate::wire::shard::split_by_series(&raw, &mut parts, &mut samples)
            .map_err(|e| format!("queue {}: {e}", self.name))?;
        thread_local! {
            /// Snappy's worst-case output buffer, grown (and zeroed) once per thread.
            static COMPRESSED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let mut enc = snap::raw::Encoder::new();
        let mut out = Vec::with_capacity(n);
        COMPRESSED.with_borrow_mut(|compressed| {
            for (i, p) in parts.iter().enumerate() {
                if p.is_empty() {
                    continue;
                }
                let len = crate::wire::snappy::compress_into(&mut enc, p, compressed);
                // Copied out at its length: a record must hold no more memory than the
                // queue's budget counts (a part left in snappy's worst-case-sized buffer
                // held ~12x its length: a memory queue with `shards` > 1 held ~12x
                // `max_bytes`; tests/zero_alloc.rs).
                out.push((
                    i,
                    Bytes::copy_from_slice(&compressed[..len]),
                    None,
                    samples[i],
                ));
            }
            // One huge request must not pin its worst-case buffer in every thread for
            // good (16 MiB: the pooled workspaces are freed past the same size).
            if compressed.capacity() > 16 << 20 {
                *compressed = Vec::new();
            }
        });
        Ok(out)
    }

    /// Takes `bytes` of the budget, making room by dropping the oldest requests when
    /// so configured; else the sender gets the throttle status with `Retry-After`. A
    /// request larger than the whole budget can never fit: `413`, not retried.
    fn reserve_bytes(&self, run: &Running, bytes: u64) -> Result<(), Outcome> {
        let max = self.opts.max_bytes;
        if bytes > max {
            telemetry::queue_refused(&self.name, "too_large");
            return Err(Outcome::Rejected {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                retry_after: None,
                reason: format!(
                    "a request of {bytes} bytes can never fit the queue of backend {} (queue.max_bytes {max})",
                    self.name
                ),
            });
        }
        let prev = run.bytes.fetch_add(bytes, Ordering::AcqRel);
        if prev + bytes <= max {
            return Ok(());
        }
        if self.opts.when_full == WhenFull::DropOldest {
            let mut over = prev + bytes - max;
            while over > 0 {
                let Some(removed) = self.drop_oldest(run) else {
                    break;
                };
                over = over.saturating_sub(removed);
            }
            if over == 0 {
                return Ok(());
            }
        }
        run.bytes.fetch_sub(bytes, Ordering::AcqRel);
        run.refusing.store(true, Ordering::Relaxed);
        telemetry::queue_refused(&self.name, "full");
        Err(Outcome::Rejected {
            status: self.opts.full_status,
            retry_after: Some(HeaderValue::from_static(FULL_RETRY_AFTER_SECS)),
            reason: format!(
                "the queue of backend {} is full ({} of max_bytes {} in use)",
                self.name,
                prev.min(max),
                max
            ),
        })
    }

    /// Drops the oldest request not in flight; its bytes are returned to the budget.
    fn drop_oldest(&self, run: &Running) -> Option<u64> {
        let mut best: Option<(usize, u64)> = None;
        for (i, s) in run.shards.iter().enumerate() {
            let st = lock(&s.state);
            if st.store.len() > st.in_flight
                && let Some(t) = st.store.oldest_ms()
                && best.is_none_or(|(_, b)| t < b)
            {
                best = Some((i, t));
            }
        }
        let (i, _) = best?;
        let removed = {
            let mut st = lock(&run.shards[i].state);
            let index = st.in_flight;
            st.store.remove(index)?
        };
        run.bytes.fetch_sub(removed.bytes, Ordering::AcqRel);
        run.requests.fetch_sub(1, Ordering::Relaxed);
        telemetry::samples_dropped_at("queue_full", &self.name, removed.samples);
        Some(removed.bytes)
    }

    fn store_failed(&self, run: &Running, e: StoreError) -> Outcome {
        match e {
            StoreError::NoSpace(err) => {
                run.refusing.store(true, Ordering::Relaxed);
                telemetry::queue_refused(&self.name, "disk_full");
                warn_limited(&self.name, &format!("disk full: {err}"));
                Outcome::Rejected {
                    status: self.opts.full_status,
                    retry_after: Some(HeaderValue::from_static(FULL_RETRY_AFTER_SECS)),
                    reason: format!("the disk queue of backend {} is out of space", self.name),
                }
            }
            StoreError::Io(err) => {
                telemetry::queue_refused(&self.name, "io_error");
                warn_limited(&self.name, &format!("queue i/o error: {err}"));
                unavailable(&format!(
                    "the disk queue of backend {} failed: {err}",
                    self.name
                ))
            }
        }
    }
}

fn unavailable(reason: &str) -> Outcome {
    Outcome::Rejected {
        status: StatusCode::SERVICE_UNAVAILABLE,
        retry_after: None,
        reason: reason.to_string(),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Logs a queue problem at most once every 10 s per backend.
fn warn_limited(backend: &str, msg: &str) {
    static LAST: Mutex<Vec<(String, std::time::Instant)>> = Mutex::new(Vec::new());
    let mut last = lock(&LAST);
    let now = std::time::Instant::now();
    match last.iter_mut().find(|(b, _)| b == backend) {
        Some((_, t)) if now.duration_since(*t) < Duration::from_secs(10) => return,
        Some((_, t)) => *t = now,
        None => last.push((backend.to_string(), now)),
    }
    tracing::warn!(backend, "{msg}");
}

/// What the backend's request path calls.
impl Queue {
    /// Stores `payload` (the outcome is `Queued`, or why not).
    pub fn send(&self, payload: Payload, incoming: &HeaderMap) -> Outcome {
        match self.running() {
            Some(run) => {
                let bytes = self.estimate(&payload, incoming);
                match self.reserve_bytes(&run, bytes) {
                    Ok(()) => self.enqueue(&run, payload, incoming, bytes),
                    Err(o) => o,
                }
            }
            None => unavailable("the queue is not open"),
        }
    }

    /// Takes room for `payload` in the queue's budget; returns the bytes taken.
    pub fn reserve(&self, payload: &Payload, incoming: &HeaderMap) -> Result<u64, Outcome> {
        let Some(run) = self.running() else {
            return Err(unavailable("the queue is not open"));
        };
        let bytes = self.estimate(payload, incoming);
        self.reserve_bytes(&run, bytes).map(|()| bytes)
    }

    /// Gives back a reservation that will not be used.
    pub fn unreserve(&self, bytes: u64) {
        if let Some(run) = self.running() {
            run.bytes.fetch_sub(bytes, Ordering::AcqRel);
        }
    }

    /// [`Queue::send`] after a successful [`Queue::reserve`].
    pub fn send_reserved(&self, payload: Payload, incoming: &HeaderMap, reserved: u64) -> Outcome {
        match self.running() {
            Some(run) => self.enqueue(&run, payload, incoming, reserved),
            None => unavailable("the queue is not open"),
        }
    }

    /// Opens the queue's store (replaying a disk queue) and starts its senders; a
    /// queue already open stays as it is.
    pub fn start(&self) -> Result<(), QueueError> {
        let mut slot = lock(&self.running);
        if slot.is_some() {
            return Ok(());
        }
        let stores = self.open_stores().map_err(|source| QueueError::Open {
            backend: self.name.clone(),
            source,
        })?;
        let mut bytes = 0;
        let mut requests = 0;
        for s in &stores {
            bytes += s.bytes();
            requests += s.len() as u64;
        }
        if requests > 0 {
            tracing::info!(backend = %self.name, requests, bytes, "replaying the disk queue");
        }
        let run = Arc::new(Running {
            shards: stores
                .into_iter()
                .map(|store| Shard {
                    state: Mutex::new(ShardState {
                        store,
                        in_flight: 0,
                        closed: false,
                    }),
                    wake: Notify::new(),
                })
                .collect(),
            bytes: AtomicU64::new(bytes),
            requests: AtomicU64::new(requests),
            refusing: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            tasks: Mutex::new(Vec::new()),
        });
        telemetry::register_queue(&self.name, self.opts.max_bytes);
        self.spawn_tasks(&run);
        *slot = Some(run);
        Ok(())
    }

    /// A memory queue delivers what it holds within `within`; a disk queue stops at once
    /// (what it holds is durable: the next start replays it), so a dead backend does not
    /// hold up a shutdown or a restart.
    pub async fn stop(&self, within: Duration) {
        {
            let Some(run) = self.running() else {
                return;
            };
            run.draining.store(true, Ordering::Relaxed);
            if matches!(self.opts.kind, QueueKind::Memory) {
                let deadline = tokio::time::Instant::now() + within;
                while run.requests.load(Ordering::Relaxed) > 0
                    && tokio::time::Instant::now() < deadline
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            drop(run);
            if let Some(h) = self.halt().await {
                h.close();
            }
        }
    }

    /// What the queue holds now; `None` while it is not open.
    pub fn state(&self) -> Option<QueueState> {
        let run = self.running()?;
        let now = now_ms();
        let oldest = run
            .shards
            .iter()
            .filter_map(|s| lock(&s.state).store.oldest_ms())
            .min();
        Some(QueueState {
            bytes: run.bytes.load(Ordering::Relaxed),
            max_bytes: self.opts.max_bytes,
            requests: run.requests.load(Ordering::Relaxed),
            oldest_age: oldest.map(|t| Duration::from_millis(now.saturating_sub(t))),
            refusing: run.refusing.load(Ordering::Relaxed),
            durable: matches!(self.opts.kind, QueueKind::Disk { .. }),
        })
    }
}

/// One shard's sender: the oldest records, one request at a time, until delivered or
/// dropped. When several wait, consecutive 1.0 records with the same headers go as one
/// request of at most `max_samples_per_send` samples ([`Record::merge`]): a backlog
/// drains in fewer round trips, each series still in order. A merged request the
/// backend refuses as bad data is sent again record by record, so that only the records
/// it refuses are dropped.
async fn drain_shard(
    run: Arc<Running>,
    index: usize,
    inner: Arc<dyn Transport>,
    name: String,
    metrics: Arc<telemetry::BackendMetrics>,
    opts: QueueOptions,
) {
    let shard = &run.shards[index];
    let mut backoff = Backoff::new(opts.first_backoff, opts.max_backoff);
    // Records still to send one by one after a merged request was refused as bad data.
    let mut solo_left = 0usize;
    // The last merged body's allocation, for the next merge.
    let mut merge_buf = Vec::new();
    loop {
        let batch = {
            let mut st = lock(&shard.state);
            let (len, bytes) = (st.store.len(), st.store.bytes());
            let f = st.store.front();
            // Records found corrupt on the way were removed: the budget and the request
            // count follow.
            let (gone, freed) = (
                len.saturating_sub(st.store.len()),
                bytes.saturating_sub(st.store.bytes()),
            );
            if gone > 0 {
                run.requests.fetch_sub(gone as u64, Ordering::Relaxed);
                run.bytes.fetch_sub(freed, Ordering::AcqRel);
            }
            let corrupt = st.store.take_corrupt();
            if !corrupt.is_empty() {
                telemetry::queue_corrupt_skipped(
                    &name,
                    corrupt.records,
                    corrupt.samples,
                    corrupt.bytes,
                );
            }
            f.map(|front| {
                front.map(|first| {
                    let mut batch = vec![first];
                    if solo_left == 0 {
                        gather(&mut st, &mut batch, opts.max_samples_per_send);
                    }
                    // drop_oldest leaves these alone until they are decided.
                    st.in_flight = batch.len();
                    batch
                })
            })
        };
        let batch = match batch {
            Ok(Some(b)) => b,
            Ok(None) => {
                shard.wake.notified().await;
                continue;
            }
            Err(e) => {
                warn_limited(&name, &format!("reading the queue: {e}"));
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let age = Duration::from_millis(now_ms().saturating_sub(batch[0].enqueued_ms));
        if opts.max_age.is_some_and(|m| age > m) {
            finish(&run, shard, &name, "max_age", 1);
            solo_left = solo_left.saturating_sub(1);
            continue;
        }
        let merged = Record::merge(&batch, &mut merge_buf);
        let (rec, count) = match &merged {
            Some((m, n)) => (m, *n),
            None => (&batch[0], 1),
        };
        let outcome = inner.send(rec.payload(), &rec.header_map()).await;
        match outcome.class() {
            OutcomeClass::Delivered => {
                metrics.samples_forwarded(rec.samples);
                telemetry::queue_send_lag(
                    &name,
                    Duration::from_millis(now_ms().saturating_sub(rec.enqueued_ms)),
                );
                finish(&run, shard, &name, "", count);
                solo_left = solo_left.saturating_sub(1);
                backoff.reset();
            }
            OutcomeClass::DataRejected if count > 1 => {
                tracing::info!(backend = %name, ?outcome, requests = count, "backend refused a merged request as bad data; sending its requests one by one");
                solo_left = count;
            }
            OutcomeClass::DataRejected => {
                tracing::warn!(backend = %name, ?outcome, samples = rec.samples, "backend rejected queued samples; dropped");
                finish(&run, shard, &name, "backend_rejected", 1);
                solo_left = solo_left.saturating_sub(1);
            }
            _ => {
                // A merged request that could not be delivered is retried record by
                // record: a limit on request size (a proxy's, a receiver's burst) must
                // not hold the shard up for good.
                if count > 1 {
                    solo_left = count;
                }
                telemetry::queue_retry(&name);
                tokio::time::sleep(backoff.wait(&outcome)).await;
            }
        }
        if let Some((m, _)) = merged {
            merge_buf = record::reusable_body(m.v1);
        }
    }
}

/// Records one merged request joins at most, whatever they hold (records of metadata
/// alone hold no samples).
const MAX_BATCH_RECORDS: usize = 256;

/// Adds to `batch` (holding the front record) the records after it that can go in the
/// same request: while the samples stay within `max_samples` and the decoded size within
/// [`record::MAX_MERGED_RAW`]. `max_samples` 1: none.
fn gather(st: &mut ShardState, batch: &mut Vec<Record>, max_samples: u64) {
    let Some(mut raw) = batch[0].v1_decoded_len() else {
        return;
    };
    if max_samples <= 1 || batch[0].v2.is_some() {
        return;
    }
    let mut samples = batch[0].samples;
    while batch.len() < MAX_BATCH_RECORDS
        && samples < max_samples
        && let Ok(Some(next)) = st.store.get(batch.len())
    {
        let Some(len) = next.v1_decoded_len() else {
            break;
        };
        if samples + next.samples > max_samples
            || raw + len > record::MAX_MERGED_RAW
            || !batch[0].mergeable(&next)
        {
            break;
        }
        samples += next.samples;
        raw += len;
        batch.push(next);
    }
}

/// Removes the `count` front records of a shard; `drop_reason` non-empty counts their
/// samples as dropped for that reason.
fn finish(run: &Running, shard: &Shard, name: &str, drop_reason: &'static str, count: usize) {
    let removed: Vec<_> = {
        let mut st = lock(&shard.state);
        st.in_flight = 0;
        (0..count).map_while(|_| st.store.pop_front()).collect()
    };
    for r in removed {
        run.bytes.fetch_sub(r.bytes, Ordering::AcqRel);
        run.requests.fetch_sub(1, Ordering::Relaxed);
        run.refusing.store(false, Ordering::Relaxed);
        if !drop_reason.is_empty() {
            telemetry::samples_dropped_at(drop_reason, name, r.samples);
        }
    }
}

async fn sync_periodically(run: Arc<Running>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        for s in &run.shards {
            // The fsync itself runs on a blocking thread, without the shard's lock: on a
            // runtime of one worker it stalled every request for its duration (the disk
            // queue's throughput was 0.76-0.92x of no queue, the SUT not busy all the time).
            let handle = lock(&s.state).store.sync_handle();
            let flushed = match handle {
                Ok(Some(pending)) => match tokio::task::spawn_blocking(move || pending.run()).await
                {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err((e, left))) => {
                        // What failed stays due, for the next flush.
                        lock(&s.state).store.sync_failed(left);
                        Err(StoreError::from(e))
                    }
                    Err(e) => Err(StoreError::from(std::io::Error::other(e.to_string()))),
                },
                Ok(None) => Ok(()),
                Err(e) => Err(e),
            };
            if let Err(e) = flushed {
                tracing::warn!(error = %e, "fsync of the disk queue");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forward::Payload;

    /// A backend that answers 503 to everything.
    struct Down;

    impl Transport for Down {
        fn name(&self) -> &str {
            "down"
        }
        fn send<'a>(&'a self, _: Payload, _: &'a HeaderMap) -> super::super::SendFuture<'a> {
            Box::pin(std::future::ready(unavailable("down")))
        }
    }

    fn metrics() -> Arc<telemetry::BackendMetrics> {
        Arc::new(telemetry::BackendMetrics::new("down"))
    }

    fn opts(dir: &std::path::Path, shards: usize) -> QueueOptions {
        QueueOptions {
            kind: QueueKind::Disk {
                dir: dir.to_path_buf(),
                fsync_interval: Duration::ZERO,
            },
            max_bytes: 1 << 20,
            max_age: None,
            shards,
            when_full: WhenFull::Reject,
            full_status: StatusCode::TOO_MANY_REQUESTS,
            first_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(50),
            max_samples_per_send: 10_000,
            disk_cache_bytes: 8 << 20,
        }
    }

    fn body() -> Payload {
        body_of("m", 1.0)
    }

    fn body_of(name: &str, value: f64) -> Payload {
        let req = crate::wire::proto::prometheus::WriteRequest {
            timeseries: vec![crate::wire::proto::prometheus::TimeSeries {
                labels: vec![crate::wire::proto::prometheus::Label {
                    name: "__name__".into(),
                    value: name.into(),
                }],
                samples: vec![crate::wire::proto::prometheus::Sample {
                    value,
                    timestamp: 1,
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let raw = prost::Message::encode_to_vec(&req);
        let c = snap::raw::Encoder::new().compress_vec(&raw).unwrap();
        Payload::v1(Bytes::from(c)).with_samples(1)
    }

    #[tokio::test]
    async fn a_disk_queue_refuses_another_shard_count_while_it_holds_data_and_reopens_after_stop() {
        let dir = std::env::temp_dir().join(format!("promnorm-q-layout-{}", now_ms()));
        let q = Queue::new(Arc::new(Down), Vec::new(), None, metrics(), opts(&dir, 1));
        q.start().unwrap();
        assert!(matches!(q.send(body(), &HeaderMap::new()), Outcome::Queued));
        q.stop(Duration::ZERO).await;
        // Stopped: refused, never stored where nothing drains it.
        assert!(!matches!(
            q.send(body(), &HeaderMap::new()),
            Outcome::Queued
        ));
        let other = Queue::new(Arc::new(Down), Vec::new(), None, metrics(), opts(&dir, 2));
        let err = other.start().unwrap_err().to_string();
        assert!(err.contains("queued with shards: 1"), "{err}");
        // The same sink starts again (a reload undone) and finds its request.
        q.start().unwrap();
        assert_eq!(q.state().unwrap().requests, 1);
        q.stop(Duration::ZERO).await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_request_larger_than_the_whole_queue_is_413_not_retried_forever() {
        let dir = std::env::temp_dir().join(format!("promnorm-q-413-{}", now_ms()));
        let mut o = opts(&dir, 1);
        o.kind = QueueKind::Memory;
        let q = Queue::new(Arc::new(Down), Vec::new(), None, metrics(), o);
        q.start().unwrap();
        let big = Payload::v1(Bytes::from(vec![0u8; 2 << 20]));
        match q.send(big, &HeaderMap::new()) {
            Outcome::Rejected { status, .. } => assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE),
            o => panic!("{o:?}"),
        }
        assert!(!q.state().unwrap().refusing);
        q.stop(Duration::ZERO).await;
    }

    /// A backend that holds its first request until `gate` opens (so that a backlog
    /// builds), notes each request's series, and refuses as bad data (400) any request
    /// holding a series named `bad`.
    struct Recorder {
        gate: tokio::sync::Notify,
        opened: AtomicBool,
        seen: Mutex<Vec<Vec<(String, f64)>>>,
        /// Requests holding more series are answered 503 (a size limit on the way).
        max_series: usize,
    }

    fn recorder(max_series: usize) -> Arc<Recorder> {
        Arc::new(Recorder {
            gate: tokio::sync::Notify::new(),
            opened: AtomicBool::new(false),
            seen: Mutex::new(Vec::new()),
            max_series,
        })
    }

    impl Transport for Recorder {
        fn name(&self) -> &str {
            "recorder"
        }
        fn send<'a>(&'a self, p: Payload, _: &'a HeaderMap) -> super::super::SendFuture<'a> {
            Box::pin(async move {
                if !self.opened.load(Ordering::Acquire) {
                    self.gate.notified().await;
                    self.opened.store(true, Ordering::Release);
                }
                let raw = snap::raw::Decoder::new().decompress_vec(&p.v1).unwrap();
                let req: crate::wire::proto::prometheus::WriteRequest =
                    prost::Message::decode(raw.as_slice()).unwrap();
                let series: Vec<(String, f64)> = req
                    .timeseries
                    .iter()
                    .map(|t| (t.labels[0].value.clone(), t.samples[0].value))
                    .collect();
                let bad = series.iter().any(|(n, _)| n == "bad");
                let too_big = series.len() > self.max_series;
                lock(&self.seen).push(series);
                if too_big {
                    unavailable("too big")
                } else if bad {
                    Outcome::Rejected {
                        status: StatusCode::BAD_REQUEST,
                        retry_after: None,
                        reason: "bad".into(),
                    }
                } else {
                    Outcome::Delivered
                }
            })
        }
    }

    /// Queues one request per name, valued 1, 2, …, each after the sender took the
    /// ones before: the first is in flight (held by the [`Recorder`]'s gate) before the
    /// rest are queued behind it.
    async fn queue_behind_the_first<'a>(q: &Queue, names: impl Iterator<Item = &'a str>) {
        for (i, name) in names.enumerate() {
            assert!(matches!(
                q.send(body_of(name, (i + 1) as f64), &HeaderMap::new()),
                Outcome::Queued
            ));
            tokio::task::yield_now().await;
        }
    }

    /// Waits (at most 2.5 s) until the queue holds nothing.
    async fn drained(q: &Queue) {
        for _ in 0..500 {
            if q.state().unwrap().requests == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn a_backlog_goes_out_merged_in_order_and_a_refused_merge_is_sent_again_one_by_one() {
        for memory in [true, false] {
            let dir = std::env::temp_dir().join(format!("promnorm-q-merge-{memory}-{}", now_ms()));
            let mut o = opts(&dir, 1);
            o.max_samples_per_send = 3;
            if memory {
                o.kind = QueueKind::Memory;
            }
            let backend = recorder(usize::MAX);
            let q = Queue::new(backend.clone(), Vec::new(), None, metrics(), o);
            q.start().unwrap();
            queue_behind_the_first(&q, (1..=10).map(|i| if i == 6 { "bad" } else { "m" })).await;
            backend.gate.notify_one();
            drained(&q).await;
            assert_eq!(q.state().unwrap().requests, 0, "memory {memory}");
            let values = |r: &Vec<(String, f64)>| r.iter().map(|(_, v)| *v).collect::<Vec<f64>>();
            let seen: Vec<Vec<f64>> = lock(&backend.seen).iter().map(values).collect();
            let want: Vec<Vec<f64>> = vec![
                vec![1.0],
                vec![2.0, 3.0, 4.0],
                // Refused as a whole, then one by one: only the bad record is dropped.
                vec![5.0, 6.0, 7.0],
                vec![5.0],
                vec![6.0],
                vec![7.0],
                vec![8.0, 9.0, 10.0],
            ];
            assert_eq!(seen, want, "memory {memory}");
            q.stop(Duration::ZERO).await;
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    #[tokio::test]
    async fn a_merged_request_that_is_not_delivered_is_retried_one_by_one() {
        let dir = std::env::temp_dir().join(format!("promnorm-q-retry-merge-{}", now_ms()));
        let mut o = opts(&dir, 1);
        o.kind = QueueKind::Memory;
        o.max_samples_per_send = 3;
        o.first_backoff = Duration::from_millis(1);
        o.max_backoff = Duration::from_millis(2);
        // A proxy on the way takes at most two series a request.
        let backend = recorder(2);
        let q = Queue::new(backend.clone(), Vec::new(), None, metrics(), o);
        q.start().unwrap();
        queue_behind_the_first(&q, std::iter::repeat_n("m", 7)).await;
        backend.gate.notify_one();
        drained(&q).await;
        assert_eq!(q.state().unwrap().requests, 0);
        let delivered: Vec<f64> = lock(&backend.seen)
            .iter()
            .filter(|r| r.len() <= 2)
            .flat_map(|r| r.iter().map(|(_, v)| *v))
            .collect();
        // Every sample once, in order, although every batch of three was refused.
        assert_eq!(delivered, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
        q.stop(Duration::ZERO).await;
    }
}
