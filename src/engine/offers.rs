//! The waiting list's offers, the engine side (docs/DESIGN.md, "Fair
//! drops", "As built (the waiting list)"): the draw opens the list, a
//! sweeper round offers what came back and passes what was not bought in
//! time, a waiting user buys with its offer token, and an entrant's
//! standing reads what became of its place.
//!
//! Every step is the store's, one slot each; a round only asks them in
//! order, and every step is idempotent, so any instance's round may run at
//! any time and a round cut off anywhere is finished by the next:
//! `reserve_offers` answers the tickets a dead round left, `assign_offer`
//! answers a ticket the position it was given, `open_offer` opens a ticket
//! once.

use futures::future::try_join_all;

use super::{Engine, EngineError};
use crate::domain::draw::OfferStanding;
use crate::domain::event::EventStatus;
use crate::domain::ids::{EventId, OrderId, UserId};
use crate::domain::keys::BucketRef;
use crate::domain::model::{EntryState, EventMeta, OrderEntry, OrderView};
use crate::domain::offer::{
    OFFERS_PER_STEP, Offer, OfferTokenError, Ticket, hash_homed_at, mint_offer, verify_offer,
};
use crate::metrics::OFFERS;
use crate::store::{Assign, Claim, ClaimReply, OpenReply, Store, StoreError};

/// Why an offer's purchase was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OfferRefusal {
    /// The token is malformed, another user's or not signed by the event.
    InvalidToken,
    /// The deadline passed (the offer goes, or went, to the next user).
    Expired,
    /// The offer was passed to the next user.
    Passed,
    /// No such open offer (never made for that position, or closed).
    NotOffered,
}

impl OfferRefusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidToken => {
                "the offer token is malformed, another user's or not this event's"
            }
            Self::Expired => "the offer's deadline has passed",
            Self::Passed => "the offer was passed to the next user in line",
            Self::NotOffered => "no such open offer",
        }
    }
}

/// What one round did at an event (counted in [`OFFERS`] too).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OfferRound {
    pub made: u64,
    pub passed: u64,
    pub to_sale: u64,
}

fn count(event: &EventId, outcome: &'static str, n: u64) {
    if n > 0 {
        metrics::counter!(OFFERS, "event" => event.to_string(), "outcome" => outcome).increment(n);
    }
}

impl<S: Store> Engine<S> {
    /// The draw's part, before its record: opens each bucket's list (units
    /// that come back from then on go aside), then keeps the line (the
    /// waiting users in order) and its length. The same whenever redone.
    pub(super) async fn open_waitlist(
        &self,
        meta: &EventMeta,
        waiting: Vec<UserId>,
    ) -> Result<(), StoreError> {
        let event = &meta.spec.id;
        let buckets: Vec<BucketRef> = (0..meta.spec.buckets)
            .map(|i| Self::bucket(meta, i))
            .collect();
        try_join_all(buckets.iter().map(|b| self.store.waitlist_on(b))).await?;
        let len = waiting.len() as u64;
        let line: Vec<(u64, UserId)> = waiting
            .into_iter()
            .enumerate()
            .map(|(i, u)| (i as u64 + 1, u))
            .collect();
        self.store.write_line(event, &line).await?;
        self.store.open_list(event, len).await
    }

    /// One round of a draw event's offers, bucket by bucket of its current
    /// layout: offers past their deadline passed (units back aside), units
    /// aside turned into tickets, and each reserved ticket offered to the
    /// next position in line (or, nobody left, put on open sale).
    pub async fn offer_round(&self, event: &EventId) -> Result<OfferRound, EngineError> {
        let meta = self.meta(event).await?;
        let Some(draw) = meta.spec.draw.as_ref() else {
            return Ok(OfferRound::default());
        };
        if meta.status != EventStatus::OnSale {
            return Ok(OfferRound::default());
        }
        let offer_ms = i64::from(draw.offer_seconds) * 1000;
        let mut round = OfferRound::default();
        for i in 0..meta.spec.buckets {
            let b = Self::bucket(&meta, i);
            match self.offer_bucket(&meta, &b, offer_ms, &mut round).await {
                Ok(()) | Err(StoreError::Stale(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        count(event, "made", round.made);
        count(event, "passed", round.passed);
        count(event, "to_sale", round.to_sale);
        if round.to_sale > 0 {
            crate::engine::mover::units_came_back(&self.store, event, &meta).await?;
        }
        Ok(round)
    }

    async fn offer_bucket(
        &self,
        meta: &EventMeta,
        b: &BucketRef,
        offer_ms: i64,
        round: &mut OfferRound,
    ) -> Result<(), StoreError> {
        let now = self.clock.now_ms();
        round.passed += self.store.pass_offers(b, now, OFFERS_PER_STEP).await?.len() as u64;
        for ticket in self.store.reserve_offers(b, OFFERS_PER_STEP).await? {
            let opened = match self.store.assign_offer(&meta.spec.id, b, ticket).await? {
                Assign::NoList => return Ok(()),
                Assign::Exhausted => self.store.open_offer(b, ticket, None).await?,
                Assign::Offered { position, user } => {
                    let offer = Offer {
                        position,
                        user,
                        deadline_ms: self.clock.now_ms() + offer_ms,
                    };
                    self.store.open_offer(b, ticket, Some(&offer)).await?
                }
            };
            match opened {
                OpenReply::Opened => round.made += 1,
                OpenReply::ToSale => round.to_sale += 1,
                OpenReply::Already => {}
            }
        }
        Ok(())
    }

    /// Buys the open offer `token` names for `user`: one unit, confirmed
    /// (no hold). A retry answers the order bought before, also once the
    /// sale window ended; a first claim then buys nothing (not on sale,
    /// "ended", as a purchase: the step checks `ends_at` with the offer).
    pub async fn claim_offer(
        &self,
        event: &EventId,
        user: &UserId,
        token: &str,
    ) -> Result<(OrderView, bool), EngineError> {
        let meta = self.meta(event).await?;
        if meta.spec.draw.is_none() {
            return Err(EngineError::NotADraw(event.clone()));
        }
        let refused = |why| EngineError::OfferRefused {
            event: event.clone(),
            why,
        };
        let keys = meta
            .spec
            .tokens
            .as_ref()
            .map(|t| t.keys.as_slice())
            .unwrap_or(&[]);
        let now = self.clock.now_ms();
        let (position, deadline_ms) = match verify_offer(keys, event, user, token, now) {
            Ok(p) => p,
            Err(OfferTokenError::Invalid) => return Err(refused(OfferRefusal::InvalidToken)),
            // Expired by the token, but bought before? The store answers.
            Err(OfferTokenError::Expired) => match verify_offer(keys, event, user, token, i64::MIN)
            {
                Ok(p) => p,
                Err(_) => return Err(refused(OfferRefusal::InvalidToken)),
            },
        };
        let (bucket, ticket) = self
            .store
            .offer_at(event, position)
            .await?
            .ok_or_else(|| refused(OfferRefusal::NotOffered))?;
        let order = OrderId::generate(event, hash_homed_at(user, bucket.index, meta.spec.buckets));
        let entry = OrderEntry {
            state: EntryState::Confirmed,
            user: user.clone(),
            qty: 1,
            bucket: bucket.index,
            request_id: String::new(),
            at_ms: now,
            pay_by: None,
        };
        let claim = Claim {
            ticket,
            offer: Offer {
                position,
                user: user.clone(),
                deadline_ms,
            },
            now_ms: now,
            ends_ms: meta.spec.ends_at,
            order: order.clone(),
            entry: entry.clone(),
        };
        let reply = self.store.claim_offer(&bucket, &claim).await;
        self.activity.wrote(&bucket);
        match reply? {
            ClaimReply::Bought => {
                count(event, "taken", 1);
                Ok((OrderView::new(order, event.clone(), entry), false))
            }
            ClaimReply::Replay(order) => {
                let view = self.order(order.as_str()).await?;
                Ok((view, true))
            }
            ClaimReply::Expired => Err(refused(OfferRefusal::Expired)),
            ClaimReply::Passed => Err(refused(OfferRefusal::Passed)),
            ClaimReply::NotOffered => Err(refused(OfferRefusal::NotOffered)),
            ClaimReply::Closed => Err(EngineError::NotOnSale {
                event: event.clone(),
                why: "closed",
                starts_at: None,
            }),
            // As a purchase after the window (`purchase::check_on_sale`).
            ClaimReply::Ended => Err(EngineError::NotOnSale {
                event: event.clone(),
                why: "ended",
                starts_at: None,
            }),
        }
    }

    /// What became of waiting `position` (`user`'s): offered (with its
    /// token), bought, passed, or not reached yet.
    pub(super) async fn offer_standing(
        &self,
        meta: &EventMeta,
        position: u64,
        user: &UserId,
    ) -> Result<OfferStanding, EngineError> {
        let event = &meta.spec.id;
        let Some((bucket, ticket)) = self.store.offer_at(event, position).await? else {
            return Ok(OfferStanding::Waiting);
        };
        let ticket = self.store.ticket(&bucket, ticket).await?;
        // An open offer is shown only while the sale is: `meta` may be this
        // instance's cached one, still on sale for a moment after another
        // instance closed the event, so the offer is read against the meta
        // as stored (a read for an open offer only, a handful per line).
        let on_sale = match &ticket {
            Some(Ticket::Open(_)) if meta.status == EventStatus::OnSale => {
                self.reload(event).await?.status == EventStatus::OnSale
            }
            _ => false,
        };
        Ok(match ticket {
            Some(Ticket::Open(o)) if on_sale => {
                let key = meta
                    .spec
                    .tokens
                    .as_ref()
                    .and_then(|t| t.keys.first())
                    .ok_or_else(|| StoreError::Protocol(format!("no key for draw {event}")))?;
                OfferStanding::Offered {
                    token: mint_offer(key, event, user, position, o.deadline_ms),
                    deadline_ms: o.deadline_ms,
                }
            }
            Some(Ticket::Taken(_, order)) => OfferStanding::Bought { order },
            Some(Ticket::Passed(_) | Ticket::Open(_)) => OfferStanding::Passed,
            _ => OfferStanding::Waiting,
        })
    }
}
