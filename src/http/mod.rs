//! The HTTP API (`API.md`): axum routes, state, and the layers around them.
//!
//! Each area builds its own router (`events`, `purchases`, `orders`,
//! `lookup`, `changes`, `webhooks`, `live`, `ops`, `tokens`, `draws`); [`router`] merges them and wraps each route in one middleware,
//! [`observe`] (with the body limit inside it), which runs the request in
//! its span (`trace`: request id, event, user, the caller's trace) under the
//! request timeout, records the per-route metrics labelled by the matched
//! path (`meters`: handles registered once), and passes the answer through
//! [`error::problemize`], which guarantees that every error body is
//! `application/problem+json`. One middleware rather than three: each layer
//! costs every request clones of the boxed services under it and a boxed
//! future. `openapi`
//! serves the document generated from the handlers' annotations
//! (`GET /openapi.json`).

mod archive;
mod changes;
mod draws;
pub mod error;
mod events;
pub mod guard;
mod live;
mod lookup;
mod meters;
mod openapi;
mod ops;
mod orders;
mod purchases;
mod quarantine;
mod release_orders;
mod releases;
pub mod serve;
mod tokens;
mod trace;
mod webhooks;
mod whole;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::control::flusher::FlushOptions;
use crate::control::rebalancer::RebalanceOptions;
use crate::domain::ids::EventId;
use crate::engine::Engine;
use crate::ledger::Ledger;
use crate::store::Store;

pub use error::{ApiError, ApiJson};
pub use guard::RateLimitOptions;
use guard::RateLimits;
pub use live::Live;
pub use meters::Meters;
pub use quarantine::{Quarantine, Quarantined};

/// The bounds every request is held to (`app::options::router` maps them
/// from `[server]`: `http` does not read settings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterOptions {
    /// Time limit for one request.
    pub(crate) request_timeout: Duration,
    /// Largest request body accepted.
    pub(crate) body_limit_bytes: usize,
}

/// What every handler can reach: one `Arc`, so the clone axum makes for
/// every request is one reference count (it was one per field: a dozen).
pub struct AppState<S: Store>(Arc<Shared<S>>);

/// The fields of [`AppState`], reached through it (`state.engine`).
pub struct Shared<S: Store> {
    pub engine: Arc<Engine<S>>,
    pub ledger: Ledger,
    pub admin_token: Option<Arc<str>>,
    pub limits: Arc<RateLimits>,
    pub metrics: PrometheusHandle,
    /// The handles of the request path's metric series.
    pub(crate) meters: Arc<Meters>,
    /// Events refused until an operator recovers them.
    pub(crate) quarantine: Arc<Quarantine>,
    pub flush: FlushOptions,
    pub rebalance: RebalanceOptions,
    /// Fires when the application stops (long admin operations give up).
    pub stop: CancellationToken,
    /// How long a long admin operation (a reshard, a close) may take before
    /// its request answers `503 try-again` while the operation goes on as its
    /// own task; kept under the request timeout, which would cut the answer
    /// to an ambiguous "outcome unknown".
    pub(crate) admin_wait: Duration,
    /// The snapshot `GET /v1/live` answers from (read at most once a second).
    pub live: Live,
}

impl<S: Store> AppState<S> {
    pub fn new(shared: Shared<S>) -> Self {
        Self(Arc::new(shared))
    }
}

impl<S: Store> Clone for AppState<S> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<S: Store> std::ops::Deref for AppState<S> {
    type Target = Shared<S>;

    fn deref(&self) -> &Shared<S> {
        &self.0
    }
}

impl<S: Store> AppState<S> {
    /// An engine error, but a quarantined event's "unknown" becomes a clear 503.
    fn engine_error(&self, event: &EventId, e: crate::engine::EngineError) -> ApiError {
        if matches!(e, crate::engine::EngineError::UnknownEvent(_))
            && let Some(refused) = self.quarantine.refusal(event)
        {
            return refused;
        }
        e.into()
    }

    /// [`AppState::engine_error`], and one more case: an event this instance
    /// has served (it is in the engine's cache) that the store no longer
    /// knows, while the database has it on sale. The store lost its state
    /// mid-sale (Redis emptied, restarted without its data, replaced): every
    /// purchase is refused with 503 until an operator recovers the event
    /// (`shardstock recover`), never answered "unknown event" for an event
    /// on sale, and `shardstock_store_events_lost_total` raises the alarm.
    /// Made-up ids never reach the database: the engine never knew them.
    async fn engine_error_checked(
        &self,
        event: &EventId,
        e: crate::engine::EngineError,
    ) -> ApiError {
        if !matches!(e, crate::engine::EngineError::UnknownEvent(_))
            || self.quarantine.contains(event)
            || !self.engine.is_known(event)
        {
            return self.engine_error(event, e);
        }
        match self.ledger.event(event).await {
            Ok(Some(db)) if !db.closed => {
                metrics::counter!(crate::metrics::STORE_EVENTS_LOST, "event" => event.to_string())
                    .increment(1);
                tracing::error!(%event, "the store lost an event the database has on sale");
                ApiError::Unavailable {
                    detail: format!(
                        "the store lost event {event}, which the database has on sale; \
                         an operator must run `shardstock recover {event}`"
                    ),
                    outcome_unknown: false,
                }
            }
            _ => self.engine_error(event, e),
        }
    }
}

/// The whole API.
///
/// Its layers are one: [`observe`] and the body limit, composed, wrap each
/// route once. Every layer added to a [`Router`] wraps every route in a
/// boxed service of its own, and a request clones the whole chain of boxes
/// at each level it passes (three layers made 13 allocations a request of
/// cloned boxes alone), so the request timeout runs inside [`observe`]
/// instead of as a layer of its own.
pub fn router<S: Store>(state: AppState<S>, opts: &RouterOptions) -> Router {
    let layers = tower::ServiceBuilder::new()
        .layer(middleware::from_fn_with_state(
            Observe {
                meters: state.meters.clone(),
                timeout: opts.request_timeout,
            },
            observe,
        ))
        .layer(DefaultBodyLimit::max(opts.body_limit_bytes));
    Router::new()
        .merge(events::router())
        .merge(purchases::router())
        .merge(tokens::router())
        .merge(draws::router())
        .merge(releases::router())
        .merge(release_orders::router())
        .merge(orders::router())
        .merge(lookup::router())
        .merge(changes::router())
        .merge(webhooks::router())
        .merge(live::router())
        .merge(ops::router())
        .fallback(error::not_found)
        .method_not_allowed_fallback(error::method_not_allowed)
        .with_state(state)
        .layer(layers)
}

/// What [`observe`] needs: the request path's metric handles and the request timeout.
#[derive(Clone)]
struct Observe {
    meters: Arc<Meters>,
    timeout: Duration,
}

/// Around every request: its span, the request timeout (a `408` that
/// [`error::problemize`] answers as `503`, outcome unknown), its metrics
/// (request count and latency, labelled by the matched route, not the raw
/// URI whose ids would explode the label set), a problem body for any
/// error answer, and the request's `X-Request-Id` on every answer, errors
/// included (the client's, or the one made for it: what its log lines carry).
async fn observe(State(o): State<Observe>, req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().cloned();
    let route = route.as_ref().map_or("unmatched", |p| p.as_str());
    let method = req.method().clone();
    let request_id = trace::request_id(&req);
    let span = trace::span(&req, route, &request_id);
    let start = Instant::now();
    let response = tokio::time::timeout(o.timeout, next.run(req))
        .instrument(span.clone())
        .await
        .unwrap_or_else(|_| StatusCode::REQUEST_TIMEOUT.into_response());
    let elapsed = start.elapsed();
    let status = response.status().as_u16();
    o.meters
        .request(route, &method, status, elapsed.as_secs_f64());
    trace::answered(&span, status, elapsed);
    let mut response = error::problemize(response);
    if let Ok(value) = HeaderValue::try_from(request_id) {
        response.headers_mut().insert(trace::X_REQUEST_ID, value);
    }
    response
}
