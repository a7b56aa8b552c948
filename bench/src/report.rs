//! [`Report`]: what a run measured, and the verdict on the books.
//!
//! The verdict compares three numbers that must agree: the stock at the start
//! (S), the units the clients were told they bought (`Bought { units }`), and
//! what the strategy's store says is left (`remaining`).
//!
//! - **Oversold** when more units were sold than existed: `units_sold > S`, or
//!   the store went negative (`remaining < 0`), or buyers were told `Bought`
//!   for units the store still counts as left (`units_sold > S - remaining`:
//!   those units can be sold a second time).
//! - **Undersold** when a buyer was refused while a unit could have served
//!   them (see [`Report::unsold_while_refused`]), or when units left the store
//!   without any client hearing `Bought` (`unaccounted_units > 0`: an error
//!   after the store took the units, or a rollback that never happened).
//!
//! Rendering is `Display` for people and JSON (serde) for scripts.

use std::fmt;
use std::time::Duration;

use serde::Serialize;

use crate::Workload;
use crate::runner::Tally;

/// The outcome of one [`run`](crate::run).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub strategy: String,
    pub workload: Workload,
    pub attempts: u64,
    /// Attempts answered `Bought`.
    pub purchases_ok: u64,
    /// Units in those `Bought` answers.
    pub units_sold: u64,
    pub sold_out_answers: u64,
    pub limit_exceeded: u64,
    pub replayed: u64,
    pub errors: u64,
    /// The first error message, when there were errors.
    pub first_error: Option<String>,
    pub elapsed_s: f64,
    pub purchases_per_s: f64,
    pub attempts_per_s: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    /// Units left in the strategy's store after the run.
    pub remaining: i64,
    /// Units sold beyond the stock (0 when none); see the module doc.
    pub oversold_units: u64,
    /// `S - remaining - units_sold`: units that left the store without a
    /// `Bought` answer (positive) or `Bought` units the store never took
    /// (negative, counted in `oversold_units`). Errors and replays can hide
    /// units here: the client does not learn what they did.
    pub unaccounted_units: i64,
    /// True when `remaining > 0` after the run and some attempt was answered
    /// `SoldOut` for a quantity no larger than `remaining`.
    ///
    /// A coarse but honest check. It never accuses wrongly a strategy whose
    /// store only ever decreases (every baseline here, and any strategy
    /// without cancels): if `q` units are left at the end, at least `q` were
    /// left at every earlier moment, so that `SoldOut` was wrong when it was
    /// given. It misses refusals that were wrong at the time but for more
    /// units than are left at the end (the harness does not see the store
    /// mid-run). A strategy that gives units back (a DECRBY rolled back with
    /// INCRBY, a cancel) can trip it legitimately: units came back after the
    /// refusal — which is exactly the transient undersell of DECR-rollback.
    pub unsold_while_refused: bool,
    /// How many `SoldOut` answers asked for no more than `remaining`.
    pub refused_while_unsold: u64,
    /// `"clean"`, `"OVERSOLD n"` or `"UNDERSOLD …"`.
    pub verdict: String,
    pub claims_no_oversell: bool,
}

impl Report {
    /// Builds the report from the merged tally of a run.
    pub(crate) fn new(
        strategy: String,
        claims_no_oversell: bool,
        w: &Workload,
        tally: Tally,
        elapsed: Duration,
        remaining: i64,
    ) -> Self {
        let stock = i64::try_from(w.stock).unwrap_or(i64::MAX);
        let sold = i64::try_from(tally.units_sold).unwrap_or(i64::MAX);
        let unaccounted = stock - remaining - sold;
        let oversold = [sold - stock, -remaining, -unaccounted, 0]
            .into_iter()
            .max()
            .unwrap_or(0);
        let refused_while_unsold: u64 = match u32::try_from(remaining.max(0)) {
            Ok(left) => tally.sold_out_by_qty.range(..=left).map(|(_, n)| n).sum(),
            Err(_) => tally.sold_out,
        };
        let secs = elapsed.as_secs_f64();
        let rate = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
        let h = &tally.latency_us;
        let mut report = Self {
            strategy,
            workload: w.clone(),
            attempts: tally.attempts,
            purchases_ok: tally.purchases_ok,
            units_sold: tally.units_sold,
            sold_out_answers: tally.sold_out,
            limit_exceeded: tally.limit_exceeded,
            replayed: tally.replayed,
            errors: tally.errors,
            first_error: tally.first_error.clone(),
            elapsed_s: secs,
            purchases_per_s: rate(tally.purchases_ok),
            attempts_per_s: rate(tally.attempts),
            p50_us: h.value_at_quantile(0.5),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            max_us: h.max(),
            remaining,
            oversold_units: oversold.unsigned_abs(),
            unaccounted_units: unaccounted,
            unsold_while_refused: remaining > 0 && refused_while_unsold > 0,
            refused_while_unsold,
            verdict: String::new(),
            claims_no_oversell,
        };
        report.verdict = report.judge();
        report
    }

    /// True when the strategy claims no oversell and oversold anyway.
    pub fn broken_claim(&self) -> bool {
        self.claims_no_oversell && self.oversold_units > 0
    }

    /// Pretty-printed JSON.
    pub fn to_json(&self) -> serde_json::Result<String> {
        serde_json::to_string_pretty(self)
    }

    fn judge(&self) -> String {
        if self.oversold_units > 0 {
            let claim = if self.claims_no_oversell {
                " (breaks its no-oversell claim)"
            } else {
                ""
            };
            return format!("OVERSOLD {}{claim}", self.oversold_units);
        }
        let mut under = Vec::new();
        if self.unsold_while_refused {
            under.push(format!(
                "{} left while {} attempts for at most that many were refused",
                self.remaining, self.refused_while_unsold
            ));
        }
        if self.unaccounted_units > 0 {
            under.push(format!(
                "{} units left the stock without a Bought answer ({} errors, {} replays)",
                self.unaccounted_units, self.errors, self.replayed
            ));
        }
        if under.is_empty() {
            "clean".to_string()
        } else {
            format!("UNDERSOLD: {}", under.join("; "))
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = &self.workload;
        let claim = if self.claims_no_oversell {
            "claims no oversell"
        } else {
            "naive: may oversell"
        };
        let users = match w.zipf {
            None => "uniform".to_string(),
            Some(s) => format!("Zipf s={s}"),
        };
        writeln!(f, "{} — {} ({claim})", self.strategy, self.verdict)?;
        writeln!(
            f,
            "  workload    S={} U={} ({users}) A={} C={} retry={:.0}% seed={}",
            w.stock,
            w.users,
            w.attempts,
            w.concurrency,
            w.retry_rate * 100.0,
            w.seed
        )?;
        writeln!(
            f,
            "  answers     {} attempts: {} bought ({} units), {} sold out, {} over limit, {} replayed, {} errors",
            self.attempts,
            self.purchases_ok,
            self.units_sold,
            self.sold_out_answers,
            self.limit_exceeded,
            self.replayed,
            self.errors
        )?;
        if let Some(e) = &self.first_error {
            writeln!(f, "  first error {e}")?;
        }
        writeln!(
            f,
            "  throughput  {:.0} attempts/s, {:.0} purchases/s over {:.2} s",
            self.attempts_per_s, self.purchases_per_s, self.elapsed_s
        )?;
        writeln!(
            f,
            "  latency µs  p50 {} · p99 {} · p99.9 {} · max {}",
            self.p50_us, self.p99_us, self.p999_us, self.max_us
        )?;
        write!(
            f,
            "  stock       remaining {}, oversold {}, unaccounted {}, refused while unsold {}",
            self.remaining, self.oversold_units, self.unaccounted_units, self.refused_while_unsold
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Outcome;

    /// A report for stock 10 after the given answers, with `remaining` left.
    fn report(answers: &[(u32, Outcome)], remaining: i64, claims: bool) -> Report {
        let w = Workload {
            stock: 10,
            ..Workload::default()
        };
        let mut tally = Tally::new().unwrap();
        for (qty, outcome) in answers {
            tally.record(*qty, outcome.clone(), Duration::from_micros(100));
        }
        Report::new(
            "t".into(),
            claims,
            &w,
            tally,
            Duration::from_secs(1),
            remaining,
        )
    }

    fn bought(units: u32) -> (u32, Outcome) {
        (units, Outcome::Bought { units })
    }

    #[test]
    fn selling_exactly_the_stock_is_clean() {
        let r = report(&[bought(3), bought(7), (1, Outcome::SoldOut)], 0, true);
        assert_eq!(r.verdict, "clean");
        assert_eq!((r.oversold_units, r.unaccounted_units), (0, 0));
        assert!(!r.unsold_while_refused);
    }

    #[test]
    fn selling_more_than_the_stock_is_oversold_and_breaks_the_claim() {
        let r = report(&[bought(8), bought(4)], -2, true);
        assert_eq!(r.oversold_units, 2);
        assert!(r.verdict.starts_with("OVERSOLD 2"), "{}", r.verdict);
        assert!(r.broken_claim());
        let naive = report(&[bought(8), bought(4)], -2, false);
        assert_eq!(naive.verdict, "OVERSOLD 2");
        assert!(!naive.broken_claim());
    }

    #[test]
    fn bought_units_the_store_still_holds_are_oversold() {
        // 10 units sold, yet the store says 3 are left to sell again.
        let r = report(&[bought(5), bought(5)], 3, true);
        assert_eq!(r.oversold_units, 3);
        assert_eq!(r.unaccounted_units, -3);
    }

    #[test]
    fn a_refusal_for_what_is_left_is_undersold() {
        let r = report(
            &[bought(8), (2, Outcome::SoldOut), (3, Outcome::SoldOut)],
            2,
            true,
        );
        assert!(r.unsold_while_refused);
        assert_eq!(r.refused_while_unsold, 1, "only the ask for 2 fits in 2");
        assert!(r.verdict.starts_with("UNDERSOLD"), "{}", r.verdict);
    }

    #[test]
    fn a_refusal_for_more_than_is_left_is_not_undersold() {
        let r = report(&[bought(8), (3, Outcome::SoldOut)], 2, true);
        assert!(!r.unsold_while_refused);
        assert_eq!(r.verdict, "clean");
    }

    #[test]
    fn units_gone_without_a_sale_are_undersold() {
        let r = report(&[bought(6), (2, Outcome::Error("timeout".into()))], 2, true);
        assert_eq!(r.unaccounted_units, 2);
        assert!(
            r.verdict.contains("without a Bought answer"),
            "{}",
            r.verdict
        );
        assert_eq!(r.first_error.as_deref(), Some("timeout"));
    }
}
