//! Releases: the steps of a multi-line order (docs/DESIGN.md, "Releases").
//!
//! At the user's home (`keys::HomeRef`, one slot): `reserve` counts the
//! order's units against the release-wide limit and leaves the pending
//! record; `commit_order` and `abort_order` decide it by compare-and-set
//! from that record; `release_order` gives the reservation of a refused
//! order back once every line is closed; `stale_orders` lists what the
//! sweeper must end. At a bucket of a line's pool: `take_line` is the
//! saga's `take` whose walk stops at an undone marker, and `undo_line`
//! gives a take back or closes the bucket to a late walk. The engine
//! encodes every record (`domain::release`); a step compares and stores it.

use crate::domain::ids::{EventId, OrderId, UserId};
use crate::domain::keys::{BucketRef, HomeRef};
use crate::domain::release::{HomeRecord, ReleaseSpec};
use crate::domain::stream::RecordKind;
use crate::store::TakeArgs;

/// A `reserve` at the user's home.
#[derive(Debug, Clone)]
pub struct ReserveArgs {
    pub rid: String,
    pub user: UserId,
    /// Units of the order, all lines.
    pub units: u64,
    /// 0: no release-wide limit.
    pub limit: u32,
    /// The record left when reserved.
    pub pending: HomeRecord,
    /// The record kept when refused by the limit.
    pub limited: HomeRecord,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReserveReply {
    /// Counted and pending: the order is the caller's to drive.
    Reserved,
    /// Over the limit; `held` is what the user holds already.
    Limit { held: u64 },
    /// The request id has a record; `held` is the user's count now.
    Replay { record: HomeRecord, held: u64 },
}

/// A compare-and-set on a home record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decided {
    /// This call moved the record.
    Done,
    /// The record was not the one expected: this is what it is.
    Found(HomeRecord),
    /// No record under the request id.
    NoRecord,
}

/// A line's take in one bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LineTake {
    /// Taken here (now, or by an earlier driver of this order).
    Taken { order_id: OrderId },
    /// Not enough here: as [`crate::store::TakeReply::Short`].
    Short {
        available: u64,
        fresh: bool,
        adds: u64,
    },
    /// The order's undo closed this bucket or gave the take here back: the
    /// order was refused, the walk stops.
    Undone,
    /// The line's take here was confirmed (`K`): the order was committed
    /// and paid, the walk stops. A late walk that read this as short would
    /// take the line a second time further on (seed 1269490 found it).
    Confirmed,
}

/// A line's undo in one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineUndo {
    /// The take here given back (`T` → `U`), with its void record.
    GaveBack,
    /// No decision here yet: closed to a late walk (nothing → `U`).
    Closed,
    /// Undone already (a replay of the undo).
    Already,
    /// A short decision: a walk went on past this bucket, so does the undo.
    Short,
}

/// A held order's line confirmed in one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineConfirm {
    /// The take here confirmed: `T` → `K`, with its confirm record.
    Confirmed,
    /// Confirmed already (a replay).
    Already,
    /// A short decision (or another order's marker): the walk went on past
    /// this bucket, so does the confirm.
    Short,
    /// No marker of the line here, or its undone one: the take is not
    /// where its walk left it (a marker outlived, a pool resharded).
    Missing,
}

section! {
    /// Steps of a release's multi-line orders.
    pub trait Releases => forward_releases {
        /// Stores the release's spec unless one is stored, and lists the
        /// release; answers the spec stored before, if any
        /// (`lua/create_release.lua`).
        fn create_release(spec: &ReleaseSpec) -> Option<ReleaseSpec>;

        /// The release's spec.
        fn load_release(release: &EventId) -> Option<ReleaseSpec>;

        /// Every release's id.
        fn list_releases() -> Vec<EventId>;

        /// Answers a known request id from its record, else counts the
        /// order's units against the limit and leaves the pending record
        /// in `pend`, or refuses by the limit (`lua/reserve.lua`).
        fn reserve(home: &HomeRef, now_ms: i64, args: &ReserveArgs) -> ReserveReply;

        /// `P` → `B` by compare-and-set; the order leaves `pend`, its id
        /// indexed to its request id (`lua/decide_order.lua`).
        fn commit_order(
            home: &HomeRef,
            rid: &str,
            pending: &HomeRecord,
            bought: &HomeRecord,
        ) -> Decided;

        /// `P` → `R` by compare-and-set; the order stays in `pend` until
        /// released (`lua/decide_order.lua`).
        fn abort_order(
            home: &HomeRef,
            rid: &str,
            pending: &HomeRecord,
            refused: &HomeRecord,
        ) -> Decided;

        /// `P` → `H` (held, open) by compare-and-set on a release with
        /// holds: the order stays in `pend` until its hold ends, and its
        /// order id is indexed to its request id (`oids`) for confirm and
        /// cancel (`lua/decide_order.lua`).
        fn hold_order(
            home: &HomeRef,
            rid: &str,
            pending: &HomeRecord,
            held: &HomeRecord,
            order_id: &OrderId,
        ) -> Decided;

        /// A held order's next state by compare-and-set (open → confirming,
        /// cancelling or expiring; confirming → confirmed with `ended`, out
        /// of `pend`) (`lua/decide_order.lua`).
        fn move_hold(
            home: &HomeRef,
            rid: &str,
            expected: &HomeRecord,
            next: &HomeRecord,
            ended: bool,
        ) -> Decided;

        /// The request id a bought order's id is kept under (`oids`).
        fn order_request(home: &HomeRef, order_id: &OrderId) -> Option<String>;

        /// `R` → `X` (or a held order's cancelling → cancelled, expiring →
        /// expired) by compare-and-set, once every line is closed or given
        /// back: the user's count down by `units`, the order out of `pend`
        /// (`lua/release_order.lua`).
        fn release_order(
            home: &HomeRef,
            rid: &str,
            user: &UserId,
            units: u64,
            refused: &HomeRecord,
            released: &HomeRecord,
        ) -> Decided;

        /// Orders in `pend` since `before_ms` or earlier whose record is `P`,
        /// `R` or `H`, at most `count`; others leave the set on the way
        /// (`lua/stale_orders.lua`).
        fn stale_orders(home: &HomeRef, before_ms: i64, count: u32) -> Vec<(String, HomeRecord)>;

        /// The record under a request id.
        fn home_record(home: &HomeRef, rid: &str) -> Option<HomeRecord>;

        /// Units a user holds against the release-wide limit.
        fn home_units(home: &HomeRef, user: &UserId) -> u64;

        /// One step of a line's walk: `take.lua` with the line's undone
        /// marker, which it answers `Undone` (`lua/take.lua`).
        fn take_line(bucket: &BucketRef, now_ms: i64, args: &TakeArgs) -> LineTake;

        /// One step of a line's undo (`lua/undo_line.lua`). Works on a
        /// sealed bucket.
        fn undo_line(bucket: &BucketRef, now_ms: i64, args: &TakeArgs) -> LineUndo;

        /// One step of a held order's line given back (cancelled or
        /// expired): `undo_line`'s walk whose record is of `kind`
        /// (`Cancel` or `Expire`) instead of a void (`lua/undo_line.lua`).
        fn give_back_line(
            bucket: &BucketRef,
            now_ms: i64,
            args: &TakeArgs,
            kind: RecordKind,
        ) -> LineUndo;

        /// One step of a held order's line confirmed: its take `T` → `K`
        /// with the confirm record, exactly once (`lua/confirm_line.lua`).
        /// Works on a sealed bucket.
        fn confirm_line(bucket: &BucketRef, now_ms: i64, args: &TakeArgs) -> LineConfirm;
    }
    also {}
}
