//! A draw schedule's waiting list under faults (check `offers`): offer
//! rounds run through the schedule's faulty engines, and the draw's losers
//! claim, replay, let pass, claim late, or try another user's or a forged
//! offer token.
//!
//! The plan ([`OfferPlan`], from its own generator of the seed, so no
//! earlier draw changed) puts three kinds of operation among the actors'
//! of a draw schedule: an offer round (`Engine::offer_round`, on the
//! actor's engine or on two at once), a poll of the line (each waiting
//! entrant reads its standing and acts as its [`Claimant`] says), and a move
//! of the clock past the offer window (the draw's `offer_seconds` is the
//! shortest allowed, so the schedule's other moves of the clock pass offers
//! too). While settling, on the healed store, rounds, polls and moves of
//! the clock alternate until no offer is open; then the quiet phase sells
//! what is on sale, and the close makes the list's units leftover.
//!
//! Checked (`offers`):
//! - positions are given in line order: whenever the store names the
//!   ticket of a position, it names one for every earlier position (read
//!   from the last position down, so a later read never sees less), each
//!   position one ticket, never another, and no ticket two positions; a
//!   position's standing only moves on (waiting, offered, bought or passed),
//!   offered once (one deadline), bought with one order;
//! - a claim with another user's or a forged offer token is refused as
//!   invalid, and a claim sent at or after its offer's deadline is refused
//!   (expired or passed): neither buys; an own claim before the deadline is
//!   refused only once the deadline has come; a claim made again answers
//!   the order the first bought, as a replay; a claim sent once the sale
//!   window ended buys nothing, and none is told the sale is closed before
//!   the window's end or a close began (`OfferLog::closing_ms`);
//! - after the final healed round: no unit sits in the list unoffered while
//!   someone waits; if units came back during the sale and the line is not
//!   empty, some offer was made; and while someone waits no returned unit
//!   went to open sale: what was on sale at the first healed round and when
//!   the quiet phase began, if someone still waited then, is the stock less
//!   every unit purchases ever took (from the database; usually the line is
//!   exhausted by then, and its units went to open sale as designed);
//! - from the database after the close: every order of a user in line (who
//!   holds no purchase token) or without a request id is an offer's, of one
//!   unit, answered to a claim of that user's position, one per position;
//!   and each waiting user's final standing names the order the database
//!   has for it, if any. Each claimed
//!   order's status is judged with the others (`database_oracle`: told
//!   confirmed, confirmed unless a cancel may have followed).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shardstock::Engine;
use shardstock::EngineError;
use shardstock::domain::draw::{OfferStanding, Standing};
use shardstock::domain::ids::{OrderId, UserId};
use shardstock::domain::model::{EventStatus, OrderStatus};
use shardstock::domain::offer::{MIN_OFFER_SECONDS, mint_offer};
use shardstock::engine::OfferRefusal;
use shardstock::store::Store;

use super::plan::{ENGINES, Op, Plan, USERS};
use super::rig::Rig;
use super::settle::Violations;
use super::told::{Told, Via};
use crate::harness::faulty::Faulty;
use crate::harness::{oracle, user};

const CHECK: &str = "offers";
/// A draw schedule's offer window: the shortest allowed.
pub const OFFER_SECONDS: u32 = MIN_OFFER_SECONDS;
/// Claimants drawn per plan: more than any line (the draw's losers).
const MAX_LINE: usize = 64;
/// A key that is not the event's (a forged offer token).
const FORGER: &str = "not-this-events-key-00000";

/// What a waiting entrant does once its standing shows an offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claimant {
    /// Claims at once (again after a failure, as a client retries).
    AtOnce,
    /// Claims, then claims again with the same token: a replay.
    Twice,
    /// Never claims: the offer passes after its deadline.
    Never,
    /// Claims only once the deadline has come: refused.
    Late,
    /// First claims with another waiting user's offer token (refused),
    /// then with its own.
    Theirs,
    /// First claims with a forged offer token (refused), then with its own.
    Forged,
}

/// A draw schedule's offers: what each position's entrant does.
#[derive(Debug, Clone)]
pub struct OfferPlan {
    pub claimants: Vec<Claimant>,
}

impl OfferPlan {
    /// Draws the claimants and puts offer rounds, polls of the line and
    /// moves of the clock past the offer window among `actors`' operations.
    pub fn draw(seed: u64, actors: &mut [Vec<Op>]) -> Self {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x0ffe_75ed);
        let claimants = (0..MAX_LINE)
            .map(|_| match rng.random_range(0..100) {
                0..35 => Claimant::AtOnce,
                35..55 => Claimant::Twice,
                55..70 => Claimant::Never,
                70..80 => Claimant::Late,
                80..90 => Claimant::Theirs,
                _ => Claimant::Forged,
            })
            .collect();
        for ops in actors.iter_mut() {
            let mut extra = Vec::new();
            for _ in 0..rng.random_range(2..=4) {
                extra.push(Op::Offers {
                    both: rng.random_bool(0.3),
                });
            }
            for _ in 0..rng.random_range(2..=4) {
                extra.push(Op::Claims);
            }
            if rng.random_bool(0.5) {
                extra.push(Op::PassOffers);
            }
            for op in extra {
                let at = rng.random_range(0..=ops.len());
                ops.insert(at, op);
            }
        }
        Self { claimants }
    }
}

/// Which token a claim carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carried {
    Own,
    /// Its own, sent once the deadline had come.
    Late,
    /// Another position's offer token.
    Theirs(usize),
    Forged,
}

/// What a claim was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    Bought {
        order: OrderId,
        status: OrderStatus,
        replay: bool,
    },
    Refused(OfferRefusal),
    /// The sale is closed.
    Closed,
    /// Failed: it may have bought.
    Unknown(String),
}

/// One claim, by position (0-based), and when it was sent and answered.
#[derive(Debug, Clone)]
pub struct Claim {
    pub at: usize,
    pub carried: Carried,
    pub deadline_ms: i64,
    pub sent_ms: i64,
    pub answered_ms: i64,
    pub answer: Claimed,
}

/// Everything the schedule saw of its waiting list.
#[derive(Debug, Clone, Default)]
pub struct OfferLog {
    /// The line: position `p`'s user at `p - 1`.
    pub line: Vec<UserId>,
    /// Each position's last standing seen (with the read count when its
    /// read answered), its own token and its deadline.
    seen: Vec<Option<(OfferStanding, u64)>>,
    /// Reads begun or answered so far: orders the polls' reads.
    reads: u64,
    tokens: Vec<Option<(String, i64)>>,
    /// Each position's ticket (generation, bucket, ticket), once the store
    /// named it.
    placed: Vec<Option<(u32, u32, u64)>>,
    pub claims: Vec<Claim>,
    /// Rounds that answered, and what they counted; rounds that failed.
    pub rounds: u64,
    pub failed_rounds: u64,
    pub made: u64,
    pub passed: u64,
    pub to_sale: u64,
    /// What broke while the schedule ran.
    pub errors: Vec<String>,
    /// At the settling's first healed round and when the quiet phase
    /// began: what was on sale, and whether anyone still waited.
    pub on_sale: Vec<(&'static str, u64, bool)>,
    /// Whether the healed settling ran its rounds (the event was on sale).
    pub settled: bool,
    /// When the first close of the schedule began (ms, the schedule's
    /// clock): from then on a claim may be answered that the sale is closed.
    pub closing_ms: Option<i64>,
    /// The final standings' counts, for the summary: made, bought, passed.
    pub fin: (usize, usize, usize),
}

impl OfferLog {
    fn with_line(line: Vec<UserId>) -> Self {
        let n = line.len();
        Self {
            line,
            seen: vec![None; n],
            tokens: vec![None; n],
            placed: vec![None; n],
            ..Self::default()
        }
    }

    /// A standing read is about to begin: its place among the reads.
    fn begin_read(&mut self) -> u64 {
        self.reads += 1;
        self.reads
    }

    /// A standing for position index `at`, read by a read that began at
    /// `begun` (`begin_read`) and answered now: it only moves on. Judged
    /// against the last standing seen only when that read answered before
    /// this one began: two polls' reads that overlap may answer in either
    /// order (one read the ticket open just before a claim that another saw
    /// taken), and the later answer is then no later state.
    fn observe(&mut self, at: usize, now: &OfferStanding, begun: u64) {
        use OfferStanding::*;
        self.reads += 1;
        let answered = self.reads;
        let before = match &self.seen[at] {
            Some((_, at_read)) if *at_read > begun => {
                if let Offered { token, deadline_ms } = now {
                    self.tokens[at] = Some((token.clone(), *deadline_ms));
                }
                return;
            }
            seen => seen.as_ref().map(|(standing, _)| standing.clone()),
        };
        let back = match (&before, now) {
            (None, _) | (Some(Waiting), _) => false,
            (Some(Offered { deadline_ms: a, .. }), Offered { deadline_ms: b, .. }) => a != b,
            (Some(Offered { .. }), Bought { .. } | Passed) => false,
            // After the close an open offer reads passed, on every engine
            // (an open ticket's standing reads the status as stored, not
            // the engine's cached meta).
            (Some(Bought { order: a }), Bought { order: b }) => a != b,
            (Some(Passed), Passed) => false,
            (Some(_), _) => true,
        };
        if back {
            self.errors.push(format!(
                "position {} stood {before:?}, then {now:?}",
                at + 1
            ));
        }
        if let Offered { token, deadline_ms } = now {
            self.tokens[at] = Some((token.clone(), *deadline_ms));
        }
        self.seen[at] = Some((now.clone(), answered));
    }

    fn claims_of(&self, at: usize) -> impl Iterator<Item = &Claim> {
        self.claims.iter().filter(move |c| c.at == at)
    }

    /// Whether a claim carrying `what` was answered (not unknown).
    fn answered(&self, at: usize, what: fn(Carried) -> bool) -> bool {
        self.claims_of(at)
            .any(|c| what(c.carried) && !matches!(c.answer, Claimed::Unknown(_)))
    }

    /// Own claims of position index `at` answered with an order.
    fn bought(&self, at: usize) -> usize {
        self.claims_of(at)
            .filter(|c| matches!(c.answer, Claimed::Bought { .. }))
            .count()
    }

    fn own_refused(&self, at: usize) -> bool {
        self.claims_of(at).any(|c| {
            matches!(c.carried, Carried::Own | Carried::Late)
                && matches!(c.answer, Claimed::Refused(_) | Claimed::Closed)
        })
    }

    /// Whether the last own claim of position index `at` failed (a client
    /// retries it with the same token).
    fn own_unknown(&self, at: usize) -> bool {
        self.claims_of(at)
            .filter(|c| matches!(c.carried, Carried::Own | Carried::Late))
            .last()
            .is_some_and(|c| matches!(c.answer, Claimed::Unknown(_)))
    }

    /// The orders claims were answered (their ids).
    pub fn claimed(&self) -> HashSet<String> {
        self.claims
            .iter()
            .filter_map(|c| match &c.answer {
                Claimed::Bought { order, .. } => Some(order.to_string()),
                _ => None,
            })
            .collect()
    }

    /// The summary's part.
    pub fn summary(&self) -> String {
        if self.line.is_empty() && self.claims.is_empty() {
            return String::new();
        }
        let refused = self
            .claims
            .iter()
            .filter(|c| matches!(c.answer, Claimed::Refused(_)))
            .count();
        let replays = self
            .claims
            .iter()
            .filter(|c| matches!(c.answer, Claimed::Bought { replay: true, .. }))
            .count();
        let (made, bought, passed) = self.fin;
        format!(
            ", offers: line {}, {made} made, {bought} bought, {passed} passed or open at the close \
             ({} rounds answered: {} made, {} passed, {} to sale; {} failed), {} claims ({replays} \
             replays, {refused} refused){}",
            self.line.len(),
            self.rounds,
            self.made,
            self.passed,
            self.to_sale,
            self.failed_rounds,
            self.claims.len(),
            self.on_sale
                .iter()
                .map(|(when, n, waited)| format!(
                    ", {n} on sale at {when} ({})",
                    if *waited {
                        "users waited"
                    } else {
                        "the line exhausted"
                    }
                ))
                .collect::<String>()
        )
    }
}

/// The draw's line, read after the draw (a plain engine): every entrant
/// that waits, by position; its positions must be 1, 2, … with none twice.
pub async fn line<S: Store>(plain: &Engine<Faulty<S>>, plan: &Plan, log: &mut super::log::Log) {
    let Some(d) = plan.tokens.as_ref().and_then(|t| t.draw.as_ref()) else {
        return;
    };
    let entrants = (0..USERS)
        .map(|i| user(Plan::user(i)))
        .chain((0..d.crowd).map(|k| user(format!("crowd{k}"))));
    let mut line: Vec<(u64, UserId)> = Vec::new();
    let mut errors = Vec::new();
    for who in entrants {
        match plain.entry_status(&plan.spec.id, &who).await {
            Ok(s) => {
                if let Standing::Waiting(p) = s.standing {
                    if s.offer != Some(OfferStanding::Waiting) {
                        errors.push(format!("{who} at {p}, just drawn, stands {:?}", s.offer));
                    }
                    line.push((p, who));
                }
            }
            Err(e) => errors.push(format!("{who}'s standing after the draw: {e}")),
        }
    }
    line.sort();
    if !line
        .iter()
        .enumerate()
        .all(|(i, (p, _))| *p == i as u64 + 1)
    {
        errors.push(format!(
            "the line's positions are {:?}",
            line.iter().map(|l| l.0).collect::<Vec<_>>()
        ));
    }
    log.offers = OfferLog::with_line(line.into_iter().map(|(_, u)| u).collect());
    log.offers.errors.extend(errors);
}

impl<S: Store> Rig<S> {
    fn offers_on(&self) -> bool {
        self.plan.offers.is_some() && !self.log.lock().unwrap().offers.line.is_empty()
    }

    /// One offer round on `engine`; counted.
    async fn offer_round(&self, engine: &Engine<Faulty<S>>) -> Option<u64> {
        let round = Box::pin(engine.offer_round(&self.id)).await;
        let mut log = self.log.lock().unwrap();
        match round {
            Ok(r) => {
                let o = &mut log.offers;
                o.rounds += 1;
                o.made += r.made;
                o.passed += r.passed;
                o.to_sale += r.to_sale;
                log.count("offer round ok".into());
                Some(r.made)
            }
            Err(_) => {
                log.offers.failed_rounds += 1;
                log.count("offer round failed".into());
                None
            }
        }
    }

    /// `Op::Offers`: a round on the actor's engine, or on it and the next
    /// one at once.
    pub(super) async fn offers_op(&self, actor: usize, both: bool) {
        if self.plan.offers.is_none() {
            return;
        }
        let one = &self.engines[actor % ENGINES];
        if both {
            let other = &self.engines[(actor + 1) % ENGINES];
            tokio::join!(self.offer_round(one), self.offer_round(other));
        } else {
            self.offer_round(one).await;
        }
    }

    /// `Op::PassOffers`: every engine's clock past the offer window.
    pub(super) fn pass_offers_op(&self) {
        if self.plan.offers.is_some() {
            self.clock
                .advance(Duration::from_secs(u64::from(OFFER_SECONDS) + 1));
            self.tally_offers("clock past offers");
        }
    }

    fn tally_offers(&self, what: &str) {
        self.log.lock().unwrap().count(what.to_owned());
    }

    /// `Op::Claims`: the line reads where it stands, from the last position
    /// down (the store's placements first), and each entrant offered acts
    /// as its claimant does.
    pub(super) async fn claims_op(&self, engine: &Engine<Faulty<S>>) {
        if !self.offers_on() {
            return;
        }
        let line = self.log.lock().unwrap().offers.line.clone();
        self.check_placements(engine, line.len()).await;
        for at in (0..line.len()).rev() {
            let begun = self.log.lock().unwrap().offers.begin_read();
            let standing = match Box::pin(engine.entry_status(&self.id, &line[at])).await {
                Ok(s) => s,
                Err(_) => {
                    self.tally_offers("offer poll failed");
                    continue;
                }
            };
            let Some(offer) = standing.offer else {
                self.log.lock().unwrap().offers.errors.push(format!(
                    "{} at position {} stands {:?} without an offer standing",
                    line[at],
                    at + 1,
                    standing.standing
                ));
                continue;
            };
            self.log.lock().unwrap().offers.observe(at, &offer, begun);
            self.act(engine, at, &offer).await;
        }
    }

    /// The store's placements, from the last position down: a position
    /// given means every earlier one was; a position keeps its ticket, and
    /// no ticket has two positions. Read from the store itself (no faults).
    async fn check_placements(&self, engine: &Engine<Faulty<S>>, n: usize) {
        let store = engine.store().inner();
        let mut given_above: Option<usize> = None;
        let mut now: Vec<Option<(u32, u32, u64)>> = vec![None; n];
        for at in (0..n).rev() {
            let Ok(placed) = store.offer_at(&self.id, at as u64 + 1).await else {
                return;
            };
            let placed = placed.map(|(b, t)| (b.generation, b.index, t));
            if placed.is_none()
                && let Some(above) = given_above
            {
                self.log.lock().unwrap().offers.errors.push(format!(
                    "position {} was given a ticket before position {} was",
                    above + 1,
                    at + 1
                ));
            }
            if placed.is_some() && given_above.is_none() {
                given_above = Some(at);
            }
            now[at] = placed;
        }
        let mut log = self.log.lock().unwrap();
        let o = &mut log.offers;
        let mut by_ticket: HashMap<(u32, u32, u64), usize> = HashMap::new();
        for (at, placed) in now.into_iter().enumerate() {
            let Some(placed) = placed else { continue };
            if let Some(other) = by_ticket.insert(placed, at) {
                o.errors.push(format!(
                    "ticket {placed:?} was given positions {} and {}",
                    other + 1,
                    at + 1
                ));
            }
            match o.placed[at] {
                Some(before) if before != placed => o.errors.push(format!(
                    "position {} was given ticket {before:?}, then {placed:?}",
                    at + 1
                )),
                _ => o.placed[at] = Some(placed),
            }
        }
    }

    /// What position index `at`'s entrant does, its standing read.
    async fn act(&self, engine: &Engine<Faulty<S>>, at: usize, offer: &OfferStanding) {
        let Some(plan) = &self.plan.offers else {
            return;
        };
        let who = plan.claimants[at % MAX_LINE];
        let (own, retry, bad_done, bought, refused) = {
            let log = self.log.lock().unwrap();
            let o = &log.offers;
            (
                o.tokens[at].clone(),
                o.own_unknown(at),
                o.answered(at, |c| matches!(c, Carried::Theirs(_) | Carried::Forged)),
                o.bought(at),
                o.own_refused(at),
            )
        };
        let offered = matches!(offer, OfferStanding::Offered { .. });
        let Some((token, deadline)) = own else {
            return;
        };
        let late = self.clock.now_ms() >= deadline;
        // A client whose claim failed asks again with its token, whatever
        // its standing reads now.
        if retry {
            let carried = if who == Claimant::Late {
                Carried::Late
            } else {
                Carried::Own
            };
            self.claim(engine, at, carried, &token, deadline).await;
            return;
        }
        if !offered || refused {
            return;
        }
        match who {
            Claimant::Never => {}
            Claimant::Late if late && bought == 0 => {
                self.claim(engine, at, Carried::Late, &token, deadline)
                    .await;
            }
            Claimant::Late => {}
            Claimant::AtOnce if bought == 0 => {
                self.claim(engine, at, Carried::Own, &token, deadline).await;
            }
            Claimant::Twice if bought < 2 => {
                self.claim(engine, at, Carried::Own, &token, deadline).await;
                self.claim(engine, at, Carried::Own, &token, deadline).await;
            }
            Claimant::Theirs | Claimant::Forged if !bad_done => {
                let theirs = {
                    let log = self.log.lock().unwrap();
                    let o = &log.offers;
                    (0..o.line.len())
                        .filter(|&p| p != at)
                        .find_map(|p| o.tokens[p].as_ref().map(|(t, _)| (p, t.clone())))
                };
                let (carried, bad) = match (who, theirs) {
                    (Claimant::Theirs, Some((p, t))) => (Carried::Theirs(p), t),
                    _ => (
                        Carried::Forged,
                        mint_offer(
                            FORGER,
                            &self.id,
                            &self.log.lock().unwrap().offers.line[at],
                            at as u64 + 1,
                            deadline,
                        ),
                    ),
                };
                self.claim(engine, at, carried, &bad, deadline).await;
                self.claim(engine, at, Carried::Own, &token, deadline).await;
            }
            Claimant::Theirs | Claimant::Forged if bought == 0 => {
                self.claim(engine, at, Carried::Own, &token, deadline).await;
            }
            _ => {}
        }
    }

    /// A claim by position index `at`'s entrant with `token`, logged (an
    /// order it is answered is told, as a purchase's 201 is).
    async fn claim(
        &self,
        engine: &Engine<Faulty<S>>,
        at: usize,
        carried: Carried,
        token: &str,
        deadline_ms: i64,
    ) {
        let who = self.log.lock().unwrap().offers.line[at].clone();
        let sent_ms = self.clock.now_ms();
        let out = Box::pin(engine.claim_offer(&self.id, &who, token)).await;
        let answered_ms = self.clock.now_ms();
        let answer = match out {
            Ok((order, replay)) => Claimed::Bought {
                order: order.order_id,
                status: order.status,
                replay,
            },
            Err(EngineError::OfferRefused { why, .. }) => Claimed::Refused(why),
            Err(EngineError::NotOnSale { .. }) => Claimed::Closed,
            Err(e) => Claimed::Unknown(e.to_string()),
        };
        let mut log = self.log.lock().unwrap();
        let kind = match &answer {
            Claimed::Bought { replay: false, .. } => "claim bought",
            Claimed::Bought { replay: true, .. } => "claim replayed",
            Claimed::Refused(_) => "claim refused",
            Claimed::Closed => "claim closed",
            Claimed::Unknown(_) => "claim unknown",
        };
        log.count(kind.into());
        if let Claimed::Bought { order, status, .. } = &answer {
            log.hear(
                order,
                Told::status(*status),
                Via::Offer,
                sent_ms,
                answered_ms,
            );
        }
        log.offers.claims.push(Claim {
            at,
            carried,
            deadline_ms,
            sent_ms,
            answered_ms,
            answer,
        });
    }

    /// The settling's part, on the healed store before the quiet phase:
    /// claims whose outcome was unknown asked again, then rounds, polls and
    /// moves of the clock past the offer window (and a poll right after it,
    /// before a round passes the offers) until no offer is open;
    /// then what the list holds is checked (module docs).
    pub(super) async fn settle_offers(&self, plain: &Engine<Faulty<S>>, v: &mut Violations) {
        if !self.offers_on() {
            return;
        }
        self.log.lock().unwrap().offers.settled = true;
        let n = self.log.lock().unwrap().offers.line.len();
        let mut open = 0;
        for i in 0..n + 4 {
            let _ = Box::pin(shardstock::control::hold_expiry::sweep_due(
                plain,
                &shardstock::control::hold_expiry::ExpiryOptions::default(),
                64,
            ))
            .await;
            if self.offer_round(plain).await.is_none() {
                v.push((CHECK, "an offer round failed on a healed store".into()));
            }
            if i == 0 {
                self.note_on_sale(plain, "the first healed round").await;
            }
            self.claims_op(plain).await;
            open = self.standings(plain).await.map_or(0, |s| s.1);
            let in_list = plain.view(&self.id).await.map_or(0, |w| w.waiting);
            if open == 0 && in_list == 0 {
                break;
            }
            self.clock
                .advance(Duration::from_secs(u64::from(OFFER_SECONDS) + 1));
            // Past the deadline, before a round passes the offers: the late
            // claimants claim now (refused: expired).
            self.claims_op(plain).await;
        }
        // The final round: everything in the list is offered, or nobody waits.
        self.offer_round(plain).await;
        self.claims_op(plain).await;
        let Some((waiting, offered)) = self.standings(plain).await else {
            v.push((CHECK, "the line's standings could not be read".into()));
            return;
        };
        let in_list = match plain.view(&self.id).await {
            Ok(w) => w.waiting,
            Err(e) => {
                v.push((CHECK, format!("the view failed on a healed store: {e}")));
                return;
            }
        };
        if waiting > 0 && in_list != offered as u64 {
            v.push((
                CHECK,
                format!(
                    "after a healed round {in_list} units are in the list, {offered} offered, while \
                     {waiting} positions wait"
                ),
            ));
        }
        if open > 0 {
            v.push((
                CHECK,
                format!(
                    "{open} offers still open after {} moves past the offer window",
                    n + 4
                ),
            ));
        }
        // Units came back during the sale: some offer was made.
        let log = self.log.lock().unwrap();
        let returned = log.stories.values().any(|s| {
            s.heard.iter().any(|h| {
                matches!(h.via, Via::Cancel | Via::Confirm)
                    && matches!(h.told, Told::Cancelled | Told::Expired)
            })
        });
        let given = log.offers.placed.iter().filter(|p| p.is_some()).count();
        if returned && given == 0 {
            v.push((
                CHECK,
                format!(
                    "units came back during the sale and {n} users wait, yet no offer was made"
                ),
            ));
        }
    }

    /// How many positions wait (not offered yet) and how many hold an open
    /// offer, read by the healed engine.
    async fn standings(&self, plain: &Engine<Faulty<S>>) -> Option<(usize, usize)> {
        let line = self.log.lock().unwrap().offers.line.clone();
        let (mut waiting, mut open) = (0, 0);
        for u in &line {
            match plain.entry_status(&self.id, u).await.ok()?.offer? {
                OfferStanding::Waiting => waiting += 1,
                OfferStanding::Offered { .. } => open += 1,
                _ => {}
            }
        }
        Some((waiting, open))
    }

    /// What is on sale now (the audit's count less the list's), and
    /// whether anyone still waits: at the settling's first healed round, and
    /// when the quiet phase begins (no purchase but the quiet phase's is
    /// made after either).
    pub(super) async fn note_on_sale(&self, plain: &Engine<Faulty<S>>, when: &'static str) {
        if !self.log.lock().unwrap().offers.settled {
            return;
        }
        let (Ok(view), Ok(a)) = (
            plain.view(&self.id).await,
            shardstock::control::audit::audit(plain, &self.ledger, &self.id).await,
        ) else {
            return;
        };
        let remaining = (a.remaining + a.in_transfer).saturating_sub(view.waiting);
        if let Some((waiting, _)) = self.standings(plain).await {
            self.log
                .lock()
                .unwrap()
                .offers
                .on_sale
                .push((when, remaining, waiting > 0));
        }
    }

    /// The check `offers` after the close (module docs).
    pub(super) async fn check_offers(&self, plain: &Engine<Faulty<S>>, v: &mut Violations) {
        if self.plan.offers.is_none() {
            return;
        }
        let log = self.log.lock().unwrap().clone();
        let o = &log.offers;
        v.extend(o.errors.iter().map(|e| (CHECK, e.clone())));
        // The claims' answers.
        let mut told: HashMap<usize, (OrderId, u32)> = HashMap::new();
        // The sale's end: its window's (an `Op::End` passes it) or the first
        // close's beginning, whichever came first.
        let ended_ms = match (self.plan.spec.ends_at, o.closing_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        for c in &o.claims {
            let pos = c.at + 1;
            let late = c.sent_ms >= c.deadline_ms;
            match (&c.carried, &c.answer) {
                // A claim sent once the window ended buys nothing, as a
                // purchase then does (the engine's `ends_at` check).
                (_, Claimed::Bought { replay: false, .. })
                    if self.plan.spec.ends_at.is_some_and(|e| c.sent_ms >= e) =>
                {
                    v.push((
                        CHECK,
                        format!(
                            "position {pos}'s claim sent at {} ms bought after the window ended \
                             at {} ms",
                            c.sent_ms,
                            self.plan.spec.ends_at.unwrap_or_default()
                        ),
                    ));
                }
                // "Closed" only once the sale ended: answered before, a
                // claim was refused while its offer stood.
                (_, Claimed::Closed) if ended_ms.is_none_or(|e| c.answered_ms < e) => v.push((
                    CHECK,
                    format!(
                        "position {pos}'s claim answered at {} ms was told the sale is closed; it \
                         ended at {ended_ms:?} ms",
                        c.answered_ms
                    ),
                )),
                (
                    Carried::Theirs(_) | Carried::Forged,
                    Claimed::Refused(OfferRefusal::InvalidToken),
                )
                | (_, Claimed::Unknown(_) | Claimed::Closed) => {}
                (Carried::Theirs(_) | Carried::Forged, a) => v.push((
                    CHECK,
                    format!(
                        "position {pos}'s claim with {:?} was answered {a:?}",
                        c.carried
                    ),
                )),
                (_, Claimed::Bought { replay: false, .. }) if late => v.push((
                    CHECK,
                    format!(
                        "position {pos}'s claim sent at {} ms bought an offer due at {} ms",
                        c.sent_ms, c.deadline_ms
                    ),
                )),
                (_, Claimed::Refused(OfferRefusal::Expired | OfferRefusal::Passed))
                    if c.answered_ms >= c.deadline_ms => {}
                (_, Claimed::Refused(why)) => v.push((
                    CHECK,
                    format!(
                        "position {pos}'s own claim ({:?}, sent {} ms, answered {} ms, due {} ms) \
                         refused {why:?}",
                        c.carried, c.sent_ms, c.answered_ms, c.deadline_ms
                    ),
                )),
                // One order a position, answered fresh once at most; in
                // whatever order the answers were logged (a claim whose
                // reply came late is logged after a retry's replay of it).
                (_, Claimed::Bought { order, replay, .. }) => {
                    let (first, fresh) = told.entry(c.at).or_insert((order.clone(), 0));
                    if first != order {
                        v.push((
                            CHECK,
                            format!("position {pos} was answered order {first}, then {order}"),
                        ));
                    }
                    if !replay {
                        *fresh += 1;
                        if *fresh > 1 {
                            v.push((
                                CHECK,
                                format!("position {pos}'s order {order} was answered fresh twice"),
                            ));
                        }
                    }
                }
            }
        }
        // From the database: orders without a request id are claims'.
        let sale = oracle::closed_sale(&self.ledger, &self.id, self.plan.spec.stock).await;
        let mut db_offer: HashMap<String, String> = HashMap::new();
        let mut purchased = 0u64;
        for (oid, order) in &sale.orders {
            // A user in line holds no purchase token (the draw's losers and
            // the crowd): each of their orders is an offer's, and an offer's
            // order has no request id.
            let rid = order.request_id.as_deref().unwrap_or("");
            let at = o.line.iter().position(|u| *u == order.user_id);
            if at.is_none() && !rid.is_empty() {
                if !rid.contains("-quiet-") {
                    purchased += u64::from(order.quantity);
                }
                continue;
            }
            let named = at
                .and_then(|at| told.get(&at))
                .is_some_and(|(t, _)| t.as_str() == oid);
            if !named || order.quantity != 1 || !rid.is_empty() {
                v.push((
                    CHECK,
                    format!(
                        "order {oid} of {} ({} units, {:?}, request id {rid:?}) is no order a \
                         claim of its user's position {:?} was answered",
                        order.user_id,
                        order.quantity,
                        order.status,
                        at.map(|a| a + 1)
                    ),
                ));
            }
            if let Some(other) = db_offer.insert(order.user_id.to_string(), oid.clone()) {
                v.push((
                    CHECK,
                    format!(
                        "{} has two offers' orders: {other} and {oid}",
                        order.user_id
                    ),
                ));
            }
        }
        // What was on sale at the first healed round and when the quiet
        // phase began: what purchases never took, when every unit that came
        // back went to the waiting list.
        for (when, remaining, _) in o.on_sale.iter().filter(|s| s.2) {
            let never_taken = self.plan.spec.stock.saturating_sub(purchased);
            if *remaining != never_taken {
                v.push((
                    CHECK,
                    format!(
                        "at {when} {remaining} units were on sale while users \
                         waited; purchases took {purchased} of {}, so {never_taken} were never \
                         taken: returned units went to open sale",
                        self.plan.spec.stock
                    ),
                ));
            }
        }
        // Each waiting user's final standing against the database.
        let (mut made, mut bought, mut passed) = (0, 0, 0);
        for (at, u) in o.line.iter().enumerate() {
            let standing = match plain.entry_status(&self.id, u).await {
                Ok(s) => s.offer,
                Err(e) => {
                    v.push((CHECK, format!("{u}'s standing after the close: {e}")));
                    continue;
                }
            };
            let db = db_offer.get(u.as_str());
            match &standing {
                Some(OfferStanding::Bought { order }) => {
                    bought += 1;
                    if db != Some(order) {
                        v.push((
                            CHECK,
                            format!(
                                "{u} (position {}) reads bought {order}, the database has {db:?}",
                                at + 1
                            ),
                        ));
                    }
                }
                other => {
                    if let Some(db) = db {
                        v.push((
                            CHECK,
                            format!("{u} (position {}) reads {other:?}, the database has its order {db}", at + 1),
                        ));
                    }
                    if let Some((t, _)) = told.get(&at) {
                        v.push((
                            CHECK,
                            format!(
                                "{u} (position {}) was told order {t}, yet reads {other:?}",
                                at + 1
                            ),
                        ));
                    }
                }
            }
            match standing {
                Some(OfferStanding::Waiting) | None => {}
                Some(OfferStanding::Passed | OfferStanding::Offered { .. }) => {
                    made += 1;
                    passed += 1;
                }
                Some(OfferStanding::Bought { .. }) => made += 1,
            }
        }
        let meta_closed =
            matches!(plain.reload(&self.id).await, Ok(m) if m.status == EventStatus::Closed);
        if !meta_closed {
            v.push((
                CHECK,
                "the event is not closed after the settling's close".into(),
            ));
        }
        self.log.lock().unwrap().offers.fin = (made, bought, passed);
    }
}
