//! The adaptive bucket count (issue 17): when the leader reshards an event
//! created with `buckets = "auto"` or `{ min, max }`, and to how many.
//!
//! A pure function of what the leader measures each round, unit-tested here;
//! `Rebalancer::resize` acts on it with the reshard protocol
//! (`control::reshard`), which is fault-safe at every step.
//!
//! - **Grow** (`hot`) while the buckets are contended: the event's demand
//!   (units asked for per second, the rebalancer's smoothed per-bucket rates
//!   summed) over `grow_above` per bucket. The new count gives each bucket
//!   about `target` units/s and is at least four times the old one (the
//!   demand a saturated layout shows is capped by that layout), and on a Redis
//!   Cluster at least the count that lands a bucket on every master. On one
//!   Redis server, whose buckets share the batcher's lanes (an event of
//!   fewer buckets than lanes spreads its calls over them), to at most
//!   `one_server_max` (1: not at all) and a multiple of the lanes past them:
//!   more buckets add groups to every call and no call in flight.
//! - **Spread** (`spread`): on a Cluster, an event carrying at least one
//!   bucket's `target` on fewer buckets than it takes to reach every master
//!   grows to that many. An event is created that wide already
//!   (`starting`): a growth in the first tenth of a second made the
//!   purchases of its reshard wait, and set auto's sale p99 above the best
//!   fixed layout's there. Once on every master it grows no further
//!   (`grow_past_masters` allows it): on this machine's Cluster 3 and 4
//!   buckets sold alike, 12 0.58–0.81× as fast.
//! - **Not past `max_moved`:** a reshard moves every buyer's records
//!   (holdings, order index, request ids) to their new home while the
//!   event's purchases wait, so its cost grows with the units sold: ~16–20 µs
//!   a buyer on this machine (1 → 5 after ~12k buyers 0.23–0.32 s, 5 → 2
//!   after 80k 1.24 s), seconds after a few hundred thousand buyers.
//!   Once more than `max_moved` units are sold the layout stays (a sale that
//!   grew early keeps its layout; a big sale's tail is served by it, with the
//!   sold-out mark and the rebalancer's gathering of fragments).
//! - **Shrink** (`drain`) as the sale drains: when fewer than
//!   `shrink_orders` full orders (`max_per_order` units) per bucket are left,
//!   to at most half the count and to as many buckets as the remaining stock
//!   fills with that many orders each, so the tail is served by a few
//!   buckets and refusing an order the event cannot serve stays cheap.
//! - **Hysteresis:** a grown layout is never so wide that it would drain at
//!   once (it keeps `2 × shrink_orders` orders a bucket); a change is a
//!   doubling or a halving at least (growing from a saturated layout is at
//!   least fourfold: the demand it shows is capped by its lanes, and a second
//!   growth later in the sale would cost more); at least `min_interval` between two
//!   resizes of one event (the first of a sale is not held back). Nothing
//!   changes a sold-out event: its sold-out mark already answers refusals in
//!   one step.
//!
//! It cannot see demand that never reaches the store (requests refused by
//! admission control), nor foresee a surge: it follows the demand of the last
//! rounds, so a layout lags a change of demand by a round or two and the time
//! a reshard takes. A sale's start is seen sooner: its first purchases wake
//! the leader's loop, which measures them 50 ms later (`schedule::QUICK`),
//! so the growth comes while few buyers have records to move (53–85 ms of
//! reshard about 0.1 s into the sale, on this machine).

use std::time::Duration;

use crate::domain::model::BucketRange;

/// The thresholds (from `[rebalancer]`; measured on the 2-core machine, see
/// docs/DESIGN.md). Its `Default` is the default settings' (`app::options`).
#[derive(Debug, Clone)]
pub struct Resizing {
    /// Grow when the demand per bucket is above this (units/s).
    pub grow_above: f64,
    /// A grown layout gets about this much demand per bucket (units/s).
    pub target: f64,
    /// Shrink when fewer than this many full orders per bucket are left.
    pub shrink_orders: u64,
    /// At least this long between two resizes of one event.
    pub min_interval: Duration,
    /// No resize once more than this many units are sold (a reshard moves
    /// every buyer's records while purchases wait).
    pub max_moved: u64,
    /// On one Redis server (the buckets share the batcher's lanes, and an
    /// event of fewer buckets than lanes spreads over them) a growth goes to
    /// at most this many buckets: 1, the default, keeps an event at its
    /// count there, since more buckets add no call in flight.
    pub one_server_max: u32,
    /// On a Redis Cluster, grow an event whose buckets already reach every
    /// master. Off by default: there, more buckets a master sold no faster
    /// (3 and 4 buckets alike, 12 0.58–0.81× as fast, 64 0.55×).
    pub grow_past_masters: bool,
}

/// What the leader knows of an adaptive event this round.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Signals {
    pub buckets: u32,
    pub range: BucketRange,
    /// Units asked for per second, the whole event.
    pub demand: f64,
    pub remaining: u64,
    /// Units sold so far (the records a reshard would move, at most).
    pub sold: u64,
    /// `max_per_order`.
    pub(crate) order_size: u64,
    /// The fewest buckets of the next layout that land on every master (1
    /// off a Cluster).
    pub spread: u32,
    /// On a Cluster, whether the current layout has a bucket on every master.
    pub(crate) on_every_master: bool,
    /// The call queues the buckets of one server share (the batcher's
    /// shared lanes, on a standalone Redis); 0: a lane per bucket.
    pub lanes: u32,
}

/// Why the count changes (the `reason` label of `shardstock_reshards_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Hot,
    Spread,
    Drain,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hot => "hot",
            Self::Spread => "spread",
            Self::Drain => "drain",
        }
    }
}

/// The count an adaptive event is created with: its `range.min`, or on a
/// Redis Cluster the fewest buckets that land on every master (`spread`),
/// as far as the range and the stock allow (no wider than the stock keeps
/// at twice the drain mark, so the first round does not shrink it).
pub fn starting(range: BucketRange, stock: u64, order_size: u64, spread: u32, r: &Resizing) -> u32 {
    range.clamp(spread.min(widest(fills(stock, order_size, r))))
}

/// Buckets `stock` fills with `shrink_orders` full orders each (the drain
/// mark: fewer than that many buckets' worth left, and an event shrinks).
fn fills(stock: u64, order_size: u64, r: &Resizing) -> u32 {
    let per_bucket = r.shrink_orders.max(1) * order_size.max(1);
    u32::try_from(stock / per_bucket).unwrap_or(u32::MAX)
}

/// The widest layout a stock that `fills` buckets keeps at twice the drain
/// mark: a layout is never made so wide that it would drain at once.
fn widest(fills: u32) -> u32 {
    (fills / 2).max(1)
}

/// The count to reshard to, and why; `None`: keep the layout.
pub(crate) fn resize(s: &Signals, r: &Resizing) -> Option<(u32, Reason)> {
    if s.remaining == 0 || s.sold > r.max_moved {
        return None;
    }
    let n = s.buckets.max(1);
    let fills = fills(s.remaining, s.order_size, r);
    if n > s.range.min && fills < n {
        let to = s.range.clamp(fills.min(n / 2).max(1));
        return (to < n).then_some((to, Reason::Drain));
    }
    let widest = widest(fills);
    let demand = if s.demand.is_finite() { s.demand } else { 0.0 };
    // On a Cluster, an event on every master already is where more buckets
    // stop paying (unless `grow_past_masters`).
    let may_grow = !s.on_every_master || r.grow_past_masters;
    if may_grow && demand / f64::from(n) > r.grow_above {
        let mut want = ((demand / r.target).ceil() as u32)
            .max(n.saturating_mul(4))
            .max(s.spread);
        if s.lanes > 0 {
            // One server, whose buckets share `lanes` call queues: an event
            // of fewer buckets than lanes already has a call in flight on
            // each (engine::batch), so more buckets only add groups to every
            // call (one bucket sold as fast as two and 1.1x as fast as four
            // here). Past the lanes, a multiple of them (bucket b queues in
            // lane b mod lanes: 3 and 5 buckets sold 0.71-0.76x as fast as 2
            // and 4 over two lanes).
            want = want.min(r.one_server_max.max(1));
            if want > s.lanes {
                want -= want % s.lanes;
            }
        }
        let to = s.range.clamp(want.min(widest));
        if to > n {
            return Some((to, Reason::Hot));
        }
    }
    if !s.on_every_master && n < s.spread && demand >= r.target {
        let to = s.range.clamp(s.spread.min(widest));
        if to > n {
            return Some((to, Reason::Spread));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signals(buckets: u32, demand: f64, remaining: u64) -> Signals {
        Signals {
            buckets,
            range: BucketRange { min: 1, max: 64 },
            demand,
            remaining,
            sold: 0,
            order_size: 2,
            spread: 1,
            on_every_master: false,
            lanes: 0,
        }
    }

    fn r() -> Resizing {
        Resizing {
            grow_above: 1000.0,
            target: 500.0,
            shrink_orders: 8,
            min_interval: Duration::ZERO,
            max_moved: 10_000,
            one_server_max: 8,
            grow_past_masters: true,
        }
    }

    #[test]
    fn an_event_starts_spread_over_the_masters_as_far_as_its_stock_allows() {
        let range = BucketRange { min: 1, max: 64 };
        // Off a Cluster (spread 1): the minimum.
        assert_eq!(starting(range, 1_000_000, 2, 1, &r()), 1);
        assert_eq!(
            starting(BucketRange { min: 3, max: 64 }, 1_000_000, 2, 1, &r()),
            3
        );
        // On a Cluster: every master reached from the start.
        assert_eq!(starting(range, 1_000_000, 2, 5, &r()), 5);
        // Within the range.
        assert_eq!(
            starting(BucketRange { min: 1, max: 4 }, 1_000_000, 2, 5, &r()),
            4
        );
        assert_eq!(
            starting(BucketRange { min: 6, max: 64 }, 1_000_000, 2, 5, &r()),
            6
        );
        // As far as the stock allows: 8 orders of 2 a bucket is the drain
        // mark; 64 units keep two buckets at twice it, 63 one.
        assert_eq!(starting(range, 64, 2, 5, &r()), 2);
        assert_eq!(starting(range, 63, 2, 5, &r()), 1);
        assert_eq!(starting(range, 0, 2, 5, &r()), 1);
        // Started that wide, the first round neither shrinks nor spreads it.
        for stock in [0, 63, 64, 100, 1_000_000] {
            let n = starting(range, stock, 2, 5, &r());
            let s = Signals {
                spread: 5,
                order_size: 2,
                ..signals(n, 0.0, stock)
            };
            assert_eq!(resize(&s, &r()), None, "{stock} units on {n} buckets");
        }
    }

    #[test]
    fn on_a_cluster_an_event_on_every_master_grows_no_further() {
        let s = Signals {
            spread: 5,
            on_every_master: true,
            ..signals(3, 1e6, 1_000_000)
        };
        let shipped = Resizing {
            grow_past_masters: false,
            ..r()
        };
        assert!(!Resizing::default().grow_past_masters);
        // However hot, and though the next layout would need 5 to reach
        // every master: kept.
        assert_eq!(resize(&s, &shipped), None);
        // Allowed: as the demand says.
        assert_eq!(resize(&s, &r()), Some((64, Reason::Hot)));
        // Not yet on every master: it grows, at least to reach them.
        let s = Signals {
            on_every_master: false,
            ..s
        };
        assert_eq!(resize(&s, &shipped), Some((64, Reason::Hot)));
        let cool = Signals { demand: 600.0, ..s };
        assert_eq!(resize(&cool, &shipped), Some((5, Reason::Spread)));
        // The drain still shrinks it.
        let draining = Signals {
            on_every_master: true,
            ..signals(3, 1e6, 20)
        };
        assert_eq!(resize(&draining, &shipped), Some((1, Reason::Drain)));
    }

    #[test]
    fn a_contended_event_grows_to_its_target_at_least_fourfold() {
        // 5,000 units/s on one bucket: 10 buckets of 500.
        assert_eq!(
            resize(&signals(1, 5000.0, 1_000_000), &r()),
            Some((10, Reason::Hot))
        );
        // Just over the mark on 4 buckets: the demand says 9, at least 16.
        assert_eq!(
            resize(&signals(4, 4100.0, 1_000_000), &r()),
            Some((16, Reason::Hot))
        );
        // 50,000 units/s: 100 buckets, more than fourfold.
        assert_eq!(
            resize(&signals(4, 50_000.0, 1_000_000), &r()),
            Some((64, Reason::Hot)),
            "(clamped to the range's 64)"
        );
        // Under the mark per bucket: kept.
        assert_eq!(resize(&signals(4, 2100.0, 1_000_000), &r()), None);
        // Bounded by the range.
        assert_eq!(
            resize(&signals(32, 1e9, u64::MAX / 4), &r()),
            Some((64, Reason::Hot))
        );
        assert_eq!(resize(&signals(64, 1e9, u64::MAX / 4), &r()), None);
    }

    #[test]
    fn on_one_server_a_grown_count_fills_its_lanes_evenly() {
        let on = |buckets, lanes, demand, max| {
            let s = Signals {
                lanes,
                ..signals(buckets, demand, 1_000_000)
            };
            resize(
                &s,
                &Resizing {
                    one_server_max: max,
                    ..r()
                },
            )
        };
        // The default: one server keeps an event at its count, however hot.
        assert_eq!(on(1, 2, 1e6, 1), None);
        assert_eq!(Resizing::default().one_server_max, 1);
        // Allowed wider: the demand says 10, at most 8, a multiple of the lanes.
        assert_eq!(on(1, 2, 5000.0, 8), Some((8, Reason::Hot)));
        assert_eq!(on(1, 3, 5000.0, 8), Some((6, Reason::Hot)));
        // At the most already: no wider.
        assert_eq!(on(8, 2, 1e6, 8), None);
        // A lane per bucket (a Cluster): as the demand says.
        assert_eq!(on(1, 0, 5000.0, 1), Some((10, Reason::Hot)));
        // The range still bounds it: an odd max is kept.
        let s = Signals {
            lanes: 2,
            range: BucketRange { min: 1, max: 3 },
            ..signals(1, 5000.0, 1_000_000)
        };
        assert_eq!(resize(&s, &r()), Some((3, Reason::Hot)));
    }

    #[test]
    fn growth_never_makes_a_layout_the_stock_would_drain_at_once() {
        // 400 units left, 16 per bucket at the drain mark: 25 buckets fill,
        // 12 keep twice the mark.
        assert_eq!(resize(&signals(1, 1e6, 400), &r()), Some((12, Reason::Hot)));
        // Then 12 buckets do not drain.
        assert_eq!(resize(&signals(12, 0.0, 400), &r()), None);
        // Too little stock to spread at all.
        assert_eq!(resize(&signals(1, 1e6, 20), &r()), None);
    }

    #[test]
    fn a_draining_event_shrinks_to_what_its_stock_fills_at_least_halving() {
        // 64 buckets, 100 units: 6 buckets fill 8 orders of 2.
        assert_eq!(
            resize(&signals(64, 1e6, 100), &r()),
            Some((6, Reason::Drain))
        );
        // 16 buckets, 250 units: 15 would fill; at least halved.
        assert_eq!(
            resize(&signals(16, 0.0, 250), &r()),
            Some((8, Reason::Drain))
        );
        // Down to the minimum, never below.
        let mut s = signals(4, 0.0, 3);
        s.range.min = 2;
        assert_eq!(resize(&s, &r()), Some((2, Reason::Drain)));
        s.buckets = 2;
        assert_eq!(resize(&s, &r()), None);
        // Sold out: the mark answers refusals; nothing to move.
        assert_eq!(resize(&signals(64, 1e6, 0), &r()), None);
    }

    #[test]
    fn on_a_cluster_a_hot_event_reaches_every_master() {
        let mut s = signals(1, 600.0, 1_000_000);
        s.spread = 5;
        assert_eq!(resize(&s, &r()), Some((5, Reason::Spread)));
        // Growing for demand goes at least that far too.
        s.demand = 1500.0;
        assert_eq!(resize(&s, &r()), Some((5, Reason::Hot)));
        // An event with little demand stays where it is.
        s.demand = 100.0;
        assert_eq!(resize(&s, &r()), None);
    }

    #[test]
    fn past_max_moved_units_sold_the_layout_stays() {
        let mut s = signals(1, 5000.0, 1_000_000);
        s.sold = 10_001;
        assert_eq!(resize(&s, &r()), None, "no growth");
        let mut s = signals(64, 0.0, 100);
        s.sold = 10_001;
        assert_eq!(resize(&s, &r()), None, "no shrink");
        s.sold = 10_000;
        assert_eq!(resize(&s, &r()), Some((6, Reason::Drain)));
    }

    #[test]
    fn a_layout_in_balance_is_kept() {
        for n in [1, 2, 7, 64] {
            assert_eq!(
                resize(&signals(n, 400.0 * f64::from(n), 1_000_000), &r()),
                None
            );
        }
        assert_eq!(resize(&signals(4, f64::NAN, 1_000_000), &r()), None);
    }
}
