//! Metric names, in one place, and their descriptions.
//!
//! Everything the service exports goes through these constants (API.md lists
//! the contract; dashboards and alert rules in `deploy/` refer to these names).
//! The recorder is `metrics-exporter-prometheus`, rendered by the app at
//! `GET /metrics`.

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};

// ---- purchases (labels: event, outcome / path) ----
/// counter {event, outcome}: ok, sold_out, limit_exceeded, invalid, replayed, error.
pub const PURCHASES: &str = "shardstock_purchases_total";
/// counter {event}: units in successful purchases (a purchase may be 1–max_per_order units).
pub const PURCHASED_UNITS: &str = "shardstock_purchased_units_total";
/// histogram {path}: fast (home bucket) or probe (the saga).
pub const PURCHASE_DURATION: &str = "shardstock_purchase_duration_seconds";
/// histogram {event}: buckets tried beyond home.
pub const PROBE_DEPTH: &str = "shardstock_probe_depth";
/// counter {event}: cancelled orders.
pub const CANCELS: &str = "shardstock_cancels_total";
/// counter {event}: on-demand consolidations by purchases.
pub const CONSOLIDATIONS: &str = "shardstock_consolidations_total";
/// counter {event}: pending sagas the sweeper ended (no driver was left to).
pub const SAGAS_SWEPT: &str = "shardstock_sagas_swept_total";

// ---- access tokens (`token` events; labels: outcome) ----
/// counter {outcome}: purchases of `token` events by what became of their
/// token ([`TOKEN_CHECK_OUTCOMES`]): consumed (it bought), or refused
/// missing, invalid, not_yours, expired, used. Once a purchase, by the call
/// that decided it; not a replay (no token is checked), nor a valid token's
/// purchase refused otherwise (sold out, the per-user limit). No event
/// label: the outcomes bound the series.
pub const TOKEN_CHECKS: &str = "shardstock_token_checks_total";
/// New entries to draws, by event (labels bounded by the events).
pub const DRAW_ENTRIES: &str = "shardstock_draw_entries_total";
/// A draw's winners once drawn, by event.
pub const DRAW_WINNERS: &str = "shardstock_draw_winners";
/// counter {event, outcome}: a draw's waiting-list offers by what became of
/// them ([`OFFER_OUTCOMES`]): made (opened to the next user in line), taken
/// (bought), passed (its deadline came: its unit goes to the next user),
/// to_sale (nobody left in line: its unit went back on open sale). Each
/// counted once, by the call whose step did it.
pub const OFFERS: &str = "shardstock_offers_total";
/// Every outcome label of [`OFFERS`].
pub const OFFER_OUTCOMES: [&str; 4] = ["made", "taken", "passed", "to_sale"];
/// Every outcome label of [`TOKEN_CHECKS`].
pub(crate) const TOKEN_CHECK_OUTCOMES: [&str; 6] = [
    "consumed",
    "missing",
    "invalid",
    "not_yours",
    "expired",
    "used",
];

// ---- holds (events with hold_seconds) ----
/// counter {event}: purchases taken as holds.
pub const HOLDS_CREATED: &str = "shardstock_holds_created_total";
/// counter {event}: holds confirmed before their deadline.
pub const HOLDS_CONFIRMED: &str = "shardstock_holds_confirmed_total";
/// counter {event}: holds that reached their deadline unconfirmed (or a close voided).
pub const HOLDS_EXPIRED: &str = "shardstock_holds_expired_total";
/// gauge {event}: units in live holds.
pub const EVENT_HELD: &str = "shardstock_event_held_units";

// ---- releases (labels: release, pool; one series a pool or release) ----
/// gauge {release, pool, event}: 1 for each pool of a release that is on
/// sale, naming the pool's event, so any per-event series joins to its
/// release: `shardstock_event_remaining * on(event) group_left(release, pool)
/// shardstock_release_pool_info`.
pub const RELEASE_POOL: &str = "shardstock_release_pool_info";
/// counter {release, outcome}: multi-line orders by outcome
/// ([`RELEASE_ORDER_OUTCOMES`]).
pub const RELEASE_ORDERS: &str = "shardstock_release_orders_total";
/// Every outcome label of [`RELEASE_ORDERS`] (a request refused before its
/// release was found is not counted: the label stays bounded by the
/// releases that exist).
pub(crate) const RELEASE_ORDER_OUTCOMES: [&str; 6] = [
    "ok",
    "sold_out",
    "limit_exceeded",
    "gave_up",
    "replayed",
    "error",
];
/// counter {release, outcome}: held release orders (a release with
/// `hold_seconds`) decided, by outcome ([`RELEASE_HOLD_OUTCOMES`]): counted
/// once an order, by the call whose compare-and-set at its home decided it
/// (a confirm, a cancel, the sweeper or a pool's close), never by one that
/// found it decided. A decision whose answer the store lost is not counted.
pub const RELEASE_HOLDS: &str = "shardstock_release_holds_total";
/// Every outcome label of [`RELEASE_HOLDS`].
pub(crate) const RELEASE_HOLD_OUTCOMES: [&str; 3] = ["confirmed", "cancelled", "expired"];

// ---- buckets (kept fresh by a background task) ----
/// gauge {event, bucket}.
pub const BUCKET_REMAINING: &str = "shardstock_bucket_remaining";
/// gauge {event}: max bucket remaining ÷ mean.
pub const BUCKET_SKEW: &str = "shardstock_bucket_skew_ratio";
/// gauge {event}: the event's stock.
pub const EVENT_STOCK: &str = "shardstock_event_stock";
/// gauge {event}: units left (buckets + in transfer).
pub const EVENT_REMAINING: &str = "shardstock_event_remaining";
/// gauge {event}: units a closed event had left (set by its close).
pub const EVENT_LEFTOVER: &str = "shardstock_event_leftover_units";
/// gauge {event}: buckets of the current layout.
pub const EVENT_BUCKETS: &str = "shardstock_event_buckets";

// ---- rebalancer ----
/// counter {event}.
pub const REBALANCE_MOVED_UNITS: &str = "shardstock_rebalance_moved_units_total";
/// counter {event}.
pub const REBALANCE_TRANSFERS: &str = "shardstock_rebalance_transfers_total";
/// counter {event}: times this instance became the event's leader.
pub const LEADER_CHANGES: &str = "shardstock_leader_changes_total";
/// gauge {event}: 1 while this instance leads the event.
pub const LEADER: &str = "shardstock_rebalancer_leader";
/// counter {event}: transfer steps a bucket refused (stale token).
pub const FENCING_REJECTIONS: &str = "shardstock_fencing_rejections_total";
/// counter {event, reason}: reshards completed; reason: manual, config,
/// resumed, or the adaptive policy's hot, spread, drain.
pub const RESHARDS: &str = "shardstock_reshards_total";

// ---- durable orders ----
/// gauge: order records in Redis streams not yet in the database.
pub const FLUSH_LAG: &str = "shardstock_flush_lag_orders";
/// counter: order records written to the database.
pub const ORDERS_FLUSHED: &str = "shardstock_orders_flushed_total";
/// counter: failed flush batches.
pub const FLUSH_ERRORS: &str = "shardstock_flush_errors_total";
/// histogram: seconds per flushed batch.
pub const FLUSH_BATCH_DURATION: &str = "shardstock_flush_batch_duration_seconds";
/// counter {event}: the database refused a sale past the stock (must stay 0).
pub const DB_GUARD_VIOLATIONS: &str = "shardstock_db_guard_violations_total";
/// gauge {event}: 1 when the last audit balanced, 0 when it did not.
pub const AUDIT_BALANCED: &str = "shardstock_audit_balanced";

// ---- order events out (the outbox relay; labels: target) ----
/// gauge {target}: changes in the outbox the target has not been sent yet.
pub const OUTBOX_LAG_CHANGES: &str = "shardstock_outbox_lag_changes";
/// gauge {target}: age of the oldest change the target has not been sent (0 when none).
pub const OUTBOX_LAG_SECONDS: &str = "shardstock_outbox_lag_seconds";
/// counter {target, outcome}: changes delivered: published, duplicate (the
/// server had it: a relay re-sent after a crash), failed.
pub const OUTBOX_DELIVERIES: &str = "shardstock_outbox_deliveries_total";
/// gauge: 1 while this instance leads the outbox relay.
pub const OUTBOX_LEADER: &str = "shardstock_outbox_relay_leader";
/// gauge {subscription}: 1 while a webhook subscription is paused (its
/// deliveries kept failing), set by the relay leader. A subscription's
/// deliveries and lag are the outbox's series with target `webhook:<id>`
/// (outcomes delivered, rejected, timeout, unreachable).
pub const WEBHOOK_PAUSED: &str = "shardstock_webhook_paused";

// ---- store and HTTP ----
/// counter {op}: store calls that failed (Redis unreachable, timeouts…).
pub const STORE_ERRORS: &str = "shardstock_store_errors_total";
/// counter {reason}: store calls refused while a Redis Cluster's slots moved
/// (tryagain, redirect, unrouted, loading, readonly) and sent again.
pub const STORE_RETRIES: &str = "shardstock_store_retries_total";
/// counter: restarts of the Redis client's routing task after it ended.
pub const STORE_ROUTER_RESTARTS: &str = "shardstock_store_router_restarts_total";
/// counter {event}: requests refused because the store lost an event that
/// this instance had served and the database still has on sale (Redis
/// emptied or replaced mid-sale): an operator must run `shardstock recover`.
pub const STORE_EVENTS_LOST: &str = "shardstock_store_events_lost_total";
/// counter {event}: units the audit found held both by orders in the
/// database and on sale in the store — writes the store lost (a partial
/// loss: a Redis restarted from an AOF missing its last second, a failover
/// to a replica that missed them); counted once per finding, then taken off
/// sale or refused by `database.lost_state`.
pub const STORE_UNITS_LOST: &str = "shardstock_store_units_lost_total";
/// counter {route, method, status}.
pub const HTTP_REQUESTS: &str = "shardstock_http_requests_total";
/// histogram {route, method}.
pub const HTTP_DURATION: &str = "shardstock_http_request_duration_seconds";
/// counter {scope}: requests refused by the rate limiter (user, global).
pub const RATE_LIMITED: &str = "shardstock_rate_limited_total";

// ---- batching ----
/// histogram: purchases per home-step script call.
pub const BATCH_SIZE: &str = "shardstock_batch_size";
/// counter: home-step script calls.
pub const SCRIPT_CALLS: &str = "shardstock_home_calls_total";
/// gauge: the share of a core the one Redis server behind the store used
/// over the last half second of calls (standalone Redis only).
pub const STORE_SERVER_BUSY: &str = "shardstock_store_server_busy_ratio";

/// Counts one token check of `outcome` (one of [`TOKEN_CHECK_OUTCOMES`])
/// on handles looked up once and kept (`metrics::counter!` builds its key
/// and searches the registry on every call: a token purchase paid that
/// where an open one records on kept handles, `http::meters`). They are
/// looked up again every 300 ms, under a third of the shortest
/// `server.metrics_retention_ms` (1 s), so no handle outlives the series
/// the recorder drops when it is idle.
pub(crate) fn count_token_check(outcome: &'static str) {
    use std::sync::RwLock;
    use std::time::{Duration, Instant};
    type Handles = Option<(Instant, [metrics::Counter; TOKEN_CHECK_OUTCOMES.len()])>;
    static HANDLES: RwLock<Handles> = RwLock::new(None);
    let Some(i) = TOKEN_CHECK_OUTCOMES.iter().position(|o| *o == outcome) else {
        return metrics::counter!(TOKEN_CHECKS, "outcome" => outcome).increment(1);
    };
    let fresh = |h: &Handles| {
        h.as_ref()
            .filter(|(at, _)| at.elapsed() < Duration::from_millis(300))
            .map(|(_, c)| c[i].clone())
    };
    // The read guard dropped before the write lock is taken.
    let kept = fresh(&HANDLES.read().expect("token meters poisoned"));
    let counter = kept.unwrap_or_else(|| {
        let mut h = HANDLES.write().expect("token meters poisoned");
        fresh(&h).unwrap_or_else(|| {
            let c = TOKEN_CHECK_OUTCOMES.map(|o| metrics::counter!(TOKEN_CHECKS, "outcome" => o));
            let counter = c[i].clone();
            *h = Some((Instant::now(), c));
            counter
        })
    });
    counter.increment(1);
}

/// Counts a failed store call (`op`: what was being done).
pub(crate) fn store_error(op: &'static str) {
    metrics::counter!(STORE_ERRORS, "op" => op).increment(1);
}

/// Registers the descriptions (HELP lines) of every metric, and the token
/// checks' series at 0 (their labels are bounded and known: `increase()`
/// reads the first one counted).
pub(crate) fn describe() {
    for outcome in TOKEN_CHECK_OUTCOMES {
        metrics::counter!(TOKEN_CHECKS, "outcome" => outcome).increment(0);
    }
    describe_counter!(PURCHASES, "Purchase requests by outcome");
    describe_counter!(PURCHASED_UNITS, "Units sold by successful purchases");
    describe_histogram!(PURCHASE_DURATION, Unit::Seconds, "Engine time per purchase");
    describe_histogram!(PROBE_DEPTH, "Buckets tried beyond the home bucket");
    describe_counter!(CANCELS, "Orders cancelled");
    describe_counter!(CONSOLIDATIONS, "On-demand consolidations of fragments");
    describe_counter!(
        SAGAS_SWEPT,
        "Pending purchase sagas ended by the sweeper (their driver was gone)"
    );
    describe_counter!(
        TOKEN_CHECKS,
        "Purchases of token events by what became of their access token"
    );
    describe_counter!(DRAW_ENTRIES, "New entries to draw events");
    describe_gauge!(DRAW_WINNERS, "Winners of a draw event, once drawn");
    describe_counter!(OFFERS, "Waiting-list offers of draw events by outcome");
    describe_counter!(HOLDS_CREATED, "Purchases taken as holds");
    describe_counter!(HOLDS_CONFIRMED, "Holds confirmed before their deadline");
    describe_counter!(
        HOLDS_EXPIRED,
        "Holds expired unconfirmed or voided by a close"
    );
    describe_gauge!(EVENT_HELD, "Units in live holds of an event");
    describe_gauge!(
        RELEASE_POOL,
        "1 for each pool of a release on sale, naming its event (join on event)"
    );
    describe_counter!(RELEASE_ORDERS, "Multi-line release orders by outcome");
    describe_counter!(
        RELEASE_HOLDS,
        "Held release orders decided (confirmed, cancelled, expired), once each"
    );
    describe_gauge!(BUCKET_REMAINING, "Units left in a bucket");
    describe_gauge!(
        BUCKET_SKEW,
        "Max bucket remaining over mean bucket remaining"
    );
    describe_gauge!(EVENT_STOCK, "An event's stock");
    describe_gauge!(EVENT_REMAINING, "Units left in an event");
    describe_gauge!(
        EVENT_LEFTOVER,
        "Units a closed event had left (set by its close; absent while it sells)"
    );
    describe_gauge!(EVENT_BUCKETS, "Buckets of an event's current layout");
    describe_counter!(
        REBALANCE_MOVED_UNITS,
        "Units moved between buckets by the rebalancer"
    );
    describe_counter!(REBALANCE_TRANSFERS, "Transfers completed by the rebalancer");
    describe_counter!(
        LEADER_CHANGES,
        "Times this instance became an event's rebalancer leader"
    );
    describe_gauge!(LEADER, "1 while this instance leads the event's rebalancer");
    describe_counter!(
        FENCING_REJECTIONS,
        "Transfer steps refused for a stale fencing token"
    );
    describe_counter!(RESHARDS, "Reshards completed");
    describe_gauge!(FLUSH_LAG, "Order records not yet written to the database");
    describe_counter!(ORDERS_FLUSHED, "Order records written to the database");
    describe_counter!(FLUSH_ERRORS, "Flush batches that failed");
    describe_histogram!(
        FLUSH_BATCH_DURATION,
        Unit::Seconds,
        "Time per flushed batch"
    );
    describe_counter!(
        DB_GUARD_VIOLATIONS,
        "Sales the database guard refused (sold past stock)"
    );
    describe_gauge!(
        AUDIT_BALANCED,
        "1 when the event's last conservation audit balanced"
    );
    describe_counter!(STORE_ERRORS, "Store calls that failed");
    describe_counter!(
        STORE_RETRIES,
        "Store calls refused while Redis Cluster slots moved, sent again"
    );
    describe_counter!(
        STORE_ROUTER_RESTARTS,
        "Restarts of the Redis client's routing task"
    );
    describe_counter!(
        STORE_EVENTS_LOST,
        "Requests refused: the store lost an event the database has on sale"
    );
    describe_counter!(
        STORE_UNITS_LOST,
        "Units held by orders in the database that the store had put back on sale (writes it lost)"
    );
    describe_gauge!(
        OUTBOX_LAG_CHANGES,
        "Changes in the outbox not yet delivered to the target"
    );
    describe_gauge!(
        OUTBOX_LAG_SECONDS,
        Unit::Seconds,
        "Age of the oldest change not yet delivered to the target"
    );
    describe_counter!(
        OUTBOX_DELIVERIES,
        "Changes delivered by the outbox relay, by target and outcome"
    );
    describe_gauge!(
        WEBHOOK_PAUSED,
        "1 while a webhook subscription is paused after failing deliveries"
    );
    describe_gauge!(
        OUTBOX_LEADER,
        "1 while this instance leads the outbox relay"
    );
    describe_counter!(HTTP_REQUESTS, "HTTP requests by matched route and status");
    describe_histogram!(
        HTTP_DURATION,
        Unit::Seconds,
        "HTTP request latency by matched route"
    );
    describe_counter!(RATE_LIMITED, "Requests refused by the rate limiter");
    describe_histogram!(BATCH_SIZE, "Purchases per home-step script call");
    describe_counter!(SCRIPT_CALLS, "Home-step script calls");
    describe_gauge!(
        STORE_SERVER_BUSY,
        "Share of a core the Redis server used over the last sample (standalone Redis)"
    );
}
