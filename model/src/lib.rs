//! A model of shardstock's store steps, checked exhaustively by `stateright`
//! for small configurations (issue 48).
//!
//! # Why a crate of its own, and why `stateright`
//! The steps are Lua scripts, each atomic on one slot; the defects that
//! survived were interleavings of such steps by different actors (engines
//! that stop after any step and are replaced, a sweeper, clients retrying),
//! not weak-memory effects inside one process. That is a state-space search
//! over atomic actions, which is what `stateright`'s `Model` explores (breadth
//! first, every state once by fingerprint); `loom` and `shuttle` explore
//! threads of one process and stay where they are (`engine::handoff`).
//! The model is plain data: it lives in a workspace member of its own so it
//! builds in seconds without the service, runs in `cargo test` at the root,
//! and does not touch `src/` or `lua/`, which other work restructures.
//!
//! # Layout
//! - [`state`]: the store's keys, the meta, the lease, the ledger's records,
//!   the engines' runs and what each client was told.
//! - [`steps`]: one function per store step, with the precondition and the
//!   effect its script has (the script is named in each doc), and the
//!   programs of the two runs an engine drives (reshard, close).
//! - [`properties`]: the oracle's rules (`tests/it/harness/oracle.rs`) and
//!   the promises of docs/DESIGN.md, as stateright properties.
//! - [`traces`]: the fixed traces of the two read-found defects.
//! - [`release`]: a release's multi-line order (issue 45), a model of its
//!   own: designed and checked before it is built.
//! - [`admission`]: fair drops' access tokens and waiting-list offers
//!   (issue 46), a third model: checked before it was built, and now of
//!   the waiting list as built (units aside in their buckets, tickets,
//!   positions given at the list's slot).
//! - [`Protocol`]: the `Model` (bounds and variant) tying them together.
//!
//! # What is abstracted away
//! Quantities are one unit a request; each request id has one order id (a
//! request whose saga was aborted answers "try again" and is not retried:
//! a retry would start a second saga with another order id). Time is a
//! deadline flag per order ([`steps::Action::Due`]) and a lapse flag on the
//! lease, not a clock: any order of deadlines and lapses is explored. The
//! flusher's read and ack are not actions: a record the step writes counts
//! in [`state::Records`] at once, which the ledger's exactly-once-by-key
//! makes equivalent. Sold-out marks, addition counts and the double collect
//! only make refusals cheap, so a saga's "sold out" is allowed once it was
//! short everywhere; markers are never deleted (a late driver replays its
//! marker). One pass of probes; one reshard (to generation 1); the
//! rebalancer's own transfers are the reshard's (same steps, same fences).

pub mod admission;
pub mod properties;
pub mod release;
pub mod state;
pub mod steps;
pub mod traces;

pub use state::State;
pub use steps::Action;

/// The sizes explored.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Buckets of the first layout.
    pub old_buckets: u8,
    /// Buckets of the layout the reshard moves to.
    pub new_buckets: u8,
    pub users: u8,
    pub requests_per_user: u8,
    /// Units on sale (all in the first layout's first bucket).
    pub stock: u8,
    /// The per-user limit, if any.
    pub limit: Option<u8>,
    pub engines: u8,
    /// Crashes of an engine and lapses of the lease, in all.
    pub faults: u8,
    pub reshard: bool,
    pub close: bool,
    pub cancels: bool,
}

impl Bounds {
    /// The bound `cargo test` checks: minutes at most on 2 cores in debug.
    pub const CI: Bounds = Bounds {
        old_buckets: 2,
        new_buckets: 2,
        users: 2,
        requests_per_user: 1,
        stock: 2,
        limit: Some(1),
        engines: 2,
        faults: 1,
        reshard: true,
        close: true,
        cancels: false,
    };

    /// The CI bound with cancels too (`SHARDSTOCK_MODEL=cancels`): a larger
    /// bound that runs to its end in minutes.
    pub const CANCELS: Bounds = Bounds {
        cancels: true,
        ..Bounds::CI
    };

    /// A larger bound (`SHARDSTOCK_MODEL=large`).
    pub const LARGE: Bounds = Bounds {
        old_buckets: 2,
        new_buckets: 3,
        users: 2,
        requests_per_user: 1,
        stock: 2,
        limit: Some(1),
        engines: 2,
        faults: 1,
        reshard: true,
        close: true,
        cancels: true,
    };

    pub fn requests(&self) -> usize {
        self.users as usize * self.requests_per_user as usize
    }

    pub fn buckets(&self) -> usize {
        self.old_buckets as usize + self.new_buckets as usize
    }
}

/// Behaviour before a fix, switched on to show the checker finds what the
/// fix removed (commit 7a3d97b).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Variant {
    /// `restore.lua` wrote every field with `HSET` (and counted a hold's
    /// units whenever its `ZADD` added it), not `HSETNX`.
    pub restore_overwrites: bool,
    /// The expiry sweeper expired in any unsealed bucket, a layout a reshard
    /// fills included, not only in the event's current layout.
    pub expiry_any_layout: bool,
    /// A close voided the live holds of every layout, not only the current.
    pub close_voids_every_layout: bool,
}

impl Variant {
    /// The code as it is.
    pub const FIXED: Variant = Variant {
        restore_overwrites: false,
        expiry_any_layout: false,
        close_voids_every_layout: false,
    };
    /// "A resumed reshard resurrecting expired holds", before 7a3d97b.
    pub const RESURRECTING_RESTORE: Variant = Variant {
        restore_overwrites: true,
        expiry_any_layout: true,
        close_voids_every_layout: false,
    };
    /// "A close voiding the old layout's copy of moved holds", before 7a3d97b.
    pub const CLOSE_VOIDS_EVERY_LAYOUT: Variant = Variant {
        restore_overwrites: false,
        expiry_any_layout: false,
        close_voids_every_layout: true,
    };
}

/// The model: the store's steps for one event under [`Bounds`], as
/// [`Variant`] says.
#[derive(Clone, Debug)]
pub struct Protocol {
    pub bounds: Bounds,
    pub variant: Variant,
    reshard_program: Vec<steps::Step>,
    close_program: Vec<steps::Step>,
}

impl Protocol {
    pub fn new(bounds: Bounds, variant: Variant) -> Self {
        Protocol {
            bounds,
            variant,
            reshard_program: steps::program(&bounds, state::RunKind::Reshard),
            close_program: steps::program(&bounds, state::RunKind::Close),
        }
    }

    pub fn program(&self, kind: state::RunKind) -> &[steps::Step] {
        match kind {
            state::RunKind::Reshard => &self.reshard_program,
            state::RunKind::Close => &self.close_program,
        }
    }
}

impl stateright::Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![steps::initial(&self.bounds)]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        steps::candidates(self, state, actions);
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
