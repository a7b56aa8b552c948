//! A token schedule's answers and tokens, held against the database and
//! the store once the sale is closed (check `tokens`).
//!
//! What a purchase carried is logged by request id (`Log::carried`). From
//! the database alone (`harness::oracle`) and the log:
//! - a request that carried another user's, a forged, an expired or no
//!   token (a draw's loser has none) has no order and was never answered 201 nor refused for anything
//!   but its token (checked before the limit and the stock), whose
//!   refusal names its reason (other user, invalid, expired, missing);
//! - a request with its own token is refused for it only as spent, or as
//!   expired when its token expires in the schedule; a fresh 201 was not
//!   sent after that expiry;
//! - a token refusal is true: no order of the request was taken before the
//!   call (a replay answers its record before any token check), and an
//!   order of a request once refused for its token was bought by a later
//!   fresh purchase of it (the store keeps no record of a token refusal,
//!   so a retry may buy once a sold-out saga gave a reservation back);
//! - per user (a draw's loser: allowance 0), the units of all their orders, whatever became of them, are
//!   at most the token's allowance: a cancelled order or an expired hold
//!   does not give its units back to the token (docs/DESIGN.md, "As built
//!   (the `token` access mode)"), nor does a close.
//!
//! Half the token events that are not draw events rotate their keys
//! mid-sale ([`Rig::rotate_op`]: `[k0, k1]` to `[new, k0]`), and some
//! purchases carry their own token signed with the new key. A token of the
//! retired key is refused as invalid, and buys nothing afresh, in every
//! call sent once every engine read the rotation (a replay still answers
//! the request's record), and a token of the new key in every call
//! answered before the rotation was sent; a token of a live key is never
//! refused as invalid. Between
//! the two (the rotation sent, not yet read by every engine) either answer
//! is true.
//!
//! And from the store ("no token consumed without its order, nor an order
//! without its token"): in the event's last layout each user's home counts
//! as bought (`t:<id>` less `r:<id>`, summed over the user's tokens)
//! exactly the units of that user's orders in the database; in every layout
//! no reservation (`r:<id>`) and no pending saga's link to its token is left.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use shardstock::domain::model::EventStatus;
use shardstock::domain::token::{TokenRefusal, token_user};
use shardstock::store::Store;
use shardstock::{Engine, EngineError};

use super::client::maybe_crash;
use super::log::{Answer, Reply};
use super::plan::{Carry, KeyFate, Plan, USERS};
use super::rig::Rig;
use super::settle::{QUIET_ALLOWANCE, Violations};
use crate::harness::faulty::Faulty;
use crate::harness::oracle;

const CHECK: &str = "tokens";
/// Calls of a rotation, or of one engine's refresh, before the schedule
/// gives up on it (each fails at the fault rate, at most 6%).
const ATTEMPTS: usize = 30;

/// A key rotation that applied: when it was first sent, and when every
/// engine had read it (`None`: some engine's refresh never answered).
#[derive(Debug, Clone, Copy)]
pub struct Rotation {
    pub sent_ms: i64,
    pub read_ms: Option<i64>,
}

impl Rotation {
    /// Whether a token whose key has `fate` is valid for its key in a call
    /// sent at `sent_ms` and answered at `answered_ms`: `None` while the
    /// rotation may or may not have reached the call's engine.
    fn key_valid(
        rotation: Option<&Self>,
        fate: KeyFate,
        (sent_ms, answered_ms): (i64, i64),
    ) -> Option<bool> {
        let before = rotation.is_none_or(|r| answered_ms < r.sent_ms);
        // Strictly: the clock counts whole milliseconds.
        let after = rotation.is_some_and(|r| r.read_ms.is_some_and(|at| sent_ms > at));
        match fate {
            KeyFate::Unchanged => Some(true),
            KeyFate::Retired if before => Some(true),
            KeyFate::Added if before => Some(false),
            KeyFate::Retired if after => Some(false),
            KeyFate::Added if after => Some(true),
            KeyFate::Retired | KeyFate::Added => None,
        }
    }
}

impl<S: Store> Rig<S> {
    /// `Op::Rotate`: the rotation through the actor's engine (perhaps
    /// dropped, or failing before or after it applied), sent again until
    /// the store holds the new keys or the event closed; then every
    /// engine's refresh (the draw timer's tick), each again until it
    /// answers. Logged once it applied.
    pub(super) async fn rotate_op(&self, engine: &Arc<Engine<Faulty<S>>>, crash: Option<Duration>) {
        let keys = Plan::rotated_keys();
        let sent_ms = self.clock.now_ms();
        let mut crash = crash;
        let mut applied = false;
        for _ in 0..ATTEMPTS {
            let call = engine.rotate_token_keys(&self.id, keys.clone());
            if let Some(Err(EngineError::NotOnSale { .. })) = maybe_crash(crash.take(), call).await
            {
                self.tally("rotate refused: closed");
                return;
            }
            // Whatever the call answered, the store tells whether it applied.
            match engine.store().inner().load_meta(&self.id).await {
                Ok(Some(m)) if m.spec.tokens.as_ref() == Some(&keys) => {
                    applied = true;
                    break;
                }
                Ok(Some(m)) if m.status == EventStatus::Closed => {
                    self.tally("rotate refused: closed");
                    return;
                }
                _ => {}
            }
        }
        if !applied {
            self.tally("rotate failed");
            return;
        }
        let mut read = true;
        for e in &self.engines {
            let mut attempts = 0;
            while e.refresh_token_keys().await.is_err() {
                attempts += 1;
                if attempts == ATTEMPTS {
                    read = false;
                    break;
                }
            }
        }
        let read_ms = read.then(|| self.clock.now_ms());
        self.tally(if read { "rotate read" } else { "rotate unread" });
        self.log.lock().unwrap().rotation = Some(Rotation { sent_ms, read_ms });
    }

    /// The settling engine reads a rotation too, before its first call:
    /// it is an instance like the others.
    pub(super) async fn refresh_settler(&self, plain: &Engine<Faulty<S>>) {
        if self.log.lock().unwrap().rotation.is_some() {
            plain
                .refresh_token_keys()
                .await
                .expect("the settling engine's store has no faults");
        }
    }

    /// The check `tokens` (module docs); nothing on an open event.
    pub(super) async fn check_tokens(&self, plain: &Engine<Faulty<S>>, v: &mut Violations) {
        let Some(tokens) = &self.plan.tokens else {
            return;
        };
        let sale = oracle::closed_sale(&self.ledger, &self.id, self.plan.spec.stock).await;
        let log = self.log.lock().unwrap().clone();
        let mut spent: HashMap<String, u64> = HashMap::new();
        let mut by_request: HashMap<(&str, &str), Vec<(i64, u32)>> = HashMap::new();
        // A waiting list's offer's order spends no access token (the check
        // `offers` holds them against the claims).
        let claimed = log.offers.claimed();
        for o in sale.orders.values() {
            if claimed.contains(o.order_id.as_str()) {
                continue;
            }
            *spent.entry(o.user_id.to_string()).or_default() += u64::from(o.quantity);
            if let Some(rid) = o.request_id.as_deref() {
                by_request
                    .entry((o.user_id.as_str(), rid))
                    .or_default()
                    .push((o.created_at.unwrap_or(i64::MAX), o.quantity));
            }
        }
        // Each schedule user's token expiry (unix ms), if within the schedule.
        let expiry_ms = |user: &str| -> Option<i64> {
            let i = (0..USERS).find(|&i| Plan::user(i) == user)?;
            tokens.expires_after[i].map(|s| (tokens.start_s + s) * 1000)
        };
        for rid in &log.order {
            let sent = &log.sent[rid];
            let user = sent.req.user.as_str();
            let carry = log.carried.get(rid).copied().unwrap_or(Carry::Own);
            let orders = by_request
                .get(&(user, rid.as_str()))
                .cloned()
                .unwrap_or_default();
            let fate = (0..USERS)
                .find(|&i| Plan::user(i) == user)
                .map_or(KeyFate::Unchanged, |i| self.plan.key_fate(i, carry));
            let key_valid = |r: &Reply| {
                Rotation::key_valid(log.rotation.as_ref(), fate, (r.sent_ms, r.answered_ms))
            };
            // A draw's loser carries no token of its own (nor another's,
            // when its neighbour lost).
            let reason = match (carry, sent.req.access_token.is_some()) {
                (_, false) | (Carry::Missing, _) => Some(TokenRefusal::Missing),
                (Carry::Own | Carry::Rotated, true) => None,
                (Carry::Theirs, true) => Some(TokenRefusal::OtherUser),
                (Carry::Forged, true) => Some(TokenRefusal::Invalid),
                (Carry::Expired, true) => Some(TokenRefusal::Expired),
            };
            if let Some(reason) = reason {
                if !orders.is_empty() {
                    v.push((
                        CHECK,
                        format!("{rid} carried {carry:?}, yet has orders {orders:?}"),
                    ));
                }
                for r in &sent.replies {
                    // The signature is checked first: a key not (yet) valid
                    // makes any token invalid.
                    let valid = key_valid(r);
                    match &r.answer {
                        // Refused before the limit and the stock are read.
                        a @ (Answer::Bought(..) | Answer::Refused(_)) => v.push((
                            CHECK,
                            format!("{rid} carried {carry:?}, yet was answered {a:?}"),
                        )),
                        Answer::TokenRefused(why)
                            if !match valid {
                                Some(true) => *why == reason,
                                Some(false) => *why == TokenRefusal::Invalid,
                                None => *why == reason || *why == TokenRefusal::Invalid,
                            } =>
                        {
                            v.push((
                                CHECK,
                                format!(
                                    "{rid} carried {carry:?} ({fate:?} key, valid {valid:?}), \
                                     refused {why:?} (not {reason:?})"
                                ),
                            ))
                        }
                        _ => {}
                    }
                }
                continue;
            }
            let expires = expiry_ms(user);
            for (i, r) in sent.replies.iter().enumerate() {
                let valid = key_valid(r);
                match &r.answer {
                    Answer::TokenRefused(why) => {
                        let owns = match valid {
                            Some(false) => *why == TokenRefusal::Invalid,
                            _ => {
                                *why == TokenRefusal::Used
                                    || (*why == TokenRefusal::Expired && expires.is_some())
                                    || (*why == TokenRefusal::Invalid && valid.is_none())
                            }
                        };
                        if !owns {
                            v.push((
                                CHECK,
                                format!(
                                    "{rid} carried its own token ({fate:?} key, valid \
                                     {valid:?} at {} ms), refused {why:?}",
                                    r.sent_ms
                                ),
                            ));
                        }
                        if let Some(earlier) = orders.iter().find(|(at, _)| *at < r.sent_ms) {
                            v.push((
                                CHECK,
                                format!(
                                    "{rid}: a call sent at {} ms refused {why:?}, yet its order \
                                     of {} units was taken at {} ms",
                                    r.sent_ms, earlier.1, earlier.0
                                ),
                            ));
                        }
                        let bought_later = sent.replies[i + 1..].iter().any(|l| l.fresh);
                        if !orders.is_empty() && !bought_later {
                            v.push((
                                CHECK,
                                format!(
                                    "{rid} refused {why:?}, and no later purchase of it bought, \
                                     yet it has orders {orders:?}"
                                ),
                            ));
                        }
                    }
                    // Bought afresh, not a replay of its record (a refusal
                    // over the limit is kept too, and answered before the
                    // token is checked: it may follow a lost answer).
                    Answer::Bought(..) if r.fresh && valid == Some(false) => v.push((
                        CHECK,
                        format!(
                            "{rid} carried its own token of the {fate:?} key in a call sent at {} \
                             ms (rotation {:?}), yet bought",
                            r.sent_ms, log.rotation
                        ),
                    )),
                    Answer::Bought(..) if r.fresh && expires.is_some_and(|e| r.sent_ms >= e) => v
                        .push((
                            CHECK,
                            format!(
                                "{rid} bought afresh in a call sent at {} ms, after its token \
                                 expired at {:?} ms",
                                r.sent_ms, expires
                            ),
                        )),
                    _ => {}
                }
            }
        }
        for (user, units) in &spent {
            let allowance = (0..USERS)
                .find(|&i| Plan::user(i) == *user)
                .map_or(QUIET_ALLOWANCE, |i| tokens.allowance[i]);
            if *units > u64::from(allowance) {
                v.push((
                    CHECK,
                    format!("{user}'s orders hold {units} units, over its token's {allowance}"),
                ));
            }
        }
        self.check_token_records(plain, &spent, v).await;
    }

    /// The store's token records against `spent` (units of each user's
    /// orders in the database): see the module docs.
    async fn check_token_records(
        &self,
        plain: &Engine<Faulty<S>>,
        spent: &HashMap<String, u64>,
        v: &mut Violations,
    ) {
        let meta = match plain.reload(&self.id).await {
            Ok(m) => m,
            Err(e) => {
                v.push((CHECK, format!("the event's meta could not be read: {e}")));
                return;
            }
        };
        let store = plain.store().inner();
        let mut used: HashMap<String, u64> = HashMap::new();
        for b in meta.all_buckets() {
            let last = b.generation == meta.generation;
            let contents = match store.contents(&b).await {
                Ok(c) => c,
                // An older layout may be gone (pruned); the last one is not.
                Err(e) if last => {
                    v.push((CHECK, format!("bucket {}: contents: {e}", b.tag())));
                    continue;
                }
                Err(_) => continue,
            };
            if !contents.reserved.is_empty() || contents.token_sagas > 0 {
                v.push((
                    CHECK,
                    format!(
                        "bucket {} (layout {}) still reserves {:?} for {} sagas after the close",
                        b.index, b.generation, contents.reserved, contents.token_sagas
                    ),
                ));
            }
            if !last {
                continue;
            }
            for (id, units) in contents.tokens {
                match token_user(&id) {
                    Some(u) => *used.entry(u.to_string()).or_default() += units,
                    None => v.push((CHECK, format!("a token record {id:?} names no user"))),
                }
            }
        }
        let mut users: Vec<&String> = used.keys().chain(spent.keys()).collect();
        users.sort();
        users.dedup();
        for user in users {
            let (store_units, db_units) = (
                used.get(user).copied().unwrap_or(0),
                spent.get(user).copied().unwrap_or(0),
            );
            if store_units != db_units {
                v.push((
                    CHECK,
                    format!(
                        "{user}: the store counts {store_units} units bought with its token, \
                         its orders in the database hold {db_units}"
                    ),
                ));
            }
        }
    }
}
