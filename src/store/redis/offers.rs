//! A draw's waiting list on Redis: the bucket steps' scripts on each
//! bucket's slot, `assign_offer.lua` on the list's (`keys::list_key`). The
//! line and its length are written with plain `HSET`/`HSETNX` commands
//! (the draw writes the same line whenever it is redone).

use fred::prelude::*;

use super::scripts::reply;
use super::steps::{self, Step};
use super::{At, RedisStore, arg, code, num, text, unknown};
use crate::domain::ids::{EventId, OrderId, UserId};
use crate::domain::keys::{BucketRef, list_key};
use crate::domain::offer::{
    LINE_PER_CALL, Offer, Ticket, assignment_field, parse_placement, placement,
};
use crate::store::{Assign, Claim, ClaimReply, Offers, OpenReply, StoreError};

use super::steps::prelude::*;

steps! {
    /// Opens a bucket's waiting list.
    WaitlistOn = waitlist_on {
        keys: [b(Bk::Stock), b(Bk::Wl)],
        argv: {},
        reply: Reply::Codes(&[reply::STALE, reply::OK]),
        writes: [],
    }
    /// Units aside into tickets; the reserved tickets.
    ReserveOffers = reserve_offers {
        keys: [b(Bk::Stock), b(Bk::Sealed), b(Bk::Wl), b(Bk::Wo)],
        argv: { max: u32, reserved: String },
        reply: Reply::Codes(&[reply::STALE, reply::OK]),
        writes: [],
    }
    /// Opens a ticket's offer, or puts its unit on sale.
    OpenOffer = open_offer {
        keys: [b(Bk::Stock), b(Bk::Sealed), b(Bk::Wl), b(Bk::Wo), b(Bk::Adds)],
        argv: { ticket: u64, reserved: String, record: String, deadline: String },
        reply: Reply::Codes(&[reply::STALE, reply::OFFER_BEFORE, reply::OK, reply::TO_SALE]),
        writes: [],
    }
    /// Buys an open offer.
    ClaimOffer = claim_offer {
        keys: [b(Bk::Stock), b(Bk::Sealed), b(Bk::Wl), b(Bk::Wo), b(Bk::Idx), b(Bk::Orders)],
        argv: {
            ticket: u64, open: String, passed: String, now: i64, deadline: i64, order: String,
            entry: String, taken: String, ends: String,
        },
        reply: Reply::Codes(&[
            reply::STALE, reply::CLOSED, reply::REPLAY, reply::SALE_ENDED, reply::OFFER_PASSED,
            reply::NOT_OFFERED, reply::OFFER_EXPIRED, reply::OK,
        ]),
        writes: [OrderEntry, Stream],
    }
    /// Passes the offers past their deadline.
    PassOffers = pass_offers {
        keys: [b(Bk::Stock), b(Bk::Sealed), b(Bk::Wl), b(Bk::Wo)],
        argv: { now: i64, count: u32, passed: &'static str },
        reply: Reply::Codes(&[reply::STALE, reply::OK]),
        writes: [],
    }
    /// Gives a ticket the next position in line.
    AssignOffer = assign_offer {
        keys: [K::Given("list"), K::Given("line")],
        argv: { field: String, placement: String },
        reply: Reply::Codes(&[reply::NO_LIST, reply::EXHAUSTED, reply::OK]),
        writes: [],
    }
}

fn ticket_record(v: &Value) -> Result<Ticket, StoreError> {
    let s = text(v)?;
    Ticket::decode(&s).ok_or_else(|| StoreError::Protocol(format!("bad ticket record {s:?}")))
}

impl RedisStore {
    fn list(&self, event: &EventId) -> At<'static> {
        At::Given(vec![
            list_key(&self.namespace, event, "list"),
            list_key(&self.namespace, event, "line"),
        ])
    }
}

impl Offers for RedisStore {
    async fn waitlist_on(&self, bucket: &BucketRef) -> Result<(), StoreError> {
        self.run_bucket(bucket, steps::WaitlistOn {}).await?;
        Ok(())
    }

    async fn write_line(&self, event: &EventId, line: &[(u64, UserId)]) -> Result<(), StoreError> {
        let key = list_key(&self.namespace, event, "line");
        for chunk in line.chunks(LINE_PER_CALL) {
            let values: Vec<(String, String)> = chunk
                .iter()
                .map(|(p, u)| (p.to_string(), u.to_string()))
                .collect();
            self.call(|| self.client.hset::<(), _, _>(&key, values.clone()))
                .await?;
        }
        Ok(())
    }

    async fn open_list(&self, event: &EventId, len: u64) -> Result<(), StoreError> {
        let key = list_key(&self.namespace, event, "list");
        // `next` first: `len` is what says the list exists.
        self.call(|| self.client.hsetnx::<(), _, _, _>(&key, "next", 1))
            .await?;
        self.call(|| self.client.hsetnx::<(), _, _, _>(&key, "len", len))
            .await
    }

    async fn assign_offer(
        &self,
        event: &EventId,
        bucket: &BucketRef,
        ticket: u64,
    ) -> Result<Assign, StoreError> {
        let step = steps::AssignOffer {
            field: assignment_field(bucket, ticket),
            placement: placement(bucket, ticket),
        };
        let parts = self.run(step, self.list(event)).await?.into_array();
        match code(&parts)?.as_str() {
            reply::NO_LIST => Ok(Assign::NoList),
            reply::EXHAUSTED => Ok(Assign::Exhausted),
            reply::OK => {
                let position = num(arg(&parts, 1)?)?;
                let user = UserId::parse(text(arg(&parts, 2)?)?).map_err(|e| {
                    StoreError::Protocol(format!("no user at position {position}: {e}"))
                })?;
                Ok(Assign::Offered { position, user })
            }
            other => Err(unknown("assign_offer", other)),
        }
    }

    async fn offer_at(
        &self,
        event: &EventId,
        position: u64,
    ) -> Result<Option<(BucketRef, u64)>, StoreError> {
        let key = list_key(&self.namespace, event, "list");
        let field = format!("o:{position}");
        let got: Option<String> = self.call(|| self.client.hget(&key, &field)).await?;
        match got {
            None => Ok(None),
            Some(s) => parse_placement(&s)
                .map(Some)
                .ok_or_else(|| StoreError::Protocol(format!("bad placement {s:?}"))),
        }
    }

    async fn reserve_offers(&self, bucket: &BucketRef, max: u32) -> Result<Vec<u64>, StoreError> {
        let step = steps::ReserveOffers {
            max,
            reserved: Ticket::Reserved.encode(),
        };
        let parts = self.run_bucket(bucket, step).await?;
        parts.iter().skip(1).map(num).collect()
    }

    async fn open_offer(
        &self,
        bucket: &BucketRef,
        ticket: u64,
        offer: Option<&Offer>,
    ) -> Result<OpenReply, StoreError> {
        let (record, deadline) = match offer {
            Some(o) => (Ticket::Open(o.clone()).encode(), o.deadline_ms.to_string()),
            None => (Ticket::ToSale.encode(), String::new()),
        };
        let step = steps::OpenOffer {
            ticket,
            reserved: Ticket::Reserved.encode(),
            record,
            deadline,
        };
        let parts = self.run_bucket(bucket, step).await?;
        match code(&parts)?.as_str() {
            reply::OK => Ok(OpenReply::Opened),
            reply::OFFER_BEFORE => Ok(OpenReply::Already),
            reply::TO_SALE => Ok(OpenReply::ToSale),
            other => Err(unknown("open_offer", other)),
        }
    }

    async fn claim_offer(&self, bucket: &BucketRef, c: &Claim) -> Result<ClaimReply, StoreError> {
        let step = steps::ClaimOffer {
            ticket: c.ticket,
            open: Ticket::Open(c.offer.clone()).encode(),
            passed: Ticket::Passed(c.offer.clone()).encode(),
            now: c.now_ms,
            deadline: c.offer.deadline_ms,
            order: c.order.to_string(),
            entry: c.entry.encode(),
            taken: Ticket::Taken(c.offer.clone(), c.order.to_string()).encode(),
            ends: c.ends_ms.map_or_else(String::new, |e| e.to_string()),
        };
        let parts = self.run_bucket(bucket, step).await?;
        let answer = match code(&parts)?.as_str() {
            reply::OK => ClaimReply::Bought,
            reply::REPLAY => match ticket_record(arg(&parts, 1)?)? {
                Ticket::Taken(_, order) => ClaimReply::Replay(OrderId::from_stored(&order)),
                other => {
                    return Err(StoreError::Protocol(format!(
                        "claim_offer replayed a ticket not taken: {other:?}"
                    )));
                }
            },
            reply::OFFER_PASSED => ClaimReply::Passed,
            reply::NOT_OFFERED => ClaimReply::NotOffered,
            reply::OFFER_EXPIRED => ClaimReply::Expired,
            reply::CLOSED => ClaimReply::Closed,
            reply::SALE_ENDED => ClaimReply::Ended,
            other => return Err(unknown("claim_offer", other)),
        };
        if answer == ClaimReply::Bought {
            self.replicated(bucket).await?;
        }
        Ok(answer)
    }

    async fn pass_offers(
        &self,
        bucket: &BucketRef,
        now_ms: i64,
        count: u32,
    ) -> Result<Vec<Offer>, StoreError> {
        let step = steps::PassOffers {
            now: now_ms,
            count,
            passed: Ticket::PASSED_TAG,
        };
        let parts = self.run_bucket(bucket, step).await?;
        parts
            .iter()
            .skip(1)
            .map(|v| match ticket_record(v)? {
                Ticket::Passed(o) => Ok(o),
                other => Err(StoreError::Protocol(format!("passed {other:?}"))),
            })
            .collect()
    }

    async fn ticket(&self, bucket: &BucketRef, ticket: u64) -> Result<Option<Ticket>, StoreError> {
        let key = bucket.key_in(&self.namespace, "wl");
        let field = format!("t:{ticket}");
        let got: Option<String> = self.call(|| self.client.hget(&key, &field)).await?;
        got.map(|s| {
            Ticket::decode(&s)
                .ok_or_else(|| StoreError::Protocol(format!("bad ticket record {s:?}")))
        })
        .transpose()
    }
}
