//! Test data: unique event ids, users, specs, users homed at a bucket, and
//! purchase requests.

use std::time::Duration;

use shardstock::domain::ids::{EventId, RequestId, UserId};
use shardstock::domain::model::{DEFAULT_MAX_PER_ORDER, EventSpec};
use shardstock::domain::routing::{home, user_hash};
use shardstock::engine::{Engine, EngineError, PurchaseOutcome, PurchaseRequest};
use shardstock::store::Store;

/// A unique event id for this test run.
pub fn event_id(prefix: &str) -> EventId {
    EventId::parse(format!("{prefix}-{:08x}", rand::random::<u32>())).unwrap()
}

pub fn user(name: impl Into<String>) -> UserId {
    UserId::parse(name.into()).unwrap()
}

/// A purchase of `qty` units of `event` by `user_id`, with the request id
/// `rid` (`None`: a purchase that cannot be retried).
pub fn req(event: &EventId, user_id: &str, qty: u32, rid: Option<&str>) -> PurchaseRequest {
    PurchaseRequest {
        event: event.clone(),
        user: user(user_id),
        quantity: qty,
        request_id: rid.map(|r| RequestId::parse(r).unwrap()),
        access_token: None,
    }
}

/// An event of `stock` units in `buckets` buckets, with no limit and no window.
pub fn spec(id: &EventId, stock: u64, buckets: u32) -> EventSpec {
    EventSpec {
        id: id.clone(),
        stock,
        buckets,
        per_user_limit: None,
        max_per_order: DEFAULT_MAX_PER_ORDER,
        starts_at: None,
        ends_at: None,
        hold_seconds: None,
        auto_buckets: None,
        tokens: None,
        draw: None,
    }
}

/// A user id whose home bucket is `bucket` among `n`.
pub fn user_homed_at(bucket: u32, n: u32, salt: &str) -> String {
    (0..)
        .map(|i| format!("u-{salt}-{i}"))
        .find(|u| home(user_hash(&user(u.as_str())), n) == bucket)
        .unwrap()
}

/// A purchase driven to a final answer the way a client does it: a
/// `Contention` (503 `try-again`: nothing was bought) is sent again with the
/// same request, after a short pause, a bounded number of times. Under a
/// CPU-starved test run a saga can give up waiting for the mover lease; that
/// answer is true (nothing bought), and the retry must then settle it.
pub async fn purchase_final<S: Store>(
    engine: &Engine<S>,
    req: &PurchaseRequest,
) -> Result<PurchaseOutcome, EngineError> {
    for _ in 0..20 {
        match engine.purchase(req).await {
            Err(EngineError::Contention { .. }) => {
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            other => return other,
        }
    }
    engine.purchase(req).await
}
