//! The metric handles the request path records into, looked up once per label
//! set and kept.
//!
//! `metrics::counter!(NAME, "event" => event.to_owned())` builds its key (the
//! label strings, then a hash of them) and looks the series up in the
//! recorder's registry on every call: a handful of allocations and hashes per
//! request, for series that exist from the first request on. Here each series
//! is registered once, when a label set is first seen, and later requests find
//! its handle with one read-locked map lookup by `&str` and no allocation.
//! The series, names and labels are exactly those of `crate::metrics`.
//!
//! Label sets stay bounded as before: routes are the matched paths, events
//! only those that exist (the handlers pass `unknown` otherwise).
//!
//! The recorder drops a series not updated for `server.metrics_retention_ms`
//! (so a closed event's series go), and a handle kept past that would record
//! into a series no longer exported: every handle is looked up again once it
//! is a third of that old, and entries not used for that long are forgotten.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::http::Method;
use metrics::{Counter, Histogram};

use crate::metrics as m;

/// Every outcome label of `shardstock_purchases_total`.
const OUTCOMES: [&str; 7] = [
    "ok",
    "sold_out",
    "limit_exceeded",
    "invalid",
    "rate_limited",
    "replayed",
    "error",
];

/// One event's purchase series.
pub struct EventMeters {
    outcomes: [Counter; OUTCOMES.len()],
    pub units: Counter,
    pub(crate) probe_depth: Histogram,
    /// Purchases answered `held` (events with `hold_seconds`).
    pub(crate) holds_created: Counter,
}

impl EventMeters {
    fn new(event: &str) -> Self {
        let event = event.to_owned();
        Self {
            outcomes: OUTCOMES.map(|outcome| {
                metrics::counter!(m::PURCHASES, "event" => event.clone(), "outcome" => outcome)
            }),
            units: metrics::counter!(m::PURCHASED_UNITS, "event" => event.clone()),
            probe_depth: metrics::histogram!(m::PROBE_DEPTH, "event" => event.clone()),
            holds_created: metrics::counter!(m::HOLDS_CREATED, "event" => event),
        }
    }

    /// Counts one purchase request with `outcome` (one of the outcome labels).
    pub fn purchase(&self, outcome: &str) {
        let i = OUTCOMES
            .iter()
            .position(|o| *o == outcome)
            .unwrap_or(OUTCOMES.len() - 1);
        self.outcomes[i].increment(1);
    }
}

/// One route and method: its latency, and its count per status (the handles
/// since `since`).
struct RouteMeters {
    duration: Histogram,
    statuses: Vec<(u16, Counter)>,
    since: Instant,
}

/// A route, a method label, and their series.
type RouteEntry = (String, &'static str, Arc<RwLock<RouteMeters>>);

/// The handles, shared by every request (in `AppState`).
pub struct Meters {
    /// Each event's handles and when they were looked up.
    events: RwLock<HashMap<String, (Instant, Arc<EventMeters>)>>,
    /// How old a handle may grow before it is looked up again.
    refresh: Duration,
    /// Few (matched routes × standard methods): scanned, not hashed.
    routes: RwLock<Vec<RouteEntry>>,
    /// `shardstock_purchase_duration_seconds{path}`: fast, probe, and when
    /// they were looked up.
    durations: RwLock<(Instant, Histogram, Histogram)>,
}

impl Default for Meters {
    fn default() -> Self {
        Self::refreshed_within(Duration::from_secs(900))
    }
}

impl Meters {
    /// Handles looked up again well within `retention` (the recorder's idle
    /// timeout).
    pub(crate) fn refreshed_within(retention: Duration) -> Self {
        Self {
            events: RwLock::default(),
            refresh: retention / 3,
            routes: RwLock::default(),
            durations: RwLock::new(durations()),
        }
    }

    /// The fast path's latency series.
    pub fn fast(&self) -> Histogram {
        self.durations().1
    }

    /// The probe saga's latency series.
    pub fn probe(&self) -> Histogram {
        self.durations().2
    }

    fn durations(&self) -> (Instant, Histogram, Histogram) {
        let now = self.durations.read().expect("meters poisoned").clone();
        if now.0.elapsed() < self.refresh {
            return now;
        }
        let fresh = durations();
        *self.durations.write().expect("meters poisoned") = fresh.clone();
        fresh
    }

    /// The purchase series of `event` (a label: an existing event or `unknown`).
    pub fn event(&self, event: &str) -> Arc<EventMeters> {
        let now = Instant::now();
        if let Some((since, meters)) = self.events.read().expect("meters poisoned").get(event)
            && now.duration_since(*since) < self.refresh
        {
            return meters.clone();
        }
        let meters = Arc::new(EventMeters::new(event));
        self.events
            .write()
            .expect("meters poisoned")
            .insert(event.to_owned(), (now, meters.clone()));
        meters
    }

    /// Forgets the handles of events not served for a while (a closed
    /// event's, whose series the recorder drops).
    pub(crate) fn forget_old(&self) {
        let now = Instant::now();
        self.events
            .write()
            .expect("meters poisoned")
            .retain(|_, (since, _)| now.duration_since(*since) < self.refresh);
    }

    /// Events with handles.
    pub fn events(&self) -> usize {
        self.events.read().expect("meters poisoned").len()
    }

    /// Records one answered request: `shardstock_http_requests_total` and
    /// `shardstock_http_request_duration_seconds` of its route and method.
    pub fn request(&self, route: &str, method: &Method, status: u16, seconds: f64) {
        let method = method_label(method);
        let route_meters = self.route(route, method);
        {
            let stale = route_meters
                .read()
                .expect("meters poisoned")
                .since
                .elapsed()
                >= self.refresh;
            if stale {
                let mut r = route_meters.write().expect("meters poisoned");
                r.statuses.clear();
                r.since = Instant::now();
            }
        }
        let found = {
            let r = route_meters.read().expect("meters poisoned");
            r.duration.record(seconds);
            r.statuses
                .iter()
                .find(|(s, _)| *s == status)
                .map(|(_, c)| c.increment(1))
                .is_some()
        };
        if !found {
            let counter = metrics::counter!(
                m::HTTP_REQUESTS,
                "route" => route.to_owned(),
                "method" => method,
                "status" => status.to_string()
            );
            counter.increment(1);
            route_meters
                .write()
                .expect("meters poisoned")
                .statuses
                .push((status, counter));
        }
    }

    fn route(&self, route: &str, method: &'static str) -> Arc<RwLock<RouteMeters>> {
        let find = |routes: &[RouteEntry]| {
            routes
                .iter()
                .find(|(r, m, _)| r == route && *m == method)
                .map(|(_, _, meters)| meters.clone())
        };
        if let Some(meters) = find(&self.routes.read().expect("meters poisoned")) {
            return meters;
        }
        let mut routes = self.routes.write().expect("meters poisoned");
        if let Some(meters) = find(&routes) {
            return meters;
        }
        let meters = Arc::new(RwLock::new(RouteMeters {
            duration: metrics::histogram!(
                m::HTTP_DURATION,
                "route" => route.to_owned(),
                "method" => method
            ),
            statuses: Vec::new(),
            since: Instant::now(),
        }));
        routes.push((route.to_owned(), method, meters.clone()));
        meters
    }
}

/// `shardstock_purchase_duration_seconds{path}`, looked up now.
fn durations() -> (Instant, Histogram, Histogram) {
    (
        Instant::now(),
        metrics::histogram!(m::PURCHASE_DURATION, "path" => "fast"),
        metrics::histogram!(m::PURCHASE_DURATION, "path" => "probe"),
    )
}

/// The `method` label: the standard methods by name, any other as `OTHER`
/// (a client may send any token as a method; the label set stays bounded).
fn method_label(method: &Method) -> &'static str {
    const STANDARD: [&str; 9] = [
        "GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "CONNECT", "PATCH", "TRACE",
    ];
    STANDARD
        .into_iter()
        .find(|m| *m == method.as_str())
        .unwrap_or("OTHER")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_outside_the_standard_set_share_one_label() {
        assert_eq!(method_label(&Method::POST), "POST");
        assert_eq!(method_label(&Method::PATCH), "PATCH");
        let odd = Method::from_bytes(b"BREW").unwrap();
        assert_eq!(method_label(&odd), "OTHER");
    }
}
