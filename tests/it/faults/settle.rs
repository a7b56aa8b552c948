//! After a schedule: heal the store, let retries and recovery finish what the
//! faults cut short, and check the promises of docs/DESIGN.md.
//!
//! Settling is what clients and operators do: retry every request whose
//! outcome is unknown with its request id, retry every confirm and cancel
//! that failed, resume a reshard that stopped half way, let the expiry
//! sweeper run, close the sale (again, if a close was cut short), which
//! drains every stream into the ledger, then ask once more with every
//! request id (the ledger answers after the close). Then the answers are
//! held against the ledger (`checks`). Each check is a named
//! switch in [`super::CHECKS`]; every violation names its check, so a failing
//! seed says which promise broke, and checks that are off still report.

use std::sync::Arc;
use std::time::Duration;

use shardstock::control::flusher::Flusher;
use shardstock::control::hold_expiry::{ExpiryOptions, sweep_due};
use shardstock::control::saga_sweeper::{self, SagaSweepOptions};
use shardstock::control::{audit, lifecycle, reshard};
use shardstock::domain::ids::RequestId;
use shardstock::domain::keys::BucketRef;
use shardstock::domain::model::{EventStatus, RequestRecord};
use shardstock::engine::{Lease, PurchaseRequest, Refusal, mover};
use shardstock::store::{Buckets, Leases, Store, Transfers};
use shardstock::{Engine, EngineError};

use super::log::Answer;
use super::rig::{Rig, flush_options};
use super::told::{Call, Via};
use crate::harness::faulty::Faulty;
use crate::harness::{eventually, user};

/// What a schedule broke: `(check, what)`.
pub type Violations = Vec<(&'static str, String)>;

/// The checks that schedules with reshards report under `across_reshards`.
const RESHARD_SENSITIVE: &[&str] = &[
    "conservation",
    "no_double_sale",
    "limits",
    "bought_once",
    "replays_agree",
    "no_false_sold_out",
];

/// How often a settling retry asks again before the request counts as
/// never answered.
const RETRIES: usize = 8;

/// A quiet buyer's token's allowance on a token schedule: every quantity it
/// asks (1–3).
pub const QUIET_ALLOWANCE: u32 = 3;

impl<S: Store> Rig<S> {
    /// Heals, settles, checks; returns what broke.
    pub async fn settle_and_check(self: &Arc<Self>, plain: &Arc<Engine<Faulty<S>>>) -> Violations {
        let mut v = Violations::new();
        for e in &self.engines {
            e.store().heal();
        }
        self.refresh_settler(plain).await;
        // Work the engines finish on their own (a batch whose callers went
        // away, a step delayed by a fault) lands before anything is judged.
        eventually(
            "the schedule's store calls to end",
            Duration::from_secs(30),
            async || {
                self.engines
                    .iter()
                    .all(|e| e.store().in_flight() == 0)
                    .then_some(())
            },
        )
        .await;
        self.resume_reshard(plain, &mut v).await;
        // A call dropped while it held the mover lease (a saga gathering, a
        // rebalancer round) left it to expire: until then nobody may move
        // units, and a purchase that needs an open transfer completed answers
        // try-again. That is the lease's bound, not a defect; the promises
        // are judged once no dead holder blocks the event. A closed event
        // sells nothing more, and the close that finishes it (below) seizes
        // the lease from a close cut off while holding it (30 s to expire).
        let closed =
            matches!(plain.reload(&self.id).await, Ok(m) if m.status == EventStatus::Closed);
        if !closed {
            eventually(
                "the mover lease of a dropped holder to expire",
                Duration::from_secs(40),
                async || {
                    matches!(plain.store().lease_holder(&self.id).await, Ok(None)).then_some(())
                },
            )
            .await;
        }
        // Nobody drives a saga now: every one still pending is the sweeper's
        // (a reshard or a close settles its own), with no wait for its bound.
        let sweep = SagaSweepOptions {
            stale_after: Duration::ZERO,
            ..SagaSweepOptions::default()
        };
        if let Err(e) = saga_sweeper::sweep_event(plain, &self.id, &sweep).await {
            v.push(("no_pending_saga", format!("the sweep failed: {e}")));
        }
        let pending = self.pending(plain).await;
        // A close cut off by a fault owns its sagas: finishing it (below)
        // settles them, as the rebalancer's leader would.
        let on_sale =
            matches!(plain.reload(&self.id).await, Ok(m) if m.status == EventStatus::OnSale);
        if pending > 0 && on_sale {
            v.push((
                "no_pending_saga",
                format!("{pending} sagas still pending after healing and a sweep"),
            ));
        }
        if !closed {
            self.retry_unknown(plain, &mut v).await;
            self.retry_orders(plain).await;
            // Holds whose deadline passed go back on sale now, as the
            // sweeper's next tick would do them.
            let swept = Box::pin(sweep_due(plain.as_ref(), &ExpiryOptions::default(), 64)).await;
            if let Err(e) = swept {
                v.push((
                    "conservation",
                    format!("the expiry sweep on a healed store failed: {e}"),
                ));
            }
            // A draw's waiting list: rounds and claims until no offer is open.
            self.settle_offers(plain, &mut v).await;
            self.audit(plain, "before the close", &mut v).await;
            if self.window_ended() {
                // Nothing sells after the window: no quiet phase to judge.
                self.log
                    .lock()
                    .unwrap()
                    .count("no quiet phase: the window ended".into());
            } else {
                self.note_on_sale(plain, "the quiet phase").await;
                self.sell_out(plain, pending, &mut v).await;
            }
        }
        let mut flusher = Flusher::new(
            plain.clone(),
            self.ledger.clone(),
            "settler".into(),
            flush_options(),
        );
        self.closing();
        if let Err(e) =
            lifecycle::close(plain, &self.ledger, &mut flusher, &self.id, &self.stop).await
        {
            v.push((
                "conservation",
                format!("the close on a healed store failed: {e}"),
            ));
            return v;
        }
        self.ask_after_close(plain, &mut v).await;
        self.audit(plain, "after the close", &mut v).await;
        self.check_ledger(&mut v).await;
        self.check_database(&mut v).await;
        self.check_tokens(plain, &mut v).await;
        self.check_offers(plain, &mut v).await;
        let errors = self.log.lock().unwrap().errors.clone();
        v.extend(errors);
        if self.plan.reshards() {
            // Every promise a reshard can break is one known defect family
            // today (see the check `across_reshards`).
            for (check, what) in &mut v {
                if RESHARD_SENSITIVE.contains(check) {
                    *what = format!("{check}: {what}");
                    *check = "across_reshards";
                }
            }
        }
        v
    }

    /// Sagas left pending in any bucket of any layout.
    async fn pending(&self, plain: &Engine<Faulty<S>>) -> usize {
        let Ok(meta) = plain.reload(&self.id).await else {
            return 0;
        };
        let mut n = 0;
        for b in meta.all_buckets() {
            if let Ok(list) = plain.store().pending(&b).await {
                n += list
                    .iter()
                    .filter(|(_, r)| matches!(r, RequestRecord::Pending { .. }))
                    .count();
            }
        }
        n
    }

    /// A reshard stopped by a fault is resumed by asking for it again.
    async fn resume_reshard(&self, plain: &Engine<Faulty<S>>, v: &mut Violations) {
        let mut errors = Vec::new();
        for _ in 0..5 {
            let Ok(meta) = plain.reload(&self.id).await else {
                return;
            };
            let Some((_, to)) = meta
                .reshard_to
                .filter(|_| meta.status == EventStatus::Resharding)
            else {
                return;
            };
            match Box::pin(reshard::reshard(plain, &self.id, to)).await {
                Ok(_) => return,
                Err(e) => errors.push(e.to_string()),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        v.push((
            "conservation",
            format!("a stopped reshard could not be resumed: {errors:?}"),
        ));
    }

    /// Retries every request whose outcome is unknown, with its request id,
    /// until it gets a final answer.
    async fn retry_unknown(&self, plain: &Engine<Faulty<S>>, v: &mut Violations) {
        let open: Vec<PurchaseRequest> = {
            let log = self.log.lock().unwrap();
            log.order
                .iter()
                .map(|rid| &log.sent[rid])
                .filter(|s| !s.answers().any(Answer::is_final))
                .filter(|s| matches!(s.answers().last(), Some(Answer::Unknown(_))))
                .map(|s| s.req.clone())
                .collect()
        };
        for req in open {
            let mut last = None;
            for _ in 0..RETRIES {
                let answer = self.purchase(plain, &req, None).await;
                // Final, or the sale is over: once it is closed the ledger
                // answers (`ask_after_close`).
                // A token refusal is an answer too: no earlier attempt
                // bought (a replay answers its record before the token).
                if answer.is_final()
                    || matches!(
                        answer,
                        Answer::NotOnSale | Answer::NoOrder | Answer::TokenRefused(_)
                    )
                {
                    last = None;
                    break;
                }
                if let Some(open) = self.complete_open_transfers(plain).await {
                    v.push((
                        "open_transfer_blocks_sales",
                        format!("a retry: {answer:?} while {open} units sat in an open transfer (completed now, as a rebalancer round would)"),
                    ));
                }
                last = Some(answer);
            }
            if let Some(answer) = last {
                let rid = req.request_id.as_ref().map(RequestId::as_str).unwrap_or("");
                v.push((
                    "replays_agree",
                    format!("{rid}: no final answer after {RETRIES} retries on a healed store (last: {answer:?})"),
                ));
            }
        }
    }

    /// Retries every confirm, then every cancel, whose outcome is unknown
    /// and whose client has not learnt since how its order ended.
    async fn retry_orders(&self, plain: &Engine<Faulty<S>>) {
        let confirms = self.log.lock().unwrap().unresolved(Call::Confirm);
        for oid in confirms {
            self.confirm(plain, &oid, None).await;
        }
        let cancels = self.log.lock().unwrap().unresolved(Call::Cancel);
        for oid in cancels {
            self.cancel(plain, &oid, None).await;
        }
    }

    /// Whether the sale window ended (nothing sells any more).
    fn window_ended(&self) -> bool {
        self.plan
            .spec
            .ends_at
            .is_some_and(|end| self.clock.now_ms() >= end)
    }

    /// After the close every request id is asked once more, as a client
    /// that never learnt (or forgot) what it bought: the engine refuses, the
    /// ledger answers. Each one must now learn its fate: its order, or that
    /// it made none.
    async fn ask_after_close(&self, plain: &Engine<Faulty<S>>, v: &mut Violations) {
        let all: Vec<PurchaseRequest> = {
            let log = self.log.lock().unwrap();
            log.order
                .iter()
                .map(|rid| log.sent[rid].req.clone())
                .collect()
        };
        for req in all {
            let answer = self.purchase(plain, &req, None).await;
            if !matches!(answer, Answer::Bought(..) | Answer::NoOrder) {
                let rid = req.request_id.as_ref().map(RequestId::as_str).unwrap_or("");
                v.push((
                    "replays_agree",
                    format!("{rid}: asked after the close, answered {answer:?} (not its order, nor that it made none)"),
                ));
            }
        }
    }

    async fn audit(&self, plain: &Engine<Faulty<S>>, when: &str, v: &mut Violations) {
        match audit::audit(plain, &self.ledger, &self.id).await {
            Ok(a) => {
                // The equation itself; the guard's alarms are their own check.
                let accounted =
                    (a.remaining + a.in_transfer + a.sold_flushed + a.sold_unflushed + a.leftover)
                        as i128
                        - a.released as i128;
                if accounted != i128::from(a.stock) {
                    v.push((
                        "conservation",
                        format!("the audit {when} does not balance: {a:?}"),
                    ));
                }
                if a.guard_violations > 0 {
                    v.push((
                        "no_guard_alarm",
                        format!(
                            "the audit {when} counts {} guard violations: {a:?}",
                            a.guard_violations
                        ),
                    ));
                }
            }
            Err(e) => v.push(("conservation", format!("the audit {when} failed: {e}"))),
        }
    }

    /// A quiet phase: fresh buyers, one at a time, until the event is sold
    /// out. A sold-out answer while the event holds at least the quantity
    /// asked is a false sold-out; every unit left must sell.
    ///
    /// What the event holds is the audit's count (stock plus units in
    /// transfers not yet delivered, less a draw's units set aside for its
    /// waiting list): a transfer cut off after its IN is still
    /// journaled at its source until a mover completes it, and the view
    /// counted its units in both buckets (seed 1269515 looked like a false
    /// sold-out for 2 with 6 left while 1 was; the view counts them once now).
    async fn sell_out(&self, plain: &Engine<Faulty<S>>, pending: usize, v: &mut Violations) {
        let stock = self.plan.spec.stock;
        let mut contention = 0;
        for i in 0..(2 * stock + 20) {
            // A drawn draw event's units set aside for its waiting list
            // (returned by a cancel or an expiry) are unsold but not on
            // sale: the audit counts them, the view names them `waiting`.
            let waiting = match plain.view(&self.id).await {
                Ok(view) => view.waiting,
                Err(e) => {
                    v.push((
                        "no_false_sold_out",
                        format!("the view failed on a healed store: {e}"),
                    ));
                    return;
                }
            };
            let remaining = match audit::audit(plain, &self.ledger, &self.id).await {
                Ok(a) => (a.remaining + a.in_transfer).saturating_sub(waiting),
                Err(e) => {
                    v.push((
                        "no_false_sold_out",
                        format!("the audit failed on a healed store: {e}"),
                    ));
                    return;
                }
            };
            let qty = if remaining == 0 {
                1
            } else {
                1 + (i as u32 % 3)
            };
            let quiet = format!("quiet{i}");
            let req = PurchaseRequest {
                event: self.id.clone(),
                user: user(quiet.clone()),
                quantity: qty,
                request_id: Some(
                    RequestId::parse(format!("s{}-quiet-{i}", self.plan.seed)).unwrap(),
                ),
                // A token schedule's quiet buyer carries its own token.
                access_token: self.plan.quiet_token(&self.id, &quiet, QUIET_ALLOWANCE),
            };
            let sent_ms = self.clock.now_ms();
            let result = Box::pin(plain.purchase(&req)).await;
            let refused_at = match &result {
                Ok(out) => match &out.result {
                    Err(Refusal::SoldOut { .. }) => Some(remaining),
                    _ => None,
                },
                Err(EngineError::Contention { .. }) if contention < 20 => {
                    contention += 1;
                    if let Some(open) = self.complete_open_transfers(plain).await {
                        v.push((
                            "open_transfer_blocks_sales",
                            format!("{qty} units: try-again while {open} units sat in an open transfer (completed now, as a rebalancer round would)"),
                        ));
                    }
                    None
                }
                Err(e) => {
                    v.push((
                        "no_false_sold_out",
                        format!("a purchase on a healed store failed: {e}"),
                    ));
                    return;
                }
            };
            let answered_ms = self.clock.now_ms();
            self.log.lock().unwrap().answered(
                &req,
                match &result {
                    Ok(out) if out.replayed => Ok((out, Via::Replay)),
                    Ok(out) => Ok((out, Via::Purchase)),
                    Err(e) => Err(Answer::of_error(e)),
                },
                sent_ms,
                answered_ms,
            );
            if remaining == 0 && refused_at.is_none() && result_bought(&self.log, &req) {
                v.push((
                    "no_double_sale",
                    format!("{qty} bought while the event showed 0 remaining"),
                ));
            }
            match refused_at {
                Some(0) => return,
                Some(r)
                    if r >= u64::from(qty)
                        && self.complete_open_transfers(plain).await.is_some() =>
                {
                    v.push((
                        "open_transfer_blocks_sales",
                        format!("sold out for {qty} while {r} units remained, some in an open transfer (completed now, as a rebalancer round would)"),
                    ));
                }
                Some(r) if r >= u64::from(qty) => {
                    let state = self.diagnose(plain).await;
                    v.push((
                        "no_false_sold_out",
                        format!("sold out for {qty} while {r} units remained, with nothing else going on ({pending} sagas left pending by the schedule); {state}"),
                    ));
                    return;
                }
                _ => {}
            }
        }
        v.push(("no_false_sold_out", "the quiet phase never sold out".into()));
    }

    /// The event's seq and sold-out mark, and each bucket's stock, units in
    /// transfer and epoch: what a false sold-out is read from.
    async fn diagnose(&self, plain: &Engine<Faulty<S>>) -> String {
        let Ok(meta) = plain.reload(&self.id).await else {
            return "no meta".into();
        };
        let mut buckets = Vec::new();
        for b in meta.all_buckets() {
            let state = plain.store().bucket_state(&b).await;
            let counters = plain.store().counters(&b).await;
            buckets.push(format!(
                "{}#{}: {:?} {:?}",
                b.generation,
                b.index,
                state.map(|s| (s.stock, s.in_transfer, s.adds)),
                counters
            ));
        }
        format!(
            "meta seq {} mark {:?} gen {}; buckets (stock, in transfer, adds) (adds, epoch): {}",
            meta.seq,
            meta.sold_out,
            meta.generation,
            buckets.join(", ")
        )
    }

    /// Completes the transfers a failed mover left open, as the next
    /// rebalancer round does; `Some(units)` when there were any.
    async fn complete_open_transfers(&self, plain: &Engine<Faulty<S>>) -> Option<u64> {
        let meta = plain.reload(&self.id).await.ok()?;
        let mut open = 0;
        for b in 0..meta.spec.buckets {
            let bucket = BucketRef::new(&self.id, meta.generation, b);
            open += plain
                .store()
                .open_transfers(&bucket)
                .await
                .ok()?
                .iter()
                .map(|t| t.units)
                .sum::<u64>();
        }
        if open == 0 {
            return None;
        }
        let owner = Lease::owner(plain.instance(), "settler");
        let lease = Lease::wait(
            plain.store(),
            &self.id,
            &owner,
            Duration::from_secs(2),
            Duration::from_secs(5),
        )
        .await
        .ok()??;
        let buckets: Vec<BucketRef> = (0..meta.spec.buckets)
            .map(|b| BucketRef::new(&self.id, meta.generation, b))
            .collect();
        let _ = mover::take_over(plain.store(), &meta, &buckets, lease.token()).await;
        lease.release(plain.store()).await;
        Some(open)
    }
}

/// Whether the last answer logged for `req` was a purchase.
fn result_bought(log: &std::sync::Mutex<super::log::Log>, req: &PurchaseRequest) -> bool {
    let rid = req.request_id.as_ref().map(RequestId::as_str).unwrap_or("");
    let log = log.lock().unwrap();
    matches!(
        log.sent.get(rid).and_then(|s| s.answers().last()),
        Some(Answer::Bought(..))
    )
}
