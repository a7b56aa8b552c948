//! Draws: an event's entries, spread over its fixed entry shards, and the
//! draw's record (docs/DESIGN.md, "Fair drops").
//!
//! At an entry shard (`keys::entry_key`, one slot of [`ENTRY_SHARDS`]):
//! `enter` adds users unless the shard is closed (one step for the entries
//! that arrived together, as a purchase's home step is), `close_entries` closes it for good (the draw does so before
//! it reads), `entries_page` and `entry_count` read it, `write_ranks` keeps
//! the draw's rank of each entrant and `entry_rank` reads one back. At the
//! draw's own slot (`keys::draw_key`): `init_draw` keeps the seed (the first
//! one, whoever asks again), `draw_record` reads it, and `finish_draw` writes
//! the draw's record once (compare-and-set: the first record stands).
//!
//! [`ENTRY_SHARDS`]: crate::domain::draw::ENTRY_SHARDS

pub use crate::domain::draw::DrawDone;
use crate::domain::ids::{EventId, UserId};

/// The answer of [`Draws::enter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnterReply {
    /// Entered now.
    New,
    /// Entered before (nothing changed).
    Already,
    /// The shard is closed: the entry window is over.
    Closed,
}

/// A draw's record: its seed (hex; secret until done) and, once done, what
/// was drawn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrawRecord {
    pub seed: String,
    pub done: Option<DrawDone>,
}

section! {
    /// Steps of a draw's entries and record.
    pub trait Draws => forward_draws {
        /// Keeps `seed` as the draw's unless one is kept; answers the one
        /// kept (`lua/init_draw.lua`).
        fn init_draw(event: &EventId, seed: &str) -> String;

        /// The draw's record, if its seed is kept.
        fn draw_record(event: &EventId) -> Option<DrawRecord>;

        /// Writes the draw's record unless one is written; answers the
        /// record that stands (`lua/finish_draw.lua`).
        fn finish_draw(event: &EventId, done: &DrawDone) -> DrawDone;

        /// Enters `users`, in order, in shard `shard` unless it is closed
        /// (`lua/enter.lua`): one answer a user (a user named twice is
        /// `Already` the second time).
        fn enter(event: &EventId, shard: u32, users: &[UserId]) -> Vec<EnterReply>;

        /// Closes shard `shard` to entries; answers its entrants' count
        /// (`lua/close_entries.lua`).
        fn close_entries(event: &EventId, shard: u32) -> u64;

        /// Entrants of shard `shard` in ascending id order after `after`
        /// (from the first when `None`), at most `limit`
        /// (`lua/entries_page.lua`).
        fn entries_page(
            event: &EventId,
            shard: u32,
            after: Option<&UserId>,
            limit: u32,
        ) -> Vec<UserId>;

        /// Entrants of shard `shard` (`lua/entries_page.lua`, limit 0).
        fn entry_count(event: &EventId, shard: u32) -> u64;

        /// Keeps each entrant's rank (1-based) in shard `shard`.
        fn write_ranks(event: &EventId, shard: u32, ranks: &[(UserId, u64)]) -> ();

        /// Whether `user` entered shard `shard` (`None`: never), and its
        /// rank once drawn (`lua/entry_rank.lua`).
        fn entry_rank(event: &EventId, shard: u32, user: &UserId) -> Option<Option<u64>>;
    }
    also {}
}
