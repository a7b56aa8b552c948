//! Access tokens of the `token` access mode: an event's signing keys
//! (`TokenAccess`), the signed token a waiting room mints and its check
//! (`verify`), and what a purchase carries to its home step (`TokenUse`).
//!
//! A token is `v1.<user>.<allowance>.<expiry>.<mac>` (docs/API.md, "Access
//! tokens"): `mac` is HMAC-SHA256 under one of the event's keys over
//! `v1\n<event>\n<user>\n<allowance>\n<expiry>` (newline-joined: no id
//! holds one, where `.` would let event `a.b` and user `c` sign what event
//! `a` and user `b.c` do), in base64url without padding.
//! The check here needs no store: its signature (any active key: two while
//! one is rotated), its user (the request's own) and its expiry. What the
//! token has bought is the store's: a record at the user's home, keyed by the
//! token's id (`<user>.<allowance>.<expiry>`, the same whichever key signed
//! it, so a token signed twice under two keys shares one allowance), checked
//! and consumed in the step that takes (`lua/purchase.lua`, `lua/finish.lua`).

use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use super::ids::{EventId, UserId};

/// Keys an event holds at most: one, and a second while rotating.
pub const MAX_TOKEN_KEYS: usize = 2;
/// A key's length bounds, in characters (printable ASCII, no space).
pub const MIN_TOKEN_KEY_LEN: usize = 16;
pub const MAX_TOKEN_KEY_LEN: usize = 128;
/// A token's allowance bounds (units it may buy in all).
pub const MAX_ALLOWANCE: u32 = 1000;
/// The longest token accepted, in bytes (a user id is at most 128).
pub const MAX_TOKEN_LEN: usize = 256;
/// Users one admin mint (`POST /v1/events/{id}/tokens`) may name at most.
pub const MAX_MINT_USERS: usize = 10_000;
/// The latest expiry a minted token can carry, in unix milliseconds: a
/// token's expiry is unix seconds of at most 12 digits (`Parsed::parse`).
pub const MAX_EXPIRY_MS: u64 = 999_999_999_999_999;

/// An event's access mode, as its create takes it and its view shows it
/// (one type, so the published document names the same values in both):
/// `open`, anyone may buy; `token`, a purchase carries an access token
/// signed with one of the event's keys; `draw`, users enter a draw and its
/// winners buy with the tokens it gives them (a `token` purchase).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    #[default]
    Open,
    Token,
    Draw,
}

impl Access {
    /// The mode of an event of `spec`.
    pub fn of(spec: &crate::domain::event::EventSpec) -> Self {
        match (&spec.draw, &spec.tokens) {
            (Some(_), _) => Self::Draw,
            (None, Some(_)) => Self::Token,
            (None, None) => Self::Open,
        }
    }

    /// Its name, as the API and the ledger's `events.access` write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Token => "token",
            Self::Draw => "draw",
        }
    }

    /// The mode named `name` (`as_str`); `None` for any other name.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::Open, Self::Token, Self::Draw]
            .into_iter()
            .find(|a| a.as_str() == name)
    }
}

/// An event under the `token` access mode: the keys its tokens are signed
/// with (the first signs in tests and tools; any one verifies). Its
/// `Debug` names how many keys, never what they are (an event's meta is
/// printed in errors and logs).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenAccess {
    pub keys: Vec<String>,
}

impl std::fmt::Debug for TokenAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TokenAccess {{ keys: {} hidden }}", self.keys.len())
    }
}

impl TokenAccess {
    /// Checks the keys' count and shape; the error names what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.keys.is_empty() || self.keys.len() > MAX_TOKEN_KEYS {
            return Err(format!(
                "must hold 1 or {MAX_TOKEN_KEYS} keys (two while one is rotated)"
            ));
        }
        for k in &self.keys {
            if !(MIN_TOKEN_KEY_LEN..=MAX_TOKEN_KEY_LEN).contains(&k.len())
                || !k.bytes().all(|b| b.is_ascii_graphic())
            {
                return Err(format!(
                    "each key must be {MIN_TOKEN_KEY_LEN} to {MAX_TOKEN_KEY_LEN} printable \
                     ASCII characters without spaces"
                ));
            }
        }
        Ok(())
    }

    /// The keys as the Redis meta keeps them: space-separated (a key holds none).
    pub fn encode(&self) -> String {
        self.keys.join(" ")
    }

    pub(crate) fn decode(s: &str) -> Option<Self> {
        (!s.is_empty()).then(|| Self {
            keys: s.split(' ').map(str::to_owned).collect(),
        })
    }
}

/// Why a purchase's token was refused (each a problem type of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenRefusal {
    /// The event is under `token` and the purchase carried none.
    Missing,
    /// Malformed, or its signature is no active key's (forged, or an old key).
    Invalid,
    /// Signed for another user than the request's.
    OtherUser,
    /// Past its expiry.
    Expired,
    /// Its allowance is spent (bought, or reserved by a saga in flight).
    Used,
}

impl TokenRefusal {
    /// The code `purchase.lua` answers with (`"K"`, code).
    pub fn code(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Invalid => "invalid",
            Self::OtherUser => "other_user",
            Self::Expired => "expired",
            Self::Used => "used",
        }
    }

    /// The `outcome` label of `shardstock_token_checks_total`.
    pub fn outcome(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Invalid => "invalid",
            Self::OtherUser => "not_yours",
            Self::Expired => "expired",
            Self::Used => "used",
        }
    }

    pub fn from_code(s: &str) -> Option<Self> {
        Some(match s {
            "missing" => Self::Missing,
            "invalid" => Self::Invalid,
            "other_user" => Self::OtherUser,
            "expired" => Self::Expired,
            "used" => Self::Used,
            _ => return None,
        })
    }
}

/// What a purchase of a `token` event carries to its home step: the
/// token's id and allowance once its signature, user and expiry passed, or
/// the refusal the script answers unless the request id has a record (a
/// replay answers its original order without checking the token again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenUse {
    Valid { id: String, allowance: u32 },
    Refused(TokenRefusal),
}

/// Checks `token` for a purchase by `user` of `event` at `now_ms`: no
/// store read. `None` (no token) is refused as missing.
pub fn verify(
    access: &TokenAccess,
    event: &EventId,
    user: &UserId,
    token: Option<&str>,
    now_ms: i64,
) -> TokenUse {
    let Some(token) = token else {
        return TokenUse::Refused(TokenRefusal::Missing);
    };
    let Some(t) = Parsed::parse(token) else {
        return TokenUse::Refused(TokenRefusal::Invalid);
    };
    let signed = access.keys.iter().any(|k| {
        bool::from(
            mac_b64(k, event, t.user, t.allowance, t.expiry)
                .as_bytes()
                .ct_eq(t.mac.as_bytes()),
        )
    });
    if !signed {
        return TokenUse::Refused(TokenRefusal::Invalid);
    }
    if t.user != user.as_str() {
        return TokenUse::Refused(TokenRefusal::OtherUser);
    }
    if now_ms >= t.expiry.saturating_mul(1000) {
        return TokenUse::Refused(TokenRefusal::Expired);
    }
    TokenUse::Valid {
        id: format!("{}.{}.{}", t.user, t.allowance, t.expiry),
        allowance: t.allowance,
    }
}

/// The user a token id names (`<user>.<allowance>.<expiry>`): where its
/// record lives (a reshard moves it with the user).
pub fn token_user(id: &str) -> Option<UserId> {
    let mut parts = id.rsplitn(3, '.');
    let (_expiry, _allowance) = (parts.next()?, parts.next()?);
    UserId::parse(parts.next()?).ok()
}

/// Mints a token under `key`: an admin's presale codes ([`Grant`]), tests
/// and tools (a waiting room mints its own, with the same bytes).
pub fn mint(key: &str, event: &EventId, user: &str, allowance: u32, expiry_unix: i64) -> String {
    format!(
        "v1.{user}.{allowance}.{expiry_unix}.{}",
        mac_b64(key, event, user, allowance, expiry_unix)
    )
}

/// Tokens an admin asks minted (`POST /v1/events/{id}/tokens`, presale
/// codes): one per user, each with the same allowance and expiry. Checked
/// whole before anything is signed; nothing is stored (a token is
/// stateless until a purchase consumes it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    users: Vec<UserId>,
    allowance: u32,
    /// Unix seconds, as the token carries it.
    expiry_unix: i64,
}

/// Why a [`Grant`] was refused; each message starts with the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    #[error("users: must hold 1 to {MAX_MINT_USERS} user ids, not {0}")]
    Users(usize),
    #[error("allowance: must be between 1 and {MAX_ALLOWANCE}, not {0}")]
    Allowance(u32),
    #[error(
        "expires_at_ms: at most {MAX_EXPIRY_MS} (a token's expiry is unix seconds of at most \
         12 digits), not {0}"
    )]
    TooLate(u64),
    /// A token carries whole seconds: `expires_at_ms` rounded down must
    /// still be after now, or the token is refused from the start.
    #[error(
        "expires_at_ms: must be in the future: {ms} is unix second {expiry_unix} (a token \
         carries whole seconds, rounded down), and it is {now_ms} now"
    )]
    Past {
        ms: u64,
        expiry_unix: i64,
        now_ms: i64,
    },
    #[error("access: event {0} is open; tokens are minted for events whose access is token")]
    Open(EventId),
}

impl Grant {
    /// Checks the request's bounds at `now_ms`: 1 to [`MAX_MINT_USERS`]
    /// users, an allowance of 1 to [`MAX_ALLOWANCE`], an expiry (unix ms,
    /// rounded down to the second) after now and at most [`MAX_EXPIRY_MS`].
    pub fn new(
        users: Vec<UserId>,
        allowance: u32,
        expires_at_ms: u64,
        now_ms: i64,
    ) -> Result<Self, GrantError> {
        if !(1..=MAX_MINT_USERS).contains(&users.len()) {
            return Err(GrantError::Users(users.len()));
        }
        if !(1..=MAX_ALLOWANCE).contains(&allowance) {
            return Err(GrantError::Allowance(allowance));
        }
        if expires_at_ms > MAX_EXPIRY_MS {
            return Err(GrantError::TooLate(expires_at_ms));
        }
        let expiry_unix = (expires_at_ms / 1000) as i64;
        // As `verify` reads it: refused from `expiry * 1000` on.
        if now_ms >= expiry_unix * 1000 {
            return Err(GrantError::Past {
                ms: expires_at_ms,
                expiry_unix,
                now_ms,
            });
        }
        Ok(Self {
            users,
            allowance,
            expiry_unix,
        })
    }

    /// Each user's token, in the request's order, signed with the event's
    /// first key (a second one is the rotation's: either verifies). An
    /// event without keys is `open`: refused.
    pub fn mint(
        self,
        access: Option<&TokenAccess>,
        event: &EventId,
    ) -> Result<Vec<(UserId, String)>, GrantError> {
        let key = access
            .and_then(|a| a.keys.first())
            .ok_or_else(|| GrantError::Open(event.clone()))?;
        Ok(self
            .users
            .into_iter()
            .map(|u| {
                let token = mint(key, event, u.as_str(), self.allowance, self.expiry_unix);
                (u, token)
            })
            .collect())
    }
}

struct Parsed<'a> {
    user: &'a str,
    allowance: u32,
    expiry: i64,
    mac: &'a str,
}

impl<'a> Parsed<'a> {
    /// From the right: a user id may hold a `.`, the other parts do not.
    fn parse(token: &'a str) -> Option<Self> {
        if token.len() > MAX_TOKEN_LEN {
            return None;
        }
        let mut parts = token.rsplitn(4, '.');
        let mac = parts.next()?;
        let expiry = parts.next()?;
        let allowance = parts.next()?;
        let user = parts.next()?.strip_prefix("v1.")?;
        // One spelling a number: no leading zero (`01` would verify with
        // the MAC of `1`).
        let digits = |s: &str| {
            !s.is_empty()
                && s.len() <= 12
                && s.bytes().all(|b| b.is_ascii_digit())
                && (s == "0" || !s.starts_with('0'))
        };
        if !digits(allowance) || !digits(expiry) || UserId::parse(user).is_err() {
            return None;
        }
        let allowance: u32 = allowance.parse().ok()?;
        if !(1..=MAX_ALLOWANCE).contains(&allowance) {
            return None;
        }
        Some(Self {
            user,
            allowance,
            expiry: expiry.parse().ok()?,
            mac,
        })
    }
}

fn mac_b64(key: &str, event: &EventId, user: &str, allowance: u32, expiry: i64) -> String {
    use std::io::Write;
    let mut mac = keyed(key);
    // Newline-separated: no id holds one. With `.` (which event and user
    // ids may hold) event `a.b` and user `c` signed the bytes of event `a`
    // and user `b.c`: a token for one event bought at another. Fed in
    // pieces, the numbers formatted on the stack: nothing allocated.
    let mut numbers = [0u8; 40];
    let mut at = &mut numbers[..];
    write!(at, "\n{allowance}\n{expiry}").expect("two numbers fit in 40 bytes");
    let len = 40 - at.len();
    for part in [
        b"v1\n".as_slice(),
        event.as_str().as_bytes(),
        b"\n",
        user.as_bytes(),
    ] {
        mac.update(part);
    }
    mac.update(&numbers[..len]);
    base64url(&mac.finalize().into_bytes())
}

/// The HMAC state keyed with `key`, its two key blocks hashed once per
/// thread and cloned after (they are two of the five SHA-256 blocks a
/// token's check hashes). At most [`KEYED_CACHED`] keys are kept, the
/// oldest dropped first.
fn keyed(key: &str) -> Hmac<Sha256> {
    use std::cell::RefCell;
    thread_local! {
        static KEYED: RefCell<Vec<(Box<str>, Hmac<Sha256>)>> = const { RefCell::new(Vec::new()) };
    }
    KEYED.with_borrow_mut(|cache| {
        if let Some((_, mac)) = cache.iter().find(|(k, _)| **k == *key) {
            return mac.clone();
        }
        let mac = Hmac::<Sha256>::new_from_slice(key.as_bytes()).expect("any key length");
        if cache.len() == KEYED_CACHED {
            cache.remove(0);
        }
        cache.push((key.into(), mac.clone()));
        mac
    })
}

/// Keys whose HMAC state a thread keeps ([`keyed`]): two events' keys
/// while both rotate.
const KEYED_CACHED: usize = 4;

/// Base64url without padding (RFC 4648 §5).
pub(crate) fn base64url(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access() -> TokenAccess {
        TokenAccess {
            keys: vec!["old-key-0123456789".into(), "new-key-0123456789".into()],
        }
    }

    #[test]
    fn base64url_is_rfc_4648s() {
        assert_eq!(base64url(b""), "");
        assert_eq!(base64url(b"f"), "Zg");
        assert_eq!(base64url(b"fo"), "Zm8");
        assert_eq!(base64url(b"foo"), "Zm9v");
        assert_eq!(base64url(b"foob"), "Zm9vYg");
        assert_eq!(base64url(&[0xfb, 0xff]), "-_8");
    }

    #[test]
    fn the_mac_is_hmac_sha256_over_the_documented_bytes() {
        // docs/API.md's example: key "0123456789abcdef", event "e1", user "u.1".
        let e = EventId::parse("e1").unwrap();
        let t = mint("0123456789abcdef", &e, "u.1", 2, 1_900_000_000);
        let mut m = Hmac::<Sha256>::new_from_slice(b"0123456789abcdef").unwrap();
        m.update(b"v1\ne1\nu.1\n2\n1900000000");
        assert_eq!(
            t,
            format!(
                "v1.u.1.2.1900000000.{}",
                base64url(&m.finalize().into_bytes())
            )
        );
        assert_eq!(
            t,
            "v1.u.1.2.1900000000.IhgKWA3fwKaB_C9PdD5vcYYQ1KNjSJ2hXlKGcpCOcQA"
        );
    }

    #[test]
    fn a_token_of_either_key_for_its_user_before_expiry_is_valid() {
        let e = EventId::parse("e1").unwrap();
        let u = UserId::parse("u.1").unwrap();
        for key in &access().keys {
            let t = mint(key, &e, "u.1", 2, 100);
            assert_eq!(
                verify(&access(), &e, &u, Some(&t), 99_999),
                TokenUse::Valid {
                    id: "u.1.2.100".into(),
                    allowance: 2
                }
            );
            assert_eq!(token_user("u.1.2.100"), Some(u.clone()));
            assert_eq!(
                verify(&access(), &e, &u, Some(&t), 100_000),
                TokenUse::Refused(TokenRefusal::Expired)
            );
        }
    }

    #[test]
    fn a_token_does_not_buy_at_an_event_whose_id_and_user_spell_the_same_dots() {
        // Event `air` and user `42.x` against event `air.42` and user `x`:
        // joined with `.` both read `air.42.x`.
        let key = &access().keys[0];
        let t = mint(key, &EventId::parse("air").unwrap(), "42.x", 1, 100);
        let mac = t.rsplit('.').next().unwrap();
        let moved = format!("v1.x.1.100.{mac}");
        let x = UserId::parse("x").unwrap();
        assert_eq!(
            verify(
                &access(),
                &EventId::parse("air.42").unwrap(),
                &x,
                Some(&moved),
                0
            ),
            TokenUse::Refused(TokenRefusal::Invalid)
        );
    }

    #[test]
    fn a_number_has_one_spelling() {
        let e = EventId::parse("e1").unwrap();
        let u = UserId::parse("u1").unwrap();
        let t = mint(&access().keys[0], &e, "u1", 1, 100);
        let zero = t.replacen("v1.u1.1.", "v1.u1.01.", 1);
        assert_eq!(
            verify(&access(), &e, &u, Some(&zero), 0),
            TokenUse::Refused(TokenRefusal::Invalid)
        );
    }

    #[test]
    fn forged_foreign_and_missing_tokens_are_refused() {
        let e = EventId::parse("e1").unwrap();
        let u = UserId::parse("u1").unwrap();
        let refused = |t: Option<&str>| verify(&access(), &e, &u, t, 0);
        assert_eq!(refused(None), TokenUse::Refused(TokenRefusal::Missing));
        let forged = mint("not-a-key-of-this-event", &e, "u1", 1, 100);
        assert_eq!(
            refused(Some(&forged)),
            TokenUse::Refused(TokenRefusal::Invalid)
        );
        let other_event = mint(
            &access().keys[0],
            &EventId::parse("e2").unwrap(),
            "u1",
            1,
            100,
        );
        assert_eq!(
            refused(Some(&other_event)),
            TokenUse::Refused(TokenRefusal::Invalid)
        );
        let good = mint(&access().keys[0], &e, "u1", 1, 100);
        let raised = good.replacen("v1.u1.1.", "v1.u1.9.", 1);
        assert_eq!(
            refused(Some(&raised)),
            TokenUse::Refused(TokenRefusal::Invalid)
        );
        let theirs = mint(&access().keys[0], &e, "u2", 1, 100);
        assert_eq!(
            refused(Some(&theirs)),
            TokenUse::Refused(TokenRefusal::OtherUser)
        );
        for junk in [
            "",
            "v1",
            "v2.u1.1.100.x",
            "v1.u1.0.100.x",
            "v1.u1.1.-5.x",
            "v1..1.100.x",
        ] {
            assert_eq!(
                refused(Some(junk)),
                TokenUse::Refused(TokenRefusal::Invalid),
                "{junk}"
            );
        }
    }

    #[test]
    fn the_keys_are_never_printed() {
        let shown = format!("{:?}", access());
        assert!(!shown.contains("key-0123"), "{shown}");
    }

    #[test]
    fn keys_are_bounded() {
        let ok = TokenAccess {
            keys: vec!["k".repeat(16)],
        };
        assert!(ok.validate().is_ok());
        assert_eq!(TokenAccess::decode(&access().encode()), Some(access()));
        for bad in [
            vec![],
            vec!["short".into()],
            vec!["k".repeat(16); 3],
            vec!["a key with spaces".into()],
        ] {
            assert!(TokenAccess { keys: bad }.validate().is_err());
        }
    }

    #[test]
    fn a_grant_mints_each_user_a_token_under_the_first_key() {
        let e = EventId::parse("e1").unwrap();
        let users = vec![UserId::parse("u.1").unwrap(), UserId::parse("u2").unwrap()];
        // 100,999 ms is second 100: valid before 100,000 ms, as `verify` reads it.
        let grant = Grant::new(users.clone(), 2, 100_999, 99_999).unwrap();
        let minted = grant.mint(Some(&access()), &e).unwrap();
        assert_eq!(minted.len(), 2);
        for ((user, token), u) in minted.iter().zip(&users) {
            assert_eq!(user, u);
            assert_eq!(*token, mint(&access().keys[0], &e, u.as_str(), 2, 100));
            assert_eq!(
                verify(&access(), &e, u, Some(token), 99_999),
                TokenUse::Valid {
                    id: format!("{u}.2.100"),
                    allowance: 2
                }
            );
        }
    }

    #[test]
    fn a_grant_is_bounded_and_names_the_field() {
        let u = || vec![UserId::parse("u1").unwrap()];
        let now = 1_000_000;
        let many = vec![UserId::parse("u1").unwrap(); MAX_MINT_USERS + 1];
        assert!(Grant::new(many[1..].to_vec(), 1, 2_000_000, now).is_ok());
        for (grant, field) in [
            (Grant::new(Vec::new(), 1, 2_000_000, now), "users:"),
            (Grant::new(many, 1, 2_000_000, now), "users:"),
            (Grant::new(u(), 0, 2_000_000, now), "allowance:"),
            (
                Grant::new(u(), MAX_ALLOWANCE + 1, 2_000_000, now),
                "allowance:",
            ),
            (Grant::new(u(), 1, 999_999, now), "expires_at_ms:"),
            // Second 1,000 is now: refused at once, though 1,000,999 > now.
            (Grant::new(u(), 1, 1_000_999, now), "expires_at_ms:"),
            (Grant::new(u(), 1, MAX_EXPIRY_MS + 1, now), "expires_at_ms:"),
        ] {
            let e = grant.unwrap_err().to_string();
            assert!(e.starts_with(field), "{e}");
        }
        assert!(Grant::new(u(), MAX_ALLOWANCE, 1_001_000, now).is_ok());
        let last = Grant::new(u(), 1, MAX_EXPIRY_MS, now).unwrap();
        let e = EventId::parse("e1").unwrap();
        let (_, token) = &last.clone().mint(Some(&access()), &e).unwrap()[0];
        assert!(token.len() <= MAX_TOKEN_LEN);
        assert!(matches!(
            verify(&access(), &e, &u()[0], Some(token), now),
            TokenUse::Valid { .. }
        ));
        let open = last.mint(None, &e).unwrap_err().to_string();
        assert!(open.starts_with("access:"), "{open}");
    }
}
