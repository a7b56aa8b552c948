//! The state of an event under admission control: its buckets (stock, the
//! saga's markers, sealed, and the bucket's share of the waiting list: on,
//! units aside, tickets), the tokens' records at their users' homes, the
//! requests' records and orders, the list's slot (the next position, which
//! ticket each position went to), the ledger's records and what each
//! client was told.

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

/// A ticket's record in its bucket (`wl.t:<n>`): one unit set aside for
/// the line, from `reserve_offers.lua` on.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Ticket {
    /// Made from a unit aside, not opened yet (its score -1 in `wo`).
    Reserved,
    /// Offered to the user at `pos`, until its deadline (`due`: passed).
    Open { pos: u8, due: bool },
    /// Bought by the user at that position (`claim_offer.lua`).
    Taken(u8),
    /// Passed at its deadline (`pass_offers.lua`): its unit back aside.
    Passed(u8),
    /// Nobody left in line: its unit went back to stock (`open_offer.lua`).
    ToSale,
    /// Reserved or open at the close: its unit is leftover (`retire.lua`);
    /// the position it was open to, if it was.
    Closed(Option<u8>),
}

/// One bucket: open-sale stock, each request's marker, sealed, and its
/// share of the waiting list (`wl`): whether returned units go aside
/// (`on`), the units aside, and the tickets made from them, in order.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Bucket {
    pub stock: u8,
    pub markers: Vec<Marker>,
    pub sealed: bool,
    pub on: bool,
    pub aside: u8,
    pub tickets: Vec<Ticket>,
}

impl Bucket {
    /// Units in tickets reserved or open: the bucket's `wl.units` besides
    /// those aside.
    pub fn in_tickets(&self) -> u32 {
        self.tickets
            .iter()
            .filter(|t| matches!(t, Ticket::Reserved | Ticket::Open { .. }))
            .count() as u32
    }
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

/// What the list's slot answered a ticket (`a:<bucket>:<ticket>`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Given {
    /// Not asked yet.
    None,
    /// That position (0-based), given to this ticket.
    At(u8),
    /// Every position was given before it asked: nobody left for it.
    Nobody,
}

/// The list's slot (`ss:{w#e}:list`): the next position to give, what each
/// ticket was given, and the ticket each position went to (`o:<pos>`).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct List {
    pub next: u8,
    /// Per bucket, per ticket.
    pub given: Vec<Vec<Given>>,
    /// Per position, its (bucket, ticket).
    pub placed: Vec<Option<(u8, u8)>>,
}

impl List {
    /// What ticket `t` of bucket `j` was given.
    pub fn given(&self, j: usize, t: usize) -> Given {
        self.given[j].get(t).copied().unwrap_or(Given::None)
    }
}

/// The last answer a client got.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Told {
    None,
    Bought,
    SoldOut,
    Refused(Why),
    /// An offer's purchase refused: passed or past its deadline.
    Late,
    /// An offer's purchase at a sealed bucket: "closed" (a replay of a
    /// bought offer too: `claim_offer.lua` checks the seal first).
    Closed,
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
    pub list: List,
    /// Per position, the offers passed at it (the round's count).
    pub passes: Vec<u8>,
    /// Per position, the ledger's order records of its offer.
    pub claims: Vec<u8>,
    /// Per position, whether its offer's order was cancelled (its unit
    /// given back at the ticket's bucket).
    pub cancelled: Vec<bool>,
    /// Per position, the last answer its user's offer purchase got.
    pub told_line: Vec<Told>,
    pub leftover: u8,
    /// Whether a unit was put (back) on open sale after the start.
    pub reopened: bool,
}

impl State {
    /// Whether a position in line was not given yet.
    pub fn waiting(&self) -> bool {
        usize::from(self.list.next) < self.list.placed.len()
    }

    /// The ticket position `p` went to, if any.
    pub fn ticket_at(&self, p: usize) -> Option<Ticket> {
        let (j, t) = self.list.placed[p]?;
        self.buckets[j as usize].tickets.get(t as usize).copied()
    }
}
