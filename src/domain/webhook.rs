//! Webhooks, the pure part: what a subscription may say ([`check`]), how a
//! delivery is signed ([`signature`]) and how a receiver verifies it
//! ([`verify`]), and how long a failed delivery waits ([`backoff`]).
//! Delivery itself is `control::webhook`'s; the subscriptions are kept in
//! the ledger.
//!
//! **The signature**, in the style Stripe uses: the header
//! `Shardstock-Signature: t=<unix seconds>,v1=<hex>[,v1=<hex>]`, each `v1`
//! the HMAC-SHA256, keyed by one of the subscription's secrets, of
//! `"<t>.<body>"` (the body's exact bytes). Two secrets while one is rotated
//! give two `v1`: a receiver that knows either accepts. The timestamp is
//! signed, so a delivery replayed later than the receiver's tolerance is
//! refused even though its body and signature are intact.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The header with the signature.
pub const SIGNATURE_HEADER: &str = "shardstock-signature";
/// The header with the change's id (the id to deduplicate by).
pub const EVENT_ID_HEADER: &str = "shardstock-event-id";
/// The header with the change's type.
pub const EVENT_TYPE_HEADER: &str = "shardstock-event-type";

/// The change types a subscription may ask for (the outbox's; the ledger's
/// constants are held to this list by a test there).
pub const CHANGE_TYPES: [&str; 7] = [
    "order.created",
    "order.confirmed",
    "order.cancelled",
    "order.expired",
    "order.voided",
    "order.restored",
    "event.closed",
];

/// The most subscriptions a deployment keeps (each is a worker on the
/// relay leader, and a label value of the delivery metrics).
pub const MAX_SUBSCRIPTIONS: usize = 32;
/// Secrets at most per subscription (a rotation: the old and the new).
pub const MAX_SECRETS: usize = 2;
/// The shortest secret accepted, in characters.
pub const MIN_SECRET_LEN: usize = 16;
/// The longest id, URL (characters) and secret (characters) accepted.
pub const MAX_ID_LEN: usize = 64;
pub const MAX_URL_LEN: usize = 2_048;
pub const MAX_SECRET_LEN: usize = 256;

/// A subscription URL's pattern, in the OpenAPI document and [`check`].
pub const URL_PATTERN: &str = "^https?://[A-Za-z0-9._~%!$&'()*+,;=:@-]+([/?#][^ ]*)?$";

/// A byte the host part of a subscription's URL may hold.
fn host_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"._~%!$&'()*+,;=:@-".contains(&b)
}

/// Checks a subscription's fields; on a refusal, the field and why.
pub fn check(
    id: &str,
    url: &str,
    types: &[String],
    secrets: &[String],
) -> Result<(), (&'static str, String)> {
    let id_ok = !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !id_ok {
        return Err((
            "id",
            format!("must be 1 to {MAX_ID_LEN} of A-Z a-z 0-9 _ -, not {id:?}"),
        ));
    }
    // The OpenAPI document's pattern ([`URL_PATTERN`]) and length (in
    // characters), exactly: what it allows is accepted. The host part (up
    // to the first `/ ? #`) is ASCII host characters, without brackets: an
    // unclosed `[` was accepted and echoed, and clients that parse the URL
    // (Python's `urlsplit`: "Invalid IPv6 URL") failed on the answer.
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    let host_ok = rest.is_some_and(|r| {
        let host = r.split(['/', '?', '#']).next().unwrap_or("");
        !host.is_empty() && host.bytes().all(host_byte) && !r.contains(' ')
    });
    if url.chars().count() > MAX_URL_LEN || !host_ok {
        return Err((
            "url",
            format!(
                "must be an http:// or https:// URL with a host of A-Z a-z 0-9 . _ ~ % ! $ & ' ( ) * + , ; = : @ - \
                 (a name or an IPv4 address, not a bracketed IPv6 one) and no space, at most {MAX_URL_LEN} characters"
            ),
        ));
    }
    if types.len() > CHANGE_TYPES.len() {
        return Err((
            "types",
            format!("may name at most {} types", CHANGE_TYPES.len()),
        ));
    }
    if let Some(t) = types.iter().find(|t| !CHANGE_TYPES.contains(&t.as_str())) {
        return Err((
            "types",
            format!(
                "{t:?} is not a change type (one of {})",
                CHANGE_TYPES.join(", ")
            ),
        ));
    }
    if secrets.is_empty() || secrets.len() > MAX_SECRETS {
        return Err((
            "secrets",
            format!("must hold 1 or {MAX_SECRETS} secrets (two while one is rotated)"),
        ));
    }
    if secrets
        .iter()
        .any(|s| !(MIN_SECRET_LEN..=MAX_SECRET_LEN).contains(&s.chars().count()))
    {
        return Err((
            "secrets",
            format!("each secret must be {MIN_SECRET_LEN} to {MAX_SECRET_LEN} characters"),
        ));
    }
    Ok(())
}

fn mac(secret: &str, t: i64, body: &[u8]) -> Hmac<Sha256> {
    // HMAC takes a key of any length.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// The `Shardstock-Signature` value of `body` sent at `t` (unix seconds):
/// `t=<t>`, then one `v1=<hex>` per secret, in the order given.
pub fn signature(secrets: &[String], t: i64, body: &[u8]) -> String {
    let mut header = format!("t={t}");
    for secret in secrets {
        let tag = mac(secret, t, body).finalize().into_bytes();
        header.push_str(",v1=");
        header.push_str(&hex::encode(tag));
    }
    header
}

/// Why [`verify`] refused a delivery.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("the signature header is malformed")]
    Malformed,
    #[error("the timestamp is outside the tolerance (a replay, or a clock off)")]
    TooOld,
    #[error("no v1 signature matches the body")]
    Mismatch,
}

/// The receiver's check: the header's `t` within `tolerance_s` of `now_s`,
/// and some `v1` equal (in constant time) to the HMAC of `"<t>.<body>"` by
/// `secret`. A receiver then deduplicates by `Shardstock-Event-Id`.
pub fn verify(
    secret: &str,
    header: &str,
    body: &[u8],
    now_s: i64,
    tolerance_s: i64,
) -> Result<(), VerifyError> {
    let mut t = None;
    let mut tags = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", v)) => t = Some(v.parse::<i64>().map_err(|_| VerifyError::Malformed)?),
            Some(("v1", v)) => tags.push(hex::decode(v).map_err(|_| VerifyError::Malformed)?),
            Some(_) => {}
            None => return Err(VerifyError::Malformed),
        }
    }
    let t = t.ok_or(VerifyError::Malformed)?;
    if (now_s - t).abs() > tolerance_s {
        return Err(VerifyError::TooOld);
    }
    // `verify_slice` compares in constant time.
    if tags
        .iter()
        .any(|tag| mac(secret, t, body).verify_slice(tag).is_ok())
    {
        Ok(())
    } else {
        Err(VerifyError::Mismatch)
    }
}

/// The longest wait before retry number `failures` (1 after the first
/// failure): `min_ms × 2^(failures − 1)`, capped at `max_ms`. The wait is a
/// uniform draw from zero to it ("full jitter"), so subscriptions failing
/// together do not retry together.
pub fn backoff(min_ms: u64, max_ms: u64, failures: u32) -> u64 {
    let doublings = failures.saturating_sub(1).min(32);
    min_ms.saturating_mul(1u64 << doublings).min(max_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_signature_is_stripes_shape_and_verifies_by_either_secret() {
        let secrets = s(&["old-secret-0123456789", "new-secret-0123456789"]);
        let body = br#"{"id":"o1:order.created"}"#;
        let header = signature(&secrets, 1_700_000_000, body);
        assert!(header.starts_with("t=1700000000,v1="), "{header}");
        assert_eq!(header.matches(",v1=").count(), 2);
        for secret in &secrets {
            assert_eq!(verify(secret, &header, body, 1_700_000_100, 300), Ok(()));
        }
        assert_eq!(
            verify("another-secret-0123", &header, body, 1_700_000_000, 300),
            Err(VerifyError::Mismatch)
        );
    }

    #[test]
    fn a_tampered_body_or_an_old_timestamp_is_refused() {
        let secrets = s(&["secret-0123456789abc"]);
        let header = signature(&secrets, 1_000, b"{\"a\":1}");
        assert_eq!(
            verify(&secrets[0], &header, b"{\"a\":2}", 1_000, 300),
            Err(VerifyError::Mismatch)
        );
        assert_eq!(
            verify(&secrets[0], &header, b"{\"a\":1}", 1_301, 300),
            Err(VerifyError::TooOld)
        );
        assert_eq!(
            verify(&secrets[0], "v1=00", b"", 0, 300),
            Err(VerifyError::Malformed)
        );
    }

    #[test]
    fn the_hmac_is_the_published_one() {
        // RFC 4231, test case 2: key "Jefe", data "what do ya want for nothing?".
        let tag = mac("Jefe", 0, b"").finalize().into_bytes().to_vec();
        assert_eq!(tag.len(), 32);
        let mut m = Hmac::<Sha256>::new_from_slice(b"Jefe").unwrap();
        m.update(b"what do ya want for nothing?");
        assert_eq!(
            hex::encode(m.finalize().into_bytes()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn backoff_doubles_to_its_cap() {
        assert_eq!(backoff(500, 300_000, 1), 500);
        assert_eq!(backoff(500, 300_000, 2), 1_000);
        assert_eq!(backoff(500, 300_000, 10), 256_000);
        assert_eq!(backoff(500, 300_000, 11), 300_000);
        assert_eq!(backoff(500, 300_000, u32::MAX), 300_000);
    }

    #[test]
    fn a_subscription_names_the_field_it_gets_wrong() {
        let ok = s(&["0123456789abcdef"]);
        assert_eq!(check("pay", "http://x.example/h", &[], &ok), Ok(()));
        let field = |r: Result<(), (&'static str, String)>| r.unwrap_err().0;
        assert_eq!(check("pay", "https://x.example/h", &[], &ok), Ok(()));
        assert_eq!(field(check("pay", "ftp://x.example/h", &[], &ok)), "url");
        assert_eq!(field(check("pay", "https://", &[], &ok)), "url");
        assert_eq!(field(check("a b", "http://x", &[], &ok)), "id");
        assert_eq!(field(check("", "http://x", &[], &ok)), "id");
        assert_eq!(field(check("a", "ftp://x", &[], &ok)), "url");
        assert_eq!(field(check("a", "http://", &[], &ok)), "url");
        assert_eq!(field(check("a", "http://x/a b", &[], &ok)), "url");
        // Brackets and non-ASCII in the host are refused (a client parsing
        // the echoed URL fails on an unclosed `[`); in the path they pass.
        assert_eq!(field(check("a", "http://[", &[], &ok)), "url");
        assert_eq!(field(check("a", "http://[::1]:80/h", &[], &ok)), "url");
        assert_eq!(field(check("a", "http://é.example/h", &[], &ok)), "url");
        assert_eq!(check("a", "http://u@x.example:8080/[a]é", &[], &ok), Ok(()));
        assert_eq!(
            field(check("a", "http://x", &s(&["order.made"]), &ok)),
            "types"
        );
        assert_eq!(field(check("a", "http://x", &[], &[])), "secrets");
        assert_eq!(
            field(check("a", "http://x", &[], &s(&["short"]))),
            "secrets"
        );
        let three = s(&["0123456789abcdef"; 3]);
        assert_eq!(field(check("a", "http://x", &[], &three)), "secrets");
    }
}
