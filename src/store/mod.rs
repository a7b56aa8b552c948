//! The store: per-slot atomic steps, and the two backends that provide them.
//!
//! [`Store`] is the whole contract between the engine and a backend. Every step
//! is one atomic step on one slot (one bucket, or one event's meta): a Lua script
//! in `redis`, one critical section under the bucket's mutex in `memory`. The
//! engine composes them (routing, probing, the purchase saga, consolidation) and
//! is written once; the conformance suite in `tests/` runs it on every backend.
//!
//! # Sections
//! The steps come in eleven sections, one trait and one file each; both backends
//! have a file of the same name for each (`redis/buckets.rs`,
//! `memory/buckets.rs`), so a step is found at the same path three times over:
//! the trait, the Redis adapter next to its script in `lua/`, the memory mirror.
//! - [`events`]: an event's own slot — create, list, meta, status, layout, seq,
//!   the sold-out mark, the two ends of a reshard.
//! - [`buckets`]: the hot path — purchase, the saga's take/untake/finish and
//!   its markers' end (`clear_markers`), the sweeper's `stale_pending`,
//!   cancel, and the reads of one bucket.
//! - [`holds`]: held orders — confirm, expiry, and the index of buckets
//!   with holds the sweeper follows.
//! - [`leases`]: the rebalancer's leadership and the mover lease.
//! - [`limits`]: a buyer's rate, shared by every instance (one GCRA step).
//! - [`transfers`]: fenced, journaled moves of units between buckets.
//! - [`streams`]: the flusher's reads and acknowledgements of order streams.
//! - [`retire`]: a bucket that stops selling — seal, leftover, audit, what it
//!   remembers and its rebuild, expiry.
//! - [`releases`]: a release's multi-line orders — reserve, commit, abort and
//!   release at the user's home, a line's take and undo in its pool.
//! - [`draws`]: a draw's entries over its fixed entry shards, each entrant's
//!   rank, and the draw's seed and record.
//! - [`offers`]: a draw's waiting list: units set aside in the buckets,
//!   offered in line order, bought or passed on.
//!
//! A step is named like the script it runs (`purchase` runs `purchase.lua`);
//! where one script serves several steps (the leases, OUT and drain) the step's
//! doc says so. A bucket that does not exist (sealed by a reshard, retired by a
//! close, lost with a Redis that restarted empty) answers [`StoreError::Stale`]:
//! the caller's view of the event is out of date and it must reload the meta.

/// Declares a section's trait from one list of its steps: each step an
/// async method answering `Result<_, StoreError>`, written once as
/// `fn name(arg: Type, …) -> Answer;`. It writes the trait (the steps, then
/// the section's other methods, given `also`, as written), the section's
/// `STEPS` (their names, which [`STEPS`] gathers), and an exported macro of
/// the same list, `forward_<section>!(callback [, extra…])`, which calls
/// `callback! { Section { fn name(arg: Type, …) -> Answer; … } [extra…] }`:
/// a wrapper of the store (the tests' fault injector) implements every step
/// from it, so a new step is written in the trait's list alone.
macro_rules! section {
    (@with ($d:tt)
        $(#[$meta:meta])*
        pub trait $name:ident => $forward:ident {
            $(
                $(#[$m:meta])*
                fn $step:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty;
            )*
        }
        also { $($also:tt)* }
    ) => {
        $(#[$meta])*
        pub trait $name {
            $(
                $(#[$m])*
                fn $step(&self, $($arg: $ty),*)
                    -> impl ::std::future::Future<Output = Result<$ret, $crate::store::StoreError>> + Send;
            )*
            $($also)*
        }

        /// This section's steps, by name.
        pub const STEPS: &[&str] = &[$(stringify!($step)),*];

        #[doc(hidden)]
        #[macro_export]
        macro_rules! $forward {
            ($d cb:ident $d(, $d($d extra:tt)*)?) => {
                $d cb! { $name { $( fn $step($($arg: $ty),*) -> $ret; )* } $d([ $d($d extra)* ])? }
            };
        }
    };
    ($($body:tt)*) => { section! { @with ($) $($body)* } };
}

pub mod buckets;
pub mod draws;
pub mod events;
pub mod holds;
pub mod leases;
pub mod limits;
pub mod memory;
pub mod offers;
pub mod redis;
pub mod releases;
pub mod retire;
pub mod streams;
pub mod transfers;

use std::future::Future;

use crate::domain::ids::EventId;

pub use buckets::{
    Buckets, CancelReply, Finish, FinishArgs, FinishReply, IndexRead, PurchaseEntry, PurchaseReply,
    TakeArgs, TakeReply,
};
pub use draws::{DrawDone, DrawRecord, Draws, EnterReply};
pub use events::{CreateEventReply, EndReshardReply, Events, SeqBump};
pub use holds::{ConfirmReply, ExpireReply, Holds};
pub use leases::Leases;
pub use limits::{Admit, Limits, Rate};
pub use memory::MemoryStore;
pub use offers::{Assign, Claim, ClaimReply, Offers, OpenReply};
pub use redis::RedisStore;
pub use releases::{Decided, LineConfirm, LineTake, LineUndo, Releases, ReserveArgs, ReserveReply};
pub use retire::{BucketAudit, BucketContents, RestoreReply, Retirement};
pub use streams::{FLUSH_GROUP, Streams};
pub use transfers::{OpenTransfer, TransferReply, Transfers};

/// Every step a [`Store`] runs, by section (each section's `STEPS`, written
/// by its trait's declaration), named like its trait method (and so like its
/// script, where it has one of its own): the list a test wrapper that fails
/// steps on purpose names them from (`tests/it/harness/faulty.rs`).
/// `purchase_groups` is the grouped call of several buckets' purchases;
/// `ping` is [`Store::ping`].
pub static STEPS: std::sync::LazyLock<Vec<&'static str>> = std::sync::LazyLock::new(|| {
    [
        events::STEPS,
        buckets::STEPS,
        &["purchase_groups"],
        holds::STEPS,
        leases::STEPS,
        limits::STEPS,
        transfers::STEPS,
        streams::STEPS,
        retire::STEPS,
        releases::STEPS,
        draws::STEPS,
        offers::STEPS,
        &["ping"],
    ]
    .concat()
});

/// Failures of one store step. Refusals (sold out, fenced, not found) are
/// answers, not errors: each step's reply type spells them out.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The backend could not be reached or did not answer in time.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The bucket does not exist under this layout generation.
    #[error("bucket {0} does not exist (sealed, closed or lost)")]
    Stale(String),
    /// The backend answered something this version does not understand.
    #[error("unexpected store reply: {0}")]
    Protocol(String),
    /// The step was only ever refused, never run, because a Redis Cluster's
    /// slots were moving (`TRYAGAIN`, redirections) for longer than its time
    /// allowed. A kind of unavailability: callers that resolve unknown
    /// outcomes treat it as [`StoreError::Unavailable`], and the HTTP layer
    /// answers "try again" instead. The text carries its `slots moving: `
    /// prefix, so it reads as it did when it was an `Unavailable`.
    #[error("store unavailable: {0}")]
    Moving(String),
}

impl StoreError {
    /// A step refused, never run, while the Cluster's slots moved.
    pub fn moving(why: impl std::fmt::Display) -> Self {
        Self::Moving(format!("slots moving: {why}"))
    }

    /// Whether this is [`StoreError::Moving`]: nothing ran, the caller may
    /// say "try again" rather than "unavailable".
    pub fn is_moving(&self) -> bool {
        matches!(self, Self::Moving(_))
    }

    /// What went wrong, without the variant's own words.
    pub fn detail(&self) -> &str {
        match self {
            Self::Unavailable(why) | Self::Stale(why) | Self::Protocol(why) | Self::Moving(why) => {
                why
            }
        }
    }
}

/// What a backend is, as far as the policies above it care: the app's
/// defaults (what to do about lost state, whether to batch purchases) are
/// decided on these, never on [`Store::kind`]'s name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// The state outlives this process (a Redis): a restart finds it. Without
    /// it (the embedded store) every start is empty, and rebuilding the
    /// events on sale from the ledger is the normal start, not a loss.
    pub durable: bool,
    /// Each call is a round trip to a server, which group commit (several
    /// purchases in one script call) saves. In process there is none, and a
    /// batcher's queue, channel and driver task would only cost.
    pub(crate) remote: bool,
}

impl Capabilities {
    /// A Redis server or Cluster.
    pub(crate) const REDIS: Self = Self {
        durable: true,
        remote: true,
    };
    /// The embedded store, in this process's memory.
    pub(crate) const EMBEDDED: Self = Self {
        durable: false,
        remote: false,
    };
}

/// Every step of every section: what the engine and the control plane ask of
/// a backend. Callers write `S: Store`.
///
/// Futures are `Send` so the engine can run on a multi-threaded runtime.
pub trait Store:
    Events
    + Buckets
    + Holds
    + Leases
    + Limits
    + Transfers
    + Streams
    + Retirement
    + Releases
    + Draws
    + Offers
    + Clone
    + Send
    + Sync
    + 'static
{
    /// Short name for logs and metrics (`memory`, `redis`, `redis-cluster`);
    /// policies read [`Store::capabilities`].
    fn kind(&self) -> &'static str;

    /// What the backend is, for the policies that differ by it. The default
    /// is a Redis's ([`Capabilities::REDIS`]): a store that keeps its state
    /// elsewhere. (A wrapper that does not forward it, such as the tests'
    /// fault injector, is never what the app runs on.)
    fn capabilities(&self) -> Capabilities {
        Capabilities::REDIS
    }

    /// Does the backend answer?
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The fewest buckets of `event`'s layout `generation` (at most `max`)
    /// that land on every master the store has: 1 off a Cluster. An adaptive
    /// event grows to at least this while it is hot, so its load spreads.
    fn spread(&self, event: &EventId, generation: u32, max: u32) -> u32 {
        let _ = (event, generation, max);
        1
    }

    /// Drops what the backend keeps in the process about `event`'s buckets
    /// (a closed event, or the layouts a reshard left): caches only, never
    /// state. The default keeps nothing.
    fn forget_event(&self, event: &EventId) {
        let _ = event;
    }

    /// Entries of the backend's in-process caches (a bound the tests hold).
    fn cached_entries(&self) -> usize {
        0
    }
}
