//! The control plane: everything beyond the hot path that keeps an event
//! whole — its life (create, close, rebuild), resharding, the rebalancer, the
//! flusher that streams orders into the ledger, the audit, and the gauges.
//!
//! These run in the background or on an operator's request, compose engine
//! and store steps under the mover lease, and join the store to the ledger.
//! They may import `engine`, `store`, `ledger` and `domain`; nothing below
//! imports them.

/// The conservation check across buckets, streams and ledger.
pub mod audit;
/// Bucket order streams → the ledger, exactly once.
pub mod flusher;
/// Background refresh of the bucket gauges.
pub mod gauges;
/// Create in both stores, close a sale, rebuild lost state.
pub mod lifecycle;
/// The per-event leader that keeps buckets balanced.
pub mod rebalancer;
/// Moving a live event to another bucket count.
pub mod reshard;
