//! Counts in request bodies, read as JSON Schema reads them.
//!
//! JSON has one number type, and JSON Schema's `integer` is any number with
//! no fractional part, so `{"buckets": 16.0}` is a valid body for a schema
//! that says `buckets: integer`. serde refuses a float for a `u32`; these
//! `deserialize_with` helpers accept an integer, or a float that is a whole
//! number small enough to be exact (at most 2^53), and refuse the rest with
//! the field's own `invalid-request`. (Found by schemathesis: the published
//! document promised what the server refused.)

use serde::Deserialize;
use serde::de::{Deserializer, Error};

use crate::domain::model::{BucketCount, BucketRange};

/// Largest float that is still an exact integer.
const EXACT: f64 = 9_007_199_254_740_992.0;

fn whole<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    exact(&serde_json::Number::deserialize(d)?).map_err(D::Error::custom)
}

fn exact(n: &serde_json::Number) -> Result<u64, String> {
    if let Some(v) = n.as_u64() {
        return Ok(v);
    }
    match n.as_f64() {
        Some(f) if f.fract() == 0.0 && (0.0..=EXACT).contains(&f) => Ok(f as u64),
        _ => Err(format!("invalid value: {n}, expected a whole number ≥ 0")),
    }
}

fn exact_u32(n: &serde_json::Number) -> Result<u32, String> {
    let v = exact(n)?;
    std::primitive::u32::try_from(v).map_err(|_| {
        format!(
            "invalid value: {v}, expected at most {}",
            std::primitive::u32::MAX
        )
    })
}

/// A bucket count: a whole number, `"auto"`, or `{"min": .., "max": ..}`
/// (the bounds are checked with the rest of the spec).
pub fn buckets<'de, D: Deserializer<'de>>(d: D) -> Result<BucketCount, D::Error> {
    use serde_json::Value;
    const EXPECTED: &str = r#"expected a whole number, "auto" or {"min": .., "max": ..}"#;
    match Value::deserialize(d)? {
        Value::Number(n) => exact_u32(&n).map(BucketCount::Fixed),
        Value::String(s) => {
            BucketCount::named(&s).ok_or_else(|| format!("invalid value: {s:?}, {EXPECTED}"))
        }
        Value::Object(fields) => {
            if let Some(k) = fields.keys().find(|k| !matches!(k.as_str(), "min" | "max")) {
                return Err(D::Error::custom(format!(
                    "unknown field `{k}` in buckets, expected `min` or `max`"
                )));
            }
            let bound = |k: &str| match fields.get(k) {
                Some(Value::Number(n)) => exact_u32(n),
                Some(other) => Err(format!(
                    "invalid value: {other} for buckets.{k}, expected a whole number"
                )),
                None => Err(format!("missing field `{k}` in buckets")),
            };
            Ok(BucketCount::Auto(BucketRange {
                min: bound("min").map_err(D::Error::custom)?,
                max: bound("max").map_err(D::Error::custom)?,
            }))
        }
        other => Err(format!("invalid value: {other}, {EXPECTED}")),
    }
    .map_err(D::Error::custom)
}

/// A `u64` count.
pub fn u64<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    whole(d)
}

/// A `u32` count.
pub fn u32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    exact_u32(&serde_json::Number::deserialize(d)?).map_err(D::Error::custom)
}

/// A purchase's `quantity`: any whole number. One outside `u32` (a negative,
/// or past 2^32 − 1) is outside every event's range and reads as 0, which
/// the engine refuses with that event's own range ("must be between 1 and
/// {max_per_order}"): quoting "≥ 0" for -1 named a range 0 is not in.
pub fn quantity<'de, D: Deserializer<'de>>(d: D) -> Result<std::primitive::u32, D::Error> {
    let n = serde_json::Number::deserialize(d)?;
    let whole = match (n.as_i64(), n.as_u64(), n.as_f64()) {
        (Some(i), _, _) => Some(i128::from(i)),
        (_, Some(u), _) => Some(i128::from(u)),
        // Saturates past i128, which is out of range all the same.
        (_, _, Some(f)) if f.fract() == 0.0 => Some(f as i128),
        _ => None,
    };
    whole
        .map(|v| std::primitive::u32::try_from(v).unwrap_or(0))
        .ok_or_else(|| {
            D::Error::custom(format!(
                "invalid value: {n}, expected a whole number from 1 to the event's max_per_order"
            ))
        })
}

/// An optional `u32` count (`null` or absent: `None`; use with `#[serde(default)]`).
pub(crate) fn opt_u32<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<std::primitive::u32>, D::Error> {
    #[derive(Deserialize)]
    struct Count(#[serde(deserialize_with = "u32")] std::primitive::u32);
    Ok(Option::<Count>::deserialize(d)?.map(|c| c.0))
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    #[derive(Deserialize, Debug)]
    struct Body {
        #[serde(deserialize_with = "super::u32")]
        n: u32,
        #[serde(default, deserialize_with = "super::opt_u32")]
        o: Option<u32>,
        #[serde(default, deserialize_with = "super::u64")]
        big: u64,
    }

    fn parse(json: &str) -> Result<Body, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    #[test]
    fn a_whole_float_is_the_integer() {
        let b = parse(r#"{"n": 158.0, "o": 2.0, "big": 9007199254740992.0}"#).unwrap();
        assert_eq!((b.n, b.o, b.big), (158, Some(2), 1 << 53));
        let b = parse(r#"{"n": 3, "o": null}"#).unwrap();
        assert_eq!((b.n, b.o, b.big), (3, None, 0));
        assert_eq!(parse(r#"{"n": -0.0}"#).unwrap().n, 0);
    }

    #[test]
    fn fractions_negatives_and_overflow_are_refused() {
        for bad in [
            r#"{"n": 1.5}"#,
            r#"{"n": -1}"#,
            r#"{"n": -1.0}"#,
            r#"{"n": 4294967296}"#,
            r#"{"n": 1e300}"#,
            r#"{"n": "1"}"#,
            r#"{"n": 1, "o": 0.5}"#,
            r#"{"n": 1, "big": 18014398509481984.0}"#,
        ] {
            assert!(parse(bad).is_err(), "{bad} was accepted");
        }
    }

    #[derive(Deserialize, Debug)]
    struct Purchase {
        #[serde(deserialize_with = "super::quantity")]
        quantity: u32,
    }

    #[test]
    fn a_quantity_outside_u32_reads_as_0_for_the_engine_to_refuse() {
        let q = |json: &str| {
            serde_json::from_str::<Purchase>(json)
                .map(|p| p.quantity)
                .map_err(|e| e.to_string())
        };
        assert_eq!(q(r#"{"quantity": 2}"#), Ok(2));
        assert_eq!(q(r#"{"quantity": 2.0}"#), Ok(2));
        assert_eq!(q(r#"{"quantity": 4294967295}"#), Ok(u32::MAX));
        for out in ["-1", "-1.0", "4294967296", "1e300", "-9223372036854775808"] {
            assert_eq!(q(&format!(r#"{{"quantity": {out}}}"#)), Ok(0), "{out}");
        }
        for bad in ["1.5", "\"2\"", "null"] {
            let e = q(&format!(r#"{{"quantity": {bad}}}"#)).unwrap_err();
            assert!(!e.contains('≥'), "{bad}: {e}");
        }
        assert!(q(r#"{"quantity": 1.5}"#).unwrap_err().contains("from 1 to"));
    }

    #[derive(Deserialize, Debug)]
    struct Create {
        #[serde(deserialize_with = "super::buckets")]
        buckets: crate::domain::model::BucketCount,
    }

    #[test]
    fn buckets_are_a_count_auto_or_bounds() {
        use crate::domain::model::{BucketCount, BucketRange};
        let b = |json: &str| {
            serde_json::from_str::<Create>(json)
                .map(|c| c.buckets)
                .map_err(|e| e.to_string())
        };
        assert_eq!(b(r#"{"buckets": 16}"#), Ok(BucketCount::Fixed(16)));
        assert_eq!(b(r#"{"buckets": 16.0}"#), Ok(BucketCount::Fixed(16)));
        assert_eq!(
            b(r#"{"buckets": "auto"}"#),
            Ok(BucketCount::Auto(BucketRange::AUTO))
        );
        assert_eq!(
            b(r#"{"buckets": {"min": 2, "max": 64.0}}"#),
            Ok(BucketCount::Auto(BucketRange { min: 2, max: 64 }))
        );
        for (bad, says) in [
            (r#"{"buckets": "many"}"#, "\"many\""),
            (r#"{"buckets": {"min": 2}}"#, "missing field `max`"),
            (
                r#"{"buckets": {"min": 2, "max": 4, "step": 2}}"#,
                "unknown field `step`",
            ),
            (r#"{"buckets": {"min": 1.5, "max": 4}}"#, "1.5"),
            (r#"{"buckets": [4]}"#, "expected a whole number"),
            (r#"{"buckets": -1}"#, "-1"),
        ] {
            let e = b(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
