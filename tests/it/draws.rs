//! Fair drops' draw: the `draw` access mode (docs/DESIGN.md, "Fair drops";
//! docs/API.md, "Draws"). Users enter in a window; the draw orders them by
//! `SHA-256(seed ‖ user)` under a seed committed at creation and revealed
//! after; winners buy with the tokens it gives them (token purchases).
//!
//! On memory, Redis and the Cluster: 100,000 entries entered concurrently and again (idempotent), entries refused
//! once the window closed, two draws at once and a third agreeing, the
//! draw recomputed here from the revealed seed and the listed entrants,
//! and the winners buying at full concurrency, with replays, other users'
//! and forged tokens refused. Over HTTP: every endpoint, each refusal by
//! its type, each bad field named, the timer drawing at `draw_at`, and a
//! cancelled unit offered to the first in line and bought with its offer
//! token (the waiting list's scenarios on every backend: `offers.rs`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use shardstock::control::lifecycle;
use shardstock::domain::draw::{DrawSpec, MAX_ENTRIES_PAGE, Standing};
use shardstock::domain::ids::{EventId, RequestId, UserId};
use shardstock::domain::model::EventSpec;
use shardstock::domain::token::{Access, TokenAccess, TokenRefusal, mint};
use shardstock::engine::{
    Clock, DrawView, EngineError, EntryStatus, ManualClock, PurchaseRequest, Refusal,
};
use shardstock::{Engine, Store};

use crate::harness::{
    Backend, TestApp, eid, event_id, eventually, ledger_for, on_every_backend, problem, settings,
    spec,
};

on_every_backend!(namespace_per_test:
    a_draw_of_many_entries_is_recomputed_and_only_its_winners_buy,
);

on_every_backend!(
    app:
    the_api_enters_draws_names_each_bad_field_and_answers_each_refusal_by_its_type,
    an_offer_claimed_after_the_window_ended_answers_not_on_sale_as_a_purchase_does,
);

const KEYS: [&str; 2] = ["draw-key-0123456789abcdef", "new-key-0123456789abcdef"];
const HOUR_MS: i64 = 3_600_000;

fn uid(s: &str) -> UserId {
    UserId::parse(s.to_owned()).unwrap()
}

fn draw_spec(id: &EventId, stock: u64, until: i64) -> EventSpec {
    let mut s = spec(id, stock, 8);
    s.tokens = Some(TokenAccess {
        keys: KEYS.iter().map(|k| k.to_string()).collect(),
    });
    s.draw = Some(DrawSpec::new(until, None, 1.2, 1, 3600, 600).unwrap());
    s
}

/// The draw as anyone recomputes it: entrants by lowercase hex
/// `SHA-256(seed bytes ‖ user id)`, ties by id.
fn recompute(seed_hex: &str, entrants: &[UserId]) -> Vec<UserId> {
    let seed = hex::decode(seed_hex).unwrap();
    let mut keyed: Vec<(String, UserId)> = entrants
        .iter()
        .map(|u| {
            let mut h = Sha256::new();
            h.update(&seed);
            h.update(u.as_str().as_bytes());
            (hex::encode(h.finalize()), u.clone())
        })
        .collect();
    keyed.sort();
    keyed.into_iter().map(|(_, u)| u).collect()
}

/// `engine.enter`, retried while the store fails (never past a refusal).
async fn enter<S: Store>(engine: &Engine<S>, id: &EventId, u: &UserId) -> bool {
    for _ in 0..50 {
        match engine.enter(id, u).await {
            Ok(new) => return new,
            Err(EngineError::Store(_)) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => panic!("entry of {u}: {e}"),
        }
    }
    panic!("entry of {u} kept failing")
}

/// A read retried while the store fails: 100,000 entrants' standings at
/// 256 at once on a loaded Cluster may time one out (a failed read changes
/// nothing, and a client asks again).
async fn read<T>(what: &str, mut call: impl AsyncFnMut() -> Result<T, EngineError>) -> T {
    for _ in 0..50 {
        match call().await {
            Ok(v) => return v,
            Err(EngineError::Store(_)) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => panic!("{what}: {e}"),
        }
    }
    panic!("{what} kept failing")
}

/// `engine.draw`, drawn again while the store fails (a draw is
/// idempotent: two at once of 100,000 entries on a loaded Cluster may time
/// a call out, and the admin's retry must give the same draw).
async fn draw<S: Store>(engine: &Engine<S>, id: &EventId) -> DrawView {
    for _ in 0..10 {
        match engine.draw(id).await {
            Ok(view) => return view,
            Err(EngineError::Store(e)) => {
                eprintln!("draw of {id} failed on the store ({e}): drawing again");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("draw of {id}: {e}"),
        }
    }
    panic!("the draw of {id} kept failing")
}

async fn a_draw_of_many_entries_is_recomputed_and_only_its_winners_buy<S: Store>(
    engine: Engine<S>,
) {
    // 100,000 entries on every backend (entries are batched per shard).
    let n: usize = 100_000;
    let clock = ManualClock::starting_now();
    let engine = Arc::new(engine.with_clock(Clock::from(clock.clone())));
    let ledger = ledger_for(engine.store().kind()).await;
    let id = event_id("draw");
    let stock = 1_000;
    let mut s = draw_spec(&id, stock, clock.now_ms() + HOUR_MS);
    engine.commit_draw(&mut s).await.unwrap();
    let published = s.draw.as_ref().unwrap().seed_hash.clone();
    assert_eq!(published.len(), 64);
    lifecycle::create(&engine, &ledger, s).await.unwrap();
    let view = engine.view(&id).await.unwrap();
    assert_eq!(view.access, Access::Draw);
    let d = view.draw.unwrap();
    assert_eq!(
        (d.seed_hash.as_str(), d.seed.as_deref()),
        (published.as_str(), None)
    );

    // Everyone enters at once, then a tenth again: one entry each.
    let users: Vec<UserId> = (0..n).map(|i| uid(&format!("e{i}"))).collect();
    let fresh: Vec<bool> = futures::stream::iter(users.iter().cloned())
        .map(|u| {
            let engine = engine.clone();
            let id = id.clone();
            async move { enter(&engine, &id, &u).await }
        })
        .buffer_unordered(256)
        .collect()
        .await;
    assert!(fresh.iter().all(|&f| f), "every first entry is new");
    for u in users.iter().step_by(10) {
        assert!(!enter(&engine, &id, u).await, "{u} entered twice");
    }
    let before = engine.draw_view(&id).await.unwrap();
    assert_eq!(before.entries, n as u64);
    assert_eq!((before.seed, before.winners), (None, None));
    assert_eq!(
        engine.entry_status(&id, &users[0]).await.unwrap().standing,
        Standing::Entered
    );
    assert!(matches!(
        engine.entry_status(&id, &uid("never")).await,
        Err(EngineError::NotEntered { .. })
    ));
    assert!(matches!(
        engine.draw(&id).await,
        Err(EngineError::DrawNotDue { .. })
    ));
    assert!(matches!(
        engine.entrants(&id, None, 10).await,
        Err(EngineError::NotDrawn(_))
    ));

    // The window closes: entries are refused; two draws at once and a
    // third after agree.
    clock.advance(Duration::from_millis(2 * HOUR_MS as u64));
    assert!(matches!(
        engine.enter(&id, &uid("late")).await,
        Err(EngineError::EntriesClosed(_))
    ));
    let (a, b) = tokio::join!(draw(&engine, &id), draw(&engine, &id));
    let again = draw(&engine, &id).await;
    let looked = engine.draw_view(&id).await.unwrap();
    assert_eq!(a.drawn_at, b.drawn_at);
    assert_eq!(a, again);
    assert_eq!(a, looked);
    assert_eq!(a.entries, n as u64);
    assert_eq!(a.winners, Some(1_200), "ceil(1,000 × 1.2)");
    // The seed revealed is the one committed to.
    let seed = a.seed.clone().unwrap();
    assert_eq!(
        hex::encode(Sha256::digest(hex::decode(&seed).unwrap())),
        published
    );

    // The entrants, page by page, are exactly those who entered.
    let mut listed: Vec<UserId> = Vec::new();
    loop {
        let page = read("a page of entrants", async || {
            engine.entrants(&id, listed.last(), MAX_ENTRIES_PAGE).await
        })
        .await;
        let last = page.len() < MAX_ENTRIES_PAGE;
        listed.extend(page);
        if last {
            break;
        }
    }
    assert!(
        listed.windows(2).all(|w| w[0] < w[1]),
        "ascending, once each"
    );
    let mut entered = users.clone();
    entered.sort();
    assert_eq!(listed, entered);

    // Recomputed here, the draw gives every entrant the service's standing.
    let order = recompute(&seed, &listed);
    let winners = 1_200;
    let standings: Vec<(usize, EntryStatus)> =
        futures::stream::iter(order.iter().cloned().enumerate())
            .map(|(i, u)| {
                let engine = engine.clone();
                let id = id.clone();
                async move {
                    let status = read("a standing", async || engine.entry_status(&id, &u).await);
                    (i, status.await)
                }
            })
            .buffer_unordered(256)
            .collect()
            .await;
    let mut tokens: HashMap<UserId, String> = HashMap::new();
    for (
        i,
        EntryStatus {
            user: u,
            standing,
            token,
            ..
        },
    ) in standings
    {
        assert_eq!(u, order[i]);
        if i < winners {
            assert_eq!(standing, Standing::Won, "{u} is #{}", i + 1);
            let (token, _until) = token.expect("a winner's token");
            tokens.insert(u, token);
        } else {
            assert_eq!(standing, Standing::Waiting((i - winners + 1) as u64), "{u}");
            assert!(token.is_none());
        }
    }
    assert_eq!(tokens.len(), winners);
    // The same token each time it is asked.
    let first = &order[0];
    let asked = engine.entry_status(&id, first).await.unwrap();
    assert_eq!(asked.token.unwrap().0, tokens[first]);

    // 80% of the winners buy (the stock covers them all), 64 at a time;
    // every 8th tries again with its token under a new request id; some
    // waiting entrants try a winner's token, a forged one, or none.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Kind {
        Own,
        Again,
        Theirs,
        Forged,
        Missing,
    }
    let buy = |u: &UserId, rid: String, token: Option<String>| PurchaseRequest {
        event: id.clone(),
        user: u.clone(),
        quantity: 1,
        request_id: Some(RequestId::parse(rid).unwrap()),
        access_token: token,
    };
    let trying: Vec<&UserId> = order[..winners].iter().take(winners * 8 / 10).collect();
    let mut attempts = Vec::new();
    for (k, u) in trying.iter().enumerate() {
        attempts.push((
            Kind::Own,
            buy(u, format!("{u}-1"), Some(tokens[*u].clone())),
        ));
        if k % 8 == 0 {
            attempts.push((
                Kind::Again,
                buy(u, format!("{u}-2"), Some(tokens[*u].clone())),
            ));
        }
    }
    for (k, u) in order[winners..winners + 300].iter().enumerate() {
        let (kind, token) = match k % 3 {
            0 => (Kind::Theirs, Some(tokens[&order[k]].clone())),
            1 => (
                Kind::Forged,
                Some(mint(
                    "not-this-events-key-00",
                    &id,
                    u.as_str(),
                    1,
                    4_102_444_800,
                )),
            ),
            _ => (Kind::Missing, None),
        };
        attempts.push((kind, buy(u, format!("{u}-x"), token)));
    }
    let outcomes: Vec<_> = futures::stream::iter(attempts.iter().cloned())
        .map(|(kind, req)| {
            let engine = engine.clone();
            async move {
                for _ in 0..50 {
                    match engine.purchase(&req).await {
                        Ok(out) => return (kind, req, out.result),
                        Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
                panic!("{:?} kept failing", req.request_id)
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let mut bought: HashMap<UserId, u32> = HashMap::new();
    for (kind, req, result) in &outcomes {
        match (kind, result) {
            (Kind::Own | Kind::Again, Ok(order)) => {
                *bought.entry(req.user.clone()).or_default() += order.quantity;
            }
            (Kind::Own | Kind::Again, Err(Refusal::Token(TokenRefusal::Used))) => {}
            (Kind::Theirs, Err(Refusal::Token(TokenRefusal::OtherUser)))
            | (Kind::Forged, Err(Refusal::Token(TokenRefusal::Invalid)))
            | (Kind::Missing, Err(Refusal::Token(TokenRefusal::Missing))) => {}
            other => panic!("{kind:?} purchase {:?} answered {other:?}", req.request_id),
        }
    }
    // Every winner who tried bought exactly its allowance; nobody else did.
    let tried: HashSet<&UserId> = trying.iter().copied().collect();
    assert_eq!(bought.len(), trying.len());
    for (u, units) in &bought {
        assert!(tried.contains(u), "{u} bought without a winner's token");
        assert_eq!(*units, 1, "{u} bought past its allowance");
    }
    let sold: u64 = bought.values().map(|&u| u64::from(u)).sum();
    let view = engine.view(&id).await.unwrap();
    assert_eq!(view.sold, sold);
    assert_eq!(view.sold + view.remaining, stock);
}

async fn the_api_enters_draws_names_each_bad_field_and_answers_each_refusal_by_its_type(
    b: Backend,
) {
    let app = TestApp::spawn(b).await;
    let id = eid("dapi");
    let at = |ms: i64| shardstock::domain::model::rfc3339_ms::format(ms);
    let now = shardstock::engine::Clock::system().now_ms();
    let later = at(now + HOUR_MS);
    let good = json!({"entries_until": later});
    for (extra, field) in [
        (json!({"access": "draw", "token_keys": [KEYS[0]]}), "draw:"),
        (json!({"access": "draw", "draw": good}), "token_keys:"),
        (
            json!({"token_keys": [KEYS[0]], "access": "token", "draw": good}),
            "draw:",
        ),
        (
            json!({"access": "draw", "token_keys": [KEYS[0]], "draw": {}}),
            "draw.entries_until:",
        ),
        (
            json!({"access": "draw", "token_keys": [KEYS[0]], "draw": {"entries_until": later, "oversubscription": 0.5}}),
            "draw.oversubscription:",
        ),
        (
            json!({"access": "draw", "token_keys": [KEYS[0]], "draw": {"entries_until": later, "oversubscription": 11}}),
            "draw.oversubscription:",
        ),
        (
            json!({"access": "draw", "token_keys": [KEYS[0]], "draw": {"entries_until": later, "allowance": 0}}),
            "draw.allowance:",
        ),
        (
            json!({"access": "draw", "token_keys": [KEYS[0]], "draw": {"entries_until": later, "buy_seconds": 59}}),
            "draw.buy_seconds:",
        ),
        (
            json!({"access": "draw", "token_keys": [KEYS[0]], "draw": {"entries_until": later, "draw_at": at(now)}}),
            "draw.draw_at:",
        ),
        (
            json!({"access": "draw", "token_keys": [KEYS[0]], "draw": {"entries_until": later, "offer_seconds": 9}}),
            "draw.offer_seconds:",
        ),
        (
            json!({"access": "draw", "token_keys": [KEYS[0]], "draw": {"entries_until": later, "offer_seconds": 86401}}),
            "draw.offer_seconds:",
        ),
        (
            json!({"access": "draw", "token_keys": [KEYS[0]], "draw": {"entries_until": later, "seed": "x"}}),
            "seed",
        ),
    ] {
        let mut body = json!({"id": id, "stock": 4, "buckets": 2});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().cloned().unwrap());
        let p = problem(
            app.admin_post("/v1/events", body).await,
            400,
            "invalid-request",
        )
        .await;
        assert!(
            p["detail"].as_str().unwrap().contains(field),
            "{field}: {p}"
        );
    }

    // A window of a few seconds; the draw at its end by the timer.
    let until = now + 3_000;
    let view = app
        .create(
            &id,
            4,
            2,
            json!({"access": "draw", "token_keys": KEYS, "draw": {"entries_until": at(until), "draw_at": at(until), "oversubscription": 1.5, "buy_seconds": 600}}),
        )
        .await;
    assert_eq!(view["access"], "draw");
    let hash = view["draw"]["seed_hash"].as_str().unwrap().to_owned();
    assert_eq!(hash.len(), 64);
    assert!(view["draw"].get("seed").is_none(), "{view}");
    assert_eq!(view["draw"]["oversubscription"], 1.5);
    let entries = format!("/v1/events/{id}/entries");
    for u in ["u-1", "u-2", "u-3", "u-4", "u-5", "u-6", "u-7"] {
        let r = app.post(&entries, json!({"user_id": u})).await;
        assert_eq!(r.status(), StatusCode::CREATED);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body, json!({"user_id": u, "status": "entered"}));
    }
    let r = app.post(&entries, json!({"user_id": "u-1"})).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["status"], "entered");
    problem(
        app.post(&entries, json!({"user_id": "u-1", "x": 1})).await,
        400,
        "invalid-request",
    )
    .await;
    problem(
        app.post(&entries, json!({"user_id": "bad user"})).await,
        400,
        "invalid-request",
    )
    .await;
    problem(app.get(&format!("{entries}/u-9")).await, 404, "not-entered").await;
    problem(app.get(&entries).await, 409, "not-drawn").await;
    problem(
        app.admin_post(&format!("/v1/events/{id}/draw"), json!({}))
            .await,
        409,
        "draw-not-due",
    )
    .await;
    let r = app
        .client
        .post(app.url(&format!("/v1/events/{id}/draw")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    problem(
        app.post("/v1/events/no-such/entries", json!({"user_id": "u-1"}))
            .await,
        404,
        "unknown-event",
    )
    .await;
    let open = eid("dopen");
    app.create(&open, 4, 2, json!({})).await;
    problem(
        app.post(
            &format!("/v1/events/{open}/entries"),
            json!({"user_id": "u-1"}),
        )
        .await,
        409,
        "not-a-draw",
    )
    .await;
    problem(
        app.get(&format!("/v1/events/{open}/draw")).await,
        409,
        "not-a-draw",
    )
    .await;

    // The timer draws at `draw_at`.
    let drawn: Value = eventually("the timer's draw", Duration::from_secs(30), async || {
        let d: Value = app
            .get(&format!("/v1/events/{id}/draw"))
            .await
            .json()
            .await
            .ok()?;
        d.get("drawn_at").is_some().then_some(d)
    })
    .await;
    problem(
        app.post(&entries, json!({"user_id": "u-8"})).await,
        409,
        "entries-closed",
    )
    .await;
    assert_eq!(drawn["entries"], 7);
    assert_eq!(drawn["winners"], 6, "ceil(4 × 1.5)");
    let seed = drawn["seed"].as_str().unwrap();
    assert_eq!(
        hex::encode(Sha256::digest(hex::decode(seed).unwrap())),
        hash
    );
    let again: Value = app
        .admin_post(&format!("/v1/events/{id}/draw"), json!({}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(again, drawn);

    // Listed in pages of 3; recomputed, the standings are the service's.
    let mut listed: Vec<UserId> = Vec::new();
    let mut after = String::new();
    loop {
        let q = if after.is_empty() {
            "?limit=3".to_owned()
        } else {
            format!("?limit=3&after={after}")
        };
        let page: Value = app
            .get(&format!("{entries}{q}"))
            .await
            .json()
            .await
            .unwrap();
        for u in page["entrants"].as_array().unwrap() {
            listed.push(uid(u.as_str().unwrap()));
        }
        match page.get("next_after") {
            Some(n) => after = n.as_str().unwrap().to_owned(),
            None => break,
        }
    }
    assert_eq!(listed.len(), 7);
    problem(
        app.get(&format!("{entries}?limit=0")).await,
        400,
        "invalid-request",
    )
    .await;
    problem(
        app.get(&format!("{entries}?limit=10001")).await,
        400,
        "invalid-request",
    )
    .await;
    problem(
        app.get(&format!("{entries}?page=2")).await,
        400,
        "invalid-request",
    )
    .await;
    let order = recompute(seed, &listed);
    let event = EventId::parse(id.clone()).unwrap();
    let mut bought: Vec<String> = Vec::new();
    for (i, u) in order.iter().enumerate() {
        let s: Value = app
            .get(&format!("{entries}/{u}"))
            .await
            .json()
            .await
            .unwrap();
        if i < 6 {
            assert_eq!(s["status"], "won", "{s}");
            let token = s["access_token"].as_str().unwrap();
            assert!(s["buy_until"].is_string(), "{s}");
            let r = app
                .post(
                    &format!("/v1/events/{id}/purchases"),
                    json!({"user_id": u.as_str(), "quantity": 1, "request_id": format!("{u}-1"), "access_token": token}),
                )
                .await;
            // 4 units for 6 winners: the first four buy, then sold out.
            if i < 4 {
                assert_eq!(r.status(), StatusCode::CREATED);
                let o: Value = r.json().await.unwrap();
                bought.push(o["order_id"].as_str().unwrap().to_owned());
            } else {
                problem(r, 409, "sold-out").await;
            }
        } else {
            assert_eq!(
                s,
                json!({"user_id": u.as_str(), "status": "waiting", "position": i - 5})
            );
            let forged = mint(
                "not-this-events-key-00",
                &event,
                u.as_str(),
                1,
                4_102_444_800,
            );
            let r = app
                .post(
                    &format!("/v1/events/{id}/purchases"),
                    json!({"user_id": u.as_str(), "quantity": 1, "request_id": "w", "access_token": forged}),
                )
                .await;
            problem(r, 403, "token-invalid").await;
        }
    }
    let view: Value = app
        .get(&format!("/v1/events/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(view["draw"]["winners"], 6);
    assert_eq!(view["remaining"], 0);
    let metrics = app.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.contains(&format!(
            "shardstock_draw_entries_total{{event=\"{id}\"}} 7"
        )),
        "{metrics}"
    );

    // The waiting list: a bought unit cancelled is not back on open sale
    // (the fifth winner still finds the event sold out); the timer's sweep
    // offers it to position 1, who buys it with the offer's token.
    let r = app
        .post(&format!("/v1/orders/{}/cancel", bought[0]), json!({}))
        .await;
    assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap());
    let fifth: Value = app
        .get(&format!("{entries}/{}", order[4]))
        .await
        .json()
        .await
        .unwrap();
    let r = app
        .post(
            &format!("/v1/events/{id}/purchases"),
            json!({"user_id": order[4].as_str(), "quantity": 1, "request_id": "fifth-2", "access_token": fifth["access_token"]}),
        )
        .await;
    problem(r, 409, "sold-out").await;
    let first = &order[6];
    let offered: Value = eventually(
        "the offer to position 1",
        Duration::from_secs(30),
        async || {
            let s: Value = app
                .get(&format!("{entries}/{first}"))
                .await
                .json()
                .await
                .ok()?;
            (s["status"] == "offered").then_some(s)
        },
    )
    .await;
    assert_eq!(offered["position"], 1);
    assert!(offered["offer_until"].is_string(), "{offered}");
    let token = offered["offer_token"].as_str().unwrap().to_owned();
    let claim = |u: &UserId, body: Value| {
        let path = format!("/v1/events/{id}/entries/{u}/offer");
        let app = &app;
        async move { app.post(&path, body).await }
    };
    problem(
        claim(&order[5], json!({"offer_token": token})).await,
        403,
        "offer-invalid",
    )
    .await;
    problem(
        claim(first, json!({"offer_token": "o1.1.1.x"})).await,
        403,
        "offer-invalid",
    )
    .await;
    problem(
        claim(first, json!({"offer_token": token, "x": 1})).await,
        400,
        "invalid-request",
    )
    .await;
    let r = claim(first, json!({"offer_token": token})).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let o: Value = r.json().await.unwrap();
    assert_eq!(
        (o["status"].as_str(), o["quantity"].as_u64()),
        (Some("confirmed"), Some(1))
    );
    let r = claim(first, json!({"offer_token": token})).await;
    assert_eq!(r.status(), StatusCode::OK, "a retry answers the same order");
    assert_eq!(r.json::<Value>().await.unwrap()["order_id"], o["order_id"]);
    let seen: Value = app
        .get(&format!("/v1/orders/{}", o["order_id"].as_str().unwrap()))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(seen["status"], "confirmed", "{seen}");
    let s: Value = app
        .get(&format!("{entries}/{first}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        s,
        json!({"user_id": first.as_str(), "status": "bought", "position": 1, "order_id": o["order_id"]})
    );
    problem(
        app.client
            .put(app.url(&format!("/v1/events/{id}/buckets")))
            .bearer_auth(crate::harness::TOKEN)
            .json(&json!({"buckets": 3}))
            .send()
            .await
            .unwrap(),
        409,
        "waiting-list",
    )
    .await;
    let metrics = app.get("/metrics").await.text().await.unwrap();
    for outcome in ["made", "taken"] {
        assert!(
            metrics.contains(&format!(
                "shardstock_offers_total{{event=\"{id}\",outcome=\"{outcome}\"}} 1"
            )),
            "{outcome}: {metrics}"
        );
    }
}

/// Over HTTP: once the sale window ended (`ends_at`) an offer still open
/// buys nothing, `409 not-on-sale` as a purchase then answers; an offer
/// bought before answers `200` with its order.
async fn an_offer_claimed_after_the_window_ended_answers_not_on_sale_as_a_purchase_does(
    b: Backend,
) {
    // No rebalancer: its leader closes an event whose window ended, and the
    // claim must meet the window's end, not the close.
    let mut settings = settings(b);
    settings.rebalancer.enabled = false;
    let app = TestApp::spawn_with(settings).await;
    let id = eid("dend");
    let at = |ms: i64| shardstock::domain::model::rfc3339_ms::format(ms);
    let now = shardstock::engine::Clock::system().now_ms();
    // Entries for 2 s, the window for 25 (the draw, two purchases and
    // their cancels, and two offers fit in it on a loaded CI machine): the
    // offers (an hour long) are open still when it ends.
    let (until, ends) = (now + 2_000, now + 25_000);
    app.create(
        &id,
        2,
        1,
        json!({"ends_at": at(ends), "access": "draw", "token_keys": [KEYS[0]], "draw": {"entries_until": at(until), "draw_at": at(until), "offer_seconds": 3600}}),
    )
    .await;
    let entries = format!("/v1/events/{id}/entries");
    let users = ["e-1", "e-2", "e-3", "e-4", "e-5", "e-6"];
    for u in users {
        let r = app.post(&entries, json!({"user_id": u})).await;
        assert_eq!(r.status(), StatusCode::CREATED);
    }
    let standing = async |u: &str| -> Value {
        app.get(&format!("{entries}/{u}"))
            .await
            .json()
            .await
            .unwrap()
    };
    eventually("the timer's draw", Duration::from_secs(30), async || {
        (standing("e-1").await["status"] != "entered").then_some(())
    })
    .await;
    // The two winners buy and cancel: their units go to the first two in line.
    let mut won = Vec::new();
    let mut line = Vec::new();
    for u in users {
        let s = standing(u).await;
        if s["status"] == "won" {
            let r = app
                .post(
                    &format!("/v1/events/{id}/purchases"),
                    json!({"user_id": u, "quantity": 1, "request_id": format!("{u}-1"), "access_token": s["access_token"]}),
                )
                .await;
            assert_eq!(r.status(), StatusCode::CREATED);
            let o: Value = r.json().await.unwrap();
            let r = app
                .post(
                    &format!("/v1/orders/{}/cancel", o["order_id"].as_str().unwrap()),
                    json!({}),
                )
                .await;
            assert_eq!(r.status(), StatusCode::OK);
            won.push((u, s["access_token"].clone()));
        } else {
            line.push((s["position"].as_u64().unwrap(), u));
        }
    }
    line.sort();
    assert_eq!((won.len(), line.len()), (2, 4));
    let mut tokens = Vec::new();
    for (_, u) in &line[..2] {
        let s = eventually("the offer", Duration::from_secs(30), async || {
            let s = standing(u).await;
            (s["status"] == "offered").then_some(s)
        })
        .await;
        tokens.push(s["offer_token"].clone());
    }
    let claim = |u: &str, token: &Value| {
        let path = format!("/v1/events/{id}/entries/{u}/offer");
        let body = json!({"offer_token": token});
        let app = &app;
        async move { app.post(&path, body).await }
    };
    let r = claim(line[0].1, &tokens[0]).await;
    assert_eq!(r.status(), StatusCode::CREATED, "bought within the window");
    let bought: Value = r.json().await.unwrap();

    let wait = ends - shardstock::engine::Clock::system().now_ms() + 100;
    assert!(
        wait > 0,
        "the offers came after the window ended: a slow machine"
    );
    tokio::time::sleep(Duration::from_millis(wait as u64)).await;
    // Ended, or sold out: every unit is bought or aside for an offer.
    let view: Value = app
        .get(&format!("/v1/events/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert!(
        view["status"] == "ended" || view["status"] == "sold_out",
        "on sale still, not closed: {view}"
    );
    problem(claim(line[1].1, &tokens[1]).await, 409, "not-on-sale").await;
    let (u, token) = &won[0];
    let r = app
        .post(
            &format!("/v1/events/{id}/purchases"),
            json!({"user_id": u, "quantity": 1, "request_id": format!("{u}-2"), "access_token": token}),
        )
        .await;
    problem(r, 409, "not-on-sale").await;
    assert_eq!(
        standing(line[1].1).await["status"],
        "offered",
        "nothing bought"
    );
    let r = claim(line[0].1, &tokens[0]).await;
    assert_eq!(r.status(), StatusCode::OK, "a retry after the window");
    assert_eq!(
        r.json::<Value>().await.unwrap()["order_id"],
        bought["order_id"]
    );
}
