//! Accepting and serving connections with the hygiene a write path needs: a bounded
//! number of connections, a deadline for request headers, idle keep-alive connections
//! closed, an explicit listen backlog, HTTP/1.1 and HTTP/2 (h2c) on one port, or both
//! over TLS (ALPN) when `server.tls` is set, and a graceful drain on shutdown.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

/// Connection settings of the server.
#[derive(Clone, Debug)]
pub struct ConnectionLimits {
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
}

/// File descriptors kept free for backend connections, mapping files and the like.
const RESERVED_FDS: usize = 256;

/// Binds `addr` with an explicit backlog (the OS default can be as low as 128, and a
/// burst of reconnecting senders then sees resets).
pub fn bind(addr: SocketAddr, backlog: u32) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// Raises the soft limit on open files to the hard limit (as Go's runtime does for
/// Prometheus and vmagent) and returns how many connections fit below it.
pub fn connections_allowed_by_fd_limit() -> Option<usize> {
    #[cfg(unix)]
    {
        let soft = crate::sys::raise_fd_limit()?;
        let soft = usize::try_from(soft).unwrap_or(usize::MAX);
        Some(soft.saturating_sub(RESERVED_FDS).max(1))
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets open requests finish
/// for at most `drain_timeout`.
pub async fn serve_connections(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    tls: Option<Arc<super::tls::TlsSource>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    drain_timeout: Duration,
) -> io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        // Ours (IdleTimeoutIo) instead: hyper's would also close idle keep-alive
        // connections after the header deadline.
        .header_read_timeout(None)
        .keep_alive(true);
    builder.http2().timer(TokioTimer::new());
    let builder = Arc::new(builder);
    let open = crate::telemetry::connections_open();
    let mut last_accept_warning: Option<Instant> = None;
    tokio::pin!(shutdown);
    loop {
        // At the limit we stop accepting: new connections wait in the backlog.
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = &mut shutdown => break,
        };
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = &mut shutdown => break,
        };
        let (stream, _peer) = match accepted {
            Ok(c) => c,
            Err(e) => {
                // EMFILE and friends: say it at most once a second, back off briefly.
                if last_accept_warning.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                    tracing::warn!(error = %e, "accepting a connection failed");
                    last_accept_warning = Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let in_flight = Arc::new(AtomicUsize::new(0));
        let io_in_flight = in_flight.clone();
        let app = app.clone();
        let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
            let guard = InFlight::enter(&in_flight);
            let mut app = app.clone();
            async move {
                let resp = app.call(req).await;
                drop(guard);
                resp
            }
        });
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let open = open.clone();
        let tls = tls.as_ref().map(|t| t.acceptor());
        let limits = limits.clone();
        tokio::spawn(async move {
            open.increment(1.0);
            let served = match tls {
                None => {
                    let io = TokioIo::new(IdleTimeoutIo::new(stream, &limits, io_in_flight));
                    watcher
                        .watch(builder.serve_connection(io, service).into_owned())
                        .await
                }
                Some(acceptor) => {
                    // The handshake is part of the request head: same deadline.
                    let within = limits.header_read_timeout.min(limits.idle_timeout);
                    match tokio::time::timeout(within, acceptor.accept(stream)).await {
                        Ok(Ok(tls_stream)) => {
                            let io =
                                TokioIo::new(IdleTimeoutIo::new(tls_stream, &limits, io_in_flight));
                            watcher
                                .watch(builder.serve_connection(io, service).into_owned())
                                .await
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, "TLS handshake failed");
                            Ok(())
                        }
                        Err(_) => {
                            tracing::debug!("TLS handshake not completed in time");
                            Ok(())
                        }
                    }
                }
            };
            if let Err(e) = served {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            open.decrement(1.0);
            drop(permit);
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(drain_timeout) => {
            tracing::warn!("shutdown deadline reached with requests still in flight");
        }
    }
    Ok(())
}

/// Counts a connection's requests in progress for [`IdleTimeoutIo`].
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn enter(n: &Arc<AtomicUsize>) -> InFlight {
        n.fetch_add(1, Ordering::Relaxed);
        InFlight(n.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A TCP stream that enforces the connection deadlines while no request of the
/// connection is being answered: once a request's first byte has arrived, its headers
/// must be complete within `header_read_timeout`; with nothing arriving, the connection
/// is closed after `idle_timeout`. A read past a deadline fails with `TimedOut`, and
/// hyper closes the connection.
struct IdleTimeoutIo<S> {
    inner: S,
    idle: Duration,
    header: Duration,
    deadline: Pin<Box<Sleep>>,
    /// A request's head is being read (bytes arrived while none was in progress).
    reading_head: bool,
    in_flight: Arc<AtomicUsize>,
    /// How far the connection's first bytes match HTTP/2's preface; `H2_PREFACE.len()`
    /// once it is HTTP/2, `usize::MAX` once it is not.
    preface: usize,
}

/// The bytes an HTTP/2 client sends first (RFC 9113 §3.4): h2c with prior knowledge
/// and h2 over TLS alike.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

impl<S> IdleTimeoutIo<S> {
    fn new(inner: S, limits: &ConnectionLimits, in_flight: Arc<AtomicUsize>) -> Self {
        // A new connection must send its first request's headers in time too: from the
        // connection, not from its first byte.
        let reading_head = limits.header_read_timeout <= limits.idle_timeout;
        let first = limits.header_read_timeout.min(limits.idle_timeout);
        IdleTimeoutIo {
            inner,
            idle: limits.idle_timeout,
            header: limits.header_read_timeout,
            deadline: Box::pin(tokio::time::sleep(first)),
            reading_head,
            in_flight,
            preface: 0,
        }
    }

    fn is_h2(&self) -> bool {
        self.preface == H2_PREFACE.len()
    }

    /// Follows the connection's first bytes until they show whether it is HTTP/2.
    fn sniff(&mut self, bytes: &[u8]) {
        if self.preface >= H2_PREFACE.len() {
            return;
        }
        let want = &H2_PREFACE[self.preface..];
        let n = want.len().min(bytes.len());
        if bytes[..n] == want[..n] {
            self.preface += n;
            if self.is_h2() {
                // HTTP/2 has no request head to wait for between requests: from here
                // the connection is idle until a request comes.
                self.reading_head = false;
                self.reset(self.idle);
            }
        } else {
            self.preface = usize::MAX;
        }
    }

    fn reset(&mut self, after: Duration) {
        // A deadline too far to represent is no deadline.
        let now = Instant::now();
        let next = now
            .checked_add(after)
            .unwrap_or(now + Duration::from_secs(86_400 * 365));
        self.deadline.as_mut().reset(next);
    }

    /// After bytes moved: a request in progress has no deadline here; bytes read while
    /// none is start (or continue) a request head, whose deadline does not move.
    fn on_progress(&mut self, read: bool) {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            self.reading_head = false;
            self.reset(self.idle);
        } else if self.is_h2() {
            // PING, SETTINGS and their acknowledgements are not requests: an HTTP/2
            // connection without a request in progress stays idle whatever frames it
            // exchanges, and closes `idle_timeout` after its last request.
        } else if read {
            if !self.reading_head {
                self.reading_head = true;
                self.reset(self.header);
            }
        } else {
            // A response going out: the request before it is done.
            self.reading_head = false;
            self.reset(self.idle);
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for IdleTimeoutIo<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    this.sniff(&buf.filled()[before..]);
                    this.on_progress(true);
                }
                Poll::Ready(r)
            }
            Poll::Pending => {
                if this.in_flight.load(Ordering::Relaxed) > 0 {
                    // A request is being answered: the idle clock starts after it. The
                    // deadline is still polled, so that a waker is registered and the
                    // clock runs once the request ends, even if hyper does not read again.
                    this.reading_head = false;
                    this.reset(this.idle);
                    let _ = this.deadline.as_mut().poll(cx);
                    return Poll::Pending;
                }
                if this.deadline.as_mut().poll(cx).is_ready() {
                    let what = if this.reading_head {
                        "request headers not received within server.header_read_timeout"
                    } else {
                        "connection idle for longer than server.idle_timeout"
                    };
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, what)));
                }
                Poll::Pending
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for IdleTimeoutIo<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.on_progress(false);
        }
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.on_progress(false);
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
