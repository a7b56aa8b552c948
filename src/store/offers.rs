//! Offers: a draw's waiting list, its units set aside in the buckets and
//! offered to the line in order (docs/DESIGN.md, "Fair drops", "As built
//! (the waiting list)"; the records are `domain::offer`'s).
//!
//! At a bucket (each step one slot): `waitlist_on` opens the bucket's list
//! (from then on an expiry, a cancel or a confirm found late puts the units
//! aside, in the same step, instead of back in stock: `expire_holds.lua`,
//! `cancel.lua`, `confirm.lua`); `reserve_offers` turns units aside into
//! tickets; `open_offer` opens a ticket's offer at the position the list
//! gave it (or, nobody left in line, puts its unit on open sale and closes
//! the bucket's list); `claim_offer` buys an open offer before its
//! deadline, writing the order and its stream record in the same step;
//! `pass_offers` passes open offers past their deadline, their units back
//! aside; `ticket` reads one record. The close's `retire` counts the list's
//! units as leftover, and the audit counts them with the stock.
//!
//! At the list's own slot (`keys::list_key`): `write_line` keeps the line
//! (position -> user) the draw made, `open_list` its length, and
//! `assign_offer` gives a bucket's ticket the next position, once (keyed by
//! bucket and ticket, so a sweeper that died between the two slots and the
//! next one that asks again get the same position); `offer_at` reads which
//! ticket a position was given.

use crate::domain::ids::{EventId, OrderId, UserId};
use crate::domain::keys::BucketRef;
use crate::domain::model::OrderEntry;
use crate::domain::offer::{Offer, Ticket};

/// The answer of [`Offers::assign_offer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Assign {
    /// The ticket's position (given now or before) and its user.
    Offered { position: u64, user: UserId },
    /// Every position was given: nobody is left in line.
    Exhausted,
    /// The event has no list (yet): not drawn.
    NoList,
}

/// The answer of [`Offers::open_offer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenReply {
    /// Opened now.
    Opened,
    /// The ticket was opened (or closed) before: nothing changed.
    Already,
    /// Nobody left in line: the unit went back on open sale now.
    ToSale,
}

/// What [`Offers::claim_offer`] checks and writes.
#[derive(Debug, Clone)]
pub struct Claim {
    pub ticket: u64,
    /// The open offer the buyer's token names.
    pub offer: Offer,
    pub now_ms: i64,
    /// The end of the event's sale window (`ends_at`), if it has one: a
    /// claim at or after it buys nothing, as a purchase does not.
    pub ends_ms: Option<i64>,
    pub order: OrderId,
    /// The order's index entry (confirmed, one unit, this bucket).
    pub entry: OrderEntry,
}

/// The answer of [`Offers::claim_offer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimReply {
    /// Bought now: the claim's order.
    Bought,
    /// Bought before: the order that bought it.
    Replay(OrderId),
    /// Its deadline has passed (the sweeper passes it).
    Expired,
    /// Passed to the next user in line.
    Passed,
    /// The bucket is sealed: the sale is closed.
    Closed,
    /// The sale window ended: not bought.
    Ended,
    /// The ticket does not hold that offer.
    NotOffered,
}

section! {
    /// Steps of a draw's waiting list and its offers.
    pub trait Offers => forward_offers {
        /// Opens the bucket's waiting list unless it was opened (or closed)
        /// before (`lua/waitlist_on.lua`).
        fn waitlist_on(bucket: &BucketRef) -> ();

        /// Keeps positions of the line (plain `HSET`s: the draw writes the
        /// same line whenever it is redone).
        fn write_line(event: &EventId, line: &[(u64, UserId)]) -> ();

        /// Keeps the line's length unless kept (opens the list).
        fn open_list(event: &EventId, len: u64) -> ();

        /// Gives `bucket`'s `ticket` the next position, or the one it was
        /// given (`lua/assign_offer.lua`).
        fn assign_offer(event: &EventId, bucket: &BucketRef, ticket: u64) -> Assign;

        /// The bucket and ticket `position` was given, if any.
        fn offer_at(event: &EventId, position: u64) -> Option<(BucketRef, u64)>;

        /// Turns up to `max` units aside into tickets; answers the bucket's
        /// reserved tickets (these and any a sweeper left), at most `max`
        /// (`lua/reserve_offers.lua`).
        fn reserve_offers(bucket: &BucketRef, max: u32) -> Vec<u64>;

        /// Opens a reserved ticket's offer, or with `None` (nobody left in
        /// line) puts its unit and the units aside on open sale and closes
        /// the bucket's list (`lua/open_offer.lua`).
        fn open_offer(bucket: &BucketRef, ticket: u64, offer: Option<&Offer>) -> OpenReply;

        /// Buys an open offer (`lua/claim_offer.lua`).
        fn claim_offer(bucket: &BucketRef, claim: &Claim) -> ClaimReply;

        /// Passes up to `count` open offers whose deadline is at or before
        /// `now_ms`, their units back aside; answers them
        /// (`lua/pass_offers.lua`).
        fn pass_offers(bucket: &BucketRef, now_ms: i64, count: u32) -> Vec<Offer>;

        /// A ticket's record (a read).
        fn ticket(bucket: &BucketRef, ticket: u64) -> Option<Ticket>;
    }
    also {}
}
