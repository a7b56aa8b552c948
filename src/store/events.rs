//! The event slot: steps on one event's meta (`ss:{<event>}:meta`), which every
//! instance reads to route, and the sets of known events: the open ones, which
//! background work visits, and the retired ones (closed and flushed).
//!
//! The meta is the event's routing table (layout generation, bucket count, the
//! retired layouts still holding records), its status, and the `seq` that makes
//! a sold-out mark trustworthy. Every write is a compare-and-set or idempotent,
//! so two instances finishing the same creation, close or reshard agree; the
//! end of a reshard is also fenced by the mover lease, so a close (which
//! writes `closed`) is never undone by a reshard that was under way.

use crate::domain::ids::EventId;
use crate::domain::model::{EventMeta, EventSpec, EventStatus, LayoutChange};
use crate::domain::token::TokenAccess;

/// Whether `create_event` wrote the meta.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateEventReply {
    Created,
    /// The event exists: nothing was written; this is its meta.
    Exists(Box<EventMeta>),
}

/// What bumping an event's seq found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqBump {
    pub seq: u64,
    /// The event was marked sold out (now or at an earlier bump whose caller
    /// never finished): every bucket's epoch must be bumped, then
    /// [`Events::epochs_bumped`] called with this value.
    pub epochs_due: Option<u64>,
}

/// The answer of [`Events::end_reshard`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReshardReply {
    /// The event routes to the new layout and is on sale again.
    Switched,
    /// The event is not resharding to that layout: a close made it `closed`,
    /// or another run switched it already. Nothing changed.
    NotResharding,
    /// The caller no longer holds the mover lease with its token (it stalled
    /// past it; a close or a newer run took it). Nothing changed.
    LeaseLost,
}

section! {
    /// Steps on an event's own slot.
    pub trait Events => forward_events {
        /// Writes the meta with status `creating` unless the event exists
        /// (`lua/create_event.lua`).
        fn create_event(spec: &EventSpec, now_ms: i64) -> CreateEventReply;

        /// Adds the event to the set of open events (`ss:events`); idempotent.
        fn register_event(event: &EventId) -> ();

        /// Every known event, open or retired (the listing of `GET /v1/events`).
        fn list_events() -> Vec<EventId>;

        /// The open events: what background work (flusher sweep, gauges,
        /// rebalancer, audits) visits. A retired event is not among them.
        fn list_open_events() -> Vec<EventId>;

        /// Moves a closed event whose streams are flushed out of the open set
        /// (`ss:events` → `ss:retired`); idempotent. Its meta and its ledger rows
        /// stay, so it is still listed, viewed and audited. Two commands on two
        /// slots, added to `ss:retired` first: a crash between them leaves the
        /// event in both sets (retired again next time), never in neither.
        fn retire_event(event: &EventId) -> ();

        /// Takes a retired event out of the listing (`DELETE /v1/events/{id}`);
        /// its meta stays readable and the ledger keeps its orders. Idempotent.
        fn archive_event(event: &EventId) -> ();

        /// The event's meta, `None` if it has none.
        fn load_meta(event: &EventId) -> Option<EventMeta>;

        /// The event's keys alone (the meta's `tokens` field), `None` without
        /// meta or keys: what a refresh of an engine's keys reads each second
        /// per cached event with keys, instead of the whole meta and its
        /// layout history.
        fn load_token_keys(event: &EventId) -> Option<TokenAccess>;

        /// Moves the status from `from` to `to`; false if it was not `from`
        /// (`lua/set_status.lua`).
        fn set_status(event: &EventId, from: EventStatus, to: EventStatus) -> bool;

        /// Replaces the keys of a token or draw event that is not closed;
        /// false otherwise (`lua/set_token_keys.lua`).
        fn set_token_keys(event: &EventId, keys: &TokenAccess) -> bool;

        /// Routes the event to layout `generation` with `buckets` buckets; `retired`
        /// lists older layouts that may still hold records. False without meta
        /// (`lua/set_layout.lua`).
        fn set_layout(
            event: &EventId,
            generation: u32,
            buckets: u32,
            retired: &[(u32, u32)],
        ) -> bool;

        /// Replaces the retired layouts with `retired` if the event is on sale in
        /// `generation` still; false otherwise (`lua/set_retired.lua`).
        fn set_retired(event: &EventId, generation: u32, retired: &[(u32, u32)]) -> bool;

        /// Increments the event's seq (after units were added to a bucket)
        /// (`lua/bump_seq.lua`).
        fn bump_seq(event: &EventId) -> SeqBump;

        /// Clears the `due` that [`Events::bump_seq`] answered, once every bucket's
        /// epoch was bumped; false when a newer one was recorded since
        /// (`lua/epochs_bumped.lua`).
        fn epochs_bumped(event: &EventId, due: u64) -> bool;

        /// Marks the event sold out at `seq` for orders of more than `left`
        /// units, if its seq is still `seq` (`lua/mark_sold_out.lua`).
        fn mark_sold_out(event: &EventId, seq: u64, now_ms: i64, left: u64) -> bool;

        /// Marks the event as resharding to `(generation, buckets)` (or confirms an
        /// interrupted reshard to the same layout); false otherwise
        /// (`lua/begin_reshard.lua`).
        fn begin_reshard(event: &EventId, generation: u32, buckets: u32) -> bool;

        /// Switches to the new layout and back on sale, in one step, if the event
        /// is still resharding to it and `owner` still holds the mover lease with
        /// `token` (`lua/end_reshard.lua`). The caller has checked that the old
        /// layout holds no units.
        fn end_reshard(
            event: &EventId,
            change: &LayoutChange,
            retired: &[(u32, u32)],
            owner: &str,
            token: u64,
        ) -> EndReshardReply;
    }
    also {
    }
}
