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

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

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
    pub probe_depth: Histogram,
    /// Purchases answered `held` (events with `hold_seconds`).
    pub holds_created: Counter,
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

/// One route and method: its latency, and its count per status.
struct RouteMeters {
    duration: Histogram,
    statuses: Vec<(u16, Counter)>,
}

/// A route, a method label, and their series.
type RouteEntry = (String, &'static str, Arc<RwLock<RouteMeters>>);

/// The handles, shared by every request (in `AppState`).
pub struct Meters {
    events: RwLock<HashMap<String, Arc<EventMeters>>>,
    /// Few (matched routes × standard methods): scanned, not hashed.
    routes: RwLock<Vec<RouteEntry>>,
    /// `shardstock_purchase_duration_seconds{path}`.
    pub fast: Histogram,
    pub probe: Histogram,
}

impl Default for Meters {
    fn default() -> Self {
        Self {
            events: RwLock::default(),
            routes: RwLock::default(),
            fast: metrics::histogram!(m::PURCHASE_DURATION, "path" => "fast"),
            probe: metrics::histogram!(m::PURCHASE_DURATION, "path" => "probe"),
        }
    }
}

impl Meters {
    /// The purchase series of `event` (a label: an existing event or `unknown`).
    pub fn event(&self, event: &str) -> Arc<EventMeters> {
        if let Some(meters) = self.events.read().expect("meters poisoned").get(event) {
            return meters.clone();
        }
        self.events
            .write()
            .expect("meters poisoned")
            .entry(event.to_owned())
            .or_insert_with(|| Arc::new(EventMeters::new(event)))
            .clone()
    }

    /// Records one answered request: `shardstock_http_requests_total` and
    /// `shardstock_http_request_duration_seconds` of its route and method.
    pub fn request(&self, route: &str, method: &Method, status: u16, seconds: f64) {
        let method = method_label(method);
        let route_meters = self.route(route, method);
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
        }));
        routes.push((route.to_owned(), method, meters.clone()));
        meters
    }
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
