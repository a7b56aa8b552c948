//! The control plane: everything beyond the hot path that keeps an event
//! whole — its life (create, close, rebuild), resharding, the rebalancer, the
//! flusher that streams orders into the ledger, the audit and the
//! reconciliation after a partial loss, the gauges, the sweepers that end
//! sagas and release orders whose driver went away, the expiry sweeper that puts unpaid
//! holds back on sale, and the relay that publishes the ledger's order
//! changes.
//!
//! These run in the background or on an operator's request, compose engine
//! and store steps under the mover lease, and join the store to the ledger.
//! They may import `engine`, `store`, `ledger` and `domain`; nothing below
//! imports them.

/// The conservation check across buckets, streams and ledger.
pub mod audit;
/// Named points where a test can crash or pause a reshard or a close.
pub mod checkpoint;
/// Draw events drawn at their `draw_at`.
pub mod draw_timer;
/// Bucket order streams → the ledger, exactly once.
pub mod flusher;
/// Background refresh of the bucket gauges.
pub mod gauges;
/// Held orders past their pay-by deadline back on sale.
pub mod hold_expiry;
/// Create in both stores, close a sale, rebuild lost state.
pub mod lifecycle;
/// The per-event leader that keeps buckets balanced.
pub mod rebalancer;
/// After a partial loss: units held by orders in the ledger taken off sale.
pub mod reconcile;
/// The outbox relay: the ledger's order changes to NATS JetStream.
pub mod relay;
/// Ends release orders no driver will end, and expires held ones at
/// their deadline.
pub mod release_sweeper;
/// Moving a live event to another bucket count.
pub mod reshard;
/// Ends pending sagas no driver will end.
pub mod saga_sweeper;
/// The flusher's slow scan over every open bucket, and its lag count.
pub mod stream_scan;
/// The pace of every background loop: a round each period until stopped.
pub mod ticker;
/// Webhook delivery: the outbox's changes POSTed, signed, to each subscription.
pub mod webhook;

use crate::domain::ids::EventId;
use crate::engine::EngineError;
use crate::ledger::LedgerError;
use crate::store::StoreError;
use flusher::FlushError;

/// Failures of the control plane (close, rebuild, reshard, rebalance, audit).
/// `Busy` is the one of its own: another mover or reshard is at work, and
/// the caller may try again.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Flush(#[from] FlushError),
    #[error("event {0} exists in the ledger")]
    Exists(EventId),
    #[error("{0}")]
    Busy(String),
    /// A reshard of a pool of a release with holds: its bucket count is
    /// fixed (a reshard does not carry a held order's markers).
    #[error("{event} is a pool of release {release}, which has holds: its bucket count is fixed")]
    HeldPool { event: EventId, release: EventId },
    /// A reshard of a drawn draw event: its waiting list's units are kept
    /// in the buckets they came back to, which a reshard does not carry.
    #[error(
        "event {0} is a drawn draw: its bucket count is fixed while its waiting list may hold units"
    )]
    WaitingList(EventId),
    /// A lost event that sold by access token: the ledger has no keys, and
    /// rebuilt without them it would sell to anyone.
    #[error(
        "event {0} sells by access token and the ledger does not keep its keys: it is not \
         rebuilt (without them it would sell to anyone)"
    )]
    TokenEvent(EventId),
    /// A reshard read a token record whose id (`<user>.<allowance>.<expiry>`)
    /// names no user, so no new home: it stops, the event left resharding,
    /// rather than move on without the token's consumption (left behind in
    /// the old layout, the token would buy its allowance again). Only a
    /// record written outside the scripts can be so: it is for an operator.
    #[error(
        "event {event}: the reshard read token record {id:?}, whose id names no user; it stops \
         rather than leave the token's consumption behind"
    )]
    TokenRecord { event: EventId, id: String },
}

impl From<StoreError> for ControlError {
    fn from(e: StoreError) -> Self {
        Self::Engine(e.into())
    }
}
