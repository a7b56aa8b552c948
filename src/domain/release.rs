//! Releases: several pools sold as one, and the records of a multi-line order.
//!
//! A release is a group of pools, each an ordinary event internally (id
//! `<release>.<pool>`), so every pool keeps its buckets, probing, rebalancer,
//! resize, reshard and audit unchanged. The release itself holds its pools in
//! a fixed order (the order every driver takes an order's lines in) and the
//! sale-wide settings. A user's orders are decided at the user's *home*, one
//! of the release's `homes` slots (`keys::HomeRef`), by the [`HomeRecord`]
//! kept under the request id there (docs/DESIGN.md, "Releases").
//!
//! The records are encoded here and handed to the scripts whole: a script
//! compares and stores them, and never assembles one.

use serde::{Deserialize, Serialize};

use super::event::{BucketRange, EventSpec, SpecError};
use super::ids::{EventId, IdError, OrderId, UserId};

/// At most this many pools in a release.
pub const MAX_POOLS: usize = 64;
/// Home slots of a release when its creator does not say.
pub const DEFAULT_HOMES: u32 = 16;
/// The longest release id: a pool's event id, `<release>.<pool>`, is an
/// event id (64 characters at most).
pub const MAX_RELEASE_ID: usize = 31;
/// The longest pool id.
pub const MAX_POOL_ID: usize = 32;

/// A release id as a release may be created with: an event id of at most
/// [`MAX_RELEASE_ID`] characters, without a `.`. The dot is the pool's
/// separator, so a pool's event id names its release once, before its first
/// dot: finding whether an event is a pool is one lookup, whatever its id.
pub fn release_id(value: impl Into<String>) -> Result<EventId, String> {
    let id = EventId::parse(value).map_err(|e| e.to_string())?;
    if id.as_str().len() > MAX_RELEASE_ID {
        return Err(format!(
            "a release id has at most {MAX_RELEASE_ID} characters"
        ));
    }
    if id.as_str().contains('.') {
        return Err(
            "a release id has no '.' (it separates a pool's event id, <release>.<pool>)".into(),
        );
    }
    Ok(id)
}

/// A pool id: an event id of at most [`MAX_POOL_ID`] characters.
pub fn pool_id(value: impl Into<String>) -> Result<EventId, String> {
    let id = EventId::parse(value).map_err(|e| e.to_string())?;
    if id.as_str().len() > MAX_POOL_ID {
        return Err(format!("a pool id has at most {MAX_POOL_ID} characters"));
    }
    Ok(id)
}

/// One pool of a release: its own stock and bucket count.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolSpec {
    /// The pool's name within the release (`42`, `floor`).
    pub name: EventId,
    pub stock: u64,
    pub buckets: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_buckets: Option<BucketRange>,
}

/// A release: its pools, in the order an order's lines are taken, and the
/// sale-wide settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseSpec {
    pub id: EventId,
    pub pools: Vec<PoolSpec>,
    /// Units a user may hold across the whole release.
    pub per_user_limit: Option<u32>,
    /// Units of one order, all lines together.
    pub max_per_order: u32,
    pub starts_at: Option<i64>,
    pub ends_at: Option<i64>,
    /// With holds: an order is held until its buyer confirms it, at most
    /// this long (one `pay_by` for every line; docs/DESIGN.md, "Holds on a
    /// release order").
    pub hold_seconds: Option<u32>,
    /// Home slots, fixed at creation (never resharded).
    pub homes: u32,
}

/// Why a release spec was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReleaseError {
    #[error("a release has 1 to {MAX_POOLS} pools, got {0}")]
    Pools(usize),
    #[error("pool {0} is listed twice")]
    DuplicatePool(String),
    #[error("pool {pool}: {error}")]
    Pool { pool: String, error: SpecError },
    #[error("pool id {0}: {1}")]
    PoolId(String, IdError),
    #[error("homes must be between 1 and 1024, got {0}")]
    Homes(u32),
    #[error("release id {0}: {1}")]
    Id(String, String),
    /// A pool's resize is a reshard, which does not carry a held order's
    /// line markers yet (docs/DESIGN.md, "Holds on a release order").
    #[error("pool {0}: a release with hold_seconds needs a fixed bucket count, not \"auto\"")]
    HeldAutoBuckets(String),
}

impl ReleaseSpec {
    /// The event that is pool `k` (`<release>.<pool>`).
    pub fn pool_event(&self, k: usize) -> Result<EventId, IdError> {
        EventId::parse(format!("{}.{}", self.id, self.pools[k].name))
    }

    /// Pool `k` as the event it is: no per-user limit of its own (the
    /// release's home holds the limit), the release's window and order size.
    pub fn pool_spec(&self, k: usize) -> Result<EventSpec, ReleaseError> {
        let pool = &self.pools[k];
        Ok(EventSpec {
            id: self
                .pool_event(k)
                .map_err(|e| ReleaseError::PoolId(pool.name.to_string(), e))?,
            stock: pool.stock,
            buckets: pool.buckets,
            per_user_limit: None,
            max_per_order: self.max_per_order,
            starts_at: self.starts_at,
            ends_at: self.ends_at,
            hold_seconds: None,
            auto_buckets: pool.auto_buckets,
            tokens: None,
            draw: None,
        })
    }

    /// An order's pay-by deadline (unix ms) on a release with holds, from
    /// when its reserve left the pending record: the same for every driver.
    pub fn pay_by(&self, at_ms: i64) -> Option<i64> {
        self.hold_seconds
            .map(|s| at_ms.saturating_add(i64::from(s) * 1_000))
    }

    /// The index of the pool named `name`.
    pub fn pool_index(&self, name: &str) -> Option<usize> {
        self.pools.iter().position(|p| p.name.as_str() == name)
    }

    /// The user's home slot, from the user's routing hash.
    pub fn home(&self, user_hash: u64) -> u32 {
        (user_hash % u64::from(self.homes.max(1))) as u32
    }

    pub fn validate(&self) -> Result<(), ReleaseError> {
        release_id(self.id.as_str()).map_err(|e| ReleaseError::Id(self.id.to_string(), e))?;
        if self.pools.is_empty() || self.pools.len() > MAX_POOLS {
            return Err(ReleaseError::Pools(self.pools.len()));
        }
        if !(1..=1024).contains(&self.homes) {
            return Err(ReleaseError::Homes(self.homes));
        }
        for (k, pool) in self.pools.iter().enumerate() {
            if self.pools[..k].iter().any(|p| p.name == pool.name) {
                return Err(ReleaseError::DuplicatePool(pool.name.to_string()));
            }
            if self.hold_seconds.is_some() && pool.auto_buckets.is_some() {
                return Err(ReleaseError::HeldAutoBuckets(pool.name.to_string()));
            }
            let mut spec = self.pool_spec(k)?;
            spec.per_user_limit = self.per_user_limit;
            // The event's bounds on a hold; the pool itself never holds.
            spec.hold_seconds = self.hold_seconds;
            spec.validate().map_err(|error| ReleaseError::Pool {
                pool: pool.name.to_string(),
                error,
            })?;
        }
        Ok(())
    }

    pub fn encode(&self) -> String {
        serde_json::to_string(self).expect("a release spec encodes")
    }

    pub fn decode(s: &str) -> Option<Self> {
        serde_json::from_str(s).ok()
    }
}

/// The order id of line `pool` of release order `order`: the pool's event
/// in place of the release, the same routing hash and tail, so each line is
/// an ordinary order of its pool in the ledger and the lines of one order
/// share the release order's id as their suffix.
pub fn line_order_id(order: &OrderId, release: &EventId, pool_event: &EventId) -> OrderId {
    let tail = order
        .as_str()
        .strip_prefix(release.as_str())
        .unwrap_or(order.as_str());
    OrderId::from_stored(&format!("{pool_event}{tail}"))
}

/// The release order line `line` of `pool_event` belongs to:
/// `line_order_id` undone, the release in place of the pool's event.
pub fn release_order_id(line: &OrderId, pool_event: &EventId, release: &EventId) -> OrderId {
    let tail = line
        .as_str()
        .strip_prefix(pool_event.as_str())
        .unwrap_or(line.as_str());
    OrderId::from_stored(&format!("{release}{tail}"))
}

/// One line of an order: a pool (by its index in the release) and units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Line {
    pub pool: u32,
    pub qty: u32,
}

/// A refused line: its pool and the units the pool had left when refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Short {
    pub pool: u32,
    pub remaining: u64,
}

/// What an order is, wherever its record is: its id, when it started, lines.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OrderHead {
    pub order_id: OrderId,
    pub user: UserId,
    pub at_ms: i64,
    /// In the release's pool order.
    pub lines: Vec<Line>,
}

impl OrderHead {
    /// Units of the order, all lines together (what the limit counts).
    pub fn units(&self) -> u64 {
        self.lines.iter().map(|l| u64::from(l.qty)).sum()
    }
}

/// Where a held order stands. `Open` is decided once, by compare-and-set at
/// the home, into `Confirming`, `Cancelling` or `Expiring`; each of those
/// stays in `pend` until every line is confirmed or given back in its pool,
/// then becomes its final state (`Confirmed`, `Cancelled`, `Expired`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HoldState {
    Open,
    Confirming,
    Confirmed,
    Cancelling,
    Cancelled,
    Expiring,
    Expired,
}

impl HoldState {
    fn code(self) -> &'static str {
        match self {
            Self::Open => "o",
            Self::Confirming => "k",
            Self::Confirmed => "K",
            Self::Cancelling => "c",
            Self::Cancelled => "C",
            Self::Expiring => "e",
            Self::Expired => "E",
        }
    }

    fn parse(code: &str) -> Option<Self> {
        Some(match code {
            "o" => Self::Open,
            "k" => Self::Confirming,
            "K" => Self::Confirmed,
            "c" => Self::Cancelling,
            "C" => Self::Cancelled,
            "e" => Self::Expiring,
            "E" => Self::Expired,
            _ => return None,
        })
    }

    /// The state a decided hold ends in once every line is done.
    pub fn ended(self) -> Self {
        match self {
            Self::Confirming => Self::Confirmed,
            Self::Cancelling => Self::Cancelled,
            Self::Expiring => Self::Expired,
            done => done,
        }
    }

    /// Decided, with lines still to confirm or give back.
    pub fn finishing(self) -> bool {
        matches!(self, Self::Confirming | Self::Cancelling | Self::Expiring)
    }
}

/// A request's record at its user's home: the decision point.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HomeRecord {
    /// `P`: reserved, undecided (in the home's `pend`).
    Pending(OrderHead),
    /// `B`: bought (final).
    Bought(OrderHead),
    /// `R`: refused, the reservation still counted (in `pend` until released).
    Refused(OrderHead, Vec<Short>),
    /// `X`: refused, every line closed, the reservation released (final).
    Released(OrderHead, Vec<Short>),
    /// `L`: refused by the limit, nothing reserved (final).
    Limit { units: u64, limit: u32 },
    /// `H`: bought as a hold on a release with holds, every line taken with
    /// the deadline `pay_by`; in `pend` until its state is final.
    Held(OrderHead, i64, HoldState),
}

fn encode_lines(lines: &[Line]) -> String {
    lines
        .iter()
        .map(|l| format!("{}:{}", l.pool, l.qty))
        .collect::<Vec<_>>()
        .join(",")
}

fn encode_shorts(shorts: &[Short]) -> String {
    shorts
        .iter()
        .map(|s| format!("{}:{}", s.pool, s.remaining))
        .collect::<Vec<_>>()
        .join(",")
}

fn pairs<A: std::str::FromStr, B: std::str::FromStr>(s: &str) -> Option<Vec<(A, B)>> {
    if s.is_empty() {
        return Some(Vec::new());
    }
    s.split(',')
        .map(|p| {
            let (a, b) = p.split_once(':')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .collect()
}

impl HomeRecord {
    /// Where a held order waits in its home's `pend` from its commit on: at
    /// its `pay_by`, not its start, so that the sweeper's listing of orders
    /// pending or refused since its bound (the earliest entries) is not
    /// filled with open holds, and the holds' own listing finds the due ones
    /// first. `None` for any other record.
    pub fn held_listed_at(&self) -> Option<i64> {
        match self {
            Self::Held(_, pay_by, _) => Some(*pay_by),
            _ => None,
        }
    }
    /// `P|oid|user|at|lines`, `B|…`, `R|oid|user|at|lines|shorts`, `X|…`,
    /// `L|units|limit`, `H|oid|user|at|lines|pay_by|state` (lines
    /// `pool:qty,…`, shorts `pool:remaining,…`, state a [`HoldState`] code).
    pub fn encode(&self) -> String {
        let head = |tag: &str, h: &OrderHead| {
            format!(
                "{tag}|{}|{}|{}|{}",
                h.order_id,
                h.user,
                h.at_ms,
                encode_lines(&h.lines)
            )
        };
        match self {
            Self::Pending(h) => head("P", h),
            Self::Bought(h) => head("B", h),
            Self::Refused(h, s) => format!("{}|{}", head("R", h), encode_shorts(s)),
            Self::Released(h, s) => format!("{}|{}", head("X", h), encode_shorts(s)),
            Self::Limit { units, limit } => format!("L|{units}|{limit}"),
            Self::Held(h, pay_by, state) => {
                format!("{}|{pay_by}|{}", head("H", h), state.code())
            }
        }
    }

    pub fn decode(s: &str) -> Option<Self> {
        let mut parts = s.split('|');
        let tag = parts.next()?;
        if tag == "L" {
            return Some(Self::Limit {
                units: parts.next()?.parse().ok()?,
                limit: parts.next()?.parse().ok()?,
            });
        }
        let head = OrderHead {
            order_id: OrderId::from_stored(parts.next()?),
            user: UserId::parse(parts.next()?).ok()?,
            at_ms: parts.next()?.parse().ok()?,
            lines: pairs(parts.next()?)?
                .into_iter()
                .map(|(pool, qty)| Line { pool, qty })
                .collect(),
        };
        let shorts = |p: Option<&str>| -> Option<Vec<Short>> {
            Some(
                pairs(p?)?
                    .into_iter()
                    .map(|(pool, remaining)| Short { pool, remaining })
                    .collect(),
            )
        };
        match tag {
            "P" => Some(Self::Pending(head)),
            "B" => Some(Self::Bought(head)),
            "R" => Some(Self::Refused(head, shorts(parts.next())?)),
            "X" => Some(Self::Released(head, shorts(parts.next())?)),
            "H" => Some(Self::Held(
                head,
                parts.next()?.parse().ok()?,
                HoldState::parse(parts.next()?)?,
            )),
            _ => None,
        }
    }

    /// The order, unless the record is a limit refusal.
    pub fn head(&self) -> Option<&OrderHead> {
        match self {
            Self::Pending(h)
            | Self::Bought(h)
            | Self::Refused(h, _)
            | Self::Released(h, _)
            | Self::Held(h, ..) => Some(h),
            Self::Limit { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_id_has_no_dot_and_fits_a_pools_event_id() {
        assert!(release_id("air-max_1").is_ok());
        let dot = release_id("air.max").unwrap_err();
        assert!(dot.contains("no '.'"), "{dot}");
        assert!(release_id("a".repeat(MAX_RELEASE_ID)).is_ok());
        assert!(release_id("a".repeat(MAX_RELEASE_ID + 1)).is_err());
        // Pools may have dots: the release is named before the first one.
        assert!(pool_id("size.42").is_ok());
        assert!(pool_id("p".repeat(MAX_POOL_ID + 1)).is_err());
        let longest = format!("{}.{}", "r".repeat(MAX_RELEASE_ID), "p".repeat(MAX_POOL_ID));
        assert!(
            EventId::parse(longest).is_ok(),
            "the longest pool event is an event id"
        );
    }

    fn head() -> OrderHead {
        OrderHead {
            order_id: OrderId::from_stored("r1.00000000000000aa.00000000000000bb"),
            user: UserId::parse("u-1@x").unwrap(),
            at_ms: 17,
            lines: vec![Line { pool: 0, qty: 2 }, Line { pool: 3, qty: 1 }],
        }
    }

    #[test]
    fn a_release_with_holds_has_fixed_bucket_counts() {
        let mut spec = ReleaseSpec {
            id: EventId::parse("r").unwrap(),
            pools: vec![PoolSpec {
                name: EventId::parse("a").unwrap(),
                stock: 10,
                buckets: 2,
                auto_buckets: None,
            }],
            per_user_limit: None,
            max_per_order: 2,
            starts_at: None,
            ends_at: None,
            hold_seconds: Some(60),
            homes: 4,
        };
        assert_eq!(spec.validate(), Ok(()));
        assert_eq!(spec.pay_by(1_000), Some(61_000));
        spec.pools[0].auto_buckets = Some(BucketRange { min: 1, max: 8 });
        assert!(matches!(
            spec.validate(),
            Err(ReleaseError::HeldAutoBuckets(_))
        ));
        spec.hold_seconds = Some(0);
        spec.pools[0].auto_buckets = None;
        assert!(matches!(spec.validate(), Err(ReleaseError::Pool { .. })));
    }

    #[test]
    fn every_home_record_decodes_to_itself() {
        for rec in [
            HomeRecord::Pending(head()),
            HomeRecord::Bought(head()),
            HomeRecord::Refused(head(), vec![]),
            HomeRecord::Refused(
                head(),
                vec![Short {
                    pool: 3,
                    remaining: 0,
                }],
            ),
            HomeRecord::Released(
                head(),
                vec![Short {
                    pool: 0,
                    remaining: 1,
                }],
            ),
            HomeRecord::Limit { units: 3, limit: 2 },
            HomeRecord::Held(head(), 60_017, HoldState::Open),
            HomeRecord::Held(head(), 60_017, HoldState::Expiring),
            HomeRecord::Held(head(), 60_017, HoldState::Confirmed),
        ] {
            assert_eq!(HomeRecord::decode(&rec.encode()), Some(rec));
        }
        assert_eq!(head().units(), 3);
    }

    #[test]
    fn a_line_is_an_order_of_its_pool_with_the_release_orders_tail() {
        let release = EventId::parse("drop").unwrap();
        let pool = EventId::parse("drop.42").unwrap();
        let order = OrderId::generate(&release, 0xab);
        let line = line_order_id(&order, &release, &pool);
        let (_, event, hash) = OrderId::parse(line.as_str()).unwrap();
        assert_eq!(event, pool);
        assert_eq!(hash, 0xab);
        assert!(line.as_str().ends_with(&order.as_str()["drop".len()..]));
    }
}
