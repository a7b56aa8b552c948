//! The domain: events, their stored meta, orders and purchase records.
//!
//! These types are shared by the engine and every store backend. The compact
//! `|`-separated encodings of [`RequestRecord`] and [`OrderEntry`] are what the Lua
//! scripts write into Redis (the Redis store builds them with `encode`, never by
//! hand); the memory backend keeps the same values decoded. The order stream's
//! entries are in [`crate::domain::stream`].

use serde::{Deserialize, Serialize};

use crate::domain::ids::{EventId, OrderId, UserId};
use crate::domain::keys::BucketRef;

/// Bounds every event must respect (API.md).
pub const MAX_BUCKETS: u32 = 1024;

/// Purchases one store call carries at most (`batching.max_batch`):
/// `purchase.lua` unpacks ranges of up to twice as many values, and Lua's
/// `unpack` takes about 8000 (its C stack). The engine clamps its batches to
/// it; the settings refuse more.
pub(crate) const MAX_BATCH: usize = 1_000;
pub(crate) const MAX_STOCK: u64 = 1 << 53;
pub const DEFAULT_MAX_PER_ORDER: u32 = 10;
/// Highest `max_per_order` accepted: a single order is a handful of units, not a wholesale.
pub(crate) const MAX_PER_ORDER_CAP: u32 = 1000;
/// Longest pay-by window (`hold_seconds`): a day.
pub(crate) const MAX_HOLD_SECONDS: u32 = 86_400;

/// What a client asks for when creating an event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventSpec {
    pub id: EventId,
    pub stock: u64,
    pub buckets: u32,
    pub per_user_limit: Option<u32>,
    pub max_per_order: u32,
    /// Unix milliseconds; `None`: open from creation.
    pub starts_at: Option<i64>,
    /// Unix milliseconds; `None`: open until sold out or closed.
    pub ends_at: Option<i64>,
    /// Purchases are holds the buyer must confirm within this many seconds
    /// (1..=86400); `None`: purchases are confirmed at once.
    pub hold_seconds: Option<u32>,
    /// The bucket count adapts to the sale within these bounds (the
    /// rebalancer's leader reshards it, `control::rebalancer::policy::resize`);
    /// `None`: `buckets` stays as set. `buckets` is the current count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_buckets: Option<BucketRange>,
}

/// Bounds of an adaptive bucket count (`buckets = "auto"` or `{ min, max }`).
/// No other member: the API refuses one (`http::whole::buckets`), and its
/// document says so (`additionalProperties: false`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BucketRange {
    #[schema(minimum = 1, maximum = 1024)]
    pub min: u32,
    #[schema(minimum = 1, maximum = 1024)]
    pub max: u32,
}

impl BucketRange {
    /// What `"auto"` means: from one bucket up to 256.
    pub const AUTO: Self = Self { min: 1, max: 256 };

    /// `n` within the bounds. Never panics: a range out of order (which
    /// `EventSpec::validate` refuses) gives its `max`.
    pub fn clamp(self, n: u32) -> u32 {
        n.max(self.min).min(self.max)
    }

    /// `min-max`, as the Redis meta keeps it.
    pub fn encode(self) -> String {
        format!("{}-{}", self.min, self.max)
    }

    pub(crate) fn decode(s: &str) -> Option<Self> {
        let (min, max) = s.split_once('-')?;
        Some(Self {
            min: min.parse().ok()?,
            max: max.parse().ok()?,
        })
    }
}

/// A bucket count as asked for at creation: a number, `"auto"`, or
/// `{ min, max }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BucketCount {
    Fixed(u32),
    Auto(BucketRange),
}

impl BucketCount {
    /// Parses the named form (`"auto"`).
    pub fn named(s: &str) -> Option<Self> {
        (s == "auto").then_some(Self::Auto(BucketRange::AUTO))
    }

    /// The count the event starts with (an adaptive one starts at its
    /// minimum and grows with its demand).
    pub(crate) fn initial(self) -> u32 {
        match self {
            Self::Fixed(n) => n,
            Self::Auto(r) => r.min,
        }
    }

    pub fn range(self) -> Option<BucketRange> {
        match self {
            Self::Fixed(_) => None,
            Self::Auto(r) => Some(r),
        }
    }
}

impl EventSpec {
    /// A purchase's pay-by deadline when bought at `now_ms` (held events only).
    pub fn pay_by(&self, now_ms: i64) -> Option<i64> {
        self.hold_seconds
            .map(|s| now_ms.saturating_add(i64::from(s) * 1000))
    }
}

/// Why an event spec was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("buckets must be between 1 and {MAX_BUCKETS}, got {0}")]
    Buckets(u32),
    #[error("stock must be between 0 and 2^53, got {0}")]
    Stock(u64),
    #[error("max_per_order must be between 1 and {MAX_PER_ORDER_CAP}, got {0}")]
    MaxPerOrder(u32),
    #[error("per_user_limit must be at least 1, got {0}")]
    PerUserLimit(u32),
    #[error("ends_at must be after starts_at")]
    Window,
    #[error("hold_seconds must be between 1 and {MAX_HOLD_SECONDS}, got {0}")]
    HoldSeconds(u32),
    #[error("buckets {{\"min\": {min}, \"max\": {max}}}: need 1 ≤ min ≤ max ≤ {MAX_BUCKETS}")]
    BucketRange { min: u32, max: u32 },
}

impl EventSpec {
    /// Checks the bounds of API.md.
    pub fn validate(&self) -> Result<(), SpecError> {
        if !(1..=MAX_BUCKETS).contains(&self.buckets) {
            return Err(SpecError::Buckets(self.buckets));
        }
        if let Some(r) = self.auto_buckets
            && !(1 <= r.min && r.min <= r.max && r.max <= MAX_BUCKETS)
        {
            return Err(SpecError::BucketRange {
                min: r.min,
                max: r.max,
            });
        }
        if self.stock > MAX_STOCK {
            return Err(SpecError::Stock(self.stock));
        }
        if !(1..=MAX_PER_ORDER_CAP).contains(&self.max_per_order) {
            return Err(SpecError::MaxPerOrder(self.max_per_order));
        }
        if let Some(limit) = self.per_user_limit.filter(|&l| l == 0) {
            return Err(SpecError::PerUserLimit(limit));
        }
        if let Some(s) = self
            .hold_seconds
            .filter(|s| !(1..=MAX_HOLD_SECONDS).contains(s))
        {
            return Err(SpecError::HoldSeconds(s));
        }
        if let (Some(s), Some(e)) = (self.starts_at, self.ends_at)
            && e <= s
        {
            return Err(SpecError::Window);
        }
        Ok(())
    }

    /// The initial stock of each bucket: an even split, the remainder spread
    /// one unit each over the first buckets.
    pub fn split(&self) -> Vec<u64> {
        split_even(self.stock, self.buckets)
    }
}

/// Each bucket should hold at least this many of the largest orders (the
/// README's sizing rule, stock / N ≥ 100 × `max_per_order`): below it a
/// bucket runs dry after a few orders, and purchases probe other buckets.
pub(crate) const ORDERS_PER_BUCKET: u64 = 100;

impl EventSpec {
    /// What is accepted but unwise about this spec, in words a client is
    /// shown (`warnings` of the create answer) and the log keeps. One
    /// bucket has no other to run dry against, so only a split is judged.
    pub fn warnings(&self) -> Vec<String> {
        let buckets = u64::from(self.buckets);
        let wanted = ORDERS_PER_BUCKET * u64::from(self.max_per_order);
        let per_bucket = self.stock / buckets.max(1);
        if buckets <= 1 || per_bucket >= wanted {
            return Vec::new();
        }
        let fits = (self.stock / wanted).max(1);
        vec![format!(
            "stock per bucket is {per_bucket} ({} units over {buckets} buckets), below \
             {ORDERS_PER_BUCKET} × max_per_order = {wanted}: buckets run dry after a few orders \
             and purchases probe other buckets; use at most {fits} bucket{}, or more stock",
            self.stock,
            if fits == 1 { "" } else { "s" },
        )]
    }
}

/// Splits `stock` over `buckets` as evenly as possible.
pub(crate) fn split_even(stock: u64, buckets: u32) -> Vec<u64> {
    let n = u64::from(buckets);
    (0..n)
        .map(|i| stock / n + u64::from(i < stock % n))
        .collect()
}

/// The lifecycle of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventStatus {
    /// Meta written, buckets being initialised: nothing sells yet.
    Creating,
    OnSale,
    /// Moving to a new bucket count: purchases wait for the new layout.
    Resharding,
    Closed,
}

impl EventStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Creating => "creating",
            Self::OnSale => "on_sale",
            Self::Resharding => "resharding",
            Self::Closed => "closed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "creating" => Self::Creating,
            "on_sale" => Self::OnSale,
            "resharding" => Self::Resharding,
            "closed" => Self::Closed,
            _ => return None,
        })
    }
}

/// An event as stored: its spec plus the state every instance shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventMeta {
    pub spec: EventSpec,
    pub status: EventStatus,
    /// Layout generation: bumped by every reshard.
    pub generation: u32,
    /// Bumped after every change that adds units to a bucket (cancel, transfer),
    /// so a sold-out decision can tell whether its probe of the ring was consistent.
    pub seq: u64,
    /// At `seq`, a consistent probe found fewer units in the whole event than
    /// a buyer asked for: `left` at most.
    pub sold_out: Option<SoldOutMark>,
    pub(crate) created_ms: i64,
    /// Older layouts `(generation, buckets)` whose buckets may still hold
    /// records not yet flushed (a reshard in progress or just done).
    pub retired: Vec<(u32, u32)>,
    /// While resharding: the layout `(generation, buckets)` being filled.
    pub reshard_to: Option<(u32, u32)>,
    /// The event's layouts, oldest first, the current one last (the last
    /// [`HISTORY_CAP`]; empty in metas written before it was kept).
    pub history: Vec<LayoutChange>,
}

/// Layouts an event's meta remembers.
pub(crate) const HISTORY_CAP: usize = 32;

/// A layout an event moved to: at creation (`reason` "created") or by a
/// reshard (its `reason`: manual, config, resumed, hot, spread, drain).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutChange {
    pub generation: u32,
    pub buckets: u32,
    pub at_ms: i64,
    pub reason: String,
}

impl LayoutChange {
    /// `gen:buckets:ms:reason,…`, as the Redis meta keeps it.
    pub fn encode_all(history: &[Self]) -> String {
        history
            .iter()
            .map(|c| format!("{}:{}:{}:{}", c.generation, c.buckets, c.at_ms, c.reason))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub(crate) fn decode_all(s: &str) -> Option<Vec<Self>> {
        s.split(',')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let mut f = p.splitn(4, ':');
                Some(Self {
                    generation: f.next()?.parse().ok()?,
                    buckets: f.next()?.parse().ok()?,
                    at_ms: f.next()?.parse().ok()?,
                    reason: f.next()?.to_owned(),
                })
            })
            .collect()
    }
}

impl EventMeta {
    /// Every bucket that may hold units or records: the current layout, the
    /// one a reshard moves to, and older ones not drained yet.
    pub fn all_buckets(&self) -> Vec<BucketRef> {
        self.layouts()
            .into_iter()
            .flat_map(|(generation, n)| {
                (0..n).map(move |b| BucketRef::new(&self.spec.id, generation, b))
            })
            .collect()
    }

    /// The bucket layouts that may still hold units or records: `(generation,
    /// bucket count)`, the current one first.
    pub fn layouts(&self) -> Vec<(u32, u32)> {
        let mut all = vec![(self.generation, self.spec.buckets)];
        all.extend(self.reshard_to);
        all.extend(self.retired.iter().copied());
        all
    }

    /// Encodes retired layouts for the meta hash: `gen:count,gen:count`.
    pub(crate) fn encode_layouts(layouts: &[(u32, u32)]) -> String {
        layouts
            .iter()
            .map(|(g, n)| format!("{g}:{n}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub(crate) fn decode_layouts(s: &str) -> Option<Vec<(u32, u32)>> {
        s.split(',')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (g, n) = p.split_once(':')?;
                Some((g.parse().ok()?, n.parse().ok()?))
            })
            .collect()
    }

    /// `Some(left)` when the sold-out mark is current (same seq, younger than
    /// `max_age_ms`) and says fewer than `qty` units are left: an order of
    /// `qty` is refused without probing.
    pub(crate) fn sold_out_for(&self, qty: u32, now_ms: i64, max_age_ms: i64) -> Option<u64> {
        self.sold_out
            .filter(|m| m.seq == self.seq && now_ms - m.at_ms <= max_age_ms)
            .map(|m| m.left)
            .filter(|&left| left < u64::from(qty))
    }
}

/// A consistent probe's verdict on a whole event: at `seq` (no unit has come
/// back since while the event's seq is still `seq`), at most `left` units
/// were left, fewer than the buyer who probed asked for. Units only leave
/// until the seq moves on, so every order of more than `left` units is
/// refused truly, in one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SoldOutMark {
    pub seq: u64,
    pub at_ms: i64,
    pub left: u64,
}

impl SoldOutMark {
    /// The meta hash's form, `seq|at_ms|left`.
    pub fn encode(&self) -> String {
        format!("{}|{}|{}", self.seq, self.at_ms, self.left)
    }

    /// Reads `seq|at_ms|left`, or the older `seq|at_ms` (nothing left).
    pub(crate) fn decode(s: &str) -> Option<Self> {
        let mut parts = s.split('|');
        let seq = parts.next()?.parse().ok()?;
        let at_ms = parts.next()?.parse().ok()?;
        let left = match parts.next() {
            Some(l) => l.parse().ok()?,
            None => 0,
        };
        parts.next().is_none().then_some(Self { seq, at_ms, left })
    }
}

/// A bucket's state as one atomic read sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BucketState {
    pub stock: u64,
    /// Units journaled out of this bucket by an open transfer.
    pub in_transfer: u64,
    pub fence: u64,
    /// How many steps have added units to this bucket.
    pub adds: u64,
    /// Units asked for by buyers homed here (bought or probed for), ever.
    pub demand: u64,
    /// Units in live holds of buyers homed here (taken: not in `stock`).
    pub held: u64,
    /// Sealed (by a reshard, a close or a partial loss): nothing sells here;
    /// the view then checks that the layout it read is still current.
    pub sealed: bool,
}

/// The outcome of a request id, stored in the home bucket so a retry gets the same answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestRecord {
    /// Quota reserved, the home bucket was short: the ring is being probed.
    Pending {
        qty: u32,
        order_id: OrderId,
        user: UserId,
        at_ms: i64,
    },
    Bought {
        qty: u32,
        order_id: OrderId,
        bucket: u32,
        probes: u32,
    },
    LimitExceeded {
        qty: u32,
        limit: u32,
        held: u64,
    },
    SoldOut {
        qty: u32,
        remaining: u64,
    },
}

impl RequestRecord {
    pub fn qty(&self) -> u32 {
        match self {
            Self::Pending { qty, .. }
            | Self::Bought { qty, .. }
            | Self::LimitExceeded { qty, .. }
            | Self::SoldOut { qty, .. } => *qty,
        }
    }

    /// The encoding the Lua scripts write.
    pub fn encode(&self) -> String {
        match self {
            Self::Pending {
                qty,
                order_id,
                user,
                at_ms,
            } => format!("P|{qty}|{order_id}|{user}|{at_ms}"),
            Self::Bought {
                qty,
                order_id,
                bucket,
                probes,
            } => Self::encode_bought(*qty, order_id, *bucket, *probes),
            Self::LimitExceeded { qty, limit, held } => format!("L|{qty}|{limit}|{held}"),
            Self::SoldOut { qty, remaining } => format!("S|{qty}|{remaining}"),
        }
    }

    /// [`RequestRecord::Bought`]'s encoding, from borrowed parts.
    pub(crate) fn encode_bought(qty: u32, order_id: &OrderId, bucket: u32, probes: u32) -> String {
        let mut s = String::with_capacity(order_id.as_str().len() + 24);
        Self::write_bought(&mut s, qty, order_id, bucket, probes);
        s
    }

    /// [`RequestRecord::encode_bought`], written to `w`.
    pub(crate) fn write_bought(
        w: &mut impl std::fmt::Write,
        qty: u32,
        order_id: &OrderId,
        bucket: u32,
        probes: u32,
    ) {
        let _ = write!(w, "B|{qty}|{order_id}|{bucket}|{probes}");
    }

    pub(crate) fn decode(s: &str) -> Option<Self> {
        let f: Vec<&str> = s.split('|').collect();
        let n = |i: usize| f.get(i)?.parse::<u64>().ok();
        let qty = n(1)? as u32;
        Some(match *f.first()? {
            "P" if f.len() == 5 => Self::Pending {
                qty,
                order_id: OrderId::from_stored(f[2]),
                user: UserId::parse(f[3]).ok()?,
                at_ms: f[4].parse().ok()?,
            },
            "B" if f.len() == 5 => Self::Bought {
                qty,
                order_id: OrderId::from_stored(f[2]),
                bucket: n(3)? as u32,
                probes: n(4)? as u32,
            },
            "L" if f.len() == 4 => Self::LimitExceeded {
                qty,
                limit: n(2)? as u32,
                held: n(3)?,
            },
            "S" if f.len() == 3 => Self::SoldOut {
                qty,
                remaining: n(2)?,
            },
            _ => return None,
        })
    }
}

/// Where an order stands in its home bucket's index: the first letter of
/// its entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryState {
    /// `C`: bought (a hold that was confirmed, or an event without holds).
    Confirmed,
    /// `X`: cancelled, its units back on sale.
    Cancelled,
    /// `H`: held until its pay-by deadline.
    Held,
    /// `E`: a hold that reached its deadline (or was voided by a close), its
    /// units back on sale.
    Expired,
}

impl EntryState {
    fn letter(self) -> char {
        match self {
            Self::Confirmed => 'C',
            Self::Cancelled => 'X',
            Self::Held => 'H',
            Self::Expired => 'E',
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "C" => Self::Confirmed,
            "X" => Self::Cancelled,
            "H" => Self::Held,
            "E" => Self::Expired,
            _ => return None,
        })
    }
}

/// An order as its home bucket indexes it (until the flusher and the DB take over).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderEntry {
    pub state: EntryState,
    pub user: UserId,
    pub qty: u32,
    /// The bucket the units were taken from.
    pub bucket: u32,
    /// The client's request id, empty when none was given.
    pub request_id: String,
    pub at_ms: i64,
    /// The pay-by deadline of an order taken as a hold (whatever became of it).
    pub pay_by: Option<i64>,
}

impl OrderEntry {
    /// Whether it was cancelled.
    pub fn cancelled(&self) -> bool {
        self.state == EntryState::Cancelled
    }

    /// `S|user|qty|bucket|rid|at`, and `|pay_by` for a hold.
    pub fn encode(&self) -> String {
        let mut s = String::with_capacity(self.user.as_str().len() + self.request_id.len() + 40);
        Self::write_parts(
            &mut s,
            self.state,
            self.user.as_str(),
            self.qty,
            self.bucket,
            &self.request_id,
            self.at_ms,
            self.pay_by,
        );
        s
    }

    /// [`OrderEntry::encode`] from borrowed parts, written to `w` (the hot
    /// path writes a call's entries into one buffer).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn write_parts(
        w: &mut impl std::fmt::Write,
        state: EntryState,
        user: &str,
        qty: u32,
        bucket: u32,
        request_id: &str,
        at_ms: i64,
        pay_by: Option<i64>,
    ) {
        let _ = write!(
            w,
            "{}|{user}|{qty}|{bucket}|{request_id}|{at_ms}",
            state.letter()
        );
        if let Some(p) = pay_by {
            let _ = write!(w, "|{p}");
        }
    }

    pub(crate) fn decode(s: &str) -> Option<Self> {
        let f: Vec<&str> = s.split('|').collect();
        if f.len() != 6 && f.len() != 7 {
            return None;
        }
        Some(Self {
            state: EntryState::parse(f[0])?,
            user: UserId::parse(f[1]).ok()?,
            qty: f[2].parse().ok()?,
            bucket: f[3].parse().ok()?,
            request_id: f[4].to_owned(),
            at_ms: f[5].parse().ok()?,
            pay_by: match f.get(6) {
                Some(p) => Some(p.parse().ok()?),
                None => None,
            },
        })
    }
}

/// Where an order stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OrderStatus {
    Confirmed,
    Cancelled,
    /// Taken as a hold, not paid yet: confirm it before `pay_by`.
    Held,
    /// A hold not confirmed by its `pay_by` (or voided by the event's close):
    /// its units went back on sale.
    Expired,
}

impl From<EntryState> for OrderStatus {
    fn from(s: EntryState) -> Self {
        match s {
            EntryState::Confirmed => Self::Confirmed,
            EntryState::Cancelled => Self::Cancelled,
            EntryState::Held => Self::Held,
            EntryState::Expired => Self::Expired,
        }
    }
}

/// An order as the API shows it (from its home bucket's index, or from the ledger).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct OrderView {
    pub order_id: OrderId,
    pub event_id: EventId,
    pub user_id: UserId,
    pub quantity: u32,
    /// The bucket the units came from.
    pub bucket: u32,
    pub status: OrderStatus,
    /// The purchase's request id, when one was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<crate::domain::ids::RequestId>)]
    pub request_id: Option<String>,
    /// When the order was taken (RFC 3339, UTC).
    #[serde(with = "crate::domain::model::rfc3339_ms")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub created_at: Option<i64>,
    /// Orders taken as holds (events with `hold_seconds`): the deadline to
    /// confirm by (RFC 3339, UTC), whatever became of the hold.
    #[serde(
        with = "crate::domain::model::rfc3339_ms",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub pay_by: Option<i64>,
}

impl OrderView {
    pub fn new(order_id: OrderId, event: EventId, entry: OrderEntry) -> Self {
        // Stored request ids are "<user>/<request id>".
        let request_id = entry
            .request_id
            .split_once('/')
            .map(|(_, rid)| rid.to_owned())
            .filter(|rid| !rid.is_empty());
        Self {
            order_id,
            event_id: event,
            user_id: entry.user,
            quantity: entry.qty,
            bucket: entry.bucket,
            status: entry.state.into(),
            request_id,
            created_at: Some(entry.at_ms),
            pay_by: entry.pay_by,
        }
    }
}

/// A confirmed purchase, as the API returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Order {
    pub order_id: OrderId,
    pub event_id: EventId,
    pub user_id: UserId,
    pub quantity: u32,
    /// The bucket the units came from.
    pub bucket: u32,
    /// How many buckets beyond the home bucket were tried.
    pub probes: u32,
    /// `held` on events with `hold_seconds` (confirm by `pay_by`); absent
    /// otherwise (the order is confirmed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<OrderStatus>,
    /// The deadline to confirm a held order by (RFC 3339, UTC).
    #[serde(
        with = "crate::domain::model::rfc3339_ms",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub pay_by: Option<i64>,
}

impl Order {
    /// The order a replay answers from what is known of it now (the ledger
    /// after a close): its status shown on an event with holds, or when it
    /// is no longer confirmed; `probes` is not kept (0).
    pub fn from_view(view: OrderView) -> Self {
        Self {
            status: Some(view.status)
                .filter(|s| view.pay_by.is_some() || *s != OrderStatus::Confirmed),
            order_id: view.order_id,
            event_id: view.event_id,
            user_id: view.user_id,
            quantity: view.quantity,
            bucket: view.bucket,
            probes: 0,
            pay_by: view.pay_by,
        }
    }

    /// The order held until `pay_by` (when `Some`).
    pub(crate) fn held_until(mut self, pay_by: Option<i64>) -> Self {
        if pay_by.is_some() {
            self.status = Some(OrderStatus::Held);
            self.pay_by = pay_by;
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(stock: u64, buckets: u32) -> EventSpec {
        EventSpec {
            id: EventId::parse("e").unwrap(),
            stock,
            buckets,
            per_user_limit: None,
            max_per_order: DEFAULT_MAX_PER_ORDER,
            starts_at: None,
            ends_at: None,
            hold_seconds: None,
            auto_buckets: None,
        }
    }

    #[test]
    fn stock_is_split_evenly_with_the_remainder_spread() {
        assert_eq!(spec(10, 8).split(), vec![2, 2, 1, 1, 1, 1, 1, 1]);
        assert_eq!(spec(3, 4).split(), vec![1, 1, 1, 0]);
        assert_eq!(spec(0, 2).split(), vec![0, 0]);
        assert_eq!(spec(1 << 53, 1024).split().iter().sum::<u64>(), 1 << 53);
    }

    #[test]
    fn a_small_stock_per_bucket_is_warned_about_not_refused() {
        // 16 buckets of 3 units with orders of up to 10: warned, and the
        // advice is a count that meets the rule.
        let small = spec(3, 16);
        assert_eq!(small.validate(), Ok(()));
        let w = small.warnings();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("stock per bucket is 0"), "{w:?}");
        assert!(w[0].contains("1000"), "{w:?}");
        assert!(w[0].contains("at most 1 bucket,"), "{w:?}");
        // One bucket has nothing to probe: nothing to say.
        assert!(spec(3, 1).warnings().is_empty());
        // Exactly at the rule: nothing to say.
        let mut at = spec(16 * 100 * 2, 16);
        at.max_per_order = 2;
        assert!(at.warnings().is_empty());
        at.stock -= 16;
        assert!(
            at.warnings()[0].contains("at most 15 buckets"),
            "{:?}",
            at.warnings()
        );
    }

    #[test]
    fn a_bucket_range_out_of_order_is_told_in_json() {
        let mut s = spec(10, 2);
        s.auto_buckets = Some(BucketRange { min: 8, max: 2 });
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains(r#"{"min": 8, "max": 2}"#), "{e}");
        assert!(!e.contains("min = 8"), "{e}");
    }

    #[test]
    fn out_of_bound_specs_are_refused() {
        assert_eq!(spec(1, 0).validate(), Err(SpecError::Buckets(0)));
        assert_eq!(spec(1, 1025).validate(), Err(SpecError::Buckets(1025)));
        assert_eq!(
            spec((1 << 53) + 1, 1).validate(),
            Err(SpecError::Stock((1 << 53) + 1))
        );
        let mut s = spec(1, 1);
        s.per_user_limit = Some(0);
        assert!(s.validate().is_err());
        let mut s = spec(1, 1);
        s.starts_at = Some(10);
        s.ends_at = Some(10);
        assert_eq!(s.validate(), Err(SpecError::Window));
    }

    #[test]
    fn request_records_round_trip_their_encoding() {
        let oid = OrderId::from_stored("e.0000000000000001.0000000000000002");
        for r in [
            RequestRecord::Pending {
                qty: 2,
                order_id: oid.clone(),
                user: UserId::parse("u-1").unwrap(),
                at_ms: 17,
            },
            RequestRecord::Bought {
                qty: 1,
                order_id: oid,
                bucket: 3,
                probes: 2,
            },
            RequestRecord::LimitExceeded {
                qty: 3,
                limit: 2,
                held: 1,
            },
            RequestRecord::SoldOut {
                qty: 1,
                remaining: 0,
            },
        ] {
            assert_eq!(RequestRecord::decode(&r.encode()), Some(r));
        }
        assert_eq!(RequestRecord::decode("Z|1"), None);
    }

    #[test]
    fn order_entries_round_trip_their_encoding() {
        let entry = OrderEntry {
            state: EntryState::Cancelled,
            user: UserId::parse("u-1").unwrap(),
            qty: 2,
            bucket: 3,
            request_id: "u-1/r".into(),
            at_ms: 17,
            pay_by: None,
        };
        assert_eq!(entry.encode(), "X|u-1|2|3|u-1/r|17");
        assert_eq!(OrderEntry::decode(&entry.encode()), Some(entry.clone()));
        let held = OrderEntry {
            state: EntryState::Held,
            pay_by: Some(60_017),
            ..entry
        };
        assert_eq!(held.encode(), "H|u-1|2|3|u-1/r|17|60017");
        assert_eq!(OrderEntry::decode(&held.encode()), Some(held));
        assert_eq!(OrderEntry::decode("Q|u-1|2|3||17"), None);
    }

    #[test]
    fn hold_seconds_outside_one_second_to_a_day_are_refused() {
        let mut s = spec(1, 1);
        s.hold_seconds = Some(0);
        assert_eq!(s.validate(), Err(SpecError::HoldSeconds(0)));
        s.hold_seconds = Some(86_401);
        assert!(s.validate().is_err());
        s.hold_seconds = Some(86_400);
        assert_eq!(s.validate(), Ok(()));
        assert_eq!(s.pay_by(1_000), Some(86_401_000));
    }
}

/// Serde for optional unix-millisecond timestamps as RFC 3339 strings.
pub mod rfc3339_ms {
    use serde::{Deserialize, Deserializer, Serializer};
    use time::OffsetDateTime;
    use time::format_description::well_known::Rfc3339;

    /// Formats unix milliseconds as RFC 3339 (UTC).
    pub fn format(ms: i64) -> String {
        OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
            .ok()
            .and_then(|t| t.format(&Rfc3339).ok())
            .unwrap_or_default()
    }

    /// Parses RFC 3339 into unix milliseconds.
    pub fn parse(s: &str) -> Result<i64, String> {
        OffsetDateTime::parse(s, &Rfc3339)
            .map(|t| (t.unix_timestamp_nanos() / 1_000_000) as i64)
            .map_err(|e| format!("{s:?} is not an RFC 3339 timestamp: {e}"))
    }

    pub(crate) fn serialize<S: Serializer>(v: &Option<i64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(ms) => s.serialize_str(&format(*ms)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
        match Option::<String>::deserialize(d)? {
            Some(s) => parse(&s).map(Some).map_err(serde::de::Error::custom),
            None => Ok(None),
        }
    }
}
