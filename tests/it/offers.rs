//! The waiting list's offers (the `draw` access mode; docs/DESIGN.md,
//! "Fair drops", "As built (the waiting list)"; docs/API.md, "Draws").
//!
//! On memory, Redis and the 3-master Cluster, each with its ledger: a draw
//! of 100 entrants for 40 units held 60 s; 30% of the winners never pay.
//! Their units are not put back on open sale (a walk-in's token finds the
//! event sold out): they go to the waiting list, offered in line order;
//! offers not bought in time pass to the next users; a cancelled offer's
//! unit goes to the next user too. At the close every unit is bought or
//! leftover (open offers among the leftover), the audit balances, and the
//! database alone agrees: confirmed units + leftover == stock, and every
//! order's status is what its buyer was last told. And a round cut off at
//! each of its steps (before the step ran, or after, its reply lost) is
//! finished by the next: every returned unit offered once, in line order;
//! a claim whose reply was lost answers its order again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use shardstock::control::flusher::{FlushOptions, Flusher};
use shardstock::control::hold_expiry::{ExpiryOptions, sweep_due};
use shardstock::control::lifecycle;
use shardstock::domain::draw::{DrawSpec, OfferStanding, Standing};
use shardstock::domain::ids::{EventId, OrderId, RequestId, UserId};
use shardstock::domain::model::OrderStatus;
use shardstock::domain::token::{TokenAccess, mint};
use shardstock::engine::{EngineError, ManualClock, OfferRefusal, PurchaseRequest, Refusal};
use shardstock::store::Store;
use shardstock::{Engine, EngineOptions};
use tokio_util::sync::CancellationToken;

use crate::harness::faulty::{Faulty, When};
use crate::harness::{event_id, ledger_for, on_every_backend, purchase_final, spec};

on_every_backend!(
    namespace_per_test:
    unpaid_winners_units_go_to_the_line_in_order_and_every_unit_ends_bought_or_leftover,
    an_offer_round_cut_at_any_step_is_finished_by_the_next_and_a_lost_claim_reply_replays,
    an_offer_claimed_after_the_window_ended_buys_nothing_and_one_bought_before_still_answers,
);

const KEY: &str = "offer-key-0123456789abcdef";
const HOLD_S: u32 = 60;
const OFFER_S: u32 = 60;
const STOCK: u64 = 40;
const ENTRANTS: usize = 100;

fn uid(s: &str) -> UserId {
    UserId::parse(s.to_owned()).unwrap()
}

/// `engine.offer_round`, retried while the store fails.
async fn offer_round<S: Store>(engine: &Engine<S>, id: &EventId) -> shardstock::engine::OfferRound {
    for _ in 0..50 {
        match engine.offer_round(id).await {
            Ok(r) => return r,
            Err(EngineError::Store(_)) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => panic!("offer round: {e}"),
        }
    }
    panic!("offer rounds kept failing")
}

/// A waiting user's offer: its token, or what became of it.
async fn offer_of<S: Store>(engine: &Engine<S>, id: &EventId, u: &UserId) -> OfferStanding {
    let s = engine.entry_status(id, u).await.unwrap();
    assert!(
        matches!(s.standing, Standing::Waiting(_)),
        "{u}: {:?}",
        s.standing
    );
    s.offer.expect("a waiting user's offer standing")
}

/// Users `<prefix>0`.. enter, the clock passes the entry window and the
/// draw runs; each winner buys one unit with its token. Returns the
/// winners' orders and the waiting users in line order.
async fn enter_draw_and_buy<S: Store>(
    engine: &Engine<S>,
    clock: &ManualClock,
    id: &EventId,
    prefix: &str,
    users: usize,
) -> (Vec<OrderId>, Vec<UserId>) {
    let users: Vec<UserId> = (0..users).map(|i| uid(&format!("{prefix}{i}"))).collect();
    for u in &users {
        engine.enter(id, u).await.unwrap();
    }
    clock.advance(Duration::from_secs(2));
    engine.draw(id).await.unwrap();
    let mut orders = Vec::new();
    let mut line: Vec<(u64, UserId)> = Vec::new();
    for u in &users {
        let st = engine.entry_status(id, u).await.unwrap();
        match st.standing {
            Standing::Won => {
                let req = PurchaseRequest {
                    event: id.clone(),
                    user: u.clone(),
                    quantity: 1,
                    request_id: Some(RequestId::parse(format!("r-{u}")).unwrap()),
                    access_token: Some(st.token.unwrap().0),
                };
                let o = purchase_final(engine, &req).await.unwrap().result.unwrap();
                orders.push(o.order_id);
            }
            Standing::Waiting(p) => line.push((p, u.clone())),
            other => panic!("{u}: {other:?}"),
        }
    }
    line.sort();
    (orders, line.into_iter().map(|(_, u)| u).collect())
}

fn token_of(o: &OfferStanding) -> String {
    match o {
        OfferStanding::Offered { token, .. } => token.clone(),
        other => panic!("not offered: {other:?}"),
    }
}

async fn unpaid_winners_units_go_to_the_line_in_order_and_every_unit_ends_bought_or_leftover<
    S: Store,
>(
    engine: Engine<S>,
) {
    let ledger = ledger_for(engine.store().kind()).await;
    let clock = ManualClock::starting_now();
    let engine = Arc::new(engine.with_clock(clock.clone().into()));
    let mut flusher = Flusher::new(
        engine.clone(),
        ledger.clone(),
        format!("test-{}", rand::random::<u32>()),
        FlushOptions {
            batch: 500,
            workers: 2,
            idle: Duration::from_millis(10),
            claim_idle_ms: 500,
        },
    );
    let stop = CancellationToken::new();

    // A draw of 100 entrants for 40 units in 4 buckets, held 60 s.
    let id = event_id("offers");
    let mut s = spec(&id, STOCK, 4);
    s.hold_seconds = Some(HOLD_S);
    s.tokens = Some(TokenAccess {
        keys: vec![KEY.to_owned()],
    });
    s.draw = Some(DrawSpec::new(clock.now_ms() + 1_000, None, 1.0, 1, 3_600, OFFER_S).unwrap());
    engine.commit_draw(&mut s).await.unwrap();
    lifecycle::create(&engine, &ledger, s).await.unwrap();
    let users: Vec<UserId> = (0..ENTRANTS).map(|i| uid(&format!("w{i}"))).collect();
    for u in &users {
        assert!(engine.enter(&id, u).await.unwrap());
    }
    clock.advance(Duration::from_secs(2));
    let drawn = engine.draw(&id).await.unwrap();
    assert_eq!(drawn.winners, Some(STOCK));

    // Who won, and the line in order.
    let mut winners: Vec<(UserId, String)> = Vec::new();
    let mut line: Vec<(u64, UserId)> = Vec::new();
    for u in &users {
        let st = engine.entry_status(&id, u).await.unwrap();
        match st.standing {
            Standing::Won => winners.push((u.clone(), st.token.unwrap().0)),
            Standing::Waiting(p) => {
                assert_eq!(st.offer, Some(OfferStanding::Waiting), "{u}");
                line.push((p, u.clone()));
            }
            other => panic!("{u}: {other:?}"),
        }
    }
    line.sort();
    let line: Vec<UserId> = line.into_iter().map(|(_, u)| u).collect();
    assert_eq!((winners.len(), line.len()), (40, 60));

    // Every winner buys its unit, held; 70% pay, 30% never do.
    let mut told: HashMap<OrderId, OrderStatus> = HashMap::new();
    let mut held = Vec::new();
    for (u, token) in &winners {
        let req = PurchaseRequest {
            event: id.clone(),
            user: u.clone(),
            quantity: 1,
            request_id: Some(RequestId::parse(format!("r-{u}")).unwrap()),
            access_token: Some(token.clone()),
        };
        let order = purchase_final(&engine, &req).await.unwrap().result.unwrap();
        assert_eq!(order.status, Some(OrderStatus::Held));
        held.push(order.order_id);
    }
    let (paying, unpaid) = held.split_at(28);
    for o in paying {
        let c = engine.confirm(o.as_str()).await.unwrap();
        assert!(c.result.is_ok());
        told.insert(o.clone(), OrderStatus::Confirmed);
    }
    clock.advance(Duration::from_secs(u64::from(HOLD_S) + 1));
    let expired = sweep_due(&engine, &ExpiryOptions::default(), 64)
        .await
        .unwrap();
    assert_eq!(expired, 12);
    for o in unpaid {
        assert_eq!(
            engine.order(o.as_str()).await.unwrap().status,
            OrderStatus::Expired
        );
        told.insert(o.clone(), OrderStatus::Expired);
    }

    // Not on open sale: nothing remains (12 units wait for the line, not
    // sold), and a walk-in with a good token finds the event sold out.
    let view = engine.view(&id).await.unwrap();
    assert_eq!((view.remaining, view.waiting, view.sold), (0, 12, 28));
    let walk_in = PurchaseRequest {
        event: id.clone(),
        user: uid("walk-in"),
        quantity: 1,
        request_id: Some(RequestId::parse("r-walk-in".to_owned()).unwrap()),
        access_token: Some(mint(KEY, &id, "walk-in", 1, clock.now_ms() / 1000 + 3_600)),
    };
    let refused = purchase_final(&engine, &walk_in).await.unwrap().result;
    assert!(
        matches!(refused, Err(Refusal::SoldOut { .. })),
        "{refused:?}"
    );

    // The 12 units go to the first 12 in line, in order; the 13th waits.
    let round = offer_round(&engine, &id).await;
    assert_eq!((round.made, round.passed, round.to_sale), (12, 0, 0));
    assert_eq!(
        offer_round(&engine, &id).await.made,
        0,
        "each unit offered once"
    );
    let mut tokens = Vec::new();
    for u in &line[..12] {
        tokens.push(token_of(&offer_of(&engine, &id, u).await));
    }
    assert_eq!(
        offer_of(&engine, &id, &line[12]).await,
        OfferStanding::Waiting
    );

    // Another user's offer token is refused; the first 8 buy, one twice.
    let stolen = engine.claim_offer(&id, &line[2], &tokens[1]).await;
    assert!(
        matches!(
            stolen,
            Err(EngineError::OfferRefused {
                why: OfferRefusal::InvalidToken,
                ..
            })
        ),
        "{stolen:?}"
    );
    let mut bought = Vec::new();
    for (u, t) in line[..8].iter().zip(&tokens) {
        let (order, replay) = engine.claim_offer(&id, u, t).await.unwrap();
        assert!(!replay);
        assert_eq!((order.status, order.quantity), (OrderStatus::Confirmed, 1));
        told.insert(order.order_id.clone(), OrderStatus::Confirmed);
        bought.push(order.order_id);
    }
    let (again, replay) = engine.claim_offer(&id, &line[0], &tokens[0]).await.unwrap();
    assert!(replay);
    assert_eq!(again.order_id, bought[0], "a retry answers the same order");
    assert_eq!(
        offer_of(&engine, &id, &line[0]).await,
        OfferStanding::Bought {
            order: bought[0].to_string()
        }
    );

    // The other 4 let their deadline pass: their units go to the next 4.
    clock.advance(Duration::from_secs(u64::from(OFFER_S) + 1));
    let round = offer_round(&engine, &id).await;
    assert_eq!((round.made, round.passed, round.to_sale), (4, 4, 0));
    for u in &line[8..12] {
        assert_eq!(offer_of(&engine, &id, u).await, OfferStanding::Passed);
    }
    let late = engine.claim_offer(&id, &line[8], &tokens[8]).await;
    assert!(
        matches!(
            late,
            Err(EngineError::OfferRefused {
                why: OfferRefusal::Passed,
                ..
            })
        ),
        "{late:?}"
    );
    let mut next = Vec::new();
    for u in &line[12..16] {
        next.push(token_of(&offer_of(&engine, &id, u).await));
    }
    assert_eq!(
        offer_of(&engine, &id, &line[16]).await,
        OfferStanding::Waiting
    );
    for (u, t) in line[12..14].iter().zip(&next) {
        let (order, _) = engine.claim_offer(&id, u, t).await.unwrap();
        told.insert(order.order_id.clone(), OrderStatus::Confirmed);
        bought.push(order.order_id);
    }

    // A bought offer cancelled: its unit goes to the next in line (#17),
    // not to open sale.
    let cancelled = engine.cancel(bought[1].as_str()).await.unwrap();
    assert_eq!(cancelled.order.status, OrderStatus::Cancelled);
    told.insert(bought[1].clone(), OrderStatus::Cancelled);
    assert_eq!(engine.view(&id).await.unwrap().remaining, 0);
    let round = offer_round(&engine, &id).await;
    assert_eq!((round.made, round.passed), (1, 0));
    let t17 = token_of(&offer_of(&engine, &id, &line[16]).await);
    let (order, _) = engine.claim_offer(&id, &line[16], &t17).await.unwrap();
    told.insert(order.order_id.clone(), OrderStatus::Confirmed);

    // The close: #15 and #16 hold open offers, leftover with nothing else.
    // Another instance, its meta cached on sale, shows them passed after it.
    let other = Engine::new(engine.store().clone(), EngineOptions::default())
        .with_clock(clock.clone().into());
    assert!(matches!(
        offer_of(&other, &id, &line[14]).await,
        OfferStanding::Offered { .. }
    ));
    let view = lifecycle::close(&engine, &ledger, &mut flusher, &id, &stop)
        .await
        .unwrap();
    assert_eq!((view.status, view.leftover), ("closed", Some(2)));
    assert_eq!(
        offer_of(&other, &id, &line[14]).await,
        OfferStanding::Passed,
        "an open offer after the close, read through a cached meta"
    );
    let closed = engine.claim_offer(&id, &line[14], &next[2]).await;
    assert!(closed.is_err(), "a closed sale sells no offer: {closed:?}");
    // A bought offer's retry after the close still answers its order.
    let (after, replay) = engine.claim_offer(&id, &line[0], &tokens[0]).await.unwrap();
    assert!(replay);
    assert_eq!(after.order_id, bought[0], "a retry after the close");
    let audit = shardstock::control::audit::audit(&engine, &ledger, &id)
        .await
        .unwrap();
    assert!(audit.balanced, "{audit:?}");
    assert_eq!(audit.leftover, 2);

    // The database alone: 38 confirmed units + 2 leftover == 40, and every
    // order as its buyer was last told.
    let sale = crate::harness::oracle::closed_sale(&ledger, &id, STOCK).await;
    assert!(sale.broken.is_empty(), "{:#?}", sale.broken);
    let confirmed: u32 = sale
        .orders
        .values()
        .filter(|o| o.status == OrderStatus::Confirmed)
        .map(|o| o.quantity)
        .sum();
    assert_eq!(confirmed, 38);
    assert_eq!(sale.orders.len(), told.len());
    for (order, status) in &told {
        assert_eq!(sale.orders[order.as_str()].status, *status, "{order}");
    }
}

async fn an_offer_round_cut_at_any_step_is_finished_by_the_next_and_a_lost_claim_reply_replays<
    S: Store,
>(
    engine: Engine<S>,
) {
    let ledger = ledger_for(engine.store().kind()).await;
    let clock = ManualClock::starting_now();
    let faulty = Faulty::plain(engine.store().clone());
    let engine = Arc::new(engine.with_clock(clock.clone().into()));
    let cut =
        Engine::new(faulty.clone(), EngineOptions::default()).with_clock(clock.clone().into());

    // 8 units, 20 entrants: 8 winners buy (no holds), 12 wait.
    let id = event_id("offcut");
    let mut s = spec(&id, 8, 2);
    s.tokens = Some(TokenAccess {
        keys: vec![KEY.to_owned()],
    });
    s.draw = Some(DrawSpec::new(clock.now_ms() + 1_000, None, 1.0, 1, 3_600, OFFER_S).unwrap());
    engine.commit_draw(&mut s).await.unwrap();
    lifecycle::create(&engine, &ledger, s).await.unwrap();
    let (orders, line) = enter_draw_and_buy(&engine, &clock, &id, "c", 20).await;
    assert_eq!((orders.len(), line.len()), (8, 12));

    // Each cut: one unit comes back, the round dies at the step, the next
    // round (healed) offers it to the next position; nothing twice.
    let cuts = [
        ("pass_offers", When::Before),
        ("reserve_offers", When::Before),
        ("reserve_offers", When::After),
        ("assign_offer", When::Before),
        ("assign_offer", When::After),
        ("open_offer", When::Before),
        ("open_offer", When::After),
    ];
    for (k, (step, when)) in cuts.into_iter().enumerate() {
        engine.cancel(orders[k].as_str()).await.unwrap();
        faulty.arm(step, faulty.calls(step) + 1, when);
        let died = cut.offer_round(&id).await;
        assert!(
            died.is_err(),
            "{step} {when:?}: the armed step cut the round"
        );
        faulty.heal();
        offer_round(&cut, &id).await;
        assert_eq!(offer_round(&engine, &id).await.made, 0, "{step} {when:?}");
        for u in &line[..=k] {
            let o = offer_of(&engine, &id, u).await;
            assert!(
                matches!(o, OfferStanding::Offered { .. }),
                "{step} {when:?}: {u} {o:?}"
            );
        }
        assert_eq!(
            offer_of(&engine, &id, &line[k + 1]).await,
            OfferStanding::Waiting,
            "{step} {when:?}: one offer per unit"
        );
    }
    assert_eq!(engine.view(&id).await.unwrap().remaining, 0);

    // A claim whose reply is lost: the retry answers the order it bought.
    let token = token_of(&offer_of(&engine, &id, &line[0]).await);
    faulty.arm("claim_offer", faulty.calls("claim_offer") + 1, When::After);
    assert!(cut.claim_offer(&id, &line[0], &token).await.is_err());
    faulty.heal();
    let (order, replay) = cut.claim_offer(&id, &line[0], &token).await.unwrap();
    assert!(replay, "the first call bought it");
    assert_eq!(
        engine.order(order.order_id.as_str()).await.unwrap().status,
        OrderStatus::Confirmed
    );
    assert_eq!(
        offer_of(&engine, &id, &line[0]).await,
        OfferStanding::Bought {
            order: order.order_id.to_string()
        }
    );
}

/// The sale window's end holds for a waiting list's offer as for a
/// purchase: a claim at or after `ends_at` buys nothing (not on sale,
/// "ended"), though the offer is open still; a claim that bought before
/// answers its order.
async fn an_offer_claimed_after_the_window_ended_buys_nothing_and_one_bought_before_still_answers<
    S: Store,
>(
    engine: Engine<S>,
) {
    let ledger = ledger_for(engine.store().kind()).await;
    let clock = ManualClock::starting_now();
    let engine = engine.with_clock(clock.clone().into());

    // 2 units, 6 entrants: 2 winners buy and cancel, the first two in line
    // are offered their units for an hour; the window ends in half of it.
    let id = event_id("offend");
    let mut s = spec(&id, 2, 1);
    s.tokens = Some(TokenAccess {
        keys: vec![KEY.to_owned()],
    });
    s.draw = Some(DrawSpec::new(clock.now_ms() + 1_000, None, 1.0, 1, 3_600, 3_600).unwrap());
    s.ends_at = Some(clock.now_ms() + 30 * 60_000);
    engine.commit_draw(&mut s).await.unwrap();
    lifecycle::create(&engine, &ledger, s).await.unwrap();
    let (orders, line) = enter_draw_and_buy(&engine, &clock, &id, "e", 6).await;
    for o in &orders {
        engine.cancel(o.as_str()).await.unwrap();
    }
    assert_eq!(line.len(), 4);
    assert_eq!(offer_round(&engine, &id).await.made, 2);
    let tokens = [
        token_of(&offer_of(&engine, &id, &line[0]).await),
        token_of(&offer_of(&engine, &id, &line[1]).await),
    ];
    let (bought, replay) = engine.claim_offer(&id, &line[0], &tokens[0]).await.unwrap();
    assert!(!replay, "bought within the window");

    clock.advance(Duration::from_secs(31 * 60));
    let late = engine.claim_offer(&id, &line[1], &tokens[1]).await;
    assert!(
        matches!(late, Err(EngineError::NotOnSale { why: "ended", .. })),
        "a claim after the window: {late:?}"
    );
    assert!(
        matches!(
            offer_of(&engine, &id, &line[1]).await,
            OfferStanding::Offered { .. }
        ),
        "nothing bought: the offer is as it was"
    );
    let (again, replay) = engine.claim_offer(&id, &line[0], &tokens[0]).await.unwrap();
    assert!(
        replay,
        "a retry after the window answers the order it bought"
    );
    assert_eq!(again.order_id, bought.order_id);
}
