//! A draw's waiting list in memory: a bucket's share (`wl`, `wo`) beside
//! its other fields, the list's slot in a map of its own; each step mirrors
//! its script (`lua/waitlist_on.lua`, `reserve_offers.lua`,
//! `open_offer.lua`, `claim_offer.lua`, `pass_offers.lua`,
//! `assign_offer.lua`) in one critical section.

use std::collections::{BTreeMap, HashMap};

use super::{Bucket, MemoryStore};
use crate::domain::ids::{EventId, UserId};
use crate::domain::keys::BucketRef;
use crate::domain::offer::{Offer, Ticket};
use crate::domain::stream::{RecordKind, StreamEntry, StreamId};
use crate::store::{Assign, Claim, ClaimReply, Offers, OpenReply, StoreError};

/// A bucket's share of the waiting list (`wl`, `wo`).
#[derive(Debug, Default)]
pub(super) struct Waitlist {
    /// `None`: never opened; `Some(false)`: closed, nobody left in line.
    on: Option<bool>,
    pub(super) aside: u64,
    /// Aside + reserved + offered.
    pub(super) units: u64,
    seq: u64,
    tickets: HashMap<u64, Ticket>,
    /// Reserved tickets (-1) and open offers (-> deadline).
    wo: BTreeMap<u64, i64>,
}

/// A draw's list slot (`ss:{w#<event>}:line`, `:list`).
#[derive(Debug, Default)]
pub(super) struct List {
    line: HashMap<u64, UserId>,
    len: Option<u64>,
    next: u64,
    assigned: HashMap<(BucketRef, u64), u64>,
    placed: HashMap<u64, (BucketRef, u64)>,
}

impl Bucket {
    /// Units that come back (an expiry, a cancel): aside while the
    /// bucket's list is on, else back in stock (the scripts' `give_back`).
    pub(super) fn give_back(&mut self, units: u64) {
        if self.wait.on == Some(true) {
            self.wait.aside += units;
            self.wait.units += units;
        } else {
            self.stock += units;
        }
    }
}

impl MemoryStore {
    fn with_list<T>(&self, event: &EventId, f: impl FnOnce(&mut List) -> T) -> T {
        let mut lists = self.inner.lists.lock().expect("lists poisoned");
        f(lists.entry(event.clone()).or_default())
    }
}

impl Offers for MemoryStore {
    /// Mirrors `lua/waitlist_on.lua`.
    async fn waitlist_on(&self, b: &BucketRef) -> Result<(), StoreError> {
        self.with(b, |bk| {
            bk.wait.on.get_or_insert(true);
        })
    }

    async fn write_line(&self, event: &EventId, line: &[(u64, UserId)]) -> Result<(), StoreError> {
        self.with_list(event, |l| l.line.extend(line.iter().cloned()));
        Ok(())
    }

    async fn open_list(&self, event: &EventId, len: u64) -> Result<(), StoreError> {
        self.with_list(event, |l| {
            if l.len.is_none() {
                l.next = 1;
                l.len = Some(len);
            }
        });
        Ok(())
    }

    /// Mirrors `lua/assign_offer.lua`.
    async fn assign_offer(
        &self,
        event: &EventId,
        b: &BucketRef,
        ticket: u64,
    ) -> Result<Assign, StoreError> {
        self.with_list(event, |l| {
            let Some(len) = l.len else {
                return Ok(Assign::NoList);
            };
            let key = (b.clone(), ticket);
            let position = match l.assigned.get(&key) {
                Some(0) => return Ok(Assign::Exhausted),
                Some(p) => *p,
                None if l.next > len => {
                    l.assigned.insert(key, 0);
                    return Ok(Assign::Exhausted);
                }
                None => {
                    let p = l.next;
                    l.next += 1;
                    l.assigned.insert(key.clone(), p);
                    l.placed.insert(p, key);
                    p
                }
            };
            let user = l.line.get(&position).cloned().ok_or_else(|| {
                StoreError::Protocol(format!("no user at position {position} of {event}'s line"))
            })?;
            Ok(Assign::Offered { position, user })
        })
    }

    async fn offer_at(
        &self,
        event: &EventId,
        position: u64,
    ) -> Result<Option<(BucketRef, u64)>, StoreError> {
        Ok(self.with_list(event, |l| l.placed.get(&position).cloned()))
    }

    /// Mirrors `lua/reserve_offers.lua`.
    async fn reserve_offers(&self, b: &BucketRef, max: u32) -> Result<Vec<u64>, StoreError> {
        self.with_live(b, |bk| {
            let w = &mut bk.wait;
            let n = w.aside.min(u64::from(max));
            for _ in 0..n {
                w.seq += 1;
                w.tickets.insert(w.seq, Ticket::Reserved);
                w.wo.insert(w.seq, -1);
            }
            w.aside -= n;
            w.wo.iter()
                .filter(|(_, at)| **at == -1)
                .map(|(t, _)| *t)
                .take(max as usize)
                .collect()
        })
    }

    /// Mirrors `lua/open_offer.lua`.
    async fn open_offer(
        &self,
        b: &BucketRef,
        ticket: u64,
        offer: Option<&Offer>,
    ) -> Result<OpenReply, StoreError> {
        self.with_live(b, |bk| {
            if bk.wait.tickets.get(&ticket) != Some(&Ticket::Reserved) {
                return OpenReply::Already;
            }
            match offer {
                Some(o) => {
                    bk.wait.tickets.insert(ticket, Ticket::Open(o.clone()));
                    bk.wait.wo.insert(ticket, o.deadline_ms);
                    OpenReply::Opened
                }
                None => {
                    bk.wait.tickets.insert(ticket, Ticket::ToSale);
                    bk.wait.wo.remove(&ticket);
                    let back = 1 + std::mem::take(&mut bk.wait.aside);
                    bk.wait.units -= back;
                    bk.stock += back;
                    bk.adds += 1;
                    bk.wait.on = Some(false);
                    OpenReply::ToSale
                }
            }
        })
    }

    /// Mirrors `lua/claim_offer.lua`.
    async fn claim_offer(&self, b: &BucketRef, c: &Claim) -> Result<ClaimReply, StoreError> {
        self.with(b, |bk| {
            if let Some(Ticket::Taken(_, order)) = bk.wait.tickets.get(&c.ticket) {
                return ClaimReply::Replay(crate::domain::ids::OrderId::from_stored(order));
            }
            if bk.sealed {
                return ClaimReply::Closed;
            }
            if c.ends_ms.is_some_and(|e| c.now_ms >= e) {
                return ClaimReply::Ended;
            }
            match bk.wait.tickets.get(&c.ticket) {
                Some(Ticket::Passed(o)) if *o == c.offer => return ClaimReply::Passed,
                Some(Ticket::Open(o)) if *o == c.offer => {}
                _ => return ClaimReply::NotOffered,
            }
            if c.now_ms >= c.offer.deadline_ms {
                return ClaimReply::Expired;
            }
            bk.idx.insert(c.order.clone(), c.entry.clone());
            bk.append(StreamEntry {
                id: StreamId::default(),
                kind: RecordKind::Order,
                order_id: c.order.to_string(),
                user: c.entry.user.to_string(),
                qty: u64::from(c.entry.qty),
                bucket: b.index,
                home: b.index,
                rid: c.entry.request_id.clone(),
                at_ms: c.entry.at_ms,
                pay_by: None,
                part: 0,
            });
            bk.wait.tickets.insert(
                c.ticket,
                Ticket::Taken(c.offer.clone(), c.order.to_string()),
            );
            bk.wait.wo.remove(&c.ticket);
            bk.wait.units -= 1;
            ClaimReply::Bought
        })
    }

    /// Mirrors `lua/pass_offers.lua`.
    async fn pass_offers(
        &self,
        b: &BucketRef,
        now_ms: i64,
        count: u32,
    ) -> Result<Vec<Offer>, StoreError> {
        self.with_live(b, |bk| {
            let due: Vec<u64> = bk
                .wait
                .wo
                .iter()
                .filter(|(_, at)| **at >= 0 && **at <= now_ms)
                .map(|(t, _)| *t)
                .take(count as usize)
                .collect();
            let mut passed = Vec::new();
            for t in due {
                bk.wait.wo.remove(&t);
                if let Some(Ticket::Open(o)) = bk.wait.tickets.get(&t).cloned() {
                    bk.wait.tickets.insert(t, Ticket::Passed(o.clone()));
                    bk.wait.aside += 1;
                    passed.push(o);
                }
            }
            passed
        })
    }

    async fn ticket(&self, b: &BucketRef, ticket: u64) -> Result<Option<Ticket>, StoreError> {
        self.with(b, |bk| bk.wait.tickets.get(&ticket).cloned())
    }
}
