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
    /// Committed as a hold (a release with holds): in the pending set until
    /// the hold ends, its units still counted.
    Held(Hold),
    /// A confirmed hold, every line confirmed: the final record.
    Confirmed,
    /// A cancelled hold, every line given back and the units released.
    Cancelled,
    /// An expired hold, every line given back and the units released.
    Expired,
}

/// Where a held order stands (`domain::release::HoldState` before its end):
/// open until one compare-and-set at the home decides it, then its lines
/// are finished as decided.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Hold {
    Open,
    Confirming,
    Cancelling,
    Expiring,
}

impl Rec {
    /// Whether the order's units are counted at its user's home: reserved
    /// and not released (nor refused by the limit, which counted none).
    pub fn counted(self) -> bool {
        matches!(
            self,
            Rec::Pending | Rec::Bought | Rec::Refused | Rec::Held(_) | Rec::Confirmed
        )
    }
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
    /// Confirmed (`K`): a held order's take here, its hold confirmed.
    Confirmed,
}

/// One bucket of a pool: its stock and each order's marker.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Bucket {
    pub stock: u8,
    pub markers: Vec<Marker>,
}

/// The ledger's records of one line of an order: takes and voids, and a
/// held order's confirms and give-backs (cancel or expiry records).
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub struct Line {
    pub t: u8,
    pub v: u8,
    pub c: u8,
    pub g: u8,
}

impl Line {
    /// Units the line keeps from its pool.
    pub fn standing(&self) -> u8 {
        self.t.saturating_sub(self.v + self.g)
    }
}

/// The last answer a client got for an order.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Told {
    None,
    Bought,
    Refused,
    Limit,
    /// A held order's end: confirmed, cancelled or expired.
    Confirmed,
    Cancelled,
    Expired,
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
