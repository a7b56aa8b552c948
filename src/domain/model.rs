//! The domain's orders and purchase records (and, re-exported from
//! [`super::event`], events and their stored meta).
//!
//! These types are shared by the engine and every store backend. The compact
//! `|`-separated encodings of [`RequestRecord`] and [`OrderEntry`] are what the Lua
//! scripts write into Redis (the Redis store builds them with `encode`, never by
//! hand); the memory backend keeps the same values decoded. The order stream's
//! entries are in [`crate::domain::stream`].

use serde::Serialize;

use crate::domain::ids::{EventId, OrderId, UserId};

pub use super::event::*;

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

    /// The two refusals' encodings with each number left as `%s`: the
    /// format a script fills with `string.format` where a number is one only
    /// it knows (purchase.lua: the user's units held when over the limit, the
    /// units left when sold out). Made from [`RequestRecord::encode`] itself,
    /// so a change of either format reaches the script with no copy to find.
    pub(crate) fn refusal_formats() -> &'static RefusalFormats {
        static FORMATS: std::sync::LazyLock<RefusalFormats> = std::sync::LazyLock::new(|| {
            // Numbers no field prints otherwise, each replaced by `%s`.
            let (a, b, c) = (3_000_000_001u32, 3_000_000_002u32, 3_000_000_003u64);
            let format = |r: RequestRecord, numbers: &[String]| {
                numbers
                    .iter()
                    .fold(r.encode(), |s, n| s.replacen(n.as_str(), "%s", 1))
            };
            RefusalFormats {
                limit_exceeded: format(
                    RequestRecord::LimitExceeded {
                        qty: a,
                        limit: b,
                        held: c,
                    },
                    &[a.to_string(), b.to_string(), c.to_string()],
                ),
                sold_out: format(
                    RequestRecord::SoldOut {
                        qty: a,
                        remaining: c,
                    },
                    &[a.to_string(), c.to_string()],
                ),
            }
        });
        &FORMATS
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

/// [`RequestRecord::refusal_formats`]: what purchase.lua is handed to store a
/// refusal's record.
#[derive(Debug)]
pub(crate) struct RefusalFormats {
    /// `LimitExceeded`'s, filled with the quantity, the limit and the units held.
    pub limit_exceeded: String,
    /// `SoldOut`'s, filled with the quantity and the units left.
    pub sold_out: String,
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
        char::from(self.tag().as_bytes()[0])
    }

    /// The state as the first field of an entry. A script that changes an
    /// order's state (cancel, confirm, expiry) is handed the new one and puts
    /// it in place of the stored entry's first field; the rest it copies.
    pub(crate) fn tag(self) -> &'static str {
        match self {
            Self::Confirmed => "C",
            Self::Cancelled => "X",
            Self::Held => "H",
            Self::Expired => "E",
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
    /// A line of a release order (its event a release's pool), read from the
    /// ledger: the release order's id, which every line of the order shares.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release_order: Option<OrderId>,
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
            // A line has no index entry: only the ledger shows one.
            release_order: None,
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

    /// A format filled as Lua's `string.format` fills `%s`, one value each.
    fn fill(format: &str, values: &[u64]) -> String {
        assert_eq!(format.matches("%s").count(), values.len(), "{format}");
        assert!(!format.replace("%s", "").contains('%'), "{format}");
        values.iter().fold(format.to_owned(), |s, v| {
            s.replacen("%s", &v.to_string(), 1)
        })
    }

    #[test]
    fn the_refusal_formats_filled_are_the_records_encode_writes() {
        let f = RequestRecord::refusal_formats();
        assert_eq!(f.limit_exceeded, "L|%s|%s|%s");
        assert_eq!(f.sold_out, "S|%s|%s");
        for (qty, limit, held) in [(1, 1, 0), (3, 2, 1), (40, u32::MAX, u64::from(u32::MAX))] {
            let r = RequestRecord::LimitExceeded { qty, limit, held };
            let stored = fill(&f.limit_exceeded, &[qty.into(), limit.into(), held]);
            assert_eq!(stored, r.encode());
            assert_eq!(RequestRecord::decode(&stored), Some(r));
        }
        for (qty, remaining) in [(1, 0), (5, 4), (u32::MAX, u64::MAX)] {
            let r = RequestRecord::SoldOut { qty, remaining };
            let stored = fill(&f.sold_out, &[qty.into(), remaining]);
            assert_eq!(stored, r.encode());
            assert_eq!(RequestRecord::decode(&stored), Some(r));
        }
    }

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
            tokens: None,
            draw: None,
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
