//! The domain: what every other layer speaks in, with no I/O at all.
//!
//! Ids are validated where they enter, the key layout and the routing hash are
//! pure functions, and the model types carry their stored encodings. Nothing
//! here imports another layer of the crate.

/// The `draw` access mode: its settings, the seed's commitment, the
/// draw's order and record.
pub mod draw;
/// Events: their spec, stored meta, layout history and bucket state.
pub mod event;
/// Validated identifiers (everything that reaches a key or a URL).
pub mod ids;
/// The Redis key layout and hash tags.
pub mod keys;
/// Orders, request records and their stored encodings (events re-exported).
pub mod model;
/// The waiting list's offers: ticket records, the offer token.
pub mod offer;
/// Small stored records: probe markers, lease holders, the empty mark.
pub mod records;
/// Releases: pools sold as one, and the home records of multi-line orders.
pub mod release;
/// The stable routing hash, home bucket and probe ring.
pub mod routing;
/// A bucket's order stream: entry kinds, ids and their stored encoding.
pub mod stream;
/// Access tokens of the `token` access mode: keys, the signed token and
/// its check.
pub mod token;
/// Transfer ids, and which of them a bucket may forget.
pub mod transfer;
/// Webhooks: a subscription's checks, delivery signatures and their
/// verification, the retry backoff.
pub mod webhook;
