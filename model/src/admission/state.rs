//! The state of an event under admission control: its buckets (stock, the
//! transfers of returned units, the saga's markers, sealed), the tokens'
//! records at their users' homes, the requests' records and orders, the
//! waiting list's slot (units aside, the offers in line order), the
//! ledger's records and what each client was told.

/// Why a request was refused at its home step.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Why {
    /// Forged, unknown, or another user's token.
    Token,
    /// The token's allowance is spent (or reserved by a saga).
    Used,
    /// The token expired.
    Expired,
    /// The sale is closed here.
    Closed,
}

/// A request's record at its user's home.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Rec {
    None,
    /// Broken variant only: the token was checked, not consumed.
    Admitted,
    /// A saga: the token's unit reserved, the take under way.
    Pending,
    Bought,
    SoldOut,
    Refused(Why),
}

/// A saga's marker in one bucket (`tk:<rid>:<pass>`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Marker {
    None,
    Taken,
    Short,
}

/// One bucket: open-sale stock, returned units on their way to the list's
/// slot, each request's marker, and whether the close sealed it.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Bucket {
    pub stock: u8,
    pub xfer: u8,
    pub markers: Vec<Marker>,
    pub sealed: bool,
}

/// A token's record at its user's home.
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub struct Token {
    /// Units consumed: final, each with its order.
    pub used: u8,
    /// Units reserved by pending sagas.
    pub reserved: u8,
    pub expired: bool,
}

/// A request's order (one unit, held at its user's home).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Order {
    None,
    Held,
    Paid,
    /// Expired or cancelled: its unit came back.
    Returned,
    /// Voided by the close: its unit is leftover.
    Void,
}

/// An offer to the user at one position of the line.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Offer {
    None,
    Open,
    Taken,
    Passed,
    /// Open at the close: its unit is leftover.
    Closed,
}

/// The last answer a client got.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Told {
    None,
    Bought,
    SoldOut,
    Refused(Why),
    /// An offer's purchase refused: passed, past its deadline, or closed.
    Late,
}

/// The whole state.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct State {
    pub buckets: Vec<Bucket>,
    /// Per token holder, the token's record.
    pub tokens: Vec<Token>,
    /// Per request, its record at its user's home.
    pub reqs: Vec<Rec>,
    pub orders: Vec<Order>,
    /// Per request, the ledger's consumption records of its token.
    pub consumed: Vec<u8>,
    /// Per request, the ledger's order records.
    pub ordered: Vec<u8>,
    pub told: Vec<Told>,
    /// The list's slot: returned units set aside, not offered yet.
    pub aside: u8,
    /// Per position in line, its offer.
    pub offers: Vec<Offer>,
    /// Per position, whether its offer's deadline passed.
    pub due: Vec<bool>,
    /// Per position, the ledger's records of its offer passing.
    pub passes: Vec<u8>,
    /// Per position, the ledger's order records of its offer token.
    pub claims: Vec<u8>,
    /// Per position, the last answer its user's offer purchase got.
    pub told_line: Vec<Told>,
    pub list_sealed: bool,
    pub leftover: u8,
    /// Units put (back) on open sale after the start.
    pub reopened: u8,
}

impl State {
    /// The next position in line to be offered.
    pub fn cursor(&self) -> usize {
        self.offers
            .iter()
            .take_while(|&&o| o != Offer::None)
            .count()
    }

    /// Whether users in line are still waiting for an offer.
    pub fn waiting(&self) -> bool {
        self.cursor() < self.offers.len()
    }
}
