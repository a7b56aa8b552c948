//! A draw schedule's entries and draw, before its purchases: the event is a
//! `draw` event, and its winners' tokens are what the buyers carry.
//!
//! Every buyer and a crowd of entrants who never buy enter through the
//! schedule's faulty engines (retried on an error: an entry is idempotent).
//! Then the clock passes the entry window's end and two engines draw at
//! once, one of them failing at a step the plan names (before or after it
//! applied), each drawing again until it answers: both must answer the same
//! draw (seed, entries, winners, time), every entrant must stand where the
//! revealed seed puts them (`domain::draw::order` over the listed
//! entrants), and both engines give each winner the same token. The
//! winners' tokens become the buyers' own (`Tokens::won`); a loser has none
//! and is refused as missing.

use std::sync::Arc;
use std::time::Duration;

use shardstock::Engine;
use shardstock::domain::draw::{self, Standing};
use shardstock::domain::ids::UserId;
use shardstock::engine::DrawView;
use shardstock::store::Store;

use super::clock::ScheduleClock;
use super::plan::{ENGINES, Plan, USERS};
use crate::harness::faulty::Faulty;
use crate::harness::user;

const CHECK: &str = "draws";
/// Attempts at an entry, or at a draw, before it counts as never answered.
const ATTEMPTS: usize = 12;

/// What the entries and the draw broke, and a line for the summary.
pub struct Drawn {
    pub violations: Vec<(&'static str, String)>,
    pub summary: String,
}

/// Enters, draws and fills `plan`'s winners' tokens.
pub async fn run<S: Store>(
    plan: &mut Plan,
    store: &S,
    engines: &[Arc<Engine<Faulty<S>>>],
    clock: &ScheduleClock,
) -> Drawn {
    let mut summary = String::new();
    let violations = draw(plan, store, engines, clock, &mut summary).await;
    Drawn {
        violations,
        summary,
    }
}

async fn draw<S: Store>(
    plan: &mut Plan,
    store: &S,
    engines: &[Arc<Engine<Faulty<S>>>],
    clock: &ScheduleClock,
    summary: &mut String,
) -> Vec<(&'static str, String)> {
    let mut v = Vec::new();
    let tokens = plan
        .tokens
        .as_ref()
        .expect("a draw schedule sells by token");
    let d = tokens.draw.clone().expect("a draw schedule");
    let id = plan.spec.id.clone();
    let entrants: Vec<UserId> = (0..USERS)
        .map(|i| user(Plan::user(i)))
        .chain((0..d.crowd).map(|k| user(format!("crowd{k}"))))
        .collect();
    for (i, who) in entrants.iter().enumerate() {
        let engine = &engines[i % ENGINES];
        let mut last = None;
        for _ in 0..ATTEMPTS {
            match engine.enter(&id, who).await {
                Ok(_) => {
                    last = None;
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        if let Some(e) = last {
            v.push((CHECK, format!("{who}'s entry never answered: {e}")));
        }
    }
    let spec = plan.spec.draw.as_ref().expect("a draw spec");
    let due = spec.entries_until - clock.now_ms();
    clock.advance(Duration::from_millis(due.max(0) as u64 + 1));
    // Two engines draw at once; one fails at the plan's step.
    let drawer = |i: u64| {
        let faulty = Faulty::new(store.clone(), plan.seed.wrapping_add(i));
        if i == 0 {
            faulty.arm(d.fail.0, d.fail.1, d.fail.2);
        }
        Engine::new(faulty, Plan::engine_options(0)).with_clock(clock.clock())
    };
    let (a, b) = (drawer(0), drawer(1));
    let (va, vb) = tokio::join!(draw_until_done(&a, &id), draw_until_done(&b, &id));
    let (va, vb) = match (va, vb) {
        (Ok(va), Ok(vb)) => (va, vb),
        (va, vb) => {
            v.push((CHECK, format!("a draw never answered: {va:?}, {vb:?}")));
            return v;
        }
    };
    let record = |v: &DrawView| (v.seed.clone(), v.entries, v.winners, v.drawn_at);
    if record(&va) != record(&vb) {
        v.push((CHECK, format!("two draws answered {va:?} and {vb:?}")));
    }
    if va.entries != entrants.len() as u64 {
        v.push((
            CHECK,
            format!(
                "{} entries drawn of {} entrants",
                va.entries,
                entrants.len()
            ),
        ));
    }
    let (Some(seed), Some(winners), Some(drawn_at)) = (va.seed.clone(), va.winners, va.drawn_at)
    else {
        v.push((CHECK, format!("a draw answered without its record: {va:?}")));
        return v;
    };
    let listed = match a.entrants(&id, None, draw::MAX_ENTRIES_PAGE).await {
        Ok(l) => l,
        Err(e) => {
            v.push((CHECK, format!("the entrants could not be listed: {e}")));
            return v;
        }
    };
    let Some(order) = draw::order(&seed, listed) else {
        v.push((CHECK, format!("the revealed seed {seed:?} is no seed")));
        return v;
    };
    let mut won = Vec::new();
    for i in 0..USERS {
        let who = user(Plan::user(i));
        let rank = order.iter().position(|u| *u == who).map(|p| p as u64 + 1);
        let want = rank.map(|r| Standing::of(r, winners));
        let (sa, sb) = (
            a.entry_status(&id, &who).await,
            b.entry_status(&id, &who).await,
        );
        match (sa, sb) {
            (Ok(sa), Ok(sb)) if sa == sb && Some(sa.standing) == want => {
                won.push(sa.token.map(|(t, _)| t));
            }
            (sa, sb) => {
                v.push((
                    CHECK,
                    format!("{who} (rank {rank:?} of {winners} winners) stands {sa:?} and {sb:?}"),
                ));
                won.push(None);
            }
        }
    }
    let tokens = plan.tokens.as_mut().expect("tokens");
    tokens.start_s = drawn_at.div_euclid(1000);
    for (i, token) in won.iter().enumerate() {
        tokens.allowance[i] = if token.is_some() { d.allowance } else { 0 };
        tokens.expires_after[i] = token.is_some().then_some(i64::from(d.buy_seconds));
    }
    *summary = format!(
        ", draw: {} of {USERS} buyers won, {} entrants, {winners} winners, {} #{} {:?} failed \
         ({} injected)",
        won.iter().filter(|t| t.is_some()).count(),
        va.entries,
        d.fail.0,
        d.fail.1,
        d.fail.2,
        a.store().injected().len()
    );
    tokens.won = Some(won);
    v
}

/// Draws until the engine answers (a failed step is redone by drawing again).
async fn draw_until_done<S: Store>(
    engine: &Engine<Faulty<S>>,
    id: &shardstock::domain::ids::EventId,
) -> Result<DrawView, Vec<String>> {
    let mut errors = Vec::new();
    for _ in 0..ATTEMPTS {
        match engine.draw(id).await {
            Ok(view) => return Ok(view),
            Err(e) => errors.push(e.to_string()),
        }
    }
    Err(errors)
}
