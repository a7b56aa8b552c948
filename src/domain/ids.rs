//! Validated identifiers: everything that ends up inside a Redis key or a URL.
//!
//! An id is checked once, where it enters the system, and then travels as a
//! newtype so no unchecked string can reach key building. The charsets exclude
//! `{` and `}` (a brace in an id would silently move a key to another Cluster
//! slot), `|` (the field separator of stored records) and `:` in request ids
//! (the separator of probe markers).
//!
//! An id holds an `Arc<str>`: a purchase clones its event, user and order ids
//! several times on its way (into the saga, the batch entry, the order), and
//! a clone is a reference count, not an allocation and a copy.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LazyLock};

use serde::{Deserialize, Serialize};

/// Why an id was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("{field} must not be empty")]
    Empty { field: &'static str },
    #[error("{field} is longer than {max} characters")]
    TooLong { field: &'static str, max: usize },
    #[error("{field} may only contain {allowed}")]
    Charset {
        field: &'static str,
        allowed: &'static str,
    },
    /// `.` and `..` are path segments every URL library normalizes away: an
    /// event so named could never be addressed.
    #[error("{field} must not be made of dots only")]
    DotSegment { field: &'static str },
}

fn check(
    value: &str,
    field: &'static str,
    max: usize,
    allowed: &'static str,
    ok: fn(u8) -> bool,
) -> Result<(), IdError> {
    if value.is_empty() {
        return Err(IdError::Empty { field });
    }
    if value.len() > max {
        return Err(IdError::TooLong { field, max });
    }
    if !value.bytes().all(ok) {
        return Err(IdError::Charset { field, allowed });
    }
    Ok(())
}

/// Event ids are URL path segments: refuse the ones clients normalize away.
fn path_segment(value: &str, field: &'static str) -> Result<(), IdError> {
    if value.bytes().all(|b| b == b'.') {
        return Err(IdError::DotSegment { field });
    }
    Ok(())
}

fn no_more(_: &str, _: &'static str) -> Result<(), IdError> {
    Ok(())
}

fn event_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-')
}

fn user_byte(b: u8) -> bool {
    event_byte(b) || matches!(b, b':' | b'@')
}

/// The OpenAPI schema of an id: a string with its charset as a pattern.
fn id_schema(
    pattern: &str,
    max: usize,
    description: &str,
) -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .pattern(Some(pattern))
        .min_length(Some(1))
        .max_length(Some(max))
        .description(Some(description))
        .into()
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $field:literal, $max:expr, $allowed:literal, $pattern:literal, $ok:expr, $more:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
        #[serde(transparent)]
        pub struct $name(Arc<str>);

        impl $name {
            /// The longest id accepted.
            pub const MAX_LEN: usize = $max;

            /// Validates `value` and wraps it.
            pub fn parse(value: impl Into<String>) -> Result<Self, IdError> {
                let value = value.into();
                check(&value, $field, $max, $allowed, $ok)?;
                $more(&value, $field)?;
                Ok(Self(value.into()))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let raw = String::deserialize(d)?;
                Self::parse(raw).map_err(serde::de::Error::custom)
            }
        }

        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                id_schema($pattern, $max, $allowed)
            }
        }

        impl utoipa::ToSchema for $name {}
    };
}

id_type!(
    /// An event (one product on sale): `[A-Za-z0-9_.-]{1,64}`, not only dots.
    EventId, "event id", 64, "letters, digits, '_', '.' and '-'",
    "^[A-Za-z0-9_.-]*[A-Za-z0-9_-][A-Za-z0-9_.-]*$", event_byte, path_segment
);
id_type!(
    /// A buyer: `[A-Za-z0-9_.:@-]{1,128}`.
    UserId, "user_id", 128, "letters, digits, '_', '.', '-', ':' and '@'",
    "^[A-Za-z0-9_.:@-]+$", user_byte, no_more
);
id_type!(
    /// A client's idempotency key: `[A-Za-z0-9_.-]{1,128}` (UUIDs fit).
    RequestId, "request_id", 128, "letters, digits, '_', '.' and '-'",
    "^[A-Za-z0-9_.-]+$", event_byte, no_more
);

/// Appends `value` as 16 lowercase hex digits: `{:016x}` without the
/// formatting machinery, for ids made on every purchase (`OrderId::generate`'s
/// `format!` was 1.2% of the Redis-backed service's `perf` samples).
pub(crate) fn push_hex16(s: &mut String, value: u64) {
    s.push_str(std::str::from_utf8(&hex16(value)).expect("hex digits are ASCII"));
}

/// `value` as 16 lowercase hex digits.
fn hex16(value: u64) -> [u8; 16] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    std::array::from_fn(|i| DIGITS[(value >> ((15 - i) * 4)) as usize & 0xf])
}

/// An order: `<event>.<user hash, 16 hex>.<8 random hex><8 hex of a sequence>`.
///
/// The user's routing hash is part of the id so the order's home bucket
/// (where its cancel and its index entry live) can be found under any bucket
/// count, including after a reshard, without knowing the user.
///
/// The last 8 hex digits count this process's orders (from a random start,
/// wrapping): SQLite's ledger indexes an order by them (migration 0007), and
/// a rising key lands a flushed batch on a few neighbouring pages of that
/// index where random ones touched most of its pages, each written to the
/// WAL again at every commit (BENCHMARKS.md, "Order ids that rise"). Ids stay
/// unique: two orders share an id only with the same user hash, the same
/// 32 random bits and the same sequence number.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct OrderId(Arc<str>);

impl OrderId {
    /// Builds a fresh order id for a purchase by a user with routing hash `user_hash`.
    pub fn generate(event: &EventId, user_hash: u64) -> Self {
        // Built on the stack: the id's one allocation is its `Arc`.
        let mut id = [0u8; EventId::MAX_LEN + 34];
        let e = event.as_str().len();
        id[..e].copy_from_slice(event.as_str().as_bytes());
        id[e] = b'.';
        id[e + 1..e + 17].copy_from_slice(&hex16(user_hash));
        id[e + 17] = b'.';
        let tail = u64::from(rand::random::<u32>()) << 32 | u64::from(next_in_sequence());
        id[e + 18..e + 34].copy_from_slice(&hex16(tail));
        Self(Arc::from(
            std::str::from_utf8(&id[..e + 34]).expect("ids are ASCII"),
        ))
    }

    /// Parses an order id from a client, returning it with its event and user hash.
    pub fn parse(value: &str) -> Result<(Self, EventId, u64), IdError> {
        const FIELD: &str = "order id";
        const ALLOWED: &str = "'<event>.<16 hex>.<16 hex>'";
        let bad = || IdError::Charset {
            field: FIELD,
            allowed: ALLOWED,
        };
        if value.len() > EventId::MAX_LEN + 34 {
            return Err(IdError::TooLong {
                field: FIELD,
                max: EventId::MAX_LEN + 34,
            });
        }
        let mut parts = value.rsplitn(3, '.');
        let (Some(random), Some(hash), Some(event)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let hex16 = |s: &str| s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit());
        if !hex16(random) || !hex16(hash) {
            return Err(bad());
        }
        let event = EventId::parse(event).map_err(|_| bad())?;
        let hash = u64::from_str_radix(hash, 16).map_err(|_| bad())?;
        Ok((Self(value.into()), event, hash))
    }

    /// Wraps an id read back from a store (already validated when written).
    pub fn from_stored(value: &str) -> Self {
        Self(value.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// This process's next order number: a 32-bit counter from a random start
/// (so instances, and one instance's runs, count in different places).
fn next_in_sequence() -> u32 {
    static NEXT: LazyLock<AtomicU32> = LazyLock::new(|| AtomicU32::new(rand::random()));
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl utoipa::PartialSchema for OrderId {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        id_schema(
            r"^[A-Za-z0-9_.-]+\.[0-9a-f]{16}\.[0-9a-f]{16}$",
            EventId::MAX_LEN + 34,
            "<event>.<the user's routing hash, 16 hex>.<8 random hex><8 hex of a sequence>",
        )
    }
}

impl utoipa::ToSchema for OrderId {}

impl fmt::Display for OrderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_brace_in_an_event_id_is_rejected() {
        assert!(matches!(
            EventId::parse("sneaker{42}"),
            Err(IdError::Charset { .. })
        ));
    }

    #[test]
    fn an_event_id_of_dots_only_is_rejected() {
        for dots in [".", "..", "..."] {
            assert!(
                matches!(EventId::parse(dots), Err(IdError::DotSegment { .. })),
                "{dots}"
            );
        }
        assert!(EventId::parse("sneaker.42").is_ok());
        assert!(EventId::parse(".hidden").is_ok());
    }

    #[test]
    fn ids_are_bounded() {
        assert!(EventId::parse("e".repeat(64)).is_ok());
        assert!(matches!(
            EventId::parse("e".repeat(65)),
            Err(IdError::TooLong { max: 64, .. })
        ));
        assert!(matches!(UserId::parse(""), Err(IdError::Empty { .. })));
        assert!(UserId::parse("alice@example.com").is_ok());
    }

    #[test]
    fn a_request_id_cannot_hold_a_record_or_marker_separator() {
        assert!(RequestId::parse("a|b").is_err());
        assert!(RequestId::parse("t:1").is_err());
        assert!(RequestId::parse("9f1c2b7e-0d4a-4c55-9e57-3f0b1c2d3e4f").is_ok());
    }

    #[test]
    fn an_order_id_round_trips_its_event_and_user_hash() {
        let event = EventId::parse("sneaker-4.2").unwrap();
        for v in [0, 1, 0xdead_beef, 0x0123_4567_89ab_cdef, u64::MAX] {
            let mut s = String::from("x");
            push_hex16(&mut s, v);
            assert_eq!(s, format!("x{v:016x}"));
        }
        let id = OrderId::generate(&event, 0xdead_beef);
        let (parsed, e, h) = OrderId::parse(id.as_str()).unwrap();
        assert_eq!(parsed, id);
        assert_eq!(e, event);
        assert_eq!(h, 0xdead_beef);
        assert!(id.as_str().starts_with("sneaker-4.2.00000000deadbeef."));
        // The last 8 digits count up (wrapping; other tests running at the
        // same time may take numbers in between), the 8 before them do not.
        let tail = |id: &OrderId| {
            let s = id.as_str();
            u32::from_str_radix(&s[s.len() - 8..], 16).unwrap()
        };
        let ids: Vec<OrderId> = (0..100).map(|_| OrderId::generate(&event, 1)).collect();
        for w in ids.windows(2) {
            assert!(
                (1..1000).contains(&tail(&w[1]).wrapping_sub(tail(&w[0]))),
                "{w:?}"
            );
        }
        let heads: std::collections::HashSet<&str> = ids
            .iter()
            .map(|id| &id.as_str()[id.as_str().len() - 16..id.as_str().len() - 8])
            .collect();
        assert!(heads.len() > 90, "the first 8 digits are random: {heads:?}");
        // The longest event id fits the id's buffer.
        let longest = EventId::parse("e".repeat(EventId::MAX_LEN)).unwrap();
        let (_, e, h) = OrderId::parse(OrderId::generate(&longest, u64::MAX).as_str()).unwrap();
        assert_eq!((e, h), (longest, u64::MAX));
    }

    #[test]
    fn a_malformed_order_id_is_rejected() {
        for bad in [
            "",
            "x",
            "ev.123.456",
            "ev.zzzzzzzzzzzzzzzz.0000000000000000",
        ] {
            assert!(OrderId::parse(bad).is_err(), "{bad}");
        }
    }
}
