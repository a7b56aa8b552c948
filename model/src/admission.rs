//! Fair drops (issue 46): the access-token consume step and the waiting
//! list's offers, designed and checked before they are built: a model of
//! its own, beside [`crate::Protocol`] and [`crate::release`].
//!
//! # The protocol
//! A purchase carries an access token; the token's record (units consumed,
//! units reserved by a saga) lives at its user's home, the slot of the
//! user's count and request records (a token names its user: another user's
//! token is refused there without touching its record).
//! 1. *Fast path* (`purchase.lua`, one script at the home): answer from the
//!    request's record, or check the token (known, its user's, not expired,
//!    allowance left), consume it, take the unit, and write the order and
//!    the consumption records, all in one step.
//! 2. *Saga* (home short): the same home step checks the token and reserves
//!    one unit of its allowance with the pending record (as the per-user
//!    limit is reserved); `take.lua` walks the ring; `finish.lua` at the home
//!    makes the reservation a consumption with the order (bought) or gives
//!    it back (sold out). The check and the reservation are one step with
//!    the decision to start the saga; the consumption is one step with the
//!    order's decision.
//! 3. *Returned units* (a hold expires or is cancelled, at its home) go to
//!    the waiting list's slot, not back to the bucket's stock, by a
//!    journaled transfer while a waiting list exists.
//! 4. *Offers*, at the list's slot: the next user in line gets an offer (a
//!    token for one unit, set aside from the returned ones) with a deadline;
//!    that user's purchase with the offer token takes it there in one step;
//!    the sweeper passes an open offer whose deadline passed (its unit goes
//!    back aside for the next offer). The close turns the bucket stock,
//!    live holds, the units aside and open offers into leftover.
//!
//! # What is abstracted away
//! One unit a purchase and a token per user; an offer's unit is bought
//! outright (no hold). Crashes are steps not taken: every step is on the
//! store, a retry with the same request id or the sweeper takes the same
//! action later. A transfer's arrival is one action, exactly once (the
//! journal the event's model checks). Time is flags: a token's expiry and an
//! offer's deadline may come at any point. Not modelled: reshards (the token
//! record moves with the user's count, as the limit's does), the draw and
//! entries, open sale after the waiting list is exhausted, the saga's abort
//! and untake (the event's model), several instances beyond interleaving.

//!
//! # As built (the waiting list)
//! The service builds steps 3 and 4 with one change of place, not of
//! shape (docs/DESIGN.md, "Fair drops", "As built (the waiting list)"): a
//! returned unit is not transferred to the list's slot but set *aside in
//! its own bucket*, in the same step that returns it (`expire_holds.lua`,
//! `cancel.lua`, `confirm.lua`), so the model's `Return` and `Arrive` are
//! one action there, and "in transfer" is always empty. The list's slot
//! keeps the line and the next position, and gives a bucket's unit aside
//! (a *ticket*) the next position once (`assign_offer.lua`, keyed by
//! bucket and ticket); the model's `Offer` is that assignment plus the
//! bucket's `open_offer.lua`, which opens a reserved ticket once. `Claim`
//! (`claim_offer.lua`) and `Pass` (`pass_offers.lua`) are one step each at
//! the bucket that holds the unit and the offer's record, as the model has
//! them at the list: the offer record and its unit share one slot either
//! way. The close's leftover counts the bucket's units aside and offered
//! (`retire.lua`). Each property holds of the build as stated: the
//! conservation sum with in-transfer 0; no unit back on open sale while a
//! position waits (a ticket goes to sale only when `assign_offer` found
//! every position given); offers in line order, each passed at most once
//! (the open record is compared first). What the model does not cover of
//! the build: the crash between `assign_offer` and `open_offer` (a
//! reserved ticket the next round finds and asks again, answered the same
//! position), and a unit going to open sale once the line is exhausted.

pub mod properties;
pub mod state;
pub mod steps;

pub use state::State;
pub use steps::Action;

/// What a request carries.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Carry {
    /// Its user's own token.
    Own,
    /// The token of another user (of that index).
    Of(u8),
    /// A token no one issued (a bad signature, an unknown code).
    Forged,
}

/// The sizes explored.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Buckets of the event; user `u`'s home is bucket `u % buckets`.
    pub buckets: u8,
    /// Units on sale, all in bucket 0 (a user homed elsewhere walks).
    pub stock: u8,
    /// Units each token buys at most.
    pub allowance: u8,
    /// The requests: (user, what it carries), one request id each.
    pub requests: &'static [(u8, Carry)],
    /// Users holding a token (users `0..tokens`).
    pub tokens: u8,
    /// Users on the waiting list, in line (after the token holders).
    pub line: u8,
    /// Whether tokens may expire.
    pub expiry: bool,
}

impl Bounds {
    /// The bound `cargo test` checks: two buckets, two units in the first;
    /// user 0 buys on the fast path and again with a new request id (a
    /// reuse), user 1 (homed at the short bucket) through the saga twice (a
    /// reuse on the saga) and with user 0's token; two users in line.
    pub const CI: Bounds = Bounds {
        buckets: 2,
        stock: 2,
        allowance: 1,
        requests: &[
            (0, Carry::Own),
            (0, Carry::Own),
            (1, Carry::Own),
            (1, Carry::Own),
            (1, Carry::Of(0)),
        ],
        tokens: 2,
        line: 2,
        expiry: true,
    };

    /// A larger bound (`SHARDSTOCK_MODEL=admission-large`): a forged token
    /// too, and a third user in line.
    pub const LARGE: Bounds = Bounds {
        requests: &[
            (0, Carry::Own),
            (0, Carry::Own),
            (1, Carry::Own),
            (1, Carry::Own),
            (1, Carry::Of(0)),
            (0, Carry::Forged),
        ],
        line: 3,
        ..Bounds::CI
    };

    /// User `u`'s home bucket.
    pub fn home(&self, u: usize) -> usize {
        u % self.buckets as usize
    }
}

/// A broken protocol, switched on to show the checker finds what it breaks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Variant {
    /// The token is checked in a step before the take (admitted), and the
    /// take consumes it without checking again.
    pub check_before_take: bool,
    /// The saga's home step checks the token without reserving it, and
    /// the finish consumes it (a consumption at the decision alone).
    pub saga_unreserved: bool,
    /// A passed offer's unit goes back on open sale (its bucket's stock).
    pub pass_to_open_sale: bool,
    /// `give_back` puts a returned unit in stock whether or not the
    /// bucket's list is on.
    pub give_back_to_stock: bool,
    /// `assign_offer` gives a ticket that asks again the next position,
    /// not the one it gave it before.
    pub assign_again: bool,
    /// `open_offer` stores the open record without comparing the reserved
    /// one: a ticket opened, taken or passed before opens again.
    pub open_unchecked: bool,
}

impl Variant {
    /// The protocol as built.
    pub const BUILT: Variant = Variant {
        check_before_take: false,
        saga_unreserved: false,
        pass_to_open_sale: false,
        give_back_to_stock: false,
        assign_again: false,
        open_unchecked: false,
    };
    /// The token checked in a step of its own before the take.
    pub const CHECK_BEFORE_TAKE: Variant = Variant {
        check_before_take: true,
        ..Variant::BUILT
    };
    /// The saga's token consumed at the finish, not reserved at the start.
    pub const SAGA_UNRESERVED: Variant = Variant {
        saga_unreserved: true,
        ..Variant::BUILT
    };
    /// A passed offer's unit put back on open sale.
    pub const PASS_TO_OPEN_SALE: Variant = Variant {
        pass_to_open_sale: true,
        ..Variant::BUILT
    };
    /// Returned units put in stock while the list is on.
    pub const GIVE_BACK_TO_STOCK: Variant = Variant {
        give_back_to_stock: true,
        ..Variant::BUILT
    };
    /// A ticket asking the list again given a new position.
    pub const ASSIGN_AGAIN: Variant = Variant {
        assign_again: true,
        ..Variant::BUILT
    };
    /// A ticket's offer opened without comparing its reserved record.
    pub const OPEN_UNCHECKED: Variant = Variant {
        open_unchecked: true,
        ..Variant::BUILT
    };
}

/// The model: an event's token purchases and offers under [`Bounds`], as
/// [`Variant`] says.
#[derive(Clone, Debug)]
pub struct Admission {
    pub bounds: Bounds,
    pub variant: Variant,
}

impl Admission {
    pub fn new(bounds: Bounds, variant: Variant) -> Self {
        Admission { bounds, variant }
    }
}

impl stateright::Model for Admission {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![steps::initial(&self.bounds)]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        steps::candidates(&self.bounds, state, actions);
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
