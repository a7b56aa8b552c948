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
//! And from the store ("no token consumed without its order, nor an order
//! without its token"): in the event's last layout each user's home counts
//! as bought (`u:<id>`, summed over the user's tokens) exactly the units of
//! that user's orders in the database; in every layout no reservation
//! (`r:<id>`) and no pending saga's link to its token is left.

use std::collections::HashMap;

use shardstock::Engine;
use shardstock::domain::token::{TokenRefusal, token_user};
use shardstock::store::Store;

use super::log::Answer;
use super::plan::{Carry, Plan, USERS};
use super::rig::Rig;
use super::settle::{QUIET_ALLOWANCE, Violations};
use crate::harness::faulty::Faulty;
use crate::harness::oracle;

const CHECK: &str = "tokens";

impl<S: Store> Rig<S> {
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
            // A draw's loser carries no token of its own (nor another's,
            // when its neighbour lost).
            let reason = match (carry, sent.req.access_token.is_some()) {
                (_, false) | (Carry::Missing, _) => Some(TokenRefusal::Missing),
                (Carry::Own, true) => None,
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
                for a in sent.answers() {
                    match a {
                        // Refused before the limit and the stock are read.
                        Answer::Bought(..) | Answer::Refused(_) => v.push((
                            CHECK,
                            format!("{rid} carried {carry:?}, yet was answered {a:?}"),
                        )),
                        Answer::TokenRefused(why) if *why != reason => v.push((
                            CHECK,
                            format!("{rid} carried {carry:?}, refused {why:?} (not {reason:?})"),
                        )),
                        _ => {}
                    }
                }
                continue;
            }
            let expires = expiry_ms(user);
            for (i, r) in sent.replies.iter().enumerate() {
                match &r.answer {
                    Answer::TokenRefused(why) => {
                        let owns = *why == TokenRefusal::Used
                            || (*why == TokenRefusal::Expired && expires.is_some());
                        if !owns {
                            v.push((
                                CHECK,
                                format!("{rid} carried its own token, refused {why:?}"),
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
