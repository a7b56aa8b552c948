//! The waiting list's offers (the `draw` access mode): the records a
//! bucket keeps of the units it sets aside for the line, the list's
//! assignment of a unit to a position, and the offer token a waiting user
//! buys with.
//!
//! As built (docs/DESIGN.md, "Fair drops", "As built (the waiting list)"),
//! a returned unit never leaves its bucket: once the draw opened the
//! bucket's waiting list, a hold that expires or an order that is
//! cancelled puts its units *aside* in the bucket (not back in its stock),
//! and each unit aside becomes a *ticket* there. The list's slot gives each
//! ticket the next position in line, once (the assignment is keyed by the
//! bucket and the ticket), and the bucket opens the offer with its
//! deadline; the offer is bought, or passed back aside at its deadline, by
//! one step on that bucket. A ticket's record, in the bucket's `wl` hash
//! under `t:<ticket>`:
//! - `r`: reserved for an offer, its position not yet given;
//! - `o|pos|user|deadline`: offered, open until `deadline` (unix ms);
//! - `p|pos|user|deadline`: passed at its deadline (its unit back aside);
//! - `t|pos|user|deadline|order`: taken, bought as `order`;
//! - `s`: nobody left in line: its unit went back on open sale.
//!
//! The offer token, `o1.<pos>.<deadline ms>.<mac>`, is an HMAC-SHA256 under
//! the event's first key over `o1\n<event>\n<user>\n<pos>\n<deadline>`:
//! five newline-joined fields where a purchase token's bytes have four, so
//! neither is ever the other (docs/API.md, "Draws").

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use super::ids::{EventId, UserId};
use super::keys::BucketRef;
use super::routing;
use super::token::base64url;

/// Offer validity bounds and default, in seconds (the `draw` object's
/// `offer_seconds`).
pub const MIN_OFFER_SECONDS: u32 = 10;
pub const MAX_OFFER_SECONDS: u32 = 86_400;
pub const DEFAULT_OFFER_SECONDS: u32 = 600;
/// Tickets one sweeper step handles in a bucket at most.
pub const OFFERS_PER_STEP: u32 = 256;
/// Waiting positions one write of the line carries at most.
pub const LINE_PER_CALL: usize = 1_000;

/// A ticket's record (module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ticket {
    Reserved,
    Open(Offer),
    Passed(Offer),
    Taken(Offer, String),
    ToSale,
}

/// An offer: its position in line, its user and its deadline (unix ms).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    pub position: u64,
    pub user: UserId,
    pub deadline_ms: i64,
}

impl Offer {
    fn fields(&self) -> String {
        format!("{}|{}|{}", self.position, self.user, self.deadline_ms)
    }
}

impl Ticket {
    /// The passed record's letter, put in place of an open record's first
    /// field (`pass_offers.lua`).
    pub const PASSED_TAG: &'static str = "p";

    pub fn encode(&self) -> String {
        match self {
            Self::Reserved => "r".to_owned(),
            Self::Open(o) => format!("o|{}", o.fields()),
            Self::Passed(o) => format!("p|{}", o.fields()),
            Self::Taken(o, order) => format!("t|{}|{order}", o.fields()),
            Self::ToSale => "s".to_owned(),
        }
    }

    pub fn decode(s: &str) -> Option<Self> {
        match s {
            "r" => return Some(Self::Reserved),
            "s" => return Some(Self::ToSale),
            _ => {}
        }
        let mut p = s.split('|');
        let tag = p.next()?;
        let offer = Offer {
            position: p.next()?.parse().ok()?,
            user: UserId::parse(p.next()?).ok()?,
            deadline_ms: p.next()?.parse().ok()?,
        };
        let ticket = match tag {
            "o" => Self::Open(offer),
            "p" => Self::Passed(offer),
            "t" => Self::Taken(offer, p.next()?.to_owned()),
            _ => return None,
        };
        p.next().is_none().then_some(ticket)
    }
}

/// The list's assignment key of `ticket` in `bucket` (`a:<bucket>:<ticket>`).
pub fn assignment_field(bucket: &BucketRef, ticket: u64) -> String {
    format!("a:{}:{ticket}", bucket.name())
}

/// The list's record of the offer at a position: `<bucket name>|<ticket>`.
pub fn placement(bucket: &BucketRef, ticket: u64) -> String {
    format!("{}|{ticket}", bucket.name())
}

/// Parses [`placement`] back.
pub fn parse_placement(s: &str) -> Option<(BucketRef, u64)> {
    let (bucket, ticket) = s.rsplit_once('|')?;
    Some((BucketRef::parse_name(bucket)?, ticket.parse().ok()?))
}

/// A user hash whose home, under `buckets`, is `bucket`: near the user's
/// own, so an order bought with an offer gets an id that routes to the
/// bucket holding its entry (its reads and its cancel find it there).
pub fn hash_homed_at(user: &UserId, bucket: u32, buckets: u32) -> u64 {
    let n = u64::from(buckets.max(1));
    let h = routing::user_hash(user);
    let base = h - h % n;
    base.checked_add(u64::from(bucket))
        .unwrap_or(base - n + u64::from(bucket))
}

/// Mints the offer token of position `position`, for `user`, until
/// `deadline_ms`.
pub fn mint_offer(
    key: &str,
    event: &EventId,
    user: &UserId,
    position: u64,
    deadline_ms: i64,
) -> String {
    format!(
        "o1.{position}.{deadline_ms}.{}",
        mac(key, event, user, position, deadline_ms)
    )
}

/// Why an offer token was refused (before any store read).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OfferTokenError {
    #[error("not an offer token")]
    Invalid,
    #[error("the offer's deadline has passed")]
    Expired,
}

/// Checks an offer token for `user` at `now_ms` under any of `keys`:
/// its position and deadline.
pub fn verify_offer(
    keys: &[String],
    event: &EventId,
    user: &UserId,
    token: &str,
    now_ms: i64,
) -> Result<(u64, i64), OfferTokenError> {
    let mut p = token.split('.');
    let (Some("o1"), Some(pos), Some(deadline), Some(sig), None) =
        (p.next(), p.next(), p.next(), p.next(), p.next())
    else {
        return Err(OfferTokenError::Invalid);
    };
    let (Ok(position), Ok(deadline_ms)) = (pos.parse::<u64>(), deadline.parse::<i64>()) else {
        return Err(OfferTokenError::Invalid);
    };
    if position.to_string() != pos || deadline_ms.to_string() != deadline {
        return Err(OfferTokenError::Invalid);
    }
    let signed = keys.iter().any(|k| {
        bool::from(
            mac(k, event, user, position, deadline_ms)
                .as_bytes()
                .ct_eq(sig.as_bytes()),
        )
    });
    if !signed {
        return Err(OfferTokenError::Invalid);
    }
    if now_ms >= deadline_ms {
        return Err(OfferTokenError::Expired);
    }
    Ok((position, deadline_ms))
}

fn mac(key: &str, event: &EventId, user: &UserId, position: u64, deadline_ms: i64) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key.as_bytes()).expect("any key length");
    mac.update(format!("o1\n{event}\n{user}\n{position}\n{deadline_ms}").as_bytes());
    base64url(&mac.finalize().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(s: &str) -> UserId {
        UserId::parse(s).unwrap()
    }

    #[test]
    fn every_ticket_record_reads_back() {
        let o = Offer {
            position: 7,
            user: user("u-1"),
            deadline_ms: 1_700_000_000_123,
        };
        for t in [
            Ticket::Reserved,
            Ticket::Open(o.clone()),
            Ticket::Passed(o.clone()),
            Ticket::Taken(o, "ev.0000000000000001.0000000000000002".into()),
            Ticket::ToSale,
        ] {
            assert_eq!(Ticket::decode(&t.encode()), Some(t));
        }
        assert_eq!(Ticket::decode("x|1|u|2"), None);
    }

    #[test]
    fn an_open_record_passes_by_its_first_letter() {
        let o = Offer {
            position: 1,
            user: user("u"),
            deadline_ms: 5,
        };
        let open = Ticket::Open(o.clone()).encode();
        let passed = format!("{}{}", Ticket::PASSED_TAG, &open[1..]);
        assert_eq!(Ticket::decode(&passed), Some(Ticket::Passed(o)));
    }

    #[test]
    fn an_offer_token_is_checked_for_its_user_event_and_deadline() {
        let e = EventId::parse("ev").unwrap();
        let keys = vec!["k".repeat(16)];
        let t = mint_offer(&keys[0], &e, &user("a"), 3, 10_000);
        assert_eq!(
            verify_offer(&keys, &e, &user("a"), &t, 9_999),
            Ok((3, 10_000))
        );
        assert_eq!(
            verify_offer(&keys, &e, &user("a"), &t, 10_000),
            Err(OfferTokenError::Expired)
        );
        assert_eq!(
            verify_offer(&keys, &e, &user("b"), &t, 0),
            Err(OfferTokenError::Invalid)
        );
        let other = EventId::parse("ev2").unwrap();
        assert_eq!(
            verify_offer(&keys, &other, &user("a"), &t, 0),
            Err(OfferTokenError::Invalid)
        );
        let bumped = t.replacen(".3.", ".4.", 1);
        assert_eq!(
            verify_offer(&keys, &e, &user("a"), &bumped, 0),
            Err(OfferTokenError::Invalid)
        );
        let purchase = crate::domain::token::mint(&keys[0], &e, "a", 1, 10);
        assert_eq!(
            verify_offer(&keys, &e, &user("a"), &purchase, 0),
            Err(OfferTokenError::Invalid)
        );
    }

    #[test]
    fn an_offer_order_routes_to_the_bucket_of_its_unit() {
        for b in 0..7 {
            let h = hash_homed_at(&user("someone"), b, 7);
            assert_eq!(routing::home(h, 7), b);
        }
    }

    #[test]
    fn a_placement_reads_back() {
        let b = BucketRef::new(&EventId::parse("ev").unwrap(), 2, 3);
        assert_eq!(parse_placement(&placement(&b, 9)), Some((b, 9)));
    }
}
