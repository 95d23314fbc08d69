//! The live tap behind `/debug/tap` (docs/ui.md): the next few series matching a name or
//! selector, copied as they arrive.
//!
//! Costs the request path one relaxed atomic load while no tap is open. While one is, at
//! most one request per [`MIN_GAP`] is looked at (sampled: the others pass untouched):
//! its body, already checked by the pipeline, is decompressed again on the side and, only
//! when the tap's name occurs in it, decoded into owned series, so nothing here touches
//! the pipeline's buffers. A tap is bounded in series
//! ([`MAX_TAP_SERIES`]), samples per series, bytes ([`MAX_TAP_BYTES`]) and time (the
//! opener's), and at most one is open at a time.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use prost::Message;

use super::Live;
use crate::pipeline::InputProtocol;
use crate::wire::proto::{prometheus as pb, write_v2};

/// The most series one tap captures.
pub const MAX_TAP_SERIES: usize = 100;
/// The most label and sample text one tap holds.
pub const MAX_TAP_BYTES: usize = 256 * 1024;
/// The longest a tap stays open.
pub const MAX_TAP_DURATION: Duration = Duration::from_secs(120);
/// Samples kept per captured series (the first ones of its request).
pub const SAMPLES_PER_SERIES: usize = 3;
/// Requests are looked at no more often than this while a tap is open.
pub const MIN_GAP: Duration = Duration::from_millis(100);
/// Requests larger than this once decompressed are passed over: a look decompresses and
/// may decode its request on the side, outside the overload budget, so its size is bounded
/// here (and one look runs at a time).
pub const MAX_LOOK_DECODED_BYTES: usize = 4 << 20;

/// What a tap matches: a metric name (or a histogram/summary family name: its
/// `_bucket`, `_sum`, `_count` series too) and `=` label matchers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TapMatch {
    pub name: String,
    pub labels: Vec<(String, String)>,
}

impl TapMatch {
    fn matches(&self, labels: &[(&str, &str)]) -> bool {
        let Some(&(_, name)) = labels.iter().find(|(k, _)| *k == "__name__") else {
            return false;
        };
        let name_ok = name == self.name
            || name.strip_prefix(self.name.as_str()).is_some_and(|s| {
                matches!(s, "_bucket" | "_sum" | "_count" | "_total" | "_created")
            });
        name_ok
            && self
                .labels
                .iter()
                .all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
    }
}

/// One captured series as it arrived.
#[derive(Clone, Debug)]
pub struct TapSeries {
    /// Its labels, `__name__` among them, in the order the sender wrote them.
    pub labels: Vec<(String, String)>,
    /// Up to [`SAMPLES_PER_SERIES`] float samples: (value, timestamp ms).
    pub samples: Vec<(f64, i64)>,
    /// Native histogram samples it carried (not copied).
    pub histograms: usize,
    /// `"1.0"` or `"2.0"`.
    pub protocol: &'static str,
    /// Unix milliseconds when it arrived.
    pub arrived_ms: i64,
}

/// What a closed tap captured.
#[derive(Debug, Default)]
pub struct TapResult {
    pub series: Vec<TapSeries>,
    /// The requests looked at (the rest passed while the tap sampled).
    pub requests_examined: u64,
    /// Series that matched but did not fit in [`MAX_TAP_BYTES`].
    pub over_bytes: u64,
    /// Closed because `limit` series were captured (else the time ran out).
    pub filled: bool,
}

struct Capture {
    /// The session that opened it: an older session's drop must not close a newer tap.
    id: u64,
    matcher: TapMatch,
    limit: usize,
    bytes: usize,
    result: TapResult,
}

/// At most one tap, shared by the states a reload swaps in (it lives in [`Live`]).
pub struct Tap {
    open: AtomicBool,
    /// Milliseconds since `base` before which no request is looked at.
    next_look_ms: AtomicU64,
    base: Instant,
    capture: Mutex<Option<Capture>>,
    filled: tokio::sync::Notify,
    /// A look is running (one at a time).
    looking: AtomicBool,
    next_id: AtomicU64,
}

impl Default for Tap {
    fn default() -> Self {
        Tap {
            open: AtomicBool::new(false),
            next_look_ms: AtomicU64::new(0),
            base: Instant::now(),
            capture: Mutex::new(None),
            filled: tokio::sync::Notify::new(),
            looking: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
        }
    }
}

/// A second tap while one is open.
#[derive(Debug, thiserror::Error)]
#[error("a tap is already open (one at a time); retry when it ends (at most {}s)", MAX_TAP_DURATION.as_secs())]
pub struct TapBusy;

/// The request path's hook: one atomic load unless a tap is open.
#[inline]
/// Whether a tap session is waiting for requests (what [`offer`] checks first).
pub fn is_open(live: &Live) -> bool {
    live.tap().open.load(Ordering::Relaxed)
}

pub fn offer(live: &Live, body: &[u8], protocol: InputProtocol, max_decoded: usize) {
    if live.tap().open.load(Ordering::Relaxed) {
        live.tap().look(body, protocol, max_decoded);
    }
}

impl Tap {
    /// Opens the tap for the next `limit` (at most [`MAX_TAP_SERIES`]) series `m`
    /// matches. It closes when the session is dropped.
    pub fn open(&self, m: TapMatch, limit: usize) -> Result<TapSession<'_>, TapBusy> {
        let mut guard = self.capture.lock().map_err(|_| TapBusy)?;
        if guard.is_some() {
            return Err(TapBusy);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        *guard = Some(Capture {
            id,
            matcher: m,
            limit: limit.clamp(1, MAX_TAP_SERIES),
            bytes: 0,
            result: TapResult::default(),
        });
        self.next_look_ms.store(0, Ordering::Relaxed);
        self.open.store(true, Ordering::Release);
        Ok(TapSession { tap: self, id })
    }

    /// Whether a tap is open.
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Relaxed)
    }

    fn look(&self, body: &[u8], protocol: InputProtocol, max_decoded: usize) {
        // Sampling: one request per MIN_GAP claims the look; the rest pass.
        let now = self.base.elapsed().as_millis() as u64;
        let next = self.next_look_ms.load(Ordering::Relaxed);
        if now < next
            || self
                .next_look_ms
                .compare_exchange(
                    next,
                    now + MIN_GAP.as_millis() as u64,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return;
        }
        // One look at a time: its side copies are all the memory a tap uses beyond what
        // it keeps, so they are bounded by one request of MAX_LOOK_DECODED_BYTES.
        if self.looking.swap(true, Ordering::Acquire) {
            return;
        }
        struct Done<'a>(&'a AtomicBool);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let _done = Done(&self.looking);
        let (id, matcher) = {
            let Ok(mut guard) = self.capture.lock() else {
                return;
            };
            let Some(cap) = guard.as_mut() else {
                return;
            };
            cap.result.requests_examined += 1;
            (cap.id, cap.matcher.clone())
        };
        let mut raw = Vec::new();
        let mut dec = snap::raw::Decoder::new();
        // Over the bound, snappy's declared length refuses it before anything is allocated.
        let max = max_decoded.min(MAX_LOOK_DECODED_BYTES);
        let Ok(n) = crate::wire::snappy::decompress_into(&mut dec, body, max, &mut raw) else {
            return;
        };
        let raw = &raw[..n];
        // Every matching series carries the tap's name (or a suffixed form of it) as a
        // label value, in 1.0 and 2.0 alike: a request without those bytes holds no
        // match, and most requests are passed over here without a decode.
        if memchr::memmem::find(raw, matcher.name.as_bytes()).is_none() {
            return;
        }
        let arrived_ms = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        // Decoded without the lock; only the copying of matches holds it.
        let decoded = match protocol {
            InputProtocol::V1 => pb::WriteRequest::decode(raw).map(Decoded::V1),
            InputProtocol::V2 => write_v2::Request::decode(raw).map(Decoded::V2),
        };
        let Ok(decoded) = decoded else {
            return;
        };
        let Ok(mut guard) = self.capture.lock() else {
            return;
        };
        let Some(cap) = guard.as_mut().filter(|c| c.id == id) else {
            return;
        };
        match &decoded {
            Decoded::V1(req) => {
                for ts in &req.timeseries {
                    let labels: Vec<(&str, &str)> = ts
                        .labels
                        .iter()
                        .map(|l| (l.name.as_str(), l.value.as_str()))
                        .collect();
                    let samples = ts.samples.iter().map(|s| (s.value, s.timestamp));
                    if cap.add(&labels, samples, ts.histograms.len(), "1.0", arrived_ms) {
                        break;
                    }
                }
            }
            Decoded::V2(req) => {
                let sym = |i: &u32| req.symbols.get(*i as usize).map_or("", String::as_str);
                for ts in &req.timeseries {
                    let labels: Vec<(&str, &str)> = ts
                        .labels_refs
                        .chunks_exact(2)
                        .map(|p| (sym(&p[0]), sym(&p[1])))
                        .collect();
                    let samples = ts.samples.iter().map(|s| (s.value, s.timestamp));
                    if cap.add(&labels, samples, ts.histograms.len(), "2.0", arrived_ms) {
                        break;
                    }
                }
            }
        }
        if cap.result.series.len() >= cap.limit && !cap.result.filled {
            cap.result.filled = true;
            self.open.store(false, Ordering::Relaxed);
            self.filled.notify_one();
        }
    }
}

/// A looked-at request, decoded on the side.
enum Decoded {
    V1(pb::WriteRequest),
    V2(write_v2::Request),
}

impl Capture {
    /// Adds a series when it matches and fits; true once the tap is full.
    fn add(
        &mut self,
        labels: &[(&str, &str)],
        samples: impl Iterator<Item = (f64, i64)>,
        histograms: usize,
        protocol: &'static str,
        arrived_ms: i64,
    ) -> bool {
        // Full already (a look that began before another filled it adds nothing).
        if self.result.series.len() >= self.limit {
            return true;
        }
        if !self.matcher.matches(labels) {
            return false;
        }
        let samples: Vec<(f64, i64)> = samples.take(SAMPLES_PER_SERIES).collect();
        let size = labels
            .iter()
            .map(|(k, v)| k.len() + v.len() + 4)
            .sum::<usize>()
            + samples.len() * 32;
        if self.bytes + size > MAX_TAP_BYTES {
            self.result.over_bytes += 1;
            return false;
        }
        self.bytes += size;
        self.result.series.push(TapSeries {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            samples,
            histograms,
            protocol,
            arrived_ms,
        });
        self.result.series.len() >= self.limit
    }
}

/// An open tap; dropping it closes the tap (a client that goes away frees it).
pub struct TapSession<'a> {
    tap: &'a Tap,
    id: u64,
}

impl TapSession<'_> {
    /// Waits until the tap is full or `within` (at most [`MAX_TAP_DURATION`]) passes,
    /// then closes it and returns what it captured.
    pub async fn wait(self, within: Duration) -> TapResult {
        let deadline = tokio::time::Instant::now() + within.min(MAX_TAP_DURATION);
        loop {
            let filled = self.tap.filled.notified();
            if !self.tap.is_open() {
                break;
            }
            if tokio::time::timeout_at(deadline, filled).await.is_err() {
                break;
            }
        }
        self.take()
    }

    fn take(&self) -> TapResult {
        self.close().unwrap_or_default()
    }

    /// Closes the tap if it is still this session's, and returns what it captured.
    fn close(&self) -> Option<TapResult> {
        let mut g = self.tap.capture.lock().ok()?;
        if g.as_ref().is_none_or(|c| c.id != self.id) {
            return None;
        }
        self.tap.open.store(false, Ordering::Relaxed);
        g.take().map(|c| c.result)
    }
}

impl Drop for TapSession<'_> {
    fn drop(&mut self) {
        // A newer session's tap (opened after `wait` took this one's) stays open.
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body_v1(series: &[(&str, &str, f64)]) -> Vec<u8> {
        let req = pb::WriteRequest {
            timeseries: series
                .iter()
                .map(|(name, pod, v)| pb::TimeSeries {
                    labels: vec![
                        pb::Label {
                            name: "__name__".into(),
                            value: (*name).into(),
                        },
                        pb::Label {
                            name: "pod".into(),
                            value: (*pod).into(),
                        },
                    ],
                    samples: vec![pb::Sample {
                        value: *v,
                        timestamp: 1000,
                    }],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        snap::raw::Encoder::new()
            .compress_vec(&req.encode_to_vec())
            .unwrap()
    }

    fn m(name: &str, labels: &[(&str, &str)]) -> TapMatch {
        TapMatch {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[tokio::test]
    async fn captures_matching_series_then_closes_and_one_at_a_time() {
        let tap = Tap::default();
        assert!(!tap.is_open());
        let s = tap.open(m("a_seconds", &[("pod", "p1")]), 2).unwrap();
        assert!(tap.open(m("x", &[]), 1).is_err(), "one tap at a time");
        tap.look(
            &body_v1(&[
                ("a_seconds_bucket", "p1", 1.0),
                ("a_seconds", "p2", 2.0),
                ("other", "p1", 3.0),
                ("a_secondsx", "p1", 3.0),
                ("a_seconds_sum", "p1", 4.0),
                ("a_seconds_count", "p1", 5.0),
            ]),
            InputProtocol::V1,
            1 << 20,
        );
        assert!(!tap.is_open(), "full: closed for the request path");
        let r = s.wait(Duration::from_secs(5)).await;
        assert!(r.filled);
        assert_eq!(r.requests_examined, 1);
        let names: Vec<&str> = r.series.iter().map(|s| s.labels[0].1.as_str()).collect();
        assert_eq!(names, ["a_seconds_bucket", "a_seconds_sum"]);
        assert_eq!(r.series[1].samples, [(4.0, 1000)]);
        assert!(tap.open(m("x", &[]), 1).is_ok(), "free again");
    }

    #[tokio::test]
    async fn sampled_and_timed() {
        let tap = Tap::default();
        let s = tap.open(m("a", &[]), 5).unwrap();
        let body = body_v1(&[("a", "p", 1.0)]);
        tap.look(&body, InputProtocol::V1, 1 << 20);
        // Within MIN_GAP of the first look: passed over.
        tap.look(&body, InputProtocol::V1, 1 << 20);
        let r = s.wait(Duration::from_millis(100)).await;
        assert!(!r.filled, "time ran out");
        assert_eq!(r.requests_examined, 1);
        assert_eq!(r.series.len(), 1);
        assert!(!tap.is_open());
    }

    #[test]
    fn a_dropped_session_frees_the_tap_and_bytes_are_bounded() {
        let tap = Tap::default();
        let s = tap.open(m("a", &[]), 100).unwrap();
        drop(s);
        assert!(!tap.is_open());
        let _s = tap.open(m("a", &[]), 100).unwrap();
        let big = "x".repeat(MAX_TAP_BYTES / 2);
        tap.look(
            &body_v1(&[("a", &big, 1.0), ("a", &big, 1.0), ("a", "p", 1.0)]),
            InputProtocol::V1,
            16 << 20,
        );
        let g = tap.capture.lock().unwrap();
        let c = g.as_ref().unwrap();
        assert_eq!(c.result.series.len(), 2, "the second big one does not fit");
        assert_eq!(c.result.over_bytes, 1);
        assert!(c.bytes <= MAX_TAP_BYTES);
    }

    /// Review finding: `wait` took the capture, a new tap opened, then the old session
    /// was dropped and closed the new one.
    #[test]
    fn an_old_session_does_not_close_a_newer_tap() {
        let tap = Tap::default();
        let old = tap.open(m("a", &[]), 5).unwrap();
        let _ = old.take();
        let new = tap.open(m("b", &[]), 5).unwrap();
        drop(old);
        assert!(tap.is_open(), "the newer tap stays open");
        assert!(tap.capture.lock().unwrap().is_some());
        drop(new);
        assert!(!tap.is_open());
    }

    /// Review finding: a look that began before another filled the tap added one more.
    #[test]
    fn a_full_capture_takes_no_more() {
        let tap = Tap::default();
        let _s = tap.open(m("a", &[]), 1).unwrap();
        let mut g = tap.capture.lock().unwrap();
        let c = g.as_mut().unwrap();
        let labels = [("__name__", "a"), ("pod", "p")];
        assert!(c.add(&labels, [(1.0, 1)].into_iter(), 0, "1.0", 0));
        assert!(c.add(&labels, [(2.0, 2)].into_iter(), 0, "1.0", 0));
        assert_eq!(c.result.series.len(), 1);
    }

    /// Review finding: a look's side copies were bounded only by `max_decoded_bytes`.
    #[test]
    fn requests_over_the_look_bound_are_passed_over() {
        let tap = Tap::default();
        let _s = tap.open(m("a", &[]), 5).unwrap();
        let big = "x".repeat(MAX_LOOK_DECODED_BYTES);
        tap.look(&body_v1(&[("a", &big, 1.0)]), InputProtocol::V1, 64 << 20);
        let g = tap.capture.lock().unwrap();
        let c = g.as_ref().unwrap();
        assert_eq!(c.result.requests_examined, 1);
        assert!(c.result.series.is_empty(), "not decoded");
    }
}
