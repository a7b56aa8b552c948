//! Leases in an event's slot: the rebalancer's leadership and the mover lease.
//!
//! Both are a holder key (`"owner|number"`, with a TTL) and a counter, taken by
//! `lua/lease_acquire.lua` and renewed or released by `lua/lease_renew.lua` —
//! one pair of scripts, two pairs of keys (`leader`/`term`, `lease`/`token`).
//! The mover lease's number is a fencing token: it strictly increases across
//! owners, and every bucket refuses a transfer step with a token lower than the
//! highest it has seen, so a mover that paused past its lease cannot do harm.

use crate::domain::ids::EventId;

section! {
    /// Steps on an event's leadership and mover lease.
    pub trait Leases => forward_leases {
        /// Takes or renews (same owner) the event's rebalancer leadership; returns
        /// the leadership term, or `None` when another instance leads
        /// (`lua/lease_acquire.lua` on the leadership keys).
        fn acquire_leadership(event: &EventId, owner: &str, ttl_ms: u64) -> Option<u64>;

        /// Gives up the leadership if `owner` still holds it with `term`
        /// (`lua/lease_renew.lua` with TTL 0, on the leadership keys).
        fn release_leadership(event: &EventId, owner: &str, term: u64) -> ();

        /// Takes (or renews, for the same owner) the event's mover lease; returns its
        /// fencing token, or `None` when another owner holds it
        /// (`lua/lease_acquire.lua`).
        fn acquire_lease(event: &EventId, owner: &str, ttl_ms: u64) -> Option<u64>;

        /// Takes the event's mover lease whoever holds it, with a fresh fencing
        /// token (a close wins over background work). The caller must raise every
        /// bucket's fence to the token before it moves anything
        /// (`lua/lease_acquire.lua` with `seize`).
        fn seize_lease(event: &EventId, owner: &str, ttl_ms: u64) -> u64;

        /// Extends the lease if `owner` still holds it with `token`
        /// (`lua/lease_renew.lua`).
        fn renew_lease(event: &EventId, owner: &str, token: u64, ttl_ms: u64) -> bool;

        /// Gives up the lease if `owner` still holds it with `token`
        /// (`lua/lease_renew.lua` with TTL 0).
        fn release_lease(event: &EventId, owner: &str, token: u64) -> ();

        /// Who holds the mover lease now, `(owner, token)`, or `None` when it is
        /// free. A plain read: it takes no token and changes nothing, so asking
        /// whether the lease is free never advances the fencing counter.
        fn lease_holder(event: &EventId) -> Option<(String, u64)>;
    }
    also {
    }
}
