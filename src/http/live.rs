//! `GET /v1/live`: every listed event's view in one answer, read from the
//! store at most once a second however many clients ask: what the live page
//! (`/ui`) draws.
//!
//! The page used to fetch the listing, then each event's view, every second,
//! from every open tab: tabs × events store reads a second. Here one snapshot
//! answers every request made within [`REFRESH`] of the moment its read
//! began. The first request after that starts the next read, as a task of its
//! own (a client that goes away does not cancel it for the others), and every
//! request meanwhile awaits that same read; a read still running past
//! [`REFRESH`] is joined, never doubled, so a slow store is not asked twice.
//! N tabs cost the store what one does. The body is serialized once a read.
//!
//! A release's pools are events, and `releases` says which, in the
//! release's order: the page groups them side by side.
//!
//! Each view is the one `GET /v1/events/{id}` answers (a closed event's from
//! the database). An event whose view fails (refused until an operator
//! recovers it, its store unreachable) is named in `unavailable` instead of
//! failing the answer; only a listing that fails does, and that failure is
//! the snapshot's too, until the next read.
//!
//! The lock guards a few pointer copies and is never held across an
//! `.await`: the read runs outside it.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::StreamExt;
use futures::future::{BoxFuture, FutureExt, Shared};
use serde::Serialize;
use utoipa::ToSchema;

use super::{ApiError, AppState};
use crate::domain::ids::EventId;
use crate::engine::{EngineError, EventView};
use crate::store::Store;

/// How long one snapshot answers: the live page's refresh period.
pub(crate) const REFRESH: Duration = Duration::from_secs(1);

/// Views read at once within a snapshot (the store sees a bounded burst, not
/// one read per event all at the same instant).
const VIEWS_AT_ONCE: usize = 16;

pub fn router<S: Store>() -> Router<AppState<S>> {
    Router::new().route("/v1/live", get(live::<S>))
}

/// `GET /v1/live`'s body.
#[derive(Serialize, ToSchema)]
pub(super) struct LiveViews {
    /// When this snapshot's read began (RFC 3339): the views are at most
    /// `refresh_ms` older than a fresh `GET /v1/events/{id}`.
    #[schema(format = DateTime)]
    at: String,
    /// How long one snapshot answers (ms).
    refresh_ms: u64,
    /// The rebalancer's `skew_threshold`: a `skew` above it is uneven enough
    /// for the rebalancer to level (the live page highlights it).
    skew_threshold: f64,
    /// Every listed event's view, by id, as `GET /v1/events/{id}` answers it.
    events: Vec<EventView>,
    /// Listed events whose view could not be read for this snapshot.
    #[schema(value_type = Vec<EventId>)]
    unavailable: Vec<EventId>,
    /// Every release and its pools' event ids in the release's order (each
    /// pool's view is among `events`): the page shows a release's pools
    /// side by side. A release whose spec could not be read is left out
    /// (its pools still show, as events).
    releases: Vec<LiveRelease>,
}

/// A release in `GET /v1/live`: its id and its pools' events, in order.
#[derive(Serialize, ToSchema)]
pub(super) struct LiveRelease {
    #[schema(value_type = String)]
    id: EventId,
    /// Each pool's event id (`<release>.<pool>`), in the release's order.
    #[schema(value_type = Vec<String>)]
    pools: Vec<EventId>,
}

/// One snapshot's read, shared by every request that awaits it.
type Read = Shared<BoxFuture<'static, Result<Bytes, Arc<ApiError>>>>;

/// The latest snapshot and when its read began (one per application).
#[derive(Default)]
pub struct Live {
    latest: Mutex<Option<(Instant, Read)>>,
}

impl Live {
    /// The snapshot to answer from: the latest if it began within
    /// [`REFRESH`] or is still being read, else a new read.
    fn snapshot<S: Store>(&self, state: &AppState<S>) -> Read {
        let mut latest = self.latest.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((began, read)) = latest.as_ref()
            && (began.elapsed() < REFRESH || read.peek().is_none())
        {
            return read.clone();
        }
        let task = tokio::spawn(read_all(state.clone()));
        let read = async move {
            task.await.unwrap_or_else(|e| {
                Err(Arc::new(ApiError::Internal(format!(
                    "the live snapshot's read failed: {e}"
                ))))
            })
        }
        .boxed()
        .shared();
        *latest = Some((Instant::now(), read.clone()));
        read
    }
}

/// Reads the listing and every listed event's view, and serializes the body.
async fn read_all<S: Store>(state: AppState<S>) -> Result<Bytes, Arc<ApiError>> {
    let at = state.engine.clock().now_ms();
    let mut ids = state
        .engine
        .store()
        .list_events()
        .await
        .map_err(|e| Arc::new(ApiError::from(EngineError::from(e))))?;
    ids.sort();
    let state = &state;
    let read: Vec<(EventId, Result<EventView, ApiError>)> = futures::stream::iter(ids)
        .map(|id| async move {
            let view = state.event_view(&id).await;
            (id, view)
        })
        .buffered(VIEWS_AT_ONCE)
        .collect()
        .await;
    let releases = releases(state).await;
    let mut body = LiveViews {
        at: crate::domain::model::rfc3339_ms::format(at),
        refresh_ms: REFRESH.as_millis() as u64,
        skew_threshold: state.rebalance.policy.skew_threshold,
        events: Vec::with_capacity(read.len()),
        unavailable: Vec::new(),
        releases,
    };
    for (id, view) in read {
        match view {
            Ok(view) => body.events.push(view),
            // Archived between the listing and its read: no longer listed.
            Err(ApiError::UnknownEvent(_)) => {}
            Err(e) => {
                tracing::debug!(event = %id, error = %e, "left out of the live snapshot");
                body.unavailable.push(id);
            }
        }
    }
    serde_json::to_vec(&body)
        .map(Bytes::from)
        .map_err(|e| Arc::new(ApiError::Internal(format!("the live snapshot: {e}"))))
}

/// Every release and its pools' events (a spec is read once per engine,
/// then cached: a snapshot costs the store one listing).
async fn releases<S: Store>(state: &AppState<S>) -> Vec<LiveRelease> {
    let mut ids = match state.engine.store().list_releases().await {
        Ok(ids) => ids,
        Err(e) => {
            tracing::debug!(error = %e, "live snapshot: listing releases failed");
            return Vec::new();
        }
    };
    ids.sort();
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        match state.engine.release_spec(&id).await {
            Ok(spec) => {
                let pools = (0..spec.pools.len())
                    .filter_map(|k| spec.pool_event(k).ok())
                    .collect();
                out.push(LiveRelease { id, pools });
            }
            Err(e) => tracing::debug!(release = %id, error = %e, "left out of the live snapshot"),
        }
    }
    out
}

/// The answer a failed snapshot gives every request that shares it (a
/// listing fails as unreachable, busy or broken; see `From<EngineError>`).
fn failed(e: &ApiError) -> ApiError {
    match e {
        ApiError::Unavailable {
            detail,
            outcome_unknown,
        } => ApiError::Unavailable {
            detail: detail.clone(),
            outcome_unknown: *outcome_unknown,
        },
        ApiError::TryAgain(why) => ApiError::TryAgain(why.clone()),
        other => ApiError::Internal(other.to_string()),
    }
}

/// Every listed event's view, from a snapshot read at most once a second.
#[utoipa::path(
    get, path = "/v1/live", tag = "events", operation_id = "live_views",
    responses(
        (status = 200, description = "Every listed event's view, from a snapshot shared by every \
                                      request within `refresh_ms` of its read (what the live page draws)", body = LiveViews),
        (status = 500, response = super::openapi::Internal),
        (status = 503, response = super::openapi::Unavailable),
    ),
)]
pub(super) async fn live<S: Store>(State(state): State<AppState<S>>) -> Result<Response, ApiError> {
    let read = state.live.snapshot(&state);
    match read.await {
        Ok(body) => Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response()),
        Err(e) => Err(failed(&e)),
    }
}
