//! Fenced transfers: moving units between buckets of one event.
//!
//! A transfer is two idempotent steps joined by a journal in the source
//! bucket: OUT (`transfer_out`, or `drain_out` from a sealed bucket) moves units
//! from the source's stock into a journal entry, IN (`transfer_in`, or
//! `complete_in` into a sealed bucket) adds them to the target once per
//! transfer id, and `transfer_clear` closes the entry. At
//! every instant the units are counted once: in a stock or in an open entry.
//! Every step carries the mover's fencing token (see [`super::leases`]).
//!
//! What a bucket remembers of transfers stays bounded (`domain::transfer`):
//! a step that raises the fence drops the journal's tombstones below it, and
//! [`Transfers::raise_fence`] also drops applied ids below the tokens a
//! takeover settled ([`Transfers::settle_transfers`]).

use crate::domain::ids::EventId;
use crate::domain::keys::BucketRef;
use crate::domain::transfer::Forget;

/// The answer of a fenced transfer step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferReply {
    /// Done; for `transfer_out`, the units actually journaled (≤ asked).
    Applied(u64),
    /// Already done before (same transfer id): nothing changed.
    Duplicate(u64),
    /// The bucket has accepted a higher token: this mover is stale.
    Fenced { highest: u64 },
}

/// An open transfer journaled in its source bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenTransfer {
    pub xid: String,
    pub target: u32,
    pub units: u64,
    pub token: u64,
}

section! {
    /// The steps of a transfer, and the fence and journal they rely on.
    pub trait Transfers => forward_transfers {
        /// OUT: journals up to `units` from `bucket` for transfer `xid` to `target`
        /// (`lua/transfer_out.lua`).
        fn transfer_out(
            bucket: &BucketRef,
            token: u64,
            xid: &str,
            target: u32,
            units: u64,
        ) -> TransferReply;

        /// OUT from a sealed bucket: a reshard draining the old layout
        /// (`lua/transfer_out.lua`, allowed on a sealed bucket).
        fn drain_out(
            bucket: &BucketRef,
            token: u64,
            xid: &str,
            target: u32,
            units: u64,
        ) -> TransferReply;

        /// Raises the bucket's fence to `token` (a new leader, before it moves
        /// anything); returns the fence afterwards (`lua/raise_fence.lua`). The
        /// bucket forgets the tombstones of its journal below its fence and the
        /// applied ids `forget` names.
        fn raise_fence(bucket: &BucketRef, token: u64, forget: Forget) -> u64;

        /// The tokens takeovers settled, per layout generation: every transfer
        /// whose source is in that layout and whose token is lower is closed.
        fn settled_transfers(event: &EventId) -> Vec<(u32, u64)>;

        /// Records that a mover holding `token` fenced every bucket of layout
        /// `generation` and then completed every transfer open there (kept only
        /// if higher than what is recorded; `lua/settle_transfers.lua`).
        fn settle_transfers(event: &EventId, generation: u32, token: u64) -> ();

        /// IN: adds `units` of transfer `xid` to `bucket`, once per `xid`
        /// (`lua/transfer_in.lua`).
        fn transfer_in(
            bucket: &BucketRef,
            token: u64,
            xid: &str,
            source: u32,
            units: u64,
        ) -> TransferReply;

        /// IN of a transfer whose OUT applied, allowed on a sealed bucket
        /// (`lua/transfer_in.lua` with `sealed_ok`): the engine's
        /// `mover::complete`, for a mover's own transfer and for one a
        /// takeover finishes. The units left their source already; a target
        /// sealed since must take them, or no reshard or close of the layout
        /// could finish.
        fn complete_in(
            bucket: &BucketRef,
            token: u64,
            xid: &str,
            source: u32,
            units: u64,
        ) -> TransferReply;

        /// Closes transfer `xid` in the source's journal (`lua/transfer_clear.lua`).
        fn transfer_clear(bucket: &BucketRef, token: u64, xid: &str) -> TransferReply;

        /// The transfers out of `bucket` still open in its journal.
        fn open_transfers(bucket: &BucketRef) -> Vec<OpenTransfer>;

        /// Whether transfer `xid` was applied into `bucket` (its IN ran): its
        /// units are in that bucket's stock, even while the source's journal
        /// still holds the entry open (a mover cut off before CLEAR).
        fn delivered(bucket: &BucketRef, xid: &str) -> bool;
    }
    also {
    }
}
