//! The steps of clients, sagas' drivers and the sweeper: each model action
//! one store step, its reply held against the model's answer (what the
//! client was told, whether the saga started, ended, took, gave back, which
//! order the sweep expired).

use shardstock::domain::model::RequestRecord;
use shardstock::store::{
    CancelReply, ConfirmReply, Finish, FinishArgs, FinishReply, PurchaseEntry, PurchaseReply,
    Store, TakeReply,
};
use shardstock_model::state::{Marker, State, Told};
use shardstock_model::steps::{Action, Outcome};

use super::draw::HOLD_MS;
use super::driver::Replay;

/// Takes a client's, a driver's or the sweeper's `action`; the replies
/// that disagree with the model.
pub async fn step<S: Store>(
    replay: &mut Replay<'_, S>,
    action: Action,
    before: &State,
    after: &State,
) -> Vec<String> {
    let mut problems = Vec::new();
    let now = replay.clock.now();
    let store = replay.engine.store();
    match action {
        Action::Purchase(r) => {
            let r = r as usize;
            let u = replay.model.user(r);
            let home = replay.model.home(before.meta.generation, u);
            let entry = PurchaseEntry {
                user: replay.users[u].clone(),
                qty: 1,
                limit: replay.model.bounds.limit.map_or(0, u32::from),
                rid: replay.rids[r].clone(),
                keep: true,
                order_id: replay.orders[r].clone(),
                pay_by: Some(now + HOLD_MS),
                token: None,
            };
            let reply = store.purchase(&replay.bucket(home), now, &[entry]).await;
            let told = match &reply {
                Ok(replies) => match replies.as_slice() {
                    [PurchaseReply::Bought { .. }] => Told::Bought,
                    [PurchaseReply::LimitExceeded { .. }] => Told::Limit,
                    [PurchaseReply::Pending { .. }] => Told::None,
                    // A replay answers the record's outcome.
                    [PurchaseReply::Replay(record)] => match record {
                        RequestRecord::Bought { .. } => Told::Bought,
                        RequestRecord::SoldOut { .. } => Told::SoldOut,
                        RequestRecord::LimitExceeded { .. } => Told::Limit,
                        RequestRecord::Pending { .. } => Told::None,
                    },
                    _ => Told::TryAgain,
                },
                Err(_) => Told::TryAgain,
            };
            let pending = matches!(reply.as_deref(), Ok([PurchaseReply::Pending { .. }]));
            if told != after.told[r] || pending != after.saga[r].is_some() {
                problems.push(format!(
                    "purchase answered {reply:?}; the model told {:?} (saga: {:?})",
                    after.told[r], after.saga[r]
                ));
            }
        }
        Action::Take(r, j) => {
            let (r, j) = (r as usize, j as usize);
            let g = before.saga[r].expect("a saga");
            let home = replay.model.home(g, replay.model.user(r));
            let args = replay.take_args(r, u32::from(before.buckets[home].index));
            let reply = store.take(&replay.bucket(j), now, &args).await;
            let taken = matches!(reply, Ok(TakeReply::Taken { .. }));
            let expected = after.buckets[j].markers[r] == Marker::Taken;
            if taken != expected {
                problems.push(format!(
                    "take answered {reply:?}; the model took: {expected}"
                ));
            }
        }
        Action::Finish(r, outcome) => {
            let r = r as usize;
            let g = before.saga[r].expect("a saga");
            let home = replay.model.home(g, replay.model.user(r));
            let outcome = match outcome {
                Outcome::Bought => {
                    let j = replay
                        .model
                        .layout(g)
                        .find(|&j| before.buckets[j].markers[r] == Marker::Taken)
                        .expect("a take");
                    Finish::Bought {
                        order_id: replay.orders[r].clone(),
                        bucket: u32::from(before.buckets[j].index),
                        probes: 1,
                    }
                }
                Outcome::SoldOut => Finish::SoldOut { remaining: 0 },
                Outcome::Abort => Finish::Abort,
            };
            let args = FinishArgs {
                rid: replay.rids[r].clone(),
                order_id: replay.orders[r].clone(),
                user: replay.user_of(r).clone(),
                qty: 1,
                keep: true,
                limited: replay.model.bounds.limit.is_some(),
                outcome,
                pay_by: Some(replay.clock.deadline(r)),
                tokens: false,
            };
            let reply = store.finish(&replay.bucket(home), now, &args).await;
            if !matches!(reply, Ok(FinishReply::Done)) {
                problems.push(format!(
                    "finish answered {reply:?}; the model ended the saga"
                ));
            }
        }
        Action::Untake(r, j) => {
            let (r, j) = (r as usize, j as usize);
            let g = before.saga[r].expect("a saga");
            let home = replay.model.home(g, replay.model.user(r));
            let args = replay.take_args(r, u32::from(before.buckets[home].index));
            let reply = store.untake(&replay.bucket(j), now, &args).await;
            if !matches!(reply, Ok(true)) {
                problems.push(format!("untake answered {reply:?}; the model gave back"));
            }
        }
        Action::Due(_) => {}
        Action::Expire(b, o) => {
            let o = o as usize;
            let at = replay.clock.deadline(o);
            let reply = store
                .expire_holds(&replay.bucket(b as usize), at, 512, false)
                .await;
            let expired: Vec<Option<usize>> = match &reply {
                Ok(r) => r
                    .expired
                    .iter()
                    .map(|(oid, _)| replay.order_index(oid.as_str()))
                    .collect(),
                Err(_) => vec![None],
            };
            let expected = if after.ledger[o].e > before.ledger[o].e {
                vec![Some(o)]
            } else {
                vec![]
            };
            if expired != expected {
                problems.push(format!(
                    "the sweep answered {reply:?}; the model expired {expected:?}"
                ));
            }
        }
        Action::Confirm(o) => {
            let o = o as usize;
            let home = replay
                .model
                .home(before.meta.generation, replay.model.user(o));
            let at = if before.due[o] {
                replay.clock.deadline(o)
            } else {
                now
            };
            let reply = store
                .confirm(&replay.bucket(home), at, &replay.orders[o])
                .await;
            let told = match &reply {
                Ok(ConfirmReply::Confirmed(_) | ConfirmReply::AlreadyConfirmed(_)) => {
                    Told::Confirmed
                }
                Ok(ConfirmReply::Expired { .. }) => Told::Expired,
                Ok(ConfirmReply::Cancelled(_)) => Told::Cancelled,
                _ => Told::None,
            };
            if told != after.paid[o] {
                problems.push(format!(
                    "confirm answered {reply:?}; the model told {:?}",
                    after.paid[o]
                ));
            }
        }
        Action::Cancel(o) => {
            let o = o as usize;
            let home = replay
                .model
                .home(before.meta.generation, replay.model.user(o));
            let reply = store
                .cancel(&replay.bucket(home), now, &replay.orders[o])
                .await;
            let cancelled = matches!(reply, Ok(CancelReply::Cancelled(_)));
            let expected = after.ledger[o].c > before.ledger[o].c;
            if cancelled != expected {
                problems.push(format!(
                    "cancel answered {reply:?}; the model cancelled: {expected}"
                ));
            }
        }
        other => unreachable!("{other:?} is an engine's"),
    }
    problems
}
