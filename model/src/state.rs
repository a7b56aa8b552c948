//! The state the model explores: what the store holds (buckets of two
//! layouts, the event's meta, the mover lease), what the ledger will hold
//! (each order's records, the leftover), what engines are doing, and what
//! each client was told.
//!
//! Everything is small integers and short vectors indexed by bucket, user,
//! request or order, so a state hashes and clones cheaply. A request and its
//! order share one index (`r`): the model gives each request id one order id
//! (a request aborted is not retried; see the crate docs).

/// An order's entry in its home bucket's index (`idx`: `H|…`, `C|…`,
/// `E|…`, `X|…`), or none.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Entry {
    None,
    Held,
    Confirmed,
    Expired,
    Cancelled,
}

/// A request's record in its home bucket (`reqs`): pending saga `P`, bought
/// `B`, sold out `S`, over the limit `L`, or none.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Rec {
    None,
    Pending,
    Bought,
    SoldOut,
    Limit,
}

/// A saga's probe marker in one bucket (`tk:<rid>:<pass>`): taken `T`,
/// untaken `U`, short `S`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Marker {
    None,
    Taken,
    Untaken,
    Short,
}

/// A transfer id: the source bucket, the mover's token and the run's pass
/// (`rs.<gen>.<from>.<to>.<token>.<pass>`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct Xid {
    pub source: u8,
    pub token: u8,
    pub pass: u8,
}

/// One entry of a source bucket's transfer journal (`xfer`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Journal {
    pub xid: Xid,
    /// The target, as an index into [`State::buckets`].
    pub target: u8,
    pub units: u8,
    /// Open (`o`) until CLEAR marks it done (`d`, a tombstone).
    pub open: bool,
}

/// One bucket of one layout: its keys under `ss:{e#g#b}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Bucket {
    /// Its layout's generation (0, or 1 after the reshard).
    pub generation: u8,
    /// Its index within its layout.
    pub index: u8,
    pub exists: bool,
    pub sealed: bool,
    pub stock: u8,
    pub fence: u8,
    /// `users`: units held per user (`None`: no field).
    pub users: Vec<Option<u8>>,
    /// `idx`, per order.
    pub idx: Vec<Entry>,
    /// `holds`: the deadline index, per order.
    pub holds: Vec<bool>,
    /// `hunits`: units in live holds.
    pub hunits: u8,
    /// `reqs`, per request.
    pub reqs: Vec<Rec>,
    /// `pend`: sagas pending here, per request.
    pub pend: Vec<bool>,
    /// Probe markers, per request (one pass).
    pub markers: Vec<Marker>,
    /// `xfer`: transfers out of this bucket.
    pub xfer: Vec<Journal>,
    /// `xin`: transfer ids applied here.
    pub xin: Vec<Xid>,
}

/// The event's status in its meta.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Status {
    OnSale,
    /// Resharding to generation 1 (the model's one reshard).
    Resharding,
    Closed,
}

/// The event's meta (`ss:{e}:meta`).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Meta {
    pub status: Status,
    /// The current layout's generation.
    pub generation: u8,
    /// Whether a reshard began (the model allows one).
    pub resharded: bool,
    /// The close drained the streams and closed the event in the ledger.
    pub ledger_closed: bool,
}

/// The mover lease (`ss:{e}:lease`, "owner|token").
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Lease {
    pub owner: u8,
    pub token: u8,
    /// Its TTL ran out (the holder died or paused): anyone may take it.
    pub lapsed: bool,
}

/// What a run does: a reshard (manual or adaptive: a reshard to another
/// count) or a close.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum RunKind {
    Reshard,
    Close,
}

/// An engine's run in progress: its program counter into the run's steps
/// ([`crate::steps::program`]) and its token. A crash forgets it.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Run {
    pub kind: RunKind,
    pub token: u8,
    pub pc: u8,
    pub pass: u8,
}

/// The records the ledger will hold for one order (the flusher writes each
/// stream record once: the model appends them here when the step writes
/// them). Kinds as in the ledger: `t` a take (`o`), `h` a hold, `k` a
/// confirm, `e` an expiry, `c` a cancel, `v` a void of a take.
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub struct Records {
    pub t: u8,
    pub h: u8,
    pub k: u8,
    pub e: u8,
    pub c: u8,
    pub v: u8,
}

/// An order as the ledger derives it from its records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Derived {
    /// No take, or every take voided.
    Nothing,
    Held,
    Confirmed,
    /// Cancelled or expired: its units went back.
    Released,
}

impl Records {
    pub fn derive(&self) -> Derived {
        if self.t <= self.v {
            Derived::Nothing
        } else if self.c > 0 || self.e > 0 {
            Derived::Released
        } else if self.k > 0 {
            Derived::Confirmed
        } else {
            Derived::Held
        }
    }

    /// Units (of one) this order keeps from the stock.
    pub fn live(&self) -> u8 {
        matches!(self.derive(), Derived::Held | Derived::Confirmed) as u8
    }
}

/// The last answer a client got for a request.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Told {
    None,
    Bought,
    SoldOut,
    Limit,
    /// The saga was aborted: "try again", nothing deducted.
    TryAgain,
    Confirmed,
    Expired,
    Cancelled,
}

/// The whole state.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct State {
    /// Layout 0's buckets, then layout 1's.
    pub buckets: Vec<Bucket>,
    pub meta: Meta,
    pub lease: Option<Lease>,
    pub next_token: u8,
    /// Per engine, its run.
    pub engines: Vec<Option<Run>>,
    /// Crashes and lease lapses still allowed.
    pub faults_left: u8,
    /// Runs still allowed to start (bounds the tokens).
    pub starts_left: u8,
    /// Per order, whether the clock passed its pay-by deadline.
    pub due: Vec<bool>,
    /// Per order, its records in the ledger.
    pub ledger: Vec<Records>,
    /// Leftover recorded by retired buckets.
    pub leftover: u8,
    /// Per request, the last answer its client got to the purchase.
    pub told: Vec<Told>,
    /// Per order, the last answer to a confirm or cancel.
    pub paid: Vec<Told>,
    /// Per request, the layout its saga started in (its pending record's).
    pub saga: Vec<Option<u8>>,
}
