//! A release's multi-line order (issue 45), designed and checked before it
//! is built: a model of its own, beside [`crate::Protocol`].
//!
//! # The protocol
//! A release is several pools, each with its buckets (slots of their own on
//! a Cluster), and one per-user limit across them. An order has one line per
//! pool, and no script covers it, so it is a saga of one-slot steps:
//! 1. *Reserve* at the user's home (the decision point): the request's
//!    record, or, under the limit, the order's units added to the user's
//!    count and a pending record (which the sweeper finds).
//! 2. *Take* each line, in the fixed pool order: a walk of the pool's ring
//!    from the user's home there, one marker per (request, pass, bucket) as
//!    `take.lua` writes today. A walk passes a short bucket, stops at its
//!    own take, and stops at an undone marker: the order was refused.
//! 3. *Commit* (every line taken): pending → bought by compare-and-set, the
//!    order's record written with it; or *abort*: pending → refused.
//! 4. After a refusal, *undo* each line: walk its ring as a take would, give
//!    back the take found there or leave an undone marker where a late walk
//!    would take next; then *release* the reservation (refused → released),
//!    once every line is closed.
//!
//! Whoever finds a record next takes its next step: the first driver, a
//! retry with the same request id, or the sweeper that finds it stale. Only
//! the home's compare-and-set decides, so an order is decided once.
//!
//! # Holds
//! On a release with holds ([`Bounds::holds`]) the commit leaves the
//! record held and open instead of bought. One compare-and-set at the home
//! (`move_hold`) decides it, at any time while it is open: confirming (the
//! buyer's confirm), cancelling (its cancel) or expiring (the sweeper past
//! the deadline; time is not modelled, so any open hold may expire). Then
//! each line is finished in its pool by a walk of its ring: a confirm
//! (`confirm_line.lua`) moves the take `T` → `K`, a give-back
//! (`undo_line.lua`, held) moves it `T` → `U` with the unit back and passes
//! a bucket without a marker; once every line is finished the record ends
//! (confirmed; or cancelled or expired, the user's count released). A late
//! walk of a line, by a driver that read the record pending before the
//! commit, may still run: it stops at the order's `T`, `U` and `K`.
//!
//! # What is abstracted away
//! One unit a line and one line a pool; one probe pass; markers never
//! expire. Drivers keep no state beyond what the store holds, so a crash
//! between two steps is a step not taken, and a retry or the sweeper taking
//! it is the same action later; a driver's read of another slot may be
//! stale, so a walk goes on to the next line once the previous one was
//! taken (its marker taken or undone). The users' homes are one record per
//! user: every home step touches one user's records, so their slots do not
//! matter. Not modelled: the pools' reshards, rebalancing, a hold's deadline
//! as a clock (its expiry may come at any time while it is open), the
//! ledger's flusher (a record counts once the step writes it).

pub mod properties;
pub mod state;
pub mod steps;

pub use state::State;
pub use steps::Action;

/// Pools in a release: the model's release has two.
pub const POOLS: usize = 2;

/// The sizes explored.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Buckets of each pool.
    pub buckets: [u8; POOLS],
    /// Units of each bucket of each pool.
    pub stock: [&'static [u8]; POOLS],
    /// Orders of each user (one line in every pool each).
    pub orders: &'static [u8],
    /// The release-wide per-user limit, in units.
    pub limit: u8,
    /// Whether the release holds its orders (`hold_seconds`): a commit
    /// leaves a hold, which is confirmed, cancelled or expired.
    pub holds: bool,
}

impl Bounds {
    /// The bound `cargo test` checks: three users, the first with two orders
    /// (the second fits the limit only once the first is released), two
    /// buckets a pool, two units of the first pool and one of the second
    /// (orders compete for them, a user homed at the second bucket walks),
    /// all in each pool's first bucket.
    pub const CI: Bounds = Bounds {
        buckets: [2, 2],
        stock: [&[2, 0], &[1, 0]],
        orders: &[2, 1, 1],
        limit: 2,
        holds: false,
    };

    /// A larger bound (`SHARDSTOCK_MODEL=release-large`): a third bucket in
    /// the first pool, so a walk passes two short buckets.
    pub const LARGE: Bounds = Bounds {
        buckets: [3, 2],
        stock: [&[2, 0, 0], &[1, 0]],
        orders: &[2, 1, 1],
        limit: 2,
        holds: false,
    };

    /// The bound with holds that `cargo test` checks: two users, the first
    /// with two orders (the second fits the limit once the first is
    /// cancelled or expired), two buckets a pool; the first pool has a unit
    /// in each bucket, so a walk that went past its own confirmed take
    /// would find one to take again.
    pub const HOLDS: Bounds = Bounds {
        buckets: [2, 2],
        stock: [&[1, 1], &[1, 0]],
        orders: &[2, 1],
        limit: 2,
        holds: true,
    };

    /// A larger bound with holds (`SHARDSTOCK_MODEL=release-holds-large`):
    /// the CI bound's three users and four orders.
    pub const HOLDS_LARGE: Bounds = Bounds {
        orders: &[2, 1, 1],
        ..Bounds::HOLDS
    };

    /// Units of pool `k`.
    pub fn pool_stock(&self, k: usize) -> u8 {
        self.stock[k].iter().sum()
    }

    /// Orders in all (a request id each).
    pub fn requests(&self) -> usize {
        self.orders.iter().map(|&n| n as usize).sum()
    }

    /// The user of order `r`.
    pub fn user(&self, r: usize) -> usize {
        let mut first = 0;
        for (u, &n) in self.orders.iter().enumerate() {
            first += n as usize;
            if r < first {
                return u;
            }
        }
        unreachable!("order {r} out of bounds")
    }

    /// Pool `k`'s buckets in the order a walk for user `u` takes them: from
    /// the user's home in the pool round the ring.
    pub fn ring(&self, k: usize, u: usize) -> impl Iterator<Item = usize> {
        let n = self.buckets[k] as usize;
        (0..n).map(move |i| (u + i) % n)
    }
}

/// A broken protocol, switched on to show the checker finds what it breaks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Variant {
    /// Commit writes bought without the compare-and-set on the pending
    /// record (a driver that saw every line taken commits whatever was
    /// decided meanwhile).
    pub commit_unchecked: bool,
    /// Abort releases the reservation at once, before the lines are undone.
    pub release_at_decision: bool,
    /// A walk passes an undone marker as it passes a short bucket (what
    /// `take.lua`'s reply to an undone marker, a short decision, would do).
    pub walk_past_undone: bool,
    /// A walk passes its order's confirmed marker (`K`) as it passes a
    /// short bucket: `take.lua` before commit 8d8b2d3, which answered `K`
    /// as short, so a late walk took the line again further on.
    pub walk_past_confirmed: bool,
}

impl Variant {
    /// The protocol as designed.
    pub const DESIGNED: Variant = Variant {
        commit_unchecked: false,
        release_at_decision: false,
        walk_past_undone: false,
        walk_past_confirmed: false,
    };
    /// Commit without checking the decision record.
    pub const COMMIT_UNCHECKED: Variant = Variant {
        commit_unchecked: true,
        ..Variant::DESIGNED
    };
    /// The reservation released with the decision, before the undos.
    pub const RELEASE_AT_DECISION: Variant = Variant {
        release_at_decision: true,
        ..Variant::DESIGNED
    };
    /// A late walk goes past an undone marker.
    pub const WALK_PAST_UNDONE: Variant = Variant {
        walk_past_undone: true,
        ..Variant::DESIGNED
    };
    /// A late walk goes past a confirmed take (before commit 8d8b2d3).
    pub const WALK_PAST_CONFIRMED: Variant = Variant {
        walk_past_confirmed: true,
        ..Variant::DESIGNED
    };
}

/// The model: a release's multi-line orders under [`Bounds`], as
/// [`Variant`] says.
#[derive(Clone, Debug)]
pub struct Release {
    pub bounds: Bounds,
    pub variant: Variant,
}

impl Release {
    pub fn new(bounds: Bounds, variant: Variant) -> Self {
        Release { bounds, variant }
    }
}

impl stateright::Model for Release {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![steps::initial(&self.bounds)]
    }

    fn actions(&self, _: &State, actions: &mut Vec<Action>) {
        steps::candidates(&self.bounds, actions);
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        let mut next = state.clone();
        steps::apply(self, &mut next, action);
        (next != *state).then_some(next)
    }

    fn properties(&self) -> Vec<stateright::Property<Self>> {
        properties::all()
    }
}
