//! Logs and traces: the `tracing` subscriber the binary installs, and the
//! W3C trace context of incoming requests.
//!
//! - **Logs** go to stderr as text (the default) or as one JSON object per
//!   line (`[server] log_format = "json"`), filtered by `RUST_LOG` (default
//!   `info`). Each line carries the fields of the spans it was logged in, so a
//!   line logged while serving a request has the request's `request_id`,
//!   `event` and `user` (see `http::trace`); no span records a header, so the
//!   admin token never reaches a log.
//! - **Traces** are exported over OTLP (HTTP/protobuf) only when
//!   `OTEL_EXPORTER_OTLP_ENDPOINT` is set; the other `OTEL_*` variables of the
//!   OpenTelemetry SDK apply (`OTEL_SERVICE_NAME`, headers, timeouts). The
//!   engine's spans (home step, probe passes, finish, consolidation) and the
//!   flusher's batches are at `debug` level: the log filter leaves them out,
//!   so with no exporter their call sites are disabled and cost a cached
//!   check; the trace layer has its own filter that takes them.
//!
//! `main` calls [`init`] once; the returned [`Telemetry`] flushes the last
//! spans when dropped. Tests build [`trace_layer`] over an in-memory exporter.

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Subscriber;
use tracing_subscriber::filter::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, fmt};

use crate::config::LogFormat;

/// The environment variable that switches trace export on.
pub(crate) const OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// What the trace layer takes: the service's own spans down to `debug` (the
/// engine's steps), everything else from `info`.
const TRACE_FILTER: &str = "info,shardstock=debug";

/// The installed telemetry; dropping it flushes and stops the trace exporter.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether traces are exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("the trace exporter did not shut down cleanly: {e}");
        }
    }
}

/// Installs the global subscriber: logs in `format`, and the OTLP trace
/// exporter when `OTEL_EXPORTER_OTLP_ENDPOINT` is set.
pub fn init(format: LogFormat) -> anyhow::Result<Telemetry> {
    let filter = || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = match format {
        LogFormat::Text => fmt::layer().with_writer(std::io::stderr).boxed(),
        LogFormat::Json => fmt::layer()
            .json()
            .with_current_span(false)
            .with_span_list(true)
            .with_writer(std::io::stderr)
            .boxed(),
    }
    .with_filter(filter());
    let provider = match std::env::var(OTLP_ENDPOINT) {
        Ok(endpoint) if !endpoint.trim().is_empty() => Some(otlp_provider()?),
        _ => None,
    };
    let traces = provider.as_ref().map(trace_layer);
    tracing_subscriber::registry()
        .with(logs)
        .with(traces)
        .try_init()?;
    if provider.is_some() {
        tracing::info!(
            endpoint = %std::env::var(OTLP_ENDPOINT).unwrap_or_default(),
            "exporting traces over OTLP"
        );
    }
    Ok(Telemetry { provider })
}

/// The OTLP/HTTP exporter, batched; the SDK reads its `OTEL_*` settings.
fn otlp_provider() -> anyhow::Result<SdkTracerProvider> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(
            std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "shardstock".into()),
        )
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

/// The layer that turns `tracing` spans into OpenTelemetry spans of
/// `provider`, with its own filter ([`TRACE_FILTER`]).
pub fn trace_layer<S>(provider: &SdkTracerProvider) -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("shardstock"))
        .with_location(false)
        .with_threads(false)
        .with_filter(EnvFilter::new(TRACE_FILTER))
}

/// The caller's trace context from a `traceparent` (and `tracestate`)
/// header; `None` when there is none, so requests without one pay nothing.
pub(crate) fn remote_context(headers: &axum::http::HeaderMap) -> Option<opentelemetry::Context> {
    if !headers.contains_key("traceparent") {
        return None;
    }
    Some(TraceContextPropagator::new().extract(&Headers(headers)))
}

struct Headers<'a>(&'a axum::http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TraceContextExt;

    #[test]
    fn a_traceparent_header_gives_the_callers_trace_id() {
        let mut h = axum::http::HeaderMap::new();
        assert!(remote_context(&h).is_none());
        h.insert(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
                .parse()
                .unwrap(),
        );
        let cx = remote_context(&h).unwrap();
        let span = cx.span();
        let sc = span.span_context();
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
        assert!(sc.is_remote());
    }
}
