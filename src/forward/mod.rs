//! Forwarding: sends an encoded request to every backend concurrently and maps their
//! answers onto the one answer the sender gets (SPEC 1.2).
//!
//! [`Sink`] is the seam where a durable per-backend queue can be slotted in later: the
//! request path only sees "deliver this body, tell me the outcome".

pub mod http_backend;
pub mod tls;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};

pub use http_backend::HttpBackend;

/// What one backend said about one request.
#[derive(Debug, Clone)]
pub enum Outcome {
    Delivered,
    /// The backend answered a non-2xx status.
    Rejected {
        status: StatusCode,
        retry_after: Option<http::HeaderValue>,
        reason: String,
    },
    /// No answer within the backend's timeout.
    Timeout,
    /// Could not connect or the connection broke.
    Unreachable(String),
}

/// The answer promnorm gives the sender.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub status: StatusCode,
    pub retry_after: Option<http::HeaderValue>,
    pub reason: String,
}

pub type SendFuture<'a> = Pin<Box<dyn Future<Output = Outcome> + Send + 'a>>;

/// Something that accepts encoded remote-write bodies.
pub trait Sink: Send + Sync {
    fn name(&self) -> &str;
    /// `incoming` are the sender's headers, for configured pass-through.
    fn send<'a>(&'a self, body: Bytes, incoming: &'a HeaderMap) -> SendFuture<'a>;
}

/// Fans a body out to every sink and combines the outcomes.
pub struct Forwarder {
    sinks: Vec<Box<dyn Sink>>,
}

impl Forwarder {
    pub fn new(sinks: Vec<Box<dyn Sink>>) -> Self {
        Forwarder { sinks }
    }

    pub fn sinks(&self) -> impl Iterator<Item = &dyn Sink> {
        self.sinks.iter().map(|s| s.as_ref())
    }

    pub fn is_empty(&self) -> bool {
        self.sinks.is_empty()
    }

    /// Sends to all sinks concurrently; returns each outcome in sink order.
    pub async fn send_all(&self, body: Bytes, incoming: &HeaderMap) -> Vec<Outcome> {
        let futs = self.sinks.iter().map(|s| s.send(body.clone(), incoming));
        join_all(futs).await
    }
}

/// Minimal join_all without pulling in the futures crate.
async fn join_all<'a>(futs: impl Iterator<Item = SendFuture<'a>>) -> Vec<Outcome> {
    let mut handles: Vec<(SendFuture<'a>, Option<Outcome>)> = futs.map(|f| (f, None)).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, out) in handles.iter_mut() {
            if out.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(o) => *out = Some(o),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    handles.into_iter().filter_map(|(_, o)| o).collect()
}

/// Combines per-backend outcomes: anything retryable wins (the sender must retry so the
/// failed backend gets the data), then 429, then a permanent 4xx, else success.
pub fn verdict(outcomes: &[Outcome]) -> Verdict {
    let mut best: Option<(u8, Verdict)> = None;
    for o in outcomes {
        let (rank, v) = match o {
            Outcome::Delivered => continue,
            Outcome::Timeout => (
                4,
                Verdict {
                    status: StatusCode::GATEWAY_TIMEOUT,
                    retry_after: None,
                    reason: "backend timed out".into(),
                },
            ),
            Outcome::Unreachable(e) => (
                4,
                Verdict {
                    status: StatusCode::BAD_GATEWAY,
                    retry_after: None,
                    reason: format!("backend unreachable: {e}"),
                },
            ),
            Outcome::Rejected {
                status,
                retry_after,
                reason,
            } if status.is_server_error() => (
                4,
                Verdict {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    retry_after: retry_after.clone(),
                    reason: format!("backend answered {}: {reason}", status.as_u16()),
                },
            ),
            Outcome::Rejected {
                status,
                retry_after,
                reason,
            } if *status == StatusCode::TOO_MANY_REQUESTS => (
                3,
                Verdict {
                    status: StatusCode::TOO_MANY_REQUESTS,
                    retry_after: retry_after.clone(),
                    reason: format!("backend throttled: {reason}"),
                },
            ),
            Outcome::Rejected { status, reason, .. } if status.is_client_error() => (
                2,
                Verdict {
                    status: StatusCode::BAD_REQUEST,
                    retry_after: None,
                    reason: format!("backend rejected the data ({}): {reason}", status.as_u16()),
                },
            ),
            // 1xx/3xx: not a delivery; retryable.
            Outcome::Rejected { status, reason, .. } => (
                4,
                Verdict {
                    status: StatusCode::BAD_GATEWAY,
                    retry_after: None,
                    reason: format!("unexpected backend status {}: {reason}", status.as_u16()),
                },
            ),
        };
        if best.as_ref().is_none_or(|(r, _)| rank > *r) {
            best = Some((rank, v));
        }
    }
    best.map(|(_, v)| v).unwrap_or(Verdict {
        status: StatusCode::NO_CONTENT,
        retry_after: None,
        reason: String::new(),
    })
}

/// Per-backend settings resolved from configuration.
#[derive(Clone, Debug)]
pub struct BackendSettings {
    pub name: String,
    pub url: http::Uri,
    pub timeout: Duration,
    pub headers: HeaderMap,
    pub pass_headers: Vec<http::HeaderName>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejected(code: u16) -> Outcome {
        Outcome::Rejected {
            status: StatusCode::from_u16(code).unwrap(),
            retry_after: Some(http::HeaderValue::from_static("7")),
            reason: "x".into(),
        }
    }

    #[test]
    fn status_mapping() {
        assert_eq!(
            verdict(&[Outcome::Delivered]).status,
            StatusCode::NO_CONTENT
        );
        assert_eq!(verdict(&[]).status, StatusCode::NO_CONTENT);
        assert_eq!(
            verdict(&[rejected(500)]).status,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(verdict(&[rejected(400)]).status, StatusCode::BAD_REQUEST);
        assert_eq!(verdict(&[rejected(404)]).status, StatusCode::BAD_REQUEST);
        let v = verdict(&[rejected(429)]);
        assert_eq!(v.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(v.retry_after.unwrap(), "7");
        assert_eq!(
            verdict(&[Outcome::Timeout]).status,
            StatusCode::GATEWAY_TIMEOUT
        );
        assert_eq!(
            verdict(&[Outcome::Unreachable("x".into())]).status,
            StatusCode::BAD_GATEWAY
        );
        // One backend fine, one down: the sender must retry.
        assert!(
            verdict(&[Outcome::Delivered, rejected(503)])
                .status
                .is_server_error()
        );
        // Retryable beats permanent.
        assert!(
            verdict(&[rejected(400), rejected(502)])
                .status
                .is_server_error()
        );
        assert_eq!(
            verdict(&[rejected(400), rejected(429)]).status,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
}
