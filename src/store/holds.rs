//! Holds: purchases on events with `hold_seconds` are held until the buyer
//! confirms them or their pay-by deadline passes.
//!
//! A hold is recorded in its home bucket by the step that buys it
//! (`purchase`, or the saga's `finish`): the order's index entry says `H`
//! with its deadline, the bucket's deadline index (`holds`, a sorted set in
//! the bucket's slot) lists it, the bucket counts its units (`hunits`), and
//! a hold record goes into the stream. Confirm and expiry are decided by one
//! step each on that bucket, so a confirm racing an expiry ends exactly one
//! way, and an expiry puts units back and drops the user's count once.
//!
//! Which buckets to sweep is kept in one deployment-wide index (`ss:holds`,
//! bucket -> when to look next): a step that puts the first hold into a
//! bucket announces it there (`announce_holds`, in the same store call, after
//! the bucket's step), and the sweeper moves the entry to the bucket's next
//! deadline, or drops it, with a compare-and-set (`reschedule_holds`). Idle
//! buckets are never polled.

use crate::domain::ids::OrderId;
use crate::domain::keys::BucketRef;
use crate::domain::model::OrderEntry;

/// The answer of [`Holds::confirm`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfirmReply {
    /// Confirmed by this call.
    Confirmed(OrderEntry),
    /// Confirmed before (or never held): nothing changed.
    AlreadyConfirmed(OrderEntry),
    /// The deadline had passed: `now` when this call expired it (units back
    /// on sale), false when it had expired before.
    Expired {
        entry: OrderEntry,
        now: bool,
    },
    /// Cancelled before: nothing changed.
    Cancelled(OrderEntry),
    NotFound,
}

/// The answer of [`Holds::expire_holds`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExpireReply {
    /// The orders this call expired, with their entries after the change.
    pub expired: Vec<(OrderId, OrderEntry)>,
    /// The earliest deadline still in the bucket's index.
    pub next: Option<i64>,
}

section! {
    /// Steps on held orders, and the deployment-wide index of buckets with holds.
    pub trait Holds => forward_holds {
        /// Confirms a held order before its deadline, or expires it at or after
        /// (`lua/confirm.lua`). A sealed bucket is stale.
        fn confirm(bucket: &BucketRef, now_ms: i64, order: &OrderId) -> ConfirmReply;

        /// Expires up to `count` holds of the bucket whose deadline is at or
        /// before `now_ms`; with `void`, every live hold, sealed bucket or not (a
        /// close) (`lua/expire_holds.lua`).
        fn expire_holds(bucket: &BucketRef, now_ms: i64, count: u32, void: bool) -> ExpireReply;

        /// Adds the bucket to the deadline index at `at_ms`, or lowers its entry
        /// to `at_ms` (ZADD LT).
        fn announce_holds(bucket: &BucketRef, at_ms: i64) -> ();

        /// Buckets of the deadline index due at `now_ms`, with their scores, at
        /// most `count`, earliest first. Entries that do not parse are dropped.
        fn due_holds(now_ms: i64, count: u32) -> Vec<(BucketRef, i64)>;

        /// After a sweep: moves the bucket's index entry from `seen` to `next`, or
        /// drops it (`None`), unless it changed since it was read
        /// (`lua/hold_index.lua`). True when it moved.
        fn reschedule_holds(bucket: &BucketRef, seen: i64, next: Option<i64>) -> bool;

        /// The earliest deadline in the bucket's own index (a read).
        fn next_hold(bucket: &BucketRef) -> Option<i64>;
    }
    also {
    }
}
