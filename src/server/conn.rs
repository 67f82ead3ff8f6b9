//! The API port's connection loop, so refusals made by the HTTP/1 parser itself have
//! the documented `{code, message, details}` body too (docs/api.md "Errors").
//!
//! hyper answers a request it cannot parse (a control byte in a header value, a bad
//! method, request line or URI, a head past its size limit) on its own, before any
//! router or middleware runs: `400`, `414` or `431` with an empty body, then closes the
//! connection. It offers no hook for that answer, so each connection's writes pass
//! through [`RefusalBody`], which replaces it with our error body.
//!
//! What makes the replacement safe: it only happens while no request of the connection
//! has reached the router. Then nothing of ours has been written yet, so the first
//! response head on the wire can only be hyper's own refusal; once a request was
//! served, bytes are passed through untouched (a body could hold anything). A
//! malformed request later on a keep-alive connection therefore still gets hyper's
//! empty refusal; a client that sends one opens a fresh connection for the next, and
//! a malformed first request, the common case, is covered.

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use axum::{Router, http::StatusCode};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::{conn::auto, graceful::GracefulShutdown},
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpListener,
};
use tower::Service;

use super::error::{ErrorBody, ErrorCode};

/// The message of a parser refusal, by status.
fn parser_refusal_message(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => {
            "the request is not valid HTTP/1.1 (a control byte or invalid character in a header, or a malformed method, request line or URI)"
        }
        414 => "the request URI is too long",
        431 => "the request headers are too large",
        505 => "this HTTP version is not supported",
        _ => "the request could not be parsed",
    }
}

/// The response that replaces hyper's refusal `head`, when `head` is one: a complete
/// response head alone, status 4xx or 5xx, declaring an empty body.
fn replacement_for(head: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(head).ok()?;
    if !(text.starts_with("HTTP/1.1 ") || text.starts_with("HTTP/1.0 "))
        || !text.ends_with("\r\n\r\n")
    {
        return None;
    }
    let status: u16 = text.get(9..12)?.parse().ok()?;
    let status = StatusCode::from_u16(status).ok()?;
    let empty = text
        .lines()
        .any(|l| l.eq_ignore_ascii_case("content-length: 0"));
    if !(status.is_client_error() || status.is_server_error()) || !empty {
        return None;
    }
    let code = ErrorCode::from_status(status);
    let body = serde_json::to_vec(&ErrorBody {
        code: code.as_str().to_owned(),
        message: parser_refusal_message(status).to_owned(),
        details: serde_json::json!({"status": status.as_u16()}),
    })
    .ok()?;
    let mut out = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\ncache-control: no-store\r\nconnection: close\r\n\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or("Error"),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    Some(out)
}

/// A connection's IO with hyper's parser refusal replaced (see the module docs).
pub struct RefusalBody<T> {
    inner: T,
    /// Set once a request of this connection reached the router.
    served: Arc<AtomicBool>,
    first_write_seen: bool,
    pending: Vec<u8>,
    written: usize,
}

impl<T> RefusalBody<T> {
    pub fn new(inner: T, served: Arc<AtomicBool>) -> Self {
        RefusalBody {
            inner,
            served,
            first_write_seen: false,
            pending: Vec::new(),
            written: 0,
        }
    }
}

impl<T: AsyncWrite + Unpin> RefusalBody<T> {
    /// Writes out a replacement still held; ready when none is left.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.pending.len() {
            let rest = self.pending.get(self.written..).unwrap_or_default();
            match Pin::new(&mut self.inner).poll_write(cx, rest) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => self.written += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for RefusalBody<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for RefusalBody<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Poll::Ready(Err(e)) = this.poll_drain(cx) {
            return Poll::Ready(Err(e));
        }
        if this.written < this.pending.len() {
            return Poll::Pending;
        }
        if !this.first_write_seen {
            this.first_write_seen = true;
            if !this.served.load(Ordering::Acquire)
                && let Some(replacement) = replacement_for(buf)
            {
                this.pending = replacement;
                this.written = 0;
                // The refusal counts as written; what replaces it drains from here and
                // from flush and shutdown.
                let _ = this.poll_drain(cx);
                return Poll::Ready(Ok(buf.len()));
            }
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match this.poll_drain(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.inner).poll_flush(cx),
            other => other,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match this.poll_drain(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.inner).poll_shutdown(cx),
            other => other,
        }
    }

    /// Not vectored, so hyper hands each response head over as one buffer.
    fn is_write_vectored(&self) -> bool {
        false
    }
}

/// Serves `router` on `listener` (HTTP/1.1 and HTTP/2) until `shutdown` resolves, then
/// waits for the connections in flight to finish.
pub async fn serve_api(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors and the like: wait rather than spin.
                tracing::warn!(error = %e, "accepting an API connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let served = Arc::new(AtomicBool::new(false));
        let io = TokioIo::new(RefusalBody::new(stream, served.clone()));
        let router = router.clone();
        let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
            served.store(true, Ordering::Release);
            let mut router = router.clone();
            async move { router.call(req).await }
        });
        let connection = builder
            .serve_connection_with_upgrades(io, service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "API connection ended with an error");
            }
        });
    }
    graceful.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_empty_error_head_is_replaced() {
        let refusal = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: Wed, 02 Dec 2026 19:00:00 GMT\r\n\r\n";
        let out = replacement_for(refusal).unwrap_or_default();
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{text}");
        assert!(text.contains("content-type: application/json"), "{text}");
        let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        assert_eq!(v["code"], "invalid");
        assert_eq!(v["details"]["status"], 400);
        let big = replacement_for(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n",
        );
        assert!(big.is_some_and(|b| String::from_utf8_lossy(&b).contains("too large")));
        for not_ours in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"[..],
            b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 52\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n{\"a\":1}",
            b"random body bytes",
        ] {
            assert_eq!(replacement_for(not_ours), None, "{not_ours:?}");
        }
    }
}
