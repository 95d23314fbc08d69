//! Which body each backend gets for one mapped request (docs/tenancy.md). Backends
//! without tenancy share one payload. Backends with the same tenancy settings share
//! one split of the mapped body by the tenant label's value ([`crate::wire::split`]):
//! one payload per tenant, carrying the tenant for the backend's tenant header.

use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};

use super::{Outcome, Payload, Sink};
use crate::wire::DecodeError;
use crate::wire::bodies::{BodyEncoder, V2Output};
use crate::wire::encode_v2::MetadataMemory;
use crate::wire::split::{FamilyTenants, Orphans, SplitError, SplitOptions, TenantSplit};

/// A backend's tenant routing (`tenancy`), resolved from configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenancyOptions {
    /// The label whose value names the tenant.
    pub label: String,
    /// The header that carries the tenant (`X-Scope-OrgID`).
    pub header: HeaderName,
    /// The tenant of series without the label; `None`: the sender's own tenant header
    /// (when it sent one) goes with them.
    pub default: Option<String>,
    /// Keep the tenant label on the forwarded series.
    pub keep_label: bool,
    /// A request naming more tenants is refused (`400`).
    pub max_tenants_per_request: usize,
    /// The backend's own `headers` set `header`: a request without a tenant still
    /// carries one (metadata with nowhere else to go is sent, not dropped).
    pub fixed_header: bool,
}

/// One body for one sink.
#[derive(Debug)]
pub struct Delivery {
    /// Index of the sink in the [`super::Forwarder`].
    pub sink: usize,
    pub payload: Payload,
    /// The tenant, for metrics and messages (`None`: no tenancy, or series that keep the
    /// sender's tenant).
    pub tenant: Option<String>,
    /// The outcome when the body must not be sent at all (a tenant that cannot be a
    /// header value).
    pub refused: Option<Outcome>,
}

/// A mapped request, ready to be routed.
#[derive(Clone, Copy)]
pub struct Mapped<'a> {
    /// The mapped 1.0 request, uncompressed; may carry 2.0's start timestamps.
    pub body: &'a [u8],
    pub has_start_timestamps: bool,
    /// Its compressed 1.0 body, when the caller made it already.
    pub v1: Option<&'a [u8]>,
    /// Float samples and histograms in `body`.
    pub samples: u64,
    /// Metadata remembered across requests, for 2.0 bodies.
    pub memory: Option<&'a RwLock<MetadataMemory>>,
    /// Refuse more tenants than `max_tenants_per_request` (a sender's request); the
    /// derived writer's batches have no sender to refuse and are split whatever their
    /// number of tenants.
    pub limit_tenants: bool,
    /// The sender's headers (its tenant header goes with series without a tenant);
    /// `None` for the derived writer's batches.
    pub sender: Option<&'a http::HeaderMap>,
}

/// Why a request could not be routed.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error(
        "the request names more than {limit} tenants (label {label:?}; tenancy.max_tenants_per_request)"
    )]
    TooManyTenants { limit: usize, label: String },
    #[error("encoding the output: {0}")]
    Encode(#[from] DecodeError),
}

/// The sinks grouped by tenancy settings, computed once per set of sinks.
#[derive(Debug, Default)]
pub struct Routing {
    /// Sinks without tenancy.
    plain: Vec<usize>,
    /// Each distinct tenancy setting and its sinks.
    tenanted: Vec<Tenanted>,
}

/// Sinks with one tenancy setting.
#[derive(Debug)]
struct Tenanted {
    opts: TenancyOptions,
    members: Vec<usize>,
    /// The tenants recently seen per metric name, for metadata sent without series.
    memory: Mutex<FamilyTenants>,
}

impl Routing {
    pub fn new(sinks: &[Arc<dyn Sink>]) -> Routing {
        let mut r = Routing::default();
        for (i, s) in sinks.iter().enumerate() {
            match s.tenancy() {
                None => r.plain.push(i),
                Some(t) => match r.tenanted.iter_mut().find(|g| &g.opts == t) {
                    Some(g) => g.members.push(i),
                    None => r.tenanted.push(Tenanted {
                        opts: t.clone(),
                        members: vec![i],
                        memory: Mutex::default(),
                    }),
                },
            }
        }
        r
    }

    /// True when some sink takes the request's whole body (no tenancy) and may send it
    /// as 1.0: the pipeline then compresses the 1.0 body once for all of them.
    pub fn plain_needs_v1(&self, sinks: &[Arc<dyn Sink>]) -> bool {
        self.plain.iter().any(|&i| sinks[i].needs_v1())
    }

    /// Writes one [`Delivery`] per (sink, tenant) into `out`. Sinks without tenancy all
    /// get the same body; sinks with tenancy get one body per tenant of the request.
    pub fn route(
        &self,
        sinks: &[Arc<dyn Sink>],
        mapped: &Mapped<'_>,
        split_scratch: &mut TenantSplit,
        bodies: &mut BodyEncoder,
        out: &mut Vec<Delivery>,
    ) -> Result<(), RouteError> {
        out.clear();
        if !self.plain.is_empty() {
            let wants_v2 = self.plain.iter().any(|&i| sinks[i].wants_v2());
            let needs_v1 = self.plain.iter().any(|&i| sinks[i].needs_v1());
            let payload = encode(
                &mut *bodies,
                mapped.body,
                mapped,
                mapped.v1,
                needs_v1,
                wants_v2,
                mapped.samples,
            )?;
            for &i in &self.plain {
                out.push(Delivery {
                    sink: i,
                    payload: payload.clone(),
                    tenant: None,
                    refused: None,
                });
            }
        }
        for Tenanted {
            opts,
            members,
            memory,
        } in &self.tenanted
        {
            let split = SplitOptions {
                label: opts.label.as_bytes(),
                default: opts.default.as_deref().map(str::as_bytes),
                keep_label: opts.keep_label,
                max_tenants: if mapped.limit_tenants {
                    opts.max_tenants_per_request
                } else {
                    usize::MAX
                },
            };
            // Metadata alone (Prometheus sends it so) goes to the tenants of its family's
            // series; never without a tenant to a backend that needs one.
            let orphans = Orphans {
                memory,
                untenanted_ok: opts.fixed_header
                    || mapped.sender.is_some_and(|h| h.contains_key(&opts.header)),
            };
            match split_scratch.split_routed(mapped.body, &split, &orphans) {
                Ok(_) => {}
                Err(SplitError::TooManyTenants(limit)) => {
                    return Err(RouteError::TooManyTenants {
                        limit,
                        label: opts.label.clone(),
                    });
                }
                Err(SplitError::Decode(e)) => return Err(e.into()),
            };
            for (reason, n) in [
                ("no_tenant", split_scratch.metadata_dropped()),
                ("tenant_copies", split_scratch.metadata_skipped()),
            ] {
                if n > 0 {
                    for &i in members {
                        crate::telemetry::metadata_dropped(sinks[i].name(), reason, n);
                    }
                }
            }
            let tenants = split_scratch.tenant_bodies();
            let wants_v2 = members.iter().any(|&i| sinks[i].wants_v2());
            let needs_v1 = members.iter().any(|&i| sinks[i].needs_v1());
            for tb in tenants {
                let mut payload = encode(
                    bodies, &tb.body, mapped, None, needs_v1, wants_v2, tb.samples,
                )?;
                let (tenant, refused) = match tb.tenant() {
                    None => (None, None),
                    Some(t) => {
                        let shown = printable(t);
                        match HeaderValue::from_bytes(t) {
                            Ok(v) => {
                                payload.tenant = Some(super::TenantHeader {
                                    name: opts.header.clone(),
                                    value: v,
                                });
                                (Some(shown), None)
                            }
                            Err(_) => {
                                let refused = Outcome::Rejected {
                                    status: StatusCode::BAD_REQUEST,
                                    retry_after: None,
                                    reason: format!(
                                        "tenant \"{shown}\" (label {}) cannot be sent as header {}",
                                        opts.label, opts.header
                                    ),
                                };
                                (Some(shown), Some(refused))
                            }
                        }
                    }
                };
                for &i in members {
                    out.push(Delivery {
                        sink: i,
                        payload: payload.clone(),
                        tenant: tenant.clone(),
                        refused: refused.clone(),
                    });
                }
            }
        }
        Ok(())
    }
}

/// One body in the protocols its sinks need.
fn encode(
    bodies: &mut BodyEncoder,
    body: &[u8],
    mapped: &Mapped<'_>,
    v1_done: Option<&[u8]>,
    needs_v1: bool,
    wants_v2: bool,
    samples: u64,
) -> Result<Payload, DecodeError> {
    let v2 = if wants_v2 {
        V2Output::Yes(mapped.memory)
    } else {
        V2Output::No
    };
    // No sink sends 1.0: an empty 1.0 body stands for it (never sent).
    let v1_done = if needs_v1 { v1_done } else { Some(&[][..]) };
    let b = bodies.encode(body, mapped.has_start_timestamps, v1_done, v2)?;
    let mut p = Payload::v1(Bytes::copy_from_slice(b.v1)).with_samples(samples);
    if let Some((v2, series)) = b.v2 {
        p.v2 = Some(Bytes::copy_from_slice(v2));
        p.v2_series = series;
    }
    Ok(p)
}

/// `bytes` as text fit for a log line, a metric label or an error reason: control
/// characters (a tenant label's `\n` would forge a log line) are escaped as Rust
/// escapes them (`\n`, `\u{1b}`), invalid UTF-8 replaced; anything else is kept.
pub fn printable(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    if !text.chars().any(char::is_control) {
        return text.into_owned();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}
