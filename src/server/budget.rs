//! The overload budget: how many remote-write requests may be in progress at once, and
//! how many bytes they may hold together (compressed body + declared decoded size).
//! Admission never waits: a request that does not fit is answered `429` at once, so a
//! burst of senders cannot pile up memory behind a slow backend.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The `Retry-After` of a `429` from the budget, in seconds: requests in progress end
/// within about a backend round trip, so a sender that waits a second usually fits.
pub const RETRY_AFTER_SECONDS: &str = "1";

/// Why a request was refused (the `reason` label of `promnorm_requests_throttled_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Throttle {
    /// `limits.max_concurrent_requests` requests were already in progress.
    Concurrency,
    /// The request's bytes did not fit in `limits.max_inflight_bytes`.
    Bytes,
}

impl Throttle {
    pub fn reason(self) -> &'static str {
        match self {
            Throttle::Concurrency => "concurrent_requests",
            Throttle::Bytes => "inflight_bytes",
        }
    }
}

#[derive(Debug)]
struct Inner {
    max_bytes: usize,
    max_requests: usize,
    bytes: AtomicUsize,
    requests: AtomicUsize,
}

/// Shared counters of the requests in progress and the bytes they reserved.
#[derive(Clone, Debug)]
pub struct Budget(Arc<Inner>);

impl Budget {
    pub fn new(max_inflight_bytes: usize, max_concurrent_requests: usize) -> Budget {
        Budget(Arc::new(Inner {
            max_bytes: max_inflight_bytes,
            max_requests: max_concurrent_requests.max(1),
            bytes: AtomicUsize::new(0),
            requests: AtomicUsize::new(0),
        }))
    }

    /// Admits one request, or says why not. The ticket holds its slot (and the bytes it
    /// reserves) until it is dropped.
    pub fn admit(&self) -> Result<Ticket, Throttle> {
        let max = self.0.max_requests;
        self.0
            .requests
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map_err(|_| Throttle::Concurrency)?;
        Ok(Ticket {
            budget: self.0.clone(),
            reserved: 0,
        })
    }

    /// Whether `n` more bytes would fit now (reserving nothing): a sender whose
    /// `Content-Length` cannot fit is answered at once rather than after its body.
    pub fn would_fit(&self, n: usize) -> bool {
        self.bytes_in_flight()
            .checked_add(n)
            .is_some_and(|t| t <= self.0.max_bytes)
    }

    /// Bytes reserved by requests in progress.
    pub fn bytes_in_flight(&self) -> usize {
        self.0.bytes.load(Ordering::Acquire)
    }

    /// Requests in progress.
    pub fn requests_in_flight(&self) -> usize {
        self.0.requests.load(Ordering::Acquire)
    }

    pub fn max_bytes(&self) -> usize {
        self.0.max_bytes
    }
}

/// One admitted request: its slot and the bytes it reserved.
#[derive(Debug)]
pub struct Ticket {
    budget: Arc<Inner>,
    reserved: usize,
}

impl Ticket {
    /// Reserves `n` more bytes for this request's lifetime; `Err` when they do not fit
    /// (nothing is reserved then).
    pub fn reserve(&mut self, n: usize) -> Result<(), Throttle> {
        if n == 0 {
            return Ok(());
        }
        let max = self.budget.max_bytes;
        self.budget
            .bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|t| *t <= max)
            })
            .map_err(|_| Throttle::Bytes)?;
        self.reserved += n;
        Ok(())
    }

    /// Bytes this request holds.
    pub fn reserved(&self) -> usize {
        self.reserved
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.budget.bytes.fetch_sub(self.reserved, Ordering::AcqRel);
        self.budget.requests.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Reads and discards what is left of a refused request's body, in the background, for
/// at most `within` and `limit` bytes. The answer has gone out already; without this an
/// HTTP/1.1 sender still writing its body would have the connection reset under it and
/// see an error instead of the `429` (the lingering close of Go's server and nginx).
/// Nothing is kept: a refused body costs bandwidth, not memory.
pub fn discard_rest(mut body: axum::body::Body, limit: usize, within: std::time::Duration) {
    use http_body_util::BodyExt;
    tokio::spawn(async move {
        let drain = async {
            let mut seen = 0usize;
            while let Some(Ok(frame)) = body.frame().await {
                seen = seen.saturating_add(frame.data_ref().map_or(0, |d| d.len()));
                if seen > limit {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(within, drain).await;
    });
}

/// Makes glibc's allocator hand buffers of 1 MiB and more straight back to the kernel
/// when they are freed. Its default threshold grows with the largest buffer freed (up to
/// 32 MiB), after which request bodies come from per-thread heaps that keep their pages:
/// resident memory would then follow the largest burst ever seen rather than the bytes
/// in flight, and the memory bound (README) would not hold.
pub fn return_large_buffers_to_the_kernel() {
    crate::sys::set_mmap_threshold(1 << 20);
}

/// Why a body could not be read.
#[derive(Debug)]
pub enum BodyError {
    /// More than `limit` bytes.
    TooLarge { limit: usize },
    /// The bytes did not fit in the budget.
    Throttled(Throttle),
    /// The connection failed while the body was read.
    Read(String),
}

/// The first buffer a body is read into, before it has shown how large it is.
const FIRST_BODY_BUFFER: usize = 64 << 10;

/// Reads a request body of at most `limit` bytes, reserving its bytes in `ticket` as
/// they arrive: the buffer grows to at most twice what has arrived (or to `declared`,
/// the `Content-Length`, when that is less), and each growth is reserved before it is
/// allocated. A declared length alone reserves nothing, so connections that announce
/// large bodies and send nothing cannot hold the budget that senders who are actually
/// sending need. Memory is refused before it is taken: a frame that does not fit ends
/// the read.
pub async fn read_body(
    body: &mut axum::body::Body,
    ticket: &mut Ticket,
    declared: Option<usize>,
    limit: usize,
) -> Result<bytes::Bytes, BodyError> {
    use http_body_util::BodyExt;
    let mut buf: Vec<u8> = Vec::new();
    // What this body has reserved so far: always at least the buffer's capacity.
    let mut reserved = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| BodyError::Read(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        let total = buf.len().saturating_add(data.len());
        if total > limit {
            return Err(BodyError::TooLarge { limit });
        }
        if total > buf.capacity() {
            let mut want = total
                .max(buf.capacity().saturating_mul(2))
                .max(FIRST_BODY_BUFFER);
            if let Some(d) = declared
                && d >= total
            {
                want = want.min(d);
            }
            let want = want.min(limit).max(total);
            ticket
                .reserve(want.saturating_sub(reserved))
                .map_err(BodyError::Throttled)?;
            reserved = reserved.max(want);
            buf.reserve_exact(want - buf.len());
        }
        buf.extend_from_slice(&data);
    }
    Ok(bytes::Bytes::from(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_bytes_are_bounded_and_released() {
        let b = Budget::new(100, 2);
        let mut t1 = b.admit().unwrap();
        let t2 = b.admit().unwrap();
        assert_eq!(b.admit().unwrap_err(), Throttle::Concurrency);
        t1.reserve(60).unwrap();
        let mut t2 = t2;
        assert_eq!(t2.reserve(41).unwrap_err(), Throttle::Bytes);
        t2.reserve(40).unwrap();
        assert_eq!(b.bytes_in_flight(), 100);
        assert_eq!(t2.reserve(1).unwrap_err(), Throttle::Bytes);
        drop(t1);
        assert_eq!(b.bytes_in_flight(), 40);
        assert_eq!(b.requests_in_flight(), 1);
        let _t3 = b.admit().unwrap();
        drop(t2);
        assert_eq!(b.bytes_in_flight(), 0);
        assert_eq!(b.requests_in_flight(), 1);
        // Overflow is a refusal, not a wrap.
        let mut t4 = b.admit().unwrap();
        assert_eq!(t4.reserve(usize::MAX).unwrap_err(), Throttle::Bytes);
        assert_eq!(t4.reserved(), 0);
    }
}
