//! The accept loop: HTTP/1 and HTTP/2 on hyper, with the timers and bounds
//! `axum::serve` does not set.
//!
//! `axum::serve` gives hyper no timer, so a client that sends a request line
//! and then one header line every 35 s keeps its connection (and a file
//! descriptor) forever: a few thousand of them run the service out of
//! descriptors (slowloris). Here every connection gets hyper's
//! `header_read_timeout`, which also runs while a keep-alive connection sits
//! idle between requests (so it is the idle timeout too), and the number of
//! open connections is bounded: at the bound the loop stops accepting, and
//! new clients wait in the kernel's backlog instead of taking descriptors.
//!
//! Shutdown: when `signal` completes the listener closes, every connection is
//! asked to finish its in-flight request and close (`GracefulShutdown`), and
//! `serve` returns once they have; the caller bounds that wait.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The bounds of the accept loop (from `[server]`).
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// A request's headers must arrive within this long after the connection
    /// opened or went idle; otherwise the connection is closed.
    pub(crate) header_read_timeout: Duration,
    /// Open connections at most.
    pub max_connections: usize,
}

/// Serves `router` on `listener` until `signal`, then drains the connections.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    opts: ServeOptions,
    signal: impl Future<Output = ()> + Send,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(opts.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(opts.header_read_timeout)
        .keep_alive_timeout(opts.header_read_timeout);
    let permits = Arc::new(Semaphore::new(opts.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut signal = std::pin::pin!(signal);
    loop {
        let permit = tokio::select! {
            _ = &mut signal => break,
            permit = permits.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
        };
        let stream = tokio::select! {
            _ = &mut signal => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors, or a connection reset before accept:
                    // back off a little instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
        let service = TowerToHyperService::new(router.clone());
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::trace!(error = %e, "connection ended");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
