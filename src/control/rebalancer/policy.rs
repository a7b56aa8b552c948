//! The rebalancing policy: given each bucket's stock and demand, which moves.
//!
//! Pure functions, unit-tested here. Two regimes:
//!
//! - **While the sale runs** (`level`): every bucket should hold what its own
//!   buyers will ask for over the next `horizon` (its demand rate × horizon),
//!   and the rest of the stock is spread evenly. A bucket below half its target
//!   (below 80% when the skew ratio is over the threshold) is refilled from
//!   buckets above theirs, largest deficit from largest surplus first. So a hot
//!   bucket is kept from running dry — its buyers stay on the fast path — while
//!   the stock as a whole stays even (a low skew ratio).
//! - **As stock runs low** (`gather`, under `gather_below` × stock): fragments —
//!   buckets with fewer units than one full order — are gathered into the
//!   hottest buckets until each holds at least a full order, so multi-unit
//!   orders are served by the first bucket that has anything, not by a probe
//!   through the ring or an on-demand consolidation.

/// One transfer to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct Move {
    pub from: u32,
    pub to: u32,
    pub units: u64,
}

/// The policy's tunables.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Seconds of demand a bucket should hold.
    pub horizon_s: f64,
    pub skew_threshold: f64,
    /// Fraction of the stock below which fragments are gathered.
    pub gather_below: f64,
    pub max_moves: usize,
}

/// Max ÷ mean of the stocks (1.0 when empty).
pub fn skew(stocks: &[u64]) -> f64 {
    crate::engine::skew(stocks)
}

/// The moves for one round.
pub fn plan(
    stocks: &[u64],
    rates: &[f64],
    stock_total: u64,
    order_size: u64,
    p: &Policy,
) -> Vec<Move> {
    let remaining: u64 = stocks.iter().sum();
    if remaining == 0 || stocks.len() < 2 {
        return Vec::new();
    }
    if (remaining as f64) < p.gather_below * stock_total as f64 {
        gather(stocks, rates, order_size, p.max_moves)
    } else {
        level(stocks, rates, p)
    }
}

/// "Consolidate now" (the admin endpoint): gather fragments if there are any,
/// else level toward the targets.
pub(crate) fn consolidate(stocks: &[u64], rates: &[f64], order_size: u64, p: &Policy) -> Vec<Move> {
    let moves = gather(stocks, rates, order_size, p.max_moves);
    if moves.is_empty() {
        level(stocks, rates, p)
    } else {
        moves
    }
}

/// Each bucket's target: its demand over the horizon plus an even share of
/// the rest, capped at `max_skew` × the mean (the excess water-filled into the
/// buckets under the cap), so following demand never skews the stock past
/// what the operator tolerates. Refills every round keep a hot bucket served.
pub(crate) fn targets(stocks: &[u64], rates: &[f64], horizon_s: f64, max_skew: f64) -> Vec<f64> {
    let remaining = stocks.iter().sum::<u64>() as f64;
    let n = stocks.len() as f64;
    let need: Vec<f64> = rates.iter().map(|r| r.max(0.0) * horizon_s).collect();
    let total_need: f64 = need.iter().sum();
    let mut t: Vec<f64> = if total_need >= remaining {
        need.iter().map(|d| remaining * d / total_need).collect()
    } else {
        need.iter()
            .map(|d| d + (remaining - total_need) / n)
            .collect()
    };
    let cap = max_skew.max(1.0) * remaining / n;
    for _ in 0..stocks.len() {
        let excess: f64 = t.iter().map(|x| (x - cap).max(0.0)).sum();
        let under = t.iter().filter(|x| **x < cap).count();
        if excess <= 1e-9 || under == 0 {
            break;
        }
        for x in &mut t {
            *x = if *x >= cap {
                cap
            } else {
                *x + excess / under as f64
            };
        }
    }
    t
}

fn level(stocks: &[u64], rates: &[f64], p: &Policy) -> Vec<Move> {
    let targets = targets(stocks, rates, p.horizon_s, p.skew_threshold);
    let short = if skew(stocks) > p.skew_threshold {
        0.8
    } else {
        0.5
    };
    let mut deficits: Vec<(u32, u64)> = stocks
        .iter()
        .zip(&targets)
        .enumerate()
        .filter(|(_, (s, t))| (**s as f64) < short * **t)
        .map(|(b, (s, t))| (b as u32, (t - *s as f64).floor() as u64))
        .filter(|(_, d)| *d > 0)
        .collect();
    let mut surpluses: Vec<(u32, u64)> = stocks
        .iter()
        .zip(&targets)
        .enumerate()
        .filter(|(_, (s, t))| **s as f64 > **t)
        .map(|(b, (s, t))| (b as u32, (*s as f64 - t).floor() as u64))
        .filter(|(_, s)| *s > 0)
        .collect();
    deficits.sort_by_key(|&(b, d)| (std::cmp::Reverse(d), b));
    surpluses.sort_by_key(|&(b, s)| (std::cmp::Reverse(s), b));
    pair(&mut deficits, &mut surpluses, p.max_moves)
}

/// Greedy pairing: largest need with largest surplus.
fn pair(needs: &mut [(u32, u64)], haves: &mut [(u32, u64)], max_moves: usize) -> Vec<Move> {
    let mut moves = Vec::new();
    for (to, need) in needs.iter_mut() {
        for (from, have) in haves.iter_mut() {
            if moves.len() >= max_moves || *need == 0 {
                break;
            }
            let units = (*need).min(*have);
            if units == 0 {
                continue;
            }
            moves.push(Move {
                from: *from,
                to: *to,
                units,
            });
            *need -= units;
            *have -= units;
        }
    }
    moves
}

fn gather(stocks: &[u64], rates: &[f64], order_size: u64, max_moves: usize) -> Vec<Move> {
    let order_size = order_size.max(1);
    let fragments: Vec<u32> = (0..stocks.len() as u32)
        .filter(|&b| (1..order_size).contains(&stocks[b as usize]))
        .collect();
    if fragments.len() < 2 {
        return Vec::new();
    }
    // Hottest first: they receive; the coldest fragments give.
    let mut by_heat = fragments.clone();
    by_heat.sort_by(|a, b| {
        let (ra, rb) = (rates[*a as usize], rates[*b as usize]);
        rb.total_cmp(&ra)
            .then(stocks[*b as usize].cmp(&stocks[*a as usize]))
            .then(a.cmp(b))
    });
    let mut level: Vec<u64> = stocks.to_vec();
    let mut moves = Vec::new();
    let (mut lo, mut hi) = (0usize, by_heat.len() - 1);
    while lo < hi && moves.len() < max_moves {
        let (to, from) = (by_heat[lo], by_heat[hi]);
        let need = order_size.saturating_sub(level[to as usize]);
        if need == 0 {
            lo += 1;
            continue;
        }
        let units = need.min(level[from as usize]);
        moves.push(Move { from, to, units });
        level[to as usize] += units;
        level[from as usize] -= units;
        if level[from as usize] == 0 {
            hi -= 1;
        }
    }
    moves
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            horizon_s: 1.0,
            skew_threshold: 1.5,
            gather_below: 0.1,
            max_moves: 8,
        }
    }

    fn apply(stocks: &[u64], moves: &[Move]) -> Vec<u64> {
        let mut s = stocks.to_vec();
        for m in moves {
            s[m.from as usize] -= m.units;
            s[m.to as usize] += m.units;
        }
        s
    }

    #[test]
    fn an_even_quiet_sale_needs_no_moves() {
        assert!(plan(&[100; 8], &[0.0; 8], 1000, 2, &policy()).is_empty());
    }

    #[test]
    fn a_hot_bucket_running_dry_is_refilled_and_the_stock_stays_even() {
        let stocks = [2, 100, 100, 100];
        let rates = [50.0, 1.0, 1.0, 1.0];
        let moves = plan(&stocks, &rates, 1000, 2, &policy());
        let after = apply(&stocks, &moves);
        assert_eq!(after.iter().sum::<u64>(), 302, "moves conserve units");
        assert!(
            after[0] >= 50,
            "the hot bucket holds its next second of demand: {after:?}"
        );
        assert!(
            skew(&after) <= policy().skew_threshold,
            "the skew stays under the cap: {after:?}"
        );
    }

    #[test]
    fn targets_follow_demand_when_demand_exceeds_stock() {
        let t = targets(&[10, 10], &[30.0, 10.0], 1.0, 2.0);
        assert_eq!(t, vec![15.0, 5.0]);
        let t = targets(&[10, 10], &[0.0, 0.0], 1.0, 2.0);
        assert_eq!(t, vec![10.0, 10.0]);
    }

    #[test]
    fn no_target_passes_the_skew_cap() {
        let t = targets(&[25, 25, 25, 25], &[100.0, 0.0, 0.0, 0.0], 1.0, 1.5);
        assert!((t[0] - 37.5).abs() < 1e-9, "{t:?}");
        assert!((t.iter().sum::<f64>() - 100.0).abs() < 1e-9);
    }

    #[test]
    fn low_stock_fragments_are_gathered_into_full_orders() {
        let stocks = [1, 1, 1, 0, 1, 2];
        let rates = [0.0, 9.0, 1.0, 0.0, 2.0, 0.0];
        let moves = plan(&stocks, &rates, 1000, 3, &policy());
        let after = apply(&stocks, &moves);
        assert_eq!(after.iter().sum::<u64>(), 6);
        let fragments = after.iter().filter(|&&s| (1..3).contains(&s)).count();
        assert!(fragments <= 1, "{after:?}");
        assert!(after[1] >= 3, "the hottest bucket received: {after:?}");
    }

    #[test]
    fn moves_are_bounded_per_round() {
        let stocks: Vec<u64> = (0..32).map(|b| if b % 2 == 0 { 0 } else { 100 }).collect();
        let moves = plan(&stocks, &[1.0; 32], 10_000, 2, &policy());
        assert_eq!(moves.len(), 8);
    }
}
