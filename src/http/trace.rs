//! A span per request: what log lines and traces of a request carry.
//! ([`super::observe`], the one middleware around every request, opens it.)
//!
//! The span (`request`, at `info`) holds the method, the matched route, a
//! request id (the client's `X-Request-Id` when it is a sane token, else a
//! fresh one, which the answer echoes in its own `X-Request-Id`: it
//! correlates log lines, it deduplicates nothing), and, recorded by the
//! handlers once they have parsed them, the
//! `event` and the `user`; every line logged while serving the request is
//! logged inside it. With a W3C `traceparent` header the span continues the
//! caller's trace (exported only when an OTLP endpoint is configured, see
//! `telemetry`). No header value other than those two is ever recorded, so
//! the admin token cannot reach a log line or a trace.

use axum::extract::Request;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The longest client request id kept; longer or odd ones are replaced.
const MAX_REQUEST_ID: usize = 128;

/// The header of the request id, in the request and in its answer.
pub(crate) const X_REQUEST_ID: &str = "x-request-id";

/// The client's `X-Request-Id` if it is a plain token, else a fresh id.
/// Either way a valid header value.
pub fn request_id(req: &Request) -> String {
    req.headers()
        .get(X_REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| {
            !v.is_empty()
                && v.len() <= MAX_REQUEST_ID
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
        })
        .map_or_else(|| format!("{:016x}", rand::random::<u64>()), str::to_owned)
}

/// The request's span; `route` is its matched path, `request_id` what
/// [`request_id`] made of the request.
pub fn span(req: &Request, route: &str, request_id: &str) -> tracing::Span {
    let span = tracing::info_span!(
        "request",
        "otel.kind" = "server",
        "otel.name" = format_args!("{} {route}", req.method()),
        method = %req.method(),
        route,
        request_id,
        event = Empty,
        user = Empty,
        status = Empty,
    );
    if let Some(cx) = crate::telemetry::remote_context(req.headers()) {
        // Only fails when the span is disabled (no subscriber wants it).
        let _ = span.set_parent(cx);
    }
    span
}

/// Records the answer's status on the span, and logs the access line (at
/// debug: off unless RUST_LOG asks for it).
pub fn answered(span: &tracing::Span, status: u16, elapsed: std::time::Duration) {
    span.record("status", status);
    span.in_scope(|| {
        tracing::debug!(status, micros = elapsed.as_micros() as u64, "answered");
    });
}

/// Records the event a handler is serving on the request's span.
pub(crate) fn record_event(event: &str) {
    tracing::Span::current().record("event", event);
}

/// Records the user a handler is serving on the request's span.
pub(crate) fn record_user(user: &str) {
    tracing::Span::current().record("user", user);
}
