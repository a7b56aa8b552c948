//! An order from all its records, whatever order they came in — the rule the
//! `orders` view of migration 0002 states in SQL, here for the reads the
//! service makes (one order; every confirmed order of an event), which then
//! stay two plain index reads whatever the planner's statistics say.
//!
//! The order's row is its best take — one no void gave back, then the lowest
//! bucket, then the earliest record — or, while none of its takes is in yet,
//! its cancel (bucket −1). Its status: voided when that take was given back
//! (the saga never made it this order), cancelled once a cancel exists, else
//! confirmed. An order taken as a hold has a deadline — its take's
//! `pay_by_ms` when it was bought on the fast path, a hold record (`h`, its
//! `at_ms` the deadline) when a saga bought it: it is held until a confirm
//! (`k`) or an expiry (`e`, which releases its units like a cancel) comes; an
//! expiry alone stands for its order until its take comes, as a cancel does.
//! (The view of migration 0004 says the same in SQL.)

/// The columns of `order_records` a derivation reads, in this order.
pub(super) const COLUMNS: &str =
    "order_id, kind, bucket, quantity, user_id, request_id, at_ms, stream_no, ms, seq, pay_by_ms";

/// One record of an order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Rec {
    pub order_id: String,
    pub kind: String,
    pub bucket: i64,
    pub qty: i64,
    pub user: String,
    pub rid: String,
    pub at_ms: i64,
    /// `(stream_no, ms, seq)`.
    pub key: (i64, i64, i64),
    /// A take bought as a hold on the fast path: its deadline.
    pub pay_by: Option<i64>,
}

impl Rec {
    pub(crate) fn from_row(row: &sqlx::any::AnyRow) -> Result<Self, sqlx::Error> {
        use sqlx::Row;
        Ok(Self {
            order_id: row.try_get(0)?,
            kind: row.try_get(1)?,
            bucket: row.try_get(2)?,
            qty: row.try_get(3)?,
            user: row.try_get(4)?,
            rid: row.try_get(5)?,
            at_ms: row.try_get(6)?,
            key: (row.try_get(7)?, row.try_get(8)?, row.try_get(9)?),
            pay_by: row.try_get(10)?,
        })
    }
}

/// How an order stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Status {
    Confirmed,
    Cancelled,
    Voided,
    /// Taken as a hold, neither confirmed nor expired yet.
    Held,
    Expired,
}

/// The pay-by deadline of an order taken as a hold: its take's, or its
/// hold record's.
pub(super) fn pay_by(records: &[Rec]) -> Option<i64> {
    records.iter().find_map(|r| match r.kind.as_str() {
        "h" => Some(r.at_ms),
        "o" => r.pay_by,
        _ => None,
    })
}

/// The order `records` (all of one order id) make: the record its row shows,
/// the bucket, and the status; `None` without a take or a cancel.
pub(super) fn derive(records: &[Rec]) -> Option<(&Rec, i64, Status)> {
    let voided = |bucket: i64| records.iter().any(|r| r.kind == "v" && r.bucket == bucket);
    let cancelled = records.iter().any(|r| r.kind == "c");
    let expired = records.iter().any(|r| r.kind == "e");
    let held = pay_by(records).is_some() && !records.iter().any(|r| r.kind == "k");
    let best = records
        .iter()
        .filter(|r| r.kind == "o")
        .min_by_key(|r| (voided(r.bucket), r.bucket, r.key.1, r.key.2, r.key.0));
    match best {
        Some(take) if voided(take.bucket) => Some((take, take.bucket, Status::Voided)),
        Some(take) if cancelled => Some((take, take.bucket, Status::Cancelled)),
        Some(take) if expired => Some((take, take.bucket, Status::Expired)),
        Some(take) if held => Some((take, take.bucket, Status::Held)),
        Some(take) => Some((take, take.bucket, Status::Confirmed)),
        None => records
            .iter()
            .filter(|r| r.kind == "c" || r.kind == "e")
            .min_by_key(|r| r.key)
            .map(|c| {
                let status = if c.kind == "c" {
                    Status::Cancelled
                } else {
                    Status::Expired
                };
                (c, -1, status)
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(kind: &str, bucket: i64, seq: i64) -> Rec {
        Rec {
            order_id: "x".into(),
            kind: kind.into(),
            bucket,
            qty: 2,
            user: "u".into(),
            rid: String::new(),
            at_ms: seq,
            key: (bucket, 1_000, seq),
            pay_by: None,
        }
    }

    #[test]
    fn the_live_take_with_the_lowest_bucket_is_the_order() {
        let all = [rec("o", 3, 1), rec("o", 1, 2), rec("v", 1, 3)];
        let (r, bucket, status) = derive(&all).unwrap();
        assert_eq!(
            (r.key, bucket, status),
            ((3, 1_000, 1), 3, Status::Confirmed)
        );
    }

    #[test]
    fn a_cancel_alone_stands_for_its_order_until_a_take_comes() {
        let (_, bucket, status) = derive(&[rec("c", 0, 1)]).unwrap();
        assert_eq!((bucket, status), (-1, Status::Cancelled));
        let (_, bucket, status) = derive(&[rec("c", 0, 2), rec("o", 4, 1)]).unwrap();
        assert_eq!((bucket, status), (4, Status::Cancelled));
    }

    #[test]
    fn a_hold_is_held_until_confirmed_or_expired() {
        let mut hold = rec("h", 0, 2);
        hold.at_ms = 60_000;
        let all = [rec("o", 3, 1), hold.clone()];
        assert_eq!(derive(&all).unwrap().2, Status::Held);
        assert_eq!(pay_by(&all), Some(60_000));
        let confirmed = [rec("o", 3, 1), hold.clone(), rec("k", 0, 3)];
        assert_eq!(derive(&confirmed).unwrap().2, Status::Confirmed);
        let expired = [rec("e", 0, 3), hold, rec("o", 3, 1)];
        assert_eq!(derive(&expired).unwrap().2, Status::Expired);
        assert_eq!(derive(&[rec("e", 0, 3)]).unwrap().1, -1);
        assert_eq!(pay_by(&[rec("o", 3, 1)]), None);
    }

    #[test]
    fn a_take_bought_as_a_hold_carries_its_own_deadline() {
        let mut take = rec("o", 3, 1);
        take.pay_by = Some(60_000);
        assert_eq!(derive(&[take.clone()]).unwrap().2, Status::Held);
        assert_eq!(pay_by(&[take.clone()]), Some(60_000));
        let confirmed = [take.clone(), rec("k", 3, 2)];
        assert_eq!(derive(&confirmed).unwrap().2, Status::Confirmed);
        let expired = [rec("e", 3, 2), take];
        assert_eq!(derive(&expired).unwrap().2, Status::Expired);
    }

    #[test]
    fn takes_all_given_back_void_the_order() {
        let all = [rec("o", 2, 1), rec("v", 2, 2), rec("c", 0, 3)];
        assert_eq!(derive(&all).unwrap().2, Status::Voided);
        assert_eq!(derive(&[rec("v", 2, 2)]), None);
    }
}
