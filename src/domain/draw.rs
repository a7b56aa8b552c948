//! The `draw` access mode: an entry window, a verifiable draw (commit and
//! reveal of a random seed), and each entrant's place after it.
//!
//! What is here is pure: the draw's settings as an event carries them
//! ([`DrawSpec`], in the meta), the seed and its published hash, which of
//! the fixed [`ENTRY_SHARDS`] holds a user's entry, the order of the draw
//! ([`order`]) and the record written once it is done ([`DrawDone`]). The
//! store keeps the entries and ranks (`store::draws`); the engine runs the
//! draw (`engine::draw`); a winner's token is the `token` mode's
//! ([`super::token::mint`]), so a draw event's purchase is a token purchase.
//!
//! The order (docs/API.md, "Draws"): entrants sorted by
//! `SHA-256(seed ‖ user_id)` ascending (lowercase hex, ties by user id);
//! the first [`DrawSpec::winners`] win, the rest wait in that order.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::ids::UserId;
use super::offer::{DEFAULT_OFFER_SECONDS, MAX_OFFER_SECONDS, MIN_OFFER_SECONDS};
use super::routing::user_hash;
use super::token::MAX_ALLOWANCE;

/// Shards a draw's entries are spread over, each under its own hash tag:
/// fixed, so a reshard of the buckets never moves an entry.
pub const ENTRY_SHARDS: u32 = 16;
/// Oversubscription bounds, in thousandths (1.0 to 10.0).
pub const MIN_OVERSUBSCRIPTION_MILLI: u32 = 1_000;
pub const MAX_OVERSUBSCRIPTION_MILLI: u32 = 10_000;
/// How long a winner's token is valid after the draw, in seconds.
pub const MIN_BUY_SECONDS: u32 = 60;
pub const MAX_BUY_SECONDS: u32 = 7 * 86_400;
pub const DEFAULT_BUY_SECONDS: u32 = 3_600;
/// Entrants one page of `GET /v1/events/{id}/entries` lists at most.
pub const MAX_ENTRIES_PAGE: usize = 10_000;
/// The seed's length, in bytes.
pub const SEED_LEN: usize = 32;

/// A draw event's settings, as its meta keeps them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrawSpec {
    /// Unix ms: entries are refused from then on; the draw may run.
    pub entries_until: i64,
    /// Unix ms: the leader draws then; `None`: only the admin call draws.
    pub draw_at: Option<i64>,
    /// Winners per unit of stock, in thousandths.
    pub oversubscription_milli: u32,
    /// Units a winner's token may buy.
    pub allowance: u32,
    /// A winner's token expires this long after the draw.
    pub buy_seconds: u32,
    /// A waiting user's offer is open this long.
    pub offer_seconds: u32,
    /// Lowercase hex SHA-256 of the seed: published before the draw.
    pub seed_hash: String,
}

/// Why a draw's settings were refused; each message starts with the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DrawSpecError {
    #[error("draw.draw_at: must not be before draw.entries_until")]
    DrawAt,
    #[error("draw.oversubscription: must be between 1.0 and 10.0, not {0}")]
    Oversubscription(f64),
    #[error("draw.allowance: must be between 1 and {MAX_ALLOWANCE}, not {0}")]
    Allowance(u32),
    #[error("draw.buy_seconds: must be between {MIN_BUY_SECONDS} and {MAX_BUY_SECONDS}, not {0}")]
    BuySeconds(u32),
    #[error(
        "draw.offer_seconds: must be between {MIN_OFFER_SECONDS} and {MAX_OFFER_SECONDS}, not {0}"
    )]
    OfferSeconds(u32),
}

impl DrawSpec {
    /// Checks the settings; `seed_hash` is filled by the commit.
    pub fn new(
        entries_until: i64,
        draw_at: Option<i64>,
        oversubscription: f64,
        allowance: u32,
        buy_seconds: u32,
        offer_seconds: u32,
    ) -> Result<Self, DrawSpecError> {
        if draw_at.is_some_and(|at| at < entries_until) {
            return Err(DrawSpecError::DrawAt);
        }
        if !(1.0..=10.0).contains(&oversubscription) {
            return Err(DrawSpecError::Oversubscription(oversubscription));
        }
        if !(1..=MAX_ALLOWANCE).contains(&allowance) {
            return Err(DrawSpecError::Allowance(allowance));
        }
        if !(MIN_BUY_SECONDS..=MAX_BUY_SECONDS).contains(&buy_seconds) {
            return Err(DrawSpecError::BuySeconds(buy_seconds));
        }
        if !(MIN_OFFER_SECONDS..=MAX_OFFER_SECONDS).contains(&offer_seconds) {
            return Err(DrawSpecError::OfferSeconds(offer_seconds));
        }
        Ok(Self {
            entries_until,
            draw_at,
            oversubscription_milli: (oversubscription * 1000.0).round() as u32,
            allowance,
            buy_seconds,
            offer_seconds,
            seed_hash: String::new(),
        })
    }

    /// Winners of a draw of `stock` units: `ceil(stock × oversubscription)`,
    /// in whole numbers (the oversubscription read to the thousandth), so
    /// 1,000 × 1.2 is 1,200 and never 1,201 by a float's rounding.
    pub fn winners(&self, stock: u64) -> u64 {
        let milli = u128::from(self.oversubscription_milli);
        (u128::from(stock) * milli).div_ceil(1000) as u64
    }

    /// `oversubscription` as the API shows it.
    pub fn oversubscription(&self) -> f64 {
        f64::from(self.oversubscription_milli) / 1000.0
    }

    /// The meta's `draw` field: `until|at|milli|allowance|buy|hash|offer`
    /// (a field written before offers were built has no `|offer`: the
    /// default).
    pub fn encode(&self) -> String {
        format!(
            "{}|{}|{}|{}|{}|{}|{}",
            self.entries_until,
            self.draw_at.map(|a| a.to_string()).unwrap_or_default(),
            self.oversubscription_milli,
            self.allowance,
            self.buy_seconds,
            self.seed_hash,
            self.offer_seconds
        )
    }

    pub fn decode(s: &str) -> Option<Self> {
        let mut p = s.split('|');
        let spec = Self {
            entries_until: p.next()?.parse().ok()?,
            draw_at: match p.next()? {
                "" => None,
                at => Some(at.parse().ok()?),
            },
            oversubscription_milli: p.next()?.parse().ok()?,
            allowance: p.next()?.parse().ok()?,
            buy_seconds: p.next()?.parse().ok()?,
            seed_hash: p.next()?.to_owned(),
            offer_seconds: match p.next() {
                None => DEFAULT_OFFER_SECONDS,
                Some(s) => s.parse().ok()?,
            },
        };
        p.next().is_none().then_some(spec)
    }

    /// The unix second a winner's token expires, for a draw at `drawn_at_ms`.
    pub fn token_expiry(&self, drawn_at_ms: i64) -> i64 {
        drawn_at_ms.div_euclid(1000) + i64::from(self.buy_seconds)
    }
}

/// A fresh seed, from the operating system's generator, in lowercase hex.
pub fn new_seed() -> String {
    use rand::TryRngCore;
    let mut seed = [0u8; SEED_LEN];
    rand::rngs::OsRng
        .try_fill_bytes(&mut seed)
        .expect("the operating system's random generator");
    hex::encode(seed)
}

/// The hash published before the draw: lowercase hex SHA-256 of the seed's
/// 32 bytes (`seed` is their hex). `None` for a seed that is not 32 bytes
/// of hex.
pub fn seed_hash(seed: &str) -> Option<String> {
    let bytes = hex::decode(seed).ok().filter(|b| b.len() == SEED_LEN)?;
    Some(hex::encode(Sha256::digest(&bytes)))
}

/// The shard of `user`'s entry: the user's routing hash modulo
/// [`ENTRY_SHARDS`].
pub fn entry_shard(user: &UserId) -> u32 {
    (user_hash(user) % u64::from(ENTRY_SHARDS)) as u32
}

/// A user's draw key: lowercase hex `SHA-256(seed bytes ‖ user id UTF-8)`.
pub fn draw_key(seed_bytes: &[u8], user: &UserId) -> String {
    let mut h = Sha256::new();
    h.update(seed_bytes);
    h.update(user.as_str().as_bytes());
    hex::encode(h.finalize())
}

/// The draw's order of `entrants` under `seed` (hex): by draw key, ties by
/// user id. Rank `i + 1` is the `i`-th of the answer. `None` for a bad seed.
pub fn order(seed: &str, entrants: Vec<UserId>) -> Option<Vec<UserId>> {
    let seed = hex::decode(seed).ok().filter(|b| b.len() == SEED_LEN)?;
    let mut keyed: Vec<(String, UserId)> = entrants
        .into_iter()
        .map(|u| (draw_key(&seed, &u), u))
        .collect();
    keyed.sort_unstable();
    Some(keyed.into_iter().map(|(_, u)| u).collect())
}

/// A draw's record once done, written once (compare-and-set):
/// `drawn_at_ms|entries|winners`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrawDone {
    pub drawn_at_ms: i64,
    pub entries: u64,
    pub winners: u64,
}

impl DrawDone {
    pub fn encode(&self) -> String {
        format!("{}|{}|{}", self.drawn_at_ms, self.entries, self.winners)
    }

    pub fn decode(s: &str) -> Option<Self> {
        let mut p = s.split('|');
        let done = Self {
            drawn_at_ms: p.next()?.parse().ok()?,
            entries: p.next()?.parse().ok()?,
            winners: p.next()?.parse().ok()?,
        };
        p.next().is_none().then_some(done)
    }
}

/// Where an entrant stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Entered; not drawn yet.
    Entered,
    Won,
    /// Waiting, at this position (1 first).
    Waiting(u64),
}

/// What became of a waiting user's place once the line reached it
/// (`engine::draw`'s entry status): offered, bought or passed on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OfferStanding {
    /// Not offered yet.
    Waiting,
    /// Offered: its token and deadline (unix ms).
    Offered { token: String, deadline_ms: i64 },
    /// Bought with the offer.
    Bought { order: String },
    /// Not bought in time: passed to the next user.
    Passed,
}

impl Standing {
    /// The standing of the entrant of rank `rank` (1-based) among `winners`.
    pub fn of(rank: u64, winners: u64) -> Self {
        if rank <= winners {
            Self::Won
        } else {
            Self::Waiting(rank - winners)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn winners_are_a_ceiling_in_whole_numbers() {
        let s = DrawSpec::new(0, None, 1.2, 1, 3600, 600).unwrap();
        assert_eq!(s.winners(1000), 1200);
        assert_eq!(s.winners(1), 2);
        assert_eq!(s.winners(0), 0);
        let one = DrawSpec::new(0, None, 1.0, 1, 3600, 600).unwrap();
        assert_eq!(one.winners(7), 7);
        let odd = DrawSpec::new(0, None, 1.333, 1, 3600, 600).unwrap();
        assert_eq!(odd.winners(3), 4);
    }

    #[test]
    fn each_bad_setting_names_its_field() {
        for (r, field) in [
            (
                DrawSpec::new(10, Some(9), 1.0, 1, 3600, 600),
                "draw.draw_at:",
            ),
            (
                DrawSpec::new(0, None, 0.99, 1, 3600, 600),
                "draw.oversubscription:",
            ),
            (
                DrawSpec::new(0, None, 10.01, 1, 3600, 600),
                "draw.oversubscription:",
            ),
            (
                DrawSpec::new(0, None, f64::NAN, 1, 3600, 600),
                "draw.oversubscription:",
            ),
            (DrawSpec::new(0, None, 1.0, 0, 3600, 600), "draw.allowance:"),
            (
                DrawSpec::new(0, None, 1.0, MAX_ALLOWANCE + 1, 3600, 600),
                "draw.allowance:",
            ),
            (DrawSpec::new(0, None, 1.0, 1, 59, 600), "draw.buy_seconds:"),
            (
                DrawSpec::new(0, None, 1.0, 1, MAX_BUY_SECONDS + 1, 600),
                "draw.buy_seconds:",
            ),
            (
                DrawSpec::new(0, None, 1.0, 1, 3600, MIN_OFFER_SECONDS - 1),
                "draw.offer_seconds:",
            ),
            (
                DrawSpec::new(0, None, 1.0, 1, 3600, MAX_OFFER_SECONDS + 1),
                "draw.offer_seconds:",
            ),
        ] {
            let e = r.unwrap_err().to_string();
            assert!(e.starts_with(field), "{e}");
        }
        assert!(
            DrawSpec::new(
                10,
                Some(10),
                10.0,
                MAX_ALLOWANCE,
                MAX_BUY_SECONDS,
                MAX_OFFER_SECONDS
            )
            .is_ok()
        );
    }

    #[test]
    fn a_spec_and_a_record_read_back_as_written() {
        let mut s = DrawSpec::new(1_000, Some(2_000), 1.5, 2, 600, 30).unwrap();
        s.seed_hash = seed_hash(&new_seed()).unwrap();
        assert_eq!(DrawSpec::decode(&s.encode()), Some(s.clone()));
        s.draw_at = None;
        assert_eq!(DrawSpec::decode(&s.encode()), Some(s.clone()));
        let before_offers = s.encode().rsplit_once('|').unwrap().0.to_owned();
        s.offer_seconds = DEFAULT_OFFER_SECONDS;
        assert_eq!(DrawSpec::decode(&before_offers), Some(s));
        let d = DrawDone {
            drawn_at_ms: 5,
            entries: 10,
            winners: 3,
        };
        assert_eq!(DrawDone::decode(&d.encode()), Some(d));
        assert_eq!(DrawDone::decode("1|2"), None);
    }

    #[test]
    fn the_order_is_sha256_of_seed_and_user() {
        let seed = "00".repeat(32);
        let users: Vec<UserId> = ["a", "b", "c", "d"]
            .iter()
            .map(|u| UserId::parse(*u).unwrap())
            .collect();
        let ordered = order(&seed, users.clone()).unwrap();
        let mut expected = users.clone();
        expected.sort_by_key(|u| {
            let mut bytes = vec![0u8; 32];
            bytes.extend_from_slice(u.as_str().as_bytes());
            hex::encode(Sha256::digest(&bytes))
        });
        assert_eq!(ordered, expected);
        // The published hash is of the seed's bytes, not its hex.
        assert_eq!(
            seed_hash(&seed).unwrap(),
            hex::encode(Sha256::digest([0u8; 32]))
        );
        assert_eq!(order("zz", users), None);
        assert_ne!(new_seed(), new_seed());
    }

    #[test]
    fn a_standing_is_won_or_a_waiting_position() {
        assert_eq!(Standing::of(1, 2), Standing::Won);
        assert_eq!(Standing::of(2, 2), Standing::Won);
        assert_eq!(Standing::of(3, 2), Standing::Waiting(1));
    }
}
