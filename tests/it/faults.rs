//! Randomized fault schedules: the promises of docs/DESIGN.md, checked after
//! whatever a seeded run of faults did — not only case by case.
//!
//! A schedule (`plan`) is drawn from a seed: an event (half of them hold
//! every purchase `hold_seconds` until it is confirmed), a fault rate, and
//! for each of four actors a list of purchases (1–3 units, a few users,
//! limits), replays of earlier request ids, confirms and cancels of orders
//! the clients were told of, expiry sweeps, transfers by the rebalancer's
//! mover, rebalancer rounds, reshards, flushes, sometimes a close or the end
//! of the sale window (late retries follow it), and "crashes": a call
//! dropped mid-way, as a client that goes away or a process that dies, and
//! a reshard or close cut at a named checkpoint for another engine to
//! resume. The actors share one store through three engines (batched and
//! not), each on its own `Faulty` wrapper failing, delaying or timing out
//! steps before or after they apply, and one clock (`clock`: wall time, moved
//! past every deadline or the window's end at points of the plan). `rig`
//! runs them; `client` makes each call as a client of the HTTP API sees it
//! (after the close a retry is answered from the ledger); `log` keeps every
//! answer, and for each order what its clients were told (`told`). Then the
//! store is healed and the schedule settled (`settle`), and the answers held
//! against the ledger and, from the database alone, against every order's
//! final status (`checks`): see [`CHECKS`] for what is checked, and what is
//! not yet. Half the schedules also sell a small release through the same
//! engines (`releases`): multi-line orders while one pool is resharded and
//! one closed mid-order, half of those releases with holds
//! (`release_holds`). Half the schedules run with the outbox on (order
//! events, `Ledger::with_outbox`): then its changes, for the event and the
//! release's pools, are held against the database alone (`outbox`); off,
//! none may be written. A third of the events sell by access token: every
//! purchase carries its buyer's token (of 1–3 units, some expiring when the
//! clock moves), another user's, a forged, an expired or none, and the
//! tokens' records in the store are held against the orders in the database
//! (`tokens`); half of those are draw events, entered and drawn under faults
//! first (`draw`), whose winners' tokens the buyers carry; there offer
//! rounds run too, and the draw's losers claim the offers their standings
//! show, replay, let them pass, claim late or with another's or a forged
//! offer token (`offers`). Half the token events that are not draws rotate
//! their keys mid-sale, and some purchases carry a token of the new key
//! (`tokens`).
//!
//! `SHARDSTOCK_FAULT_SCHEDULES` (default [`DEFAULT_SCHEDULES`]) schedules run
//! per backend after the fixed [`SEEDS`]; `SHARDSTOCK_FAULT_SEED` sets the
//! first seed. A long run: see the README's testing section.

mod checks;
mod client;
mod clock;
mod draw;
mod log;
mod offers;
mod outbox;
mod plan;
mod release_holds;
mod release_plan;
mod releases;
mod rig;
mod settle;
mod tokens;
mod told;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shardstock::control::checkpoint::{self, Checkpoint, Flow};
use shardstock::control::lifecycle;
use shardstock::domain::ids::EventId;
use shardstock::domain::model::EventStatus;
use shardstock::ledger::Ledger;
use shardstock::store::{Buckets, Events, Store, StoreError};
use shardstock::{Engine, MemoryStore};
use tokio_util::sync::CancellationToken;

use crate::harness::faulty::{Fault, Faulty, Mode, Rule, STEPS, When};
use crate::harness::{
    block_on_large_stacks, cluster, event_id, ledger_for, spec, standalone, suite_of,
};
use clock::ScheduleClock;
use log::Log;
use plan::{ENGINES, Plan};
use rig::Rig;

/// A promise checked after every schedule, as a named switch: every check
/// runs and reports; only those that are on fail the test. A check that
/// fails because of a known open defect is off, and says why.
pub struct Check {
    pub name: &'static str,
    pub on: bool,
    /// What it checks; for a check that is off, why.
    pub what: &'static str,
}

pub const CHECKS: &[Check] = &[
    Check {
        name: "conservation",
        on: true,
        what: "the audit balances before and after the close; a stopped reshard resumes; \
               the close on a healed store succeeds",
    },
    Check {
        name: "no_double_sale",
        on: true,
        what: "confirmed orders hold exactly the units the ledger counts sold, and sold + \
               leftover = stock; nothing bought while the event showed 0 remaining",
    },
    Check {
        name: "limits",
        on: true,
        what: "no user holds more than the per-user limit (in the ledger)",
    },
    Check {
        name: "across_reshards",
        on: true,
        what: "the checks conservation, no_double_sale, limits, bought_once and replays_agree in \
               schedules that reshard. Before the fault-safe reshard and close (issue 13 items \
               3-5) they broke: seed 5036 (Redis, Cluster) a user over the limit; seed 5010 \
               (Redis) a 201 missing from the ledger, a unit lost; seed 5096 (Cluster) 13 units \
               lost, a cancelled order counted twice",
    },
    Check {
        name: "bought_once",
        on: true,
        what: "every 201 has its order in the ledger, once, with its quantity, and a status its \
               answers explain (cancelled exactly when a cancel answered, confirmed when a \
               confirm did; a hold never confirmed expired); no order that no answer knows of; a \
               bought order can be cancelled and confirmed",
    },
    Check {
        name: "replays_agree",
        on: true,
        what: "a request answered finally (201, sold out, over the limit) gets the same final answer \
               again, also after the window ended and, from the ledger, after the close; a \
               request whose outcome was unknown gets a final answer on a healed store, and every \
               request learns after the close its order or that it made none",
    },
    Check {
        name: "no_false_sold_out",
        on: true,
        what: "in a quiet phase after healing, sold out only when fewer units than asked \
               remain (the audit's count: a transfer cut off after its IN is journaled at its \
               source until completed, and the view counts it twice), and every unit left \
               sells. Seeds 5006, 5032, 9033 and 1269515 once looked like false sold-outs: the \
               view's double count. Not judged where the sale window ended (nothing sells)",
    },
    Check {
        name: "refusal_is_true",
        on: true,
        what: "no order exists for a request whose final answer was a refusal (sold out, \
               over the limit). Found: a retry re-driving a saga cut off after a take was \
               answered sold out from a fresh sold-out mark, and the take became a confirmed \
               order; only a saga's first driver trusts the marks now (the stall test showed \
               it in about half its runs)",
    },
    Check {
        name: "nothing_deducted_is_true",
        on: true,
        what: "no order exists for a request answered \"nothing deducted\" (503 without \
               outcome, or try-again). Found: a take or finish failing after it applied was \
               answered 503 without outcome (fixed by the saga work), and a retry of a request \
               that had bought was answered so when load_meta failed or the layout kept changing \
               before its record was read (seeds 5010, 5036, 5045): a keyed request now answers \
               outcome unknown there",
    },
    Check {
        name: "no_guard_alarm",
        on: true,
        what: "the ledger's guard never fires when nothing was oversold. An order's cancel lives \
               in another stream than the order that resold its units, so a batch may carry the \
               resale before the cancel: the excess is pending while the sale is open and only a \
               violation if it outlasts the close (seed 1269490 found the false alarm)",
    },
    Check {
        name: "open_transfer_blocks_sales",
        on: true,
        what: "units left in an open transfer (a mover that failed between OUT and CLEAR) \
               never block a purchase. Found (seed 5006 on memory): the saga counted them as \
               available in their source bucket and, when that bucket alone seemed to hold \
               enough, neither gathered nor completed the transfer: every purchase answered \
               try-again until a rebalancer round completed it. A pass that saw enough units \
               and took none now completes open transfers and gathers. Judged once no dead \
               holder keeps the mover lease: a call dropped while holding it blocks every \
               move until it expires (its TTL is the bound; seed 1269490 on a loaded CI \
               machine)",
    },
    Check {
        name: "database_oracle",
        on: true,
        what: "after the close and the final flush, from the database alone \
               (harness::oracle): confirmed units + leftover = stock, no order still held, no \
               order with two records that end it differently; and every order's status is \
               what its clients were told (faults::told): confirmed when a confirm answered, \
               cancelled or expired when a cancel or confirm said so, a hold nobody confirmed \
               expired (or cancelled after a cancel that may have applied), confirmed only \
               after a confirm that answered or may have applied; every order told of is \
               there; no request answered \"no order\" has one",
    },
    Check {
        name: "answers_in_order",
        on: true,
        what: "what database_oracle checks, with every answer about an order true when it was \
               given: a call begun after another answered never shows the order earlier on its \
               path (held, then confirmed, then cancelled or expired)",
    },
    Check {
        name: "holds_answered",
        on: true,
        what: "a fresh 201 on an event with holds shows `held` and a pay-by hold_seconds after \
               the call began (at most after it ended); without holds, neither",
    },
    Check {
        name: "release_orders",
        on: true,
        what: "in the half of the schedules that sell a release alongside (faults::releases): \
               multi-line orders under the same faults and dropped calls, one pool resharded \
               and one closed mid-order (the close dropped or cut after it sealed, finished \
               when settling); a final answer never changes, no order left pending after a \
               sweep, per open pool sold + remaining = stock, each user's count its bought \
               units, and from the database alone the oracle per pool and the confirmed \
               orders exactly the bought orders' lines; half those releases hold their orders \
               (faults::release_holds: confirms, cancels, deaths after a decision, expiry, a \
               sweeper actor, the reshard refused): none left held, each ends as told, bought \
               reads confirmed in the end, and every line has its order's status",
    },
    Check {
        name: "outbox",
        on: true,
        what: "in the half of the schedules with the outbox on, after the close and from the \
               database alone, for the event and the release's pools (a line is an order of \
               its pool: its take creates it, its undo voids it, its cancel or expiry ends it; \
               a pool has no holds, so a held line's creation has no deadline and its confirm \
               makes no change): change ids unique, seqs rising; per order the ledger derives, \
               one order.created first (its quantity, user, deadline), then one terminal \
               change for each kind of record that ends it (k, c, e), its status's among them, \
               no order.voided; a voided order no change, or order.created then order.voided; \
               no change of an order the database does not have; one event.closed with the \
               ledger's totals; nothing left parked. Outbox off: no change written",
    },
    Check {
        name: "tokens",
        on: true,
        what: "in the third of the schedules whose event sells by access token (faults::tokens): \
               each user a token of 1-3 units (a third expiring about a move of the clock), \
               purchases carrying their own (reused past its allowance), another user's, a \
               forged, an expired or no token, under the same faults, replays, reshards, holds, \
               cancels and closes. From the database: no order and no 201 for a request that \
               carried another's, a forged, an expired or no token, each refused for its \
               reason; an own token refused only as spent (or expired, when it expires); a \
               token refusal true (no order of the request taken before the call; an order of \
               a request once refused bought by a later fresh purchase of it); per user all \
               orders' units, cancelled and expired too (they do not give the allowance back), \
               within the allowance. From the store after the close: each user's home in the \
               last layout counts as bought exactly the units of their orders in the database, \
               and no layout keeps a reservation or a saga's link to its token. Half the token \
               events that are not draws rotate their keys mid-sale (the call dropped or failing \
               before or after it applied, then every engine refreshed) and some purchases carry \
               a token of the new key: a retired key's token refused as invalid in every call \
               sent once every engine read the rotation, a new key's in every call sent before \
               it, a live key's never",
    },
    Check {
        name: "draws",
        on: true,
        what: "in half the token schedules the event is a draw event (faults::draw): the buyers \
               and a crowd as large as the stock enter through the faulty engines, then two \
               engines draw at once, one failing at a drawn step (closing entries, reading \
               them, writing ranks, the record; before or after it applied) and drawing again: \
               both answer the same draw, every entry counted, each buyer standing where the \
               revealed seed over the listed entrants puts them, with the same token from both; \
               the winners buy with those tokens (the check tokens), the losers hold none",
    },
    Check {
        name: "offers",
        on: true,
        what: "in the draw schedules (faults::offers): offer rounds through the faulty engines, \
               one or two at once, during the sale and while settling, and the draw's losers \
               claiming at once, twice (a replay answers the same order), never (passed after \
               the window), late (refused), or first with another's or a forged offer token \
               (refused as invalid). Positions given in line order, each once and one ticket \
               each (from the store), standings only moving on; after a healed round no unit \
               in the list unoffered while someone waits, some offer made when units came back; \
               while someone waits no returned unit went to open sale (on sale at the quiet \
               phase = stock less every unit purchases took, from the database); after the \
               close every order without a request id is a claim's, one per position, and \
               each waiting user's standing names its order in the database",
    },
    Check {
        name: "no_pending_saga",
        on: true,
        what: "no saga is left pending once the store is healed and the sweeper has run once with \
               no wait for its bound (before any retry); a close cut off by a fault owns its \
               event's sagas and settles them when it is finished",
    },
];

/// Whether the check `name` fails the test.
pub fn is_on(name: &str) -> bool {
    CHECKS
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no check is named {name}"))
        .on
}

/// Seeds that once broke a promise: they run first, every time. Those that
/// draw the outbox on (`Plan::outbox`, check `outbox`): 1269490, 5006, 5045,
/// 1269515, 7319047 and 20261930 (two of them with a release: 1269490 held,
/// 5045 held); the others check that nothing is written with it off.
const SEEDS: &[u64] = &[
    // A false guard alarm: a resale flushed before the cancel that freed its
    // units (check no_guard_alarm).
    1269490,
    // Units in an open transfer blocked every purchase (open_transfer_blocks_sales);
    // on Redis, what looked like a false sold-out (the view's double count).
    5006,
    // A false sold-out in the quiet phase: once a batch of dropped callers
    // landing late (the settling now waits for the engines' own calls), then
    // the view's double count of a transfer cut off after its IN.
    5032,
    // Reshards stopped by faults, resumed, met by a close (across_reshards,
    // before issue 13 items 3-5 were fixed): a user over the limit; a 201
    // missing, units lost; a cancel twice. Seed 5036 on memory later: a close
    // taking over an event whose stopped reshard had not made every bucket
    // failed (the memory store answered stale for a bucket never made; Redis
    // answers no open transfer).
    5036, 5010, 5096,
    // Retries answered try-again on a healed store: an open transfer again.
    5045, // What looked like false sold-outs in the quiet phase (the view's count).
    9033, 1269515,
    // Holds in the schedules (issue 42), open when found: a retry whose home
    // step's reply was lost answered another call's order as fresh, without
    // its hold (holds_answered); a retry while a close was cut off answered
    // from a ledger not yet drained, showing held an order the client had
    // been told expired (answers_in_order, about one run in ten). Seed 5036
    // above: a confirm during a stopped reshard answered "no such order", so
    // the HTTP layer found the order in the ledger and said the event was
    // closed (bought_once).
    7319047, 7319283,
    // A retry whose home step's reply was lost drove an earlier call's
    // pending saga and answered it as fresh: a pay-by older than the retry
    // (holds_answered; seen once in a campaign of 1400, timing-dependent).
    20261641,
    // An instance that had missed a reshard read an order in the old,
    // sealed layout and answered `held` after a cancel in the new one had
    // answered `cancelled` (answers_in_order).
    20261930,
    // A release with holds (release_orders): on the Cluster, once, a request
    // the store never saw was reserved and held by the settle's replay after
    // its last sweep, and was found still held. A gap in the settle (it now
    // sweeps past that deadline too), not in the service.
    7005,
    // A draw schedule with holds and the outbox on (offers): a waiting
    // list's offer bought outright was taken by the outbox for a saga's take
    // (no deadline on an event with holds) and never got its order.created.
    1269494,
    // 1269490 above, later (release_orders, about one run in 200 on a loaded
    // machine): a late walk of a held release line read its own confirmed
    // take (K) as a short bucket and took the line again further on.
    // A draw's offers (offers): two polls' standing reads that overlapped
    // answered out of order (bought, then offered) and were judged a
    // standing going back: a gap in the check, now judged only between
    // reads that did not overlap (seen in a third of the runs once an open
    // offer's read also read the event's stored status).
    91000028,
    // A key rotation mid-sale (tokens, on the Cluster): a token of the
    // retired key was answered "over the limit" in a call sent after every
    // engine had read the rotation: a purchase's meta read begun before the
    // rotation ended after the refresh and put the old keys back in the
    // engine's cache. A read now replaces only a cached meta read before it.
    4800001,
    // A draw whose sale window ends while its waiting line claims offers
    // (offers): with the claim's end-of-window check taken out of the step,
    // two claims sent after the end bought. Kept so every run has claims
    // on both sides of a window's end.
    7015,
];

/// Schedules per backend when `SHARDSTOCK_FAULT_SCHEDULES` is not set.
const DEFAULT_SCHEDULES: u64 = 12;
/// The first seed when `SHARDSTOCK_FAULT_SEED` is not set.
const DEFAULT_SEED: u64 = 0x13_5eed;

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

/// The seeds of this run: the fixed ones (unless `SHARDSTOCK_FAULT_FIXED=0`,
/// to rerun one seed alone), then the random ones.
fn seeds() -> Vec<u64> {
    let n = env_u64("SHARDSTOCK_FAULT_SCHEDULES", DEFAULT_SCHEDULES);
    let first = env_u64("SHARDSTOCK_FAULT_SEED", DEFAULT_SEED);
    let fixed = if env_u64("SHARDSTOCK_FAULT_FIXED", 1) == 0 {
        &[][..]
    } else {
        SEEDS
    };
    fixed
        .iter()
        .copied()
        .chain((0..n).map(|i| first.wrapping_add(i)))
        .collect()
}

/// Runs every seed on one backend; fails listing every broken promise.
async fn schedules<S: Store>(store: S, ledger: Ledger) {
    let backend = store.kind();
    for c in CHECKS.iter().filter(|c| !c.on) {
        println!("faults: check {} is off: {}", c.name, c.what);
    }
    let mut failed = Vec::new();
    for seed in seeds() {
        let started = Instant::now();
        let (summary, violations) = schedule(seed, store.clone(), ledger.clone()).await;
        println!(
            "faults {backend} seed {seed}: {summary}, {} violations, {:.1} s",
            violations.iter().filter(|(c, _)| is_on(c)).count(),
            started.elapsed().as_secs_f64()
        );
        let (broken, known): (Vec<_>, Vec<_>) = violations.iter().partition(|(c, _)| is_on(c));
        for (check, what) in &known {
            println!("  (off) {check}: {what}");
        }
        for (check, what) in &broken {
            println!("  {check}: {what}");
        }
        if !broken.is_empty() {
            failed.push(format!("seed {seed}: {broken:#?}"));
        }
    }
    assert!(
        failed.is_empty(),
        "{backend}: promises broken:\n{}\nrerun one: SHARDSTOCK_FAULT_SEED=<seed> \
         SHARDSTOCK_FAULT_SCHEDULES=1 SHARDSTOCK_FAULT_FIXED=0 cargo test --test it faults:: -- --nocapture",
        failed.join("\n")
    );
}

/// One schedule: set up, run, settle, check.
async fn schedule<S: Store>(seed: u64, store: S, ledger: Ledger) -> (String, settle::Violations) {
    let mut plan = Plan::draw(seed);
    // Per schedule: the ledger is shared by every seed of a backend.
    let ledger = ledger.with_outbox(plan.outbox);
    let (clock, _keeper) = ScheduleClock::start();
    if plan.ends() {
        plan.spec.ends_at = Some(clock.now_ms() + plan::WINDOW.as_millis() as i64);
    }
    if let Some(tokens) = &mut plan.tokens {
        tokens.start_s = clock.now_ms() / 1000;
    }
    if let Some(d) = plan.spec.draw.as_mut() {
        // The entries come first (`draw`), then the clock passes this.
        d.entries_until = clock.now_ms() + 60_000;
    }
    let plain = Arc::new(
        Engine::new(Faulty::plain(store.clone()), Plan::engine_options(0))
            .with_clock(clock.clock()),
    );
    plain
        .commit_draw(&mut plan.spec)
        .await
        .expect("a draw's seed kept");
    lifecycle::create(&plain, &ledger, plan.spec.clone())
        .await
        .expect("create the event");
    let engines: Vec<_> = (0..ENGINES)
        .map(|i| {
            let faulty = Faulty::new(store.clone(), seed.wrapping_mul(31).wrapping_add(i as u64));
            // The last engine sends several buckets' purchases in one call
            // where the store can (standalone Redis), as a service does; its
            // faults then strike the whole call (`purchase_groups`).
            let faulty = if i == ENGINES - 1 {
                faulty.grouping()
            } else {
                faulty
            };
            plan.rules(&faulty);
            Arc::new(Engine::new(faulty, Plan::engine_options(i)).with_clock(clock.clock()))
        })
        .collect();
    let drawn = if plan.draws() {
        Some(draw::run(&mut plan, &store, &engines, &clock).await)
    } else {
        None
    };
    let (drawn, drew) = drawn.map_or((Vec::new(), String::new()), |d| (d.violations, d.summary));
    let mut log = Log::new(plan.spec.hold_seconds);
    log.errors.extend(drawn);
    if plan.offers.is_some() {
        offers::line(&plain, &plan, &mut log).await;
    }
    let rebalancers = engines
        .iter()
        .map(|e| tokio::sync::Mutex::new(rig::rebalancer(e, &ledger)))
        .collect();
    let cut = plan.cut.map(|(at, nth)| cut_at(&plan.spec.id, at, nth));
    let release = match releases::ReleasePlan::draw(seed) {
        Some(p) => Some(releases::ReleaseRun::start(p, seed, &plain, &ledger, &clock).await),
        None => None,
    };
    let rig = Arc::new(Rig {
        id: plan.spec.id.clone(),
        log: Mutex::new(log),
        plan,
        engines,
        rebalancers,
        ledger,
        clock,
        stop: CancellationToken::new(),
    });
    let started = Instant::now();
    tokio::join!(rig.run(), async {
        if let Some(release) = &release {
            release.run(&rig.engines).await;
        }
    });
    let ran = started.elapsed();
    // The settling heals everything: its own close and resumptions are not cut.
    checkpoint::clear(&rig.id);
    let injected: usize = rig.engines.iter().map(|e| e.store().injected().len()).sum();
    let calls: u64 = rig.engines.iter().map(|e| e.store().total_calls()).sum();
    let mut violations = rig.settle_and_check(&plain).await;
    if let Some(release) = &release {
        release
            .settle_and_check(&plain, &rig.engines, &mut violations)
            .await;
    }
    let mut events = vec![rig.id.clone()];
    events.extend(release.as_ref().map_or(Vec::new(), |r| r.pools()));
    let mut changes = 0;
    for event in &events {
        changes += outbox::check(&rig.ledger, event, rig.plan.outbox, &mut violations).await;
    }
    let log = rig.log.lock().unwrap();
    let cut = match (rig.plan.cut, cut) {
        (Some((at, nth)), Some(fired)) => format!(
            ", cut at {:?} #{nth} {}",
            at,
            if fired.load(Ordering::SeqCst) {
                "(done)"
            } else {
                "(never reached)"
            }
        ),
        _ => String::new(),
    };
    let release = drew
        + &log.offers.summary()
        + &release.map_or(String::new(), |r| format!(", {}", r.summary()));
    let summary = format!(
        "{} ops, holds {:?} s, {}{}{}{} requests, {calls} store calls, {injected} faults (rate {:.2}){cut}, ran {:.1} s, {:?}{release}",
        rig.plan.ops(),
        rig.plan.spec.hold_seconds,
        if rig.plan.ends() { "window ends, " } else { "" },
        if rig.plan.outbox {
            format!("outbox on ({changes} changes), ")
        } else {
            String::new()
        },
        match &rig.plan.tokens {
            Some(t) if t.draw.is_some() => "draw, ",
            Some(_) => "tokens, ",
            None => "",
        },
        log.sent.len(),
        rig.plan.fault_rate,
        ran.as_secs_f64(),
        log.tally
    );
    (summary, violations)
}

/// Cuts the `nth` run of `event` that reaches `at` there, as if its process
/// died (once: the next run goes through and resumes the work); the flag
/// says whether it happened.
fn cut_at(event: &EventId, at: Checkpoint, nth: u32) -> Arc<AtomicBool> {
    let reached = Arc::new(AtomicU32::new(0));
    let fired = Arc::new(AtomicBool::new(false));
    let flag = fired.clone();
    checkpoint::inject(
        event,
        Arc::new(move |cp| {
            let crash = cp == at && reached.fetch_add(1, Ordering::SeqCst) + 1 == nth;
            if crash {
                flag.store(true, Ordering::SeqCst);
            }
            Box::pin(async move { if crash { Flow::Crash } else { Flow::Go } })
        }),
    );
    fired
}

#[test]
fn random_schedules_keep_every_promise_on_memory() {
    block_on_large_stacks(|| async {
        schedules(MemoryStore::new(), ledger_for("memory").await).await;
    });
}

#[test]
fn random_schedules_keep_every_promise_on_redis() {
    block_on_large_stacks(|| async {
        let store = standalone(suite_of(module_path!())).await.store().clone();
        schedules(store, ledger_for("redis").await).await;
    });
}

#[test]
fn random_schedules_keep_every_promise_on_cluster() {
    block_on_large_stacks(|| async {
        let store = cluster(suite_of(module_path!())).await.store().clone();
        schedules(store, ledger_for("redis-cluster").await).await;
    });
}

/// One call carrying several buckets' purchases (`purchase_groups.lua` on a
/// standalone Redis) that applied and whose reply was lost: every buyer in it
/// gets its own order, read back from what the call wrote in its home bucket
/// (`resolve`), and a retry with the same request id replays it. Failed
/// before it applied, the same call leaves every buyer "outcome unknown" and
/// deducts nothing; the retries buy afresh. Either way nothing is bought twice
/// or lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_grouped_call_that_failed_answers_each_buyer_from_its_own_bucket() {
    use shardstock::domain::ids::RequestId;
    use shardstock::domain::routing::{home, user_hash};
    use shardstock::engine::{PurchaseOutcome, PurchaseRequest};
    use shardstock::{EngineError, EngineOptions};

    const BUYERS: usize = 12;
    const BUCKETS: u32 = 8;
    let store = standalone(suite_of(module_path!())).await.store().clone();
    for when in [When::After, When::Before] {
        let faulty = Faulty::plain(store.clone()).grouping();
        // One lane for every bucket, and a driver that waits for company: the
        // buyers below land in one call, one group a home bucket.
        let opts = EngineOptions {
            shared_lanes: 1,
            batch_wait: Duration::from_millis(200),
            ..EngineOptions::default()
        };
        let engine = Arc::new(Engine::new(faulty.clone(), opts));
        let id = event_id("grouped");
        engine.create_event(spec(&id, 100, BUCKETS)).await.unwrap();
        let req = |u: usize| PurchaseRequest {
            event: id.clone(),
            user: crate::harness::user(format!("g-{u}")),
            quantity: 1 + (u % 2) as u32,
            request_id: Some(RequestId::parse(format!("g-{u}")).unwrap()),
            access_token: None,
        };
        let homes: std::collections::HashSet<u32> = (0..BUYERS)
            .map(|u| home(user_hash(&req(u).user), BUCKETS))
            .collect();
        assert!(homes.len() > 2, "the buyers' homes span buckets: {homes:?}");
        let all = || {
            futures::future::join_all((0..BUYERS).map(|u| {
                let (engine, req) = (engine.clone(), req(u));
                async move { engine.purchase(&req).await }
            }))
        };
        faulty.arm("purchase_groups", 1, when);
        let first = all().await;
        assert_eq!(faulty.calls("purchase"), 0, "no call of one bucket");
        assert_eq!(faulty.calls("purchase_groups"), 1, "one call for all");
        // The retries with the same request ids, on a store that works again.
        let retries = all().await;
        let mut units = 0;
        let mut orders = std::collections::HashSet::new();
        for (u, (first, retry)) in first.iter().zip(&retries).enumerate() {
            let retry = retry.as_ref().unwrap();
            let order = retry.result.as_ref().expect("the retry's order");
            assert_eq!(order.quantity, req(u).quantity);
            assert_eq!(order.bucket, home(user_hash(&req(u).user), BUCKETS));
            match when {
                When::After => {
                    let first: &PurchaseOutcome = first
                        .as_ref()
                        .unwrap_or_else(|e| panic!("buyer {u}: the call applied, yet {e}"));
                    assert!(!first.replayed, "{first:?}");
                    assert_eq!(first.result, retry.result, "buyer {u}: the same order");
                    assert!(retry.replayed, "buyer {u}'s retry: {retry:?}");
                }
                When::Before => {
                    assert!(
                        matches!(first, Err(EngineError::OutcomeUnknown(_))),
                        "buyer {u}: {first:?}"
                    );
                    assert!(!retry.replayed, "buyer {u} buys on the retry: {retry:?}");
                }
            }
            assert!(orders.insert(order.order_id.to_string()), "one order each");
            units += u64::from(order.quantity);
        }
        let view = engine.view(&id).await.unwrap();
        assert_eq!(view.sold, units, "{when:?}: every buyer's units sold once");
        assert_eq!(view.sold + view.remaining, 100);
    }
}

// The wrapper itself: what it injects is what it says.

/// An event of 10 units in 2 buckets on a plain memory store, and a Faulty over it.
async fn faulty_memory() -> (Faulty<MemoryStore>, shardstock::domain::ids::EventId) {
    let store = MemoryStore::new();
    let id = event_id("faulty");
    Engine::new(store.clone(), shardstock::EngineOptions::default())
        .create_event(spec(&id, 10, 2))
        .await
        .unwrap();
    (Faulty::new(store, 7), id)
}

#[tokio::test]
async fn an_armed_fault_before_a_step_leaves_the_store_untouched() {
    let (faulty, id) = faulty_memory().await;
    let seq = |m: Option<shardstock::domain::model::EventMeta>| m.unwrap().seq;
    let before = seq(faulty.inner().load_meta(&id).await.unwrap());
    faulty.arm("bump_seq", 2, When::Before);
    faulty.bump_seq(&id).await.unwrap();
    let failed = faulty.bump_seq(&id).await;
    assert!(
        matches!(failed, Err(StoreError::Unavailable(_))),
        "{failed:?}"
    );
    faulty.bump_seq(&id).await.unwrap();
    assert_eq!(
        seq(faulty.inner().load_meta(&id).await.unwrap()),
        before + 2
    );
    assert_eq!((faulty.calls("bump_seq"), faulty.total_calls()), (3, 3));
}

#[tokio::test]
async fn an_armed_fault_after_a_step_applies_it_and_reports_an_error() {
    let (faulty, id) = faulty_memory().await;
    faulty.arm("set_status", 1, When::After);
    let lied = faulty
        .set_status(&id, EventStatus::OnSale, EventStatus::Closed)
        .await;
    assert!(matches!(lied, Err(StoreError::Unavailable(_))), "{lied:?}");
    let meta = faulty.inner().load_meta(&id).await.unwrap().unwrap();
    assert_eq!(meta.status, EventStatus::Closed, "the step applied");
    assert_eq!(faulty.injected().len(), 1);
}

#[tokio::test]
async fn rules_fire_at_their_rate_the_same_way_for_a_seed_and_stop_when_healed() {
    let (faulty, id) = faulty_memory().await;
    let again = Faulty::new(faulty.inner().clone(), 7);
    let rule = Rule {
        probability: 0.3,
        mode: Mode::Any {
            max_delay: Duration::from_millis(2),
        },
    };
    faulty.everywhere(rule);
    again.everywhere(rule);
    faulty.rule(
        "counters",
        Rule {
            probability: 1.0,
            mode: Mode::Only(Fault::Timeout(Duration::from_millis(1)), When::Before),
        },
    );
    let bucket = shardstock::domain::keys::BucketRef::new(&id, 0, 0);
    for _ in 0..200 {
        let _ = faulty.bucket_state(&bucket).await;
        let _ = again.bucket_state(&bucket).await;
    }
    let (a, b) = (faulty.injected(), again.injected());
    assert_eq!(a, b, "one seed, one sequence of faults");
    assert!((30..=90).contains(&a.len()), "{} of 200 at 0.3", a.len());
    for f in [
        Fault::Fail,
        Fault::Delay(Duration::ZERO),
        Fault::Timeout(Duration::ZERO),
    ] {
        for w in [When::Before, When::After] {
            let seen = a.iter().any(|i| {
                std::mem::discriminant(&i.fault) == std::mem::discriminant(&f) && i.when == w
            });
            assert!(seen, "{f:?} {w:?} never drawn");
        }
    }
    assert!(faulty.counters(&bucket).await.is_err());
    faulty.heal();
    for _ in 0..50 {
        faulty.counters(&bucket).await.unwrap();
        faulty.bucket_state(&bucket).await.unwrap();
    }
    assert_eq!(faulty.calls("counters"), 51);
    let mut names = STEPS.to_vec();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), STEPS.len(), "step names are unique");
}
