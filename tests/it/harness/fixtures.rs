//! Test data: unique event ids, users, specs, and users homed at a bucket.

use shardstock::domain::ids::{EventId, UserId};
use shardstock::domain::model::{DEFAULT_MAX_PER_ORDER, EventSpec};
use shardstock::domain::routing::{home, user_hash};

/// A unique event id for this test run.
pub fn event_id(prefix: &str) -> EventId {
    EventId::parse(format!("{prefix}-{:08x}", rand::random::<u32>())).unwrap()
}

pub fn user(name: impl Into<String>) -> UserId {
    UserId::parse(name.into()).unwrap()
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
    }
}

/// A user id whose home bucket is `bucket` among `n`.
pub fn user_homed_at(bucket: u32, n: u32, salt: &str) -> String {
    (0..)
        .map(|i| format!("u-{salt}-{i}"))
        .find(|u| home(user_hash(&user(u.as_str())), n) == bucket)
        .unwrap()
}
