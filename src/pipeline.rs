//! The request pipeline shared by `serve` and `normalize`:
//! snappy decode → protobuf view → map → derive → encode → snappy encode, on reusable
//! buffers. Derived samples leave through the deriver's queues, not this request.

use std::sync::{Arc, Mutex, RwLock};

use crate::derive::{DeriveScratch, Deriver};
use crate::guard::{Guard, GuardScratch};
use crate::mapping::unroll::{Unrolled, Unroller};
use crate::mapping::{CounterFamilies, MapContext, MapOutcome, MapStats, Mapper, Rules};
use crate::wire::bodies::BodyEncoder;
use crate::wire::encode_v2::{MetadataMemory, StripScratch, V2Encoder, strip_v2};
use crate::wire::split::TenantSplit;
use crate::wire::{DecodeError, DecodeLimits, DecodedRequest, snappy};

#[derive(Clone, Copy, Debug)]
pub struct PipelineLimits {
    pub max_decoded_bytes: usize,
    pub decode: DecodeLimits,
    /// Bytes the pool of idle workspaces may hold, all together
    /// ([`Workspace::held_bytes`]): the memory bound's `W × 64 MiB`.
    pub pool_bytes: usize,
}

impl Default for PipelineLimits {
    fn default() -> Self {
        PipelineLimits {
            max_decoded_bytes: 256 << 20,
            decode: DecodeLimits::default(),
            pool_bytes: 2 * WORKSPACE_RETAIN_BYTES,
        }
    }
}

/// Per-worker buffers, reused across requests so a warm request allocates nothing per
/// sample. Taken from and returned to the [`Pipeline`]'s pool.
#[derive(Default)]
pub struct Workspace {
    decoder: Option<snap::raw::Decoder>,
    encoder: Option<snap::raw::Encoder>,
    raw: Vec<u8>,
    raw_len: usize,
    pub decoded: DecodedRequest,
    pub mapper: Mapper,
    /// The mapped request, uncompressed, unless `mapped_is_input` ([`Workspace::mapped`]).
    encoded: Vec<u8>,
    /// The mapped request is the decompressed input itself (no rule touched it):
    /// `encoded` is left empty, not filled with a copy.
    mapped_is_input: bool,
    /// Compression output; its length stays at the largest ever needed, so that
    /// compressing never zero-fills it again (only `compressed_len` bytes are the body).
    compressed: Vec<u8>,
    compressed_len: usize,
    /// The request's own 1.0 body (copied by `decode_as`): when the mapped output is byte
    /// for byte the decompressed input, that body is the output and is not compressed
    /// again.
    input_body: Vec<u8>,
    /// `input_body` holds this request's body (set by `decode_as`).
    has_input_body: bool,
    /// The 1.0 output is `input_body`, not `compressed`.
    output_is_input: bool,
    derive_scratch: DeriveScratch,
    /// The 1.0 body without 2.0's start timestamps, when the request had some.
    plain: Vec<u8>,
    strip: StripScratch,
    v2: V2Encoder,
    v2_raw: Vec<u8>,
    compressed_v2: Vec<u8>,
    compressed_v2_len: usize,
    /// Skip the 1.0 body of the whole request: every backend that takes whole requests
    /// sends 2.0, or routes by tenant and encodes its own bodies.
    pub skip_v1_body: bool,
    tenant_split: TenantSplit,
    bodies: BodyEncoder,
    /// The mapped request with its NHCB histograms unrolled into classic series, when
    /// it has some (for backends that take 1.0, `backends[].native_histograms`).
    unroller: Unroller,
    classic: Vec<u8>,
    unrolled: Unrolled,
    guard: GuardScratch,
    /// The request's tenant header, for the cardinality guard's series without a
    /// tenant label ([`Workspace::set_sender_tenant`]).
    sender_tenant: Vec<u8>,
    has_sender_tenant: bool,
}

/// What routing the last request's output needs from a workspace (see
/// `forward::Routing::route`).
pub struct RouteInput<'a> {
    /// The mapped request, uncompressed.
    pub mapped: &'a [u8],
    pub has_start_timestamps: bool,
    /// Its compressed 1.0 body, unless [`Workspace::skip_v1_body`].
    pub v1: Option<&'a [u8]>,
    pub split: &'a mut TenantSplit,
    pub bodies: &'a mut BodyEncoder,
    /// The mapped request with NHCB unrolled, and what was unrolled; `None` when the
    /// request has no NHCB.
    pub classic: Option<(&'a [u8], Unrolled)>,
    /// The decoded request the output was mapped from, and the buffer it spans.
    pub decoded: (&'a DecodedRequest, &'a [u8]),
}

/// A workspace that holds more than this ([`Workspace::held_bytes`]) sheds its buffers
/// before it is pooled (and is freed if its caches alone hold more): one worker's share
/// of the memory bound (`config::memory::WORKER_BYTES`).
/// Prometheus' default batches (2,000 samples) leave well under 1 MiB of buffers, and a
/// sender's few thousand names well under 1 MiB of caches.
pub const WORKSPACE_RETAIN_BYTES: usize = 64 << 20;

/// Idle workspaces pooled at most, whatever they hold.
const MAX_IDLE_WORKSPACES: usize = 64;

impl Workspace {
    /// Bytes the workspace holds between requests: its buffers and the mapper's name
    /// caches.
    pub fn held_bytes(&self) -> usize {
        self.buffer_bytes() + self.mapper.cache_bytes()
    }

    /// Bytes its per-request buffers hold: its byte buffers, its decoded view (a
    /// request of tiny samples grows it far past their bytes), the mapper's, the
    /// encoders' and the tenant split's buffers that grow with a request (the small
    /// per-series scratch vectors aside).
    pub fn buffer_bytes(&self) -> usize {
        self.raw.capacity()
            + self.decoded.retained_bytes()
            + self.mapper.retained_bytes()
            + self.encoded.capacity()
            + self.compressed.capacity()
            + self.input_body.capacity()
            + self.v2_raw.capacity()
            + self.compressed_v2.capacity()
            + self.v2.retained_bytes()
            + self.plain.capacity()
            + self.classic.capacity()
            + self.tenant_split.retained_bytes()
            + self.bodies.retained_bytes()
            + self.strip.retained_bytes()
            + self.unroller.retained_bytes()
            + self.derive_scratch.retained_bytes()
            + self.guard.retained_bytes()
            + self.sender_tenant.capacity()
    }

    /// The sender's tenant (its tenancy header) for the next request.
    pub fn set_sender_tenant(&mut self, tenant: Option<&[u8]>) {
        self.sender_tenant.clear();
        self.has_sender_tenant = tenant.is_some();
        if let Some(t) = tenant {
            self.sender_tenant.extend_from_slice(t);
        }
    }

    /// Frees the per-request buffers an outlier request grew, keeping the warm name
    /// caches.
    fn shed_buffers(&mut self) {
        let mapper = std::mem::take(&mut self.mapper).without_buffers();
        *self = Workspace {
            mapper,
            ..Workspace::default()
        };
    }

    /// The last request's output and the buffers to route it with.
    pub fn route_input(&mut self) -> RouteInput<'_> {
        RouteInput {
            mapped: mapped_body(
                &self.encoded,
                &self.raw[..self.raw_len],
                self.mapped_is_input,
            ),
            has_start_timestamps: self.decoded.has_start_timestamps,
            v1: (!self.skip_v1_body).then_some(if self.output_is_input {
                &self.input_body[..]
            } else {
                &self.compressed[..self.compressed_len]
            }),
            split: &mut self.tenant_split,
            bodies: &mut self.bodies,
            classic: (self.unrolled.histograms > 0).then_some((&self.classic[..], self.unrolled)),
            decoded: (&self.decoded, &self.raw[..self.raw_len]),
        }
    }

    /// The snappy-compressed output of the last [`Pipeline::process`].
    pub fn compressed(&self) -> &[u8] {
        self.compressed_v1()
    }

    fn compressed_v1(&self) -> &[u8] {
        if self.output_is_input {
            &self.input_body
        } else {
            &self.compressed[..self.compressed_len]
        }
    }

    /// The snappy-compressed 2.0 output of the last [`Pipeline::encode_v2`].
    pub fn compressed_v2(&self) -> &[u8] {
        &self.compressed_v2[..self.compressed_v2_len]
    }

    /// The uncompressed 2.0 output of the last [`Pipeline::encode_v2`].
    pub fn encoded_v2(&self) -> &[u8] {
        &self.v2_raw
    }

    /// The mapped request of the last [`Pipeline::process`], uncompressed.
    pub fn mapped(&self) -> &[u8] {
        mapped_body(&self.encoded, self.input(), self.mapped_is_input)
    }

    /// The decompressed input of the last request.
    pub fn input(&self) -> &[u8] {
        &self.raw[..self.raw_len]
    }
}

/// The mapped request: `encoded`, or the decompressed `input` when the mapper found the
/// output to be the input itself ([`MapOutcome::SameAsInput`]).
fn mapped_body<'a>(encoded: &'a [u8], input: &'a [u8], is_input: bool) -> &'a [u8] {
    if is_input { input } else { encoded }
}

/// Result of one request through the pipeline.
#[derive(Debug, Clone, Copy)]
pub struct Processed {
    pub series_in: usize,
    pub samples_in: usize,
    pub histograms_in: usize,
    pub metadata_in: usize,
    pub exemplars_in: usize,
    /// True when nothing is left to forward (every series dropped by rules, no metadata).
    pub empty: bool,
}

/// The remote-write version of a request body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputProtocol {
    /// `prometheus.WriteRequest`.
    V1,
    /// `io.prometheus.write.v2.Request`.
    V2,
}

pub struct Pipeline {
    rules: Arc<Rules>,
    deriver: Option<Arc<Deriver>>,
    counters: Option<Arc<CounterFamilies>>,
    /// Families' metadata seen so far, attached to the 2.0 series of later requests.
    metadata_memory: RwLock<MetadataMemory>,
    limits: PipelineLimits,
    pool: Mutex<Pool>,
    guard: Option<Arc<Guard>>,
}

/// Idle workspaces, and what they hold all together.
#[derive(Default)]
struct Pool {
    /// Each with its [`Workspace::held_bytes`] when it was given back.
    idle: Vec<(Box<Workspace>, usize)>,
    bytes: usize,
    /// The learnt counter families' version when the idle workspaces' snapshots were
    /// last checked (see [`Pipeline::pool_if_room`]).
    counters_checked: u64,
}

impl Pipeline {
    pub fn new(rules: Arc<Rules>, limits: PipelineLimits) -> Self {
        Pipeline {
            rules,
            deriver: None,
            counters: None,
            metadata_memory: RwLock::new(MetadataMemory::default()),
            limits,
            pool: Mutex::new(Pool::default()),
            guard: None,
        }
    }

    /// Adds the derive stage: the pipeline feeds it the mapped series it needs.
    pub fn with_deriver(mut self, deriver: Arc<Deriver>) -> Self {
        self.deriver = Some(deriver);
        self
    }

    /// Adds the cardinality guard: the mapped series pass its limits before encoding.
    pub fn with_guard(mut self, guard: Arc<Guard>) -> Self {
        self.guard = Some(guard);
        self
    }

    pub fn guard(&self) -> Option<&Arc<Guard>> {
        self.guard.as_ref()
    }

    /// Turns on the metadata `_total` fix: COUNTER families no pack knows get `_total`.
    pub fn with_metadata_total_fix(mut self) -> Self {
        self.counters = Some(Arc::new(CounterFamilies::default()));
        self
    }

    /// Keeps the counter families `other` learnt, when both have the metadata `_total`
    /// fix on (a configuration reload: what metadata said stays true).
    pub fn with_counter_families_of(mut self, other: &Pipeline) -> Self {
        if self.counters.is_some()
            && let Some(c) = &other.counters
        {
            self.counters = Some(c.clone());
        }
        self
    }

    /// Counter families learnt from metadata, when the metadata `_total` fix is on.
    pub fn counter_families(&self) -> Option<&CounterFamilies> {
        self.counters.as_deref()
    }

    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// The rules, shared (the query API holds them for one request).
    pub fn rules_arc(&self) -> Arc<Rules> {
        self.rules.clone()
    }

    /// The rules, shared: a dry run (the web UI) builds its own pipeline on them.
    pub fn shared_rules(&self) -> &Arc<Rules> {
        &self.rules
    }

    pub fn deriver(&self) -> Option<&Arc<Deriver>> {
        self.deriver.as_ref()
    }

    pub fn take_workspace(&self) -> Box<Workspace> {
        self.pool
            .lock()
            .ok()
            .and_then(|mut p| {
                let (ws, bytes) = p.idle.pop()?;
                p.bytes -= bytes;
                Some(ws)
            })
            .unwrap_or_default()
    }

    /// Gives a workspace back to the pool. One that holds more than
    /// [`WORKSPACE_RETAIN_BYTES`] (an outlier request grew it), or more than the pool
    /// has room for (`PipelineLimits::pool_bytes`: a burst of concurrent requests left
    /// many idle), keeps only its name caches (its buffers are freed), and is freed
    /// whole when even that does not fit: idle workspaces never pin more than the
    /// memory bound's share, and a sender of large batches keeps its warm caches.
    pub fn return_workspace(&self, ws: Box<Workspace>) {
        let bytes = ws.held_bytes();
        let Err(mut ws) = self.pool_if_room(ws, bytes) else {
            return;
        };
        // Freed outside the pool's lock.
        ws.shed_buffers();
        let bytes = ws.held_bytes();
        let _ = self.pool_if_room(ws, bytes);
    }

    /// Pools `ws`, which holds `bytes`, unless the pool has no room for it: then gives
    /// it back (when the pool is full in count or poisoned, it is dropped).
    fn pool_if_room(&self, mut ws: Box<Workspace>, bytes: usize) -> Result<(), Box<Workspace>> {
        // Stale learnt-counters snapshots, freed after the lock (the last copy of a
        // large set is many frees).
        let mut stale = Vec::new();
        {
            let Ok(mut p) = self.pool.lock() else {
                return Ok(());
            };
            if p.idle.len() >= MAX_IDLE_WORKSPACES {
                return Ok(());
            }
            let room = self.limits.pool_bytes.saturating_sub(p.bytes);
            if bytes > room.min(WORKSPACE_RETAIN_BYTES) {
                return Err(ws);
            }
            if let Some(counters) = &self.counters {
                // Under the lock, with the sweep: a set changed after this workspace's
                // check is caught by the learner's own return (it comes back after its
                // change), which sweeps the pool this workspace is in by then.
                stale.extend(ws.mapper.take_stale_counters(counters));
                // Snapshots go stale in idle workspaces too (the pool is last in, first
                // out: the bottom ones may idle for hours): once per change, all of them.
                let version = counters.version();
                if p.counters_checked != version {
                    p.counters_checked = version;
                    for (idle, _) in &mut p.idle {
                        stale.extend(idle.mapper.take_stale_counters(counters));
                    }
                }
            }
            p.bytes += bytes;
            p.idle.push((ws, bytes));
        }
        drop(stale);
        Ok(())
    }

    /// Idle workspaces in the pool, and the bytes they hold.
    pub fn pooled(&self) -> (usize, usize) {
        self.pool
            .lock()
            .map(|p| (p.idle.len(), p.bytes))
            .unwrap_or((0, 0))
    }

    /// A workspace from the pool that goes back to it when dropped, on every exit.
    pub fn workspace(&self) -> PooledWorkspace<'_> {
        PooledWorkspace {
            pipeline: self,
            ws: Some(self.take_workspace()),
        }
    }

    /// Decompresses a snappy 1.0 body into the workspace, then runs
    /// [`Pipeline::process_raw`].
    pub fn process(&self, ws: &mut Workspace, body: &[u8]) -> Result<Processed, DecodeError> {
        self.process_as(ws, body, InputProtocol::V1)
    }

    /// [`Pipeline::process`] for a body of the given remote-write version. Both versions
    /// decode into the same view, so mapping, derive and the output are the same.
    pub fn process_as(
        &self,
        ws: &mut Workspace,
        body: &[u8],
        protocol: InputProtocol,
    ) -> Result<Processed, DecodeError> {
        self.decode_as(ws, body, protocol)?;
        self.map_decoded(ws)
    }

    /// The first half of [`Pipeline::process_as`]: decompresses and decodes `body` into
    /// the workspace's view (spans only: nothing is rebuilt yet) and returns the bytes
    /// the request takes with its labels spelled out, so that a caller can reserve them
    /// before [`Pipeline::map_decoded`] builds the output.
    pub fn decode_as(
        &self,
        ws: &mut Workspace,
        body: &[u8],
        protocol: InputProtocol,
    ) -> Result<usize, DecodeError> {
        let decoder = ws.decoder.get_or_insert_with(snap::raw::Decoder::new);
        ws.has_input_body = false;
        ws.output_is_input = false;
        // Until mapped, there is no mapped body: not the previous request's, nor this input.
        ws.mapped_is_input = false;
        ws.encoded.clear();
        ws.raw_len =
            snappy::decompress_into(decoder, body, self.limits.max_decoded_bytes, &mut ws.raw)?;
        if protocol == InputProtocol::V1 && !ws.skip_v1_body {
            // A copy of the compressed body is a few percent of compressing it again.
            ws.input_body.clear();
            ws.input_body.extend_from_slice(body);
            ws.has_input_body = true;
        }
        self.decode_raw(ws, protocol)
    }

    /// [`Pipeline::decode_as`] for a body that was never compressed (a scrape's batch,
    /// encoded in process): copied in, not decompressed; over `max_decoded_bytes` it is
    /// refused as a compressed body declaring that size would be.
    pub fn decode_uncompressed_as(
        &self,
        ws: &mut Workspace,
        raw: &[u8],
        protocol: InputProtocol,
    ) -> Result<usize, DecodeError> {
        if raw.len() > self.limits.max_decoded_bytes {
            return Err(DecodeError::DecodedTooLarge {
                declared: raw.len(),
                limit: self.limits.max_decoded_bytes,
            });
        }
        ws.has_input_body = false;
        ws.output_is_input = false;
        ws.mapped_is_input = false;
        ws.encoded.clear();
        ws.raw.clear();
        ws.raw.extend_from_slice(raw);
        ws.raw_len = raw.len();
        self.decode_raw(ws, protocol)
    }

    /// Runs the pipeline on an uncompressed `WriteRequest` (used by `normalize`).
    pub fn process_raw(&self, ws: &mut Workspace, raw: &[u8]) -> Result<Processed, DecodeError> {
        self.process_raw_as(ws, raw, InputProtocol::V1)
    }

    /// [`Pipeline::process_raw`] for an uncompressed body of the given version.
    pub fn process_raw_as(
        &self,
        ws: &mut Workspace,
        raw: &[u8],
        protocol: InputProtocol,
    ) -> Result<Processed, DecodeError> {
        ws.raw.clear();
        ws.raw.extend_from_slice(raw);
        ws.raw_len = raw.len();
        ws.has_input_body = false;
        ws.output_is_input = false;
        ws.mapped_is_input = false;
        ws.encoded.clear();
        self.run(ws, protocol)
    }

    fn run(&self, ws: &mut Workspace, protocol: InputProtocol) -> Result<Processed, DecodeError> {
        self.decode_raw(ws, protocol)?;
        self.map_decoded(ws)
    }

    fn decode_raw(
        &self,
        ws: &mut Workspace,
        protocol: InputProtocol,
    ) -> Result<usize, DecodeError> {
        let input = &ws.raw[..ws.raw_len];
        match protocol {
            InputProtocol::V1 => ws.decoded.decode(input, self.limits.decode)?,
            InputProtocol::V2 => ws.decoded.decode_v2(input, self.limits.decode)?,
        }
        Ok(ws.decoded.expanded_bytes)
    }

    /// The second half of [`Pipeline::process_as`]: maps the request
    /// [`Pipeline::decode_as`] left in the workspace, feeds the derive stage and encodes
    /// the output.
    pub fn map_decoded(&self, ws: &mut Workspace) -> Result<Processed, DecodeError> {
        let input = &ws.raw[..ws.raw_len];
        ws.encoded.clear();
        let ctx = MapContext {
            taps: self.deriver.as_ref().map(|d| d.taps()),
            counters: self.counters.as_deref(),
        };
        ws.mapped_is_input = ws.mapper.map_request_unless_same(
            &self.rules,
            input,
            &ws.decoded,
            &mut ws.encoded,
            &ctx,
        ) == MapOutcome::SameAsInput;
        if let Some(d) = &self.deriver {
            d.observe(&ws.mapper, input, &mut ws.derive_scratch);
        }
        if let Some(g) = &self.guard {
            let mapped = mapped_body(&ws.encoded, &ws.raw[..ws.raw_len], ws.mapped_is_input);
            let sender = ws.has_sender_tenant.then_some(&ws.sender_tenant[..]);
            let left_out = if ws.mapped_is_input && !ws.decoded.v2 {
                g.filter_input(mapped, &ws.decoded, sender, &mut ws.guard)?
            } else {
                g.filter(mapped, sender, &mut ws.guard)?
            };
            if left_out.series > 0 {
                std::mem::swap(&mut ws.encoded, &mut ws.guard.out);
                ws.mapped_is_input = false;
                let stats = &mut ws.mapper.stats;
                stats.series_out = stats.series_out.saturating_sub(left_out.series as u64);
                stats.samples_out = stats.samples_out.saturating_sub(left_out.samples);
                stats.histograms_out = stats.histograms_out.saturating_sub(left_out.histograms);
            }
        }
        ws.has_sender_tenant = false;
        ws.unrolled = Unrolled::default();
        if ws.decoded.has_nhcb {
            ws.unrolled = ws.unroller.unroll(
                mapped_body(&ws.encoded, &ws.raw[..ws.raw_len], ws.mapped_is_input),
                &mut ws.classic,
                self.limits.max_decoded_bytes,
            )?;
        }
        ws.compressed_len = 0;
        let unchanged =
            ws.has_input_body && (ws.mapped_is_input || ws.encoded[..] == ws.raw[..ws.raw_len]);
        ws.has_input_body = false;
        ws.output_is_input = false;
        if unchanged && !ws.skip_v1_body {
            // No rule touched the request (every series and metadata entry copied as it
            // came, in order): its own compressed body decompresses to the output.
            ws.output_is_input = true;
        } else if !ws.skip_v1_body {
            let encoder = ws.encoder.get_or_insert_with(snap::raw::Encoder::new);
            // Start timestamps ride in the mapped body for 2.0 output; 1.0 has no field
            // for them.
            let mapped = mapped_body(&ws.encoded, &ws.raw[..ws.raw_len], ws.mapped_is_input);
            let v1: &[u8] = if ws.decoded.has_start_timestamps {
                strip_v2(mapped, &mut ws.plain, &mut ws.strip)?;
                &ws.plain
            } else {
                mapped
            };
            ws.compressed_len = snappy::compress_into(encoder, v1, &mut ws.compressed);
        }
        ws.compressed_v2_len = 0;
        Ok(Processed {
            series_in: ws.decoded.series.len(),
            samples_in: ws.decoded.sample_count(),
            histograms_in: ws.decoded.histogram_count(),
            metadata_in: ws.decoded.metadata.len(),
            exemplars_in: ws.decoded.exemplars.len(),
            empty: ws.mapped().is_empty(),
        })
    }

    /// Encodes the last processed request as remote-write 2.0 (see
    /// [`Workspace::compressed_v2`]); returns the number of series it holds. Series get
    /// the metadata of their family from the request or, failing that, from earlier
    /// requests.
    pub fn encode_v2(&self, ws: &mut Workspace) -> Result<usize, DecodeError> {
        let mapped = mapped_body(&ws.encoded, &ws.raw[..ws.raw_len], ws.mapped_is_input);
        let written = ws.v2.encode_remembering(
            mapped,
            &self.metadata_memory,
            &mut ws.v2_raw,
            ws.mapper.stats.metadata_out > 0,
        )?;
        let encoder = ws.encoder.get_or_insert_with(snap::raw::Encoder::new);
        ws.compressed_v2_len = snappy::compress_into(encoder, &ws.v2_raw, &mut ws.compressed_v2);
        Ok(written.series)
    }

    /// Families' metadata remembered for 2.0 output (tenant routing encodes with it too).
    pub fn metadata_memory(&self) -> &RwLock<MetadataMemory> {
        &self.metadata_memory
    }

    /// Families whose metadata is remembered for 2.0 output.
    pub fn remembered_metadata(&self) -> usize {
        self.metadata_memory.read().map(|m| m.len()).unwrap_or(0)
    }

    pub fn stats<'a>(&self, ws: &'a Workspace) -> &'a MapStats {
        &ws.mapper.stats
    }
}

/// A pooled [`Workspace`] ([`Pipeline::workspace`]): returned to the pool when dropped,
/// so no exit of a request can forget it.
pub struct PooledWorkspace<'a> {
    pipeline: &'a Pipeline,
    /// `Some` until dropped.
    ws: Option<Box<Workspace>>,
}

impl std::ops::Deref for PooledWorkspace<'_> {
    type Target = Workspace;
    fn deref(&self) -> &Workspace {
        self.ws.as_deref().expect("present until dropped")
    }
}

impl std::ops::DerefMut for PooledWorkspace<'_> {
    fn deref_mut(&mut self) -> &mut Workspace {
        self.ws.as_deref_mut().expect("present until dropped")
    }
}

impl Drop for PooledWorkspace<'_> {
    fn drop(&mut self) {
        if let Some(ws) = self.ws.take() {
            self.pipeline.return_workspace(ws);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pooled_workspace_goes_back_to_the_pool_on_every_exit() {
        let p = Pipeline::new(Arc::new(Rules::empty()), PipelineLimits::default());
        let pooled = |p: &Pipeline| p.pooled().0;
        assert_eq!(pooled(&p), 0);
        let early_exit = |fail: bool| -> Result<(), ()> {
            let mut ws = p.workspace();
            ws.skip_v1_body = true;
            if fail {
                return Err(());
            }
            Ok(())
        };
        assert!(early_exit(true).is_err());
        assert_eq!(pooled(&p), 1);
        // Taken again from the pool, and back again.
        assert!(early_exit(false).is_ok());
        assert_eq!(pooled(&p), 1);
    }

    /// Idle workspaces hold at most `pool_bytes` all together, their name caches
    /// counted: a burst of concurrent requests does not leave 64 workspaces pinned.
    #[test]
    fn the_pool_holds_at_most_its_bytes() {
        let one = {
            let mut ws = Box::<Workspace>::default();
            ws.encoded.reserve(1 << 20);
            ws.held_bytes()
        };
        let limits = PipelineLimits {
            pool_bytes: 3 * one + one / 2,
            ..Default::default()
        };
        let p = Pipeline::new(Arc::new(Rules::empty()), limits);
        let taken: Vec<_> = (0..10)
            .map(|_| {
                let mut ws = p.take_workspace();
                ws.encoded.reserve(1 << 20);
                ws
            })
            .collect();
        for ws in taken {
            p.return_workspace(ws);
        }
        let (idle, bytes) = p.pooled();
        // Three whole; the others without their buffers (nothing left: no caches).
        assert_eq!(idle, 10);
        assert_eq!(bytes, 3 * one);
        // Taking them gives their bytes back to the pool.
        let taken: Vec<_> = (0..10).map(|_| p.take_workspace()).collect();
        assert_eq!(p.pooled(), (0, 0));
        assert_eq!(taken.iter().map(|w| w.held_bytes()).sum::<usize>(), bytes);
    }

    /// Idle workspaces let go of learnt-counters snapshots that went stale while they
    /// idled, once the next workspace comes back after the change.
    #[test]
    fn idle_workspaces_let_go_of_stale_counter_snapshots() {
        use crate::wire::proto::prometheus as pb;
        let p = Pipeline::new(Arc::new(Rules::empty()), PipelineLimits::default())
            .with_metadata_total_fix();
        let request = |family: &str| {
            let body = pb::WriteRequest {
                timeseries: vec![pb::TimeSeries {
                    labels: vec![pb::Label {
                        name: "__name__".into(),
                        value: family.into(),
                    }],
                    samples: vec![pb::Sample {
                        value: 1.0,
                        timestamp: 1,
                    }],
                    ..Default::default()
                }],
                metadata: vec![pb::MetricMetadata {
                    r#type: pb::metric_metadata::MetricType::Counter as i32,
                    metric_family_name: family.into(),
                    help: "Jobs.".into(),
                    unit: String::new(),
                }],
            };
            prost::Message::encode_to_vec(&body)
        };
        // Learnt, then every workspace maps with a snapshot of it.
        let mut ws = p.take_workspace();
        p.process_raw(&mut ws, &request("acme_jobs"))
            .expect("valid");
        p.return_workspace(ws);
        let mut a = p.take_workspace();
        let mut b = p.take_workspace();
        p.process_raw(&mut a, &request("acme_jobs")).expect("valid");
        p.process_raw(&mut b, &request("acme_jobs")).expect("valid");
        let learnt = a.mapper.counters_snapshot();
        assert!(learnt.is_some());
        assert_eq!(b.mapper.counters_snapshot(), learnt);
        p.return_workspace(a);
        // A new family changes the set while `a` idles; `b` comes back after it.
        p.process_raw(&mut b, &request("acme_batches"))
            .expect("valid");
        p.return_workspace(b);
        let idle: Vec<_> = (0..2).map(|_| p.take_workspace()).collect();
        assert!(
            idle.iter().all(|w| w.mapper.counters_snapshot() != learnt),
            "no idle workspace keeps the old copy"
        );
    }

    /// A workspace past a worker's share keeps its name caches and sheds its buffers;
    /// the caches count in what it holds.
    #[test]
    fn an_outlier_sheds_its_buffers_and_keeps_its_caches() {
        let p = Pipeline::new(Arc::new(Rules::empty()), PipelineLimits::default());
        let mut ws = p.take_workspace();
        let body = crate::wire::proto::prometheus::WriteRequest {
            timeseries: (0..2_000)
                .map(|i| crate::wire::proto::prometheus::TimeSeries {
                    labels: vec![crate::wire::proto::prometheus::Label {
                        name: "__name__".into(),
                        value: format!("family_{i}_{}", "n".repeat(200)),
                    }],
                    samples: vec![crate::wire::proto::prometheus::Sample {
                        value: 1.0,
                        timestamp: 1,
                    }],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        p.process_raw(&mut ws, &prost::Message::encode_to_vec(&body))
            .expect("valid");
        let caches = ws.mapper.cache_bytes();
        assert!(caches >= 2_000 * 200, "{caches}");
        assert!(ws.buffer_bytes() > 0);
        ws.encoded.reserve(WORKSPACE_RETAIN_BYTES);
        p.return_workspace(ws);
        assert_eq!(p.pooled(), (1, caches), "the caches alone");
        let mut ws = p.take_workspace();
        assert_eq!(ws.mapper.cache_bytes(), caches, "still warm");
        // Warm: the same names again resolve from the cache without growing it.
        p.process_raw(&mut ws, &prost::Message::encode_to_vec(&body))
            .expect("valid");
        assert_eq!(ws.mapper.cache_bytes(), caches);
    }
}
