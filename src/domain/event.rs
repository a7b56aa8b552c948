//! Events: what an event is asked to be (`EventSpec`, its bounds and its
//! bucket count), what the store keeps about it (`EventMeta`: status, layout
//! and its history, the sold-out mark) and one bucket's state as a read sees
//! it. Orders and request records are in [`super::model`], which re-exports
//! these.

use serde::{Deserialize, Serialize};

use crate::domain::ids::EventId;
use crate::domain::keys::BucketRef;
use crate::domain::token::TokenAccess;

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
    /// The `token` access mode: a purchase carries a signed token, checked
    /// against these keys and consumed at the buyer's home
    /// ([`super::token`]); `None`: the `open` mode, today's sale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TokenAccess>,
    /// The `draw` access mode (with `tokens`: a winner's token is signed
    /// with the first key): the entry window, the draw's settings and the
    /// seed's published hash ([`super::draw`]); `None` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draw: Option<crate::domain::draw::DrawSpec>,
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
    #[error("token_keys: {0}")]
    TokenKeys(String),
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
        if let Some(t) = &self.tokens {
            t.validate().map_err(SpecError::TokenKeys)?;
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
    /// A draw's waiting list here: units aside or offered (not in `stock`,
    /// not sold).
    pub waiting: u64,
    /// Sealed (by a reshard, a close or a partial loss): nothing sells here;
    /// the view then checks that the layout it read is still current.
    pub sealed: bool,
}
