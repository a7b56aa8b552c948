//! [`run`]: prepare a strategy, drive it with C concurrent clients, measure.
//!
//! Clients pull attempt indices from one shared counter until the workload's A
//! attempts are handed out, ask the [`Picker`] what attempt `i` sends, time the
//! strategy's answer into their own HDR histogram, and tally outcomes. The
//! tallies and histograms are merged once at the end, so the hot loop shares
//! nothing but two atomic counters.
//!
//! The C clients are futures polled concurrently in the caller's task
//! (`FuturesUnordered`), not `tokio::spawn`ed tasks: [`run`] borrows the
//! strategy (`&S`), and a borrow cannot move into a spawned task without
//! `unsafe` or an `Arc` in the signature. Every strategy's I/O (fred's
//! connection tasks, sqlx's pool) runs on the runtime's worker threads anyway;
//! only the few microseconds of client-side bookkeeping share one thread.
//! Measured on the 2-core machine (release, single-key Lua, C=64, A=200,000):
//! one task 114k–165k attempts/s, 64 spawned tasks 102k–109k — the single
//! task is no bottleneck (fewer cross-thread wake-ups, if anything).
//!
//! What the numbers mean is left to [`Report`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::{Outcome, Picker, Report, Strategy, Workload};

/// Latencies are recorded in microseconds, from 1 µs to one hour, to three
/// significant digits.
const LATENCY_MAX_US: u64 = 3_600_000_000;

/// What one client (or, merged, all of them) saw.
#[derive(Debug, Clone)]
pub(crate) struct Tally {
    pub attempts: u64,
    pub purchases_ok: u64,
    pub units_sold: u64,
    pub sold_out: u64,
    /// SoldOut answers by the quantity asked, for the undersell check.
    pub sold_out_by_qty: BTreeMap<u32, u64>,
    pub limit_exceeded: u64,
    pub replayed: u64,
    pub errors: u64,
    /// The first error message seen, to say *why* there were errors.
    pub first_error: Option<String>,
    pub latency_us: Histogram<u64>,
}

impl Tally {
    pub(crate) fn new() -> anyhow::Result<Self> {
        Ok(Self {
            attempts: 0,
            purchases_ok: 0,
            units_sold: 0,
            sold_out: 0,
            sold_out_by_qty: BTreeMap::new(),
            limit_exceeded: 0,
            replayed: 0,
            errors: 0,
            first_error: None,
            latency_us: Histogram::new_with_bounds(1, LATENCY_MAX_US, 3)
                .context("latency histogram")?,
        })
    }

    pub(crate) fn record(&mut self, qty: u32, outcome: Outcome, latency: Duration) {
        self.attempts += 1;
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.latency_us.saturating_record(us.max(1));
        match outcome {
            Outcome::Bought { units } => {
                self.purchases_ok += 1;
                self.units_sold += u64::from(units);
            }
            Outcome::SoldOut => {
                self.sold_out += 1;
                *self.sold_out_by_qty.entry(qty).or_default() += 1;
            }
            Outcome::LimitExceeded => self.limit_exceeded += 1,
            Outcome::Replayed => self.replayed += 1,
            Outcome::Error(message) => {
                self.errors += 1;
                self.first_error.get_or_insert(message);
            }
        }
    }

    fn merge(&mut self, other: Tally) -> anyhow::Result<()> {
        self.attempts += other.attempts;
        self.purchases_ok += other.purchases_ok;
        self.units_sold += other.units_sold;
        self.sold_out += other.sold_out;
        for (qty, n) in other.sold_out_by_qty {
            *self.sold_out_by_qty.entry(qty).or_default() += n;
        }
        self.limit_exceeded += other.limit_exceeded;
        self.replayed += other.replayed;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.latency_us
            .add(&other.latency_us)
            .context("merging latency histograms")
    }
}

/// Runs workload `w` against `strategy`: `prepare`, the attempts, then
/// `remaining` and `cleanup`. With `progress`, a bar on stderr follows the
/// attempts. Errors are those of the setup and the final count; a failed
/// attempt is an [`Outcome::Error`] in the report, not an error here.
pub async fn run<S: Strategy>(
    strategy: &S,
    w: &Workload,
    progress: bool,
) -> anyhow::Result<Report> {
    let picker = Picker::new(w)?;
    let name = strategy.name();
    if let Err(e) = strategy.prepare(w).await {
        // A half-done prepare may have left a row or a key: remove it, but
        // report the prepare's error, which is the one that matters.
        let _ = strategy.cleanup().await;
        return Err(e.context(format!("{name}: prepare")));
    }
    // Whatever happens after `prepare`, `cleanup` runs; the first error wins.
    let measured = drive(strategy, &picker, w, progress).await;
    let remaining = match &measured {
        Ok(_) => strategy
            .remaining()
            .await
            .with_context(|| format!("{name}: remaining")),
        Err(_) => Ok(0),
    };
    let cleaned = strategy
        .cleanup()
        .await
        .with_context(|| format!("{name}: cleanup"));
    let (tally, elapsed) = measured?;
    let remaining = remaining?;
    cleaned?;
    Ok(Report::new(
        name,
        strategy.claims_no_oversell(),
        w,
        tally,
        elapsed,
        remaining,
    ))
}

/// The measured part: C clients until A attempts are done.
async fn drive<S: Strategy>(
    strategy: &S,
    picker: &Picker,
    w: &Workload,
    progress: bool,
) -> anyhow::Result<(Tally, Duration)> {
    let bar = progress_bar(w.attempts, progress, &strategy.name());
    let next = AtomicU64::new(0);
    let tallies = (0..w.concurrency)
        .map(|_| Tally::new())
        .collect::<anyhow::Result<Vec<_>>>()?;
    let started = Instant::now();
    let mut clients = tallies
        .into_iter()
        .map(|tally| client(strategy, picker, w.attempts, &next, &bar, tally))
        .collect::<FuturesUnordered<_>>();
    let mut total = Tally::new()?;
    while let Some(tally) = clients.next().await {
        total.merge(tally)?;
    }
    let elapsed = started.elapsed();
    bar.finish_and_clear();
    Ok((total, elapsed))
}

/// One client: attempts until the shared counter passes `attempts`.
async fn client<S: Strategy>(
    strategy: &S,
    picker: &Picker,
    attempts: u64,
    next: &AtomicU64,
    bar: &ProgressBar,
    mut tally: Tally,
) -> Tally {
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= attempts {
            return tally;
        }
        let a = picker.attempt(i);
        let sent = Instant::now();
        let outcome = strategy.attempt(&a.user, a.qty, &a.request_id).await;
        tally.record(a.qty, outcome, sent.elapsed());
        bar.inc(1);
    }
}

fn progress_bar(len: u64, visible: bool, name: &str) -> ProgressBar {
    if !visible {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    // The template is a constant; should it ever fail to parse, keep the default.
    if let Ok(style) = ProgressStyle::with_template(
        "{prefix:>22} [{elapsed_precise}] {wide_bar} {pos}/{len} ({per_sec}, eta {eta})",
    ) {
        bar.set_style(style);
    }
    bar.set_prefix(name.to_string());
    bar
}
