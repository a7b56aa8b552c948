//! Fair drops (issue 46): the access-token consume step and the waiting
//! list's offers as built: a model of its own, beside [`crate::Protocol`]
//! and [`crate::release`].
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
//! 3. *Returned units* (a hold expires, `confirm.lua` finds it late, or it
//!    is cancelled, at its home) are set aside *in that bucket*, in the step
//!    that returns them (`give_back` in `expire_holds.lua`, `cancel.lua`,
//!    `confirm.lua`), while the bucket's list is on (`waitlist_on.lua`: the
//!    draw turns it on in every bucket before any winner has a token, so the
//!    model starts with it on); to stock once it is off.
//! 4. *Offers*, a sweeper's round (`engine::offer_round`), one step on one
//!    slot at a time: `pass_offers.lua` at the bucket passes the open
//!    offers past their deadline (each unit back aside); `reserve_offers.lua`
//!    turns the units aside into reserved *tickets*; for each,
//!    `assign_offer.lua` at the list's slot gives it the next position once
//!    (asked again, the same position; every position given, "nobody"), and
//!    `open_offer.lua` at the bucket opens a reserved ticket once as that
//!    position's offer, or, nobody left, puts its unit and every unit aside
//!    back in stock and turns the bucket's list off. The user at a position
//!    buys with its offer token: the engine reads the position's ticket at
//!    the list, and `claim_offer.lua` at the ticket's bucket checks the
//!    seal, the open record and the deadline, and takes it with its order.
//!    The close seals a bucket, voids its live holds, and `retire.lua`
//!    turns its stock and `wl.units` (aside, reserved and open tickets)
//!    into leftover.
//!
//! Each step is an action of its own, so a round cut off between any two
//! (a crash between `assign_offer` and `open_offer` leaves a reserved
//! ticket that a later round asks again, gets the same position for, and
//! opens), and rounds of several instances interleaved, are explored: any
//! ticket that exists may be asked at the list and opened at any time.
//!
//! # What is abstracted away
//! One unit a purchase and a token per user; an offer's unit is bought
//! outright (no hold); its order's cancel (its unit aside again, as a
//! returned hold's) is explored in the larger bounds only; a paid token
//! order is final. Crashes are steps not taken: every step is on the
//! store, a retry with the same request id or the next round takes the
//! same action later. `open_offer` reads the list's
//! answer for its ticket from the state, where the build passes what
//! `assign_offer` answered the round: the same, as that answer is written
//! once. Time is flags: a token's expiry and an offer's deadline may come
//! at any point (a token's only while a request of its user is still to
//! be checked: after that no step reads it). A `reserve_offers` or
//! `pass_offers` call handles every ticket of the bucket (the build's
//! `OFFERS_PER_STEP` at a time). The close of a bucket is one action
//! (seal, void, retire: every step on a sealed bucket refuses, so nothing
//! runs between them there); the event's model checks the close's run.
//! Not modelled: reshards (refused for a drawn draw event), the draw and
//! entries, the list's line (users are positions), the saga's abort and
//! untake (the event's model), the memory store.

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
    /// Whether a bought offer's order may be cancelled.
    pub offer_cancels: bool,
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
        offer_cancels: false,
    };

    /// The CI bound with bought offers cancelled too
    /// (`SHARDSTOCK_MODEL=admission-cancels`): twice the states.
    pub const CANCELS: Bounds = Bounds {
        offer_cancels: true,
        ..Bounds::CI
    };

    /// A larger bound (`SHARDSTOCK_MODEL=admission-large`): a forged token
    /// too, a third position in line, and offers cancelled.
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
        offer_cancels: true,
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
