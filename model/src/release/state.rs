//! The state of a release: its pools' buckets with the orders' markers, the
//! users' homes (counts and request records), the ledger's records of each
//! order, and what each client was told. Small integers and short vectors
//! indexed by pool, bucket and order (one request id an order).

/// A request's record at its user's home: the decision point.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Rec {
    None,
    /// Refused at the reserve: the limit, nothing reserved.
    Limit,
    /// Reserved, undecided (in the home's set of pending sagas).
    Pending,
    /// Decided bought: the final record.
    Bought,
    /// Decided refused, the reservation still counted until every line is
    /// undone (still in the pending set: the sweeper finishes it).
    Refused,
    /// Refused, every line undone and the reservation released: the final
    /// record a retry is answered from.
    Released,
}

/// An order's marker in one bucket of a line's pool (`tk:<rid>:<pass>`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Marker {
    None,
    /// The unit taken here.
    Taken,
    /// Short here: a walk goes on to the next bucket.
    Short,
    /// Undone: the take given back, or a bucket closed to a late walk.
    Undone,
}

/// One bucket of a pool: its stock and each order's marker.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Bucket {
    pub stock: u8,
    pub markers: Vec<Marker>,
}

/// The ledger's records of one line of an order: takes and voids.
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub struct Line {
    pub t: u8,
    pub v: u8,
}

impl Line {
    /// Units the line keeps from its pool.
    pub fn standing(&self) -> u8 {
        self.t.saturating_sub(self.v)
    }
}

/// The last answer a client got for an order.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Told {
    None,
    Bought,
    Refused,
    Limit,
}

/// The whole state.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct State {
    /// Per pool, its buckets.
    pub pools: Vec<Vec<Bucket>>,
    /// Per user, the units counted against the limit at its home.
    pub users: Vec<u8>,
    /// Per order, its record at its user's home.
    pub reqs: Vec<Rec>,
    /// Per order and pool, the line's take and void records.
    pub lines: Vec<Vec<Line>>,
    /// Per order, its order records (written by the commit).
    pub bought: Vec<u8>,
    /// Per order, its refusal records (written by the abort).
    pub refused: Vec<u8>,
    /// Per order, the last answer its client got.
    pub told: Vec<Told>,
}
