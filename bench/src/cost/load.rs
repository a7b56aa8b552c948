//! The HTTP load of a cost row: C clients posting one-unit purchases by
//! random users (or a draw's entries), for a number of requests or for a
//! duration.
//!
//! Every request is the service's purchase call with a fresh request id, so
//! shardstock does its whole work (no replays) and the peers parse the same
//! body. A token row's purchases carry their user's access token, signed
//! here as a waiting room would (its cost is the load's, not the server's);
//! an entry row's requests each enter a new user. Clients are futures polled in the caller's task, as in
//! [`run`](crate::run); completions are also counted per second, so a
//! sustained run can compare its last seconds with its first.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use hdrhistogram::Histogram;

/// How long a load runs.
#[derive(Debug, Clone, Copy)]
pub enum Until {
    /// This many requests in all.
    Requests(u64),
    /// Until this much time has passed.
    Elapsed(Duration),
}

/// What each request of a load is.
#[derive(Debug, Clone)]
pub enum Request {
    /// `POST /v1/events/{id}/purchases`, one unit, a random user of a million.
    Purchase,
    /// The same, with the user's access token signed under `key`.
    TokenPurchase { key: String },
    /// `POST /v1/events/{id}/entries`, a new user each time.
    Entry,
}

/// What a load measured.
#[derive(Debug, Clone)]
pub struct Load {
    pub requests: u64,
    pub created: u64,
    pub refused: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub elapsed: Duration,
    pub latency_us: Histogram<u64>,
    /// Completions in each second of the run.
    pub per_second: Vec<u64>,
}

impl Load {
    /// Requests per second over the run.
    pub fn rate(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The mean rate over seconds `[from, to)` of the run.
    pub fn window_rate(&self, from: usize, to: usize) -> f64 {
        let to = to.min(self.per_second.len());
        if from >= to {
            return 0.0;
        }
        self.per_second[from..to].iter().sum::<u64>() as f64 / (to - from) as f64
    }
}

/// Drives `POST {base}/v1/events/{event}/purchases` (or `/entries`).
pub async fn drive(
    client: &reqwest::Client,
    base: &str,
    event: &str,
    request: &Request,
    concurrency: usize,
    until: Until,
    tag: &str,
) -> anyhow::Result<Load> {
    let path = match request {
        Request::Entry => "entries",
        Request::Purchase | Request::TokenPurchase { .. } => "purchases",
    };
    let url = format!("{base}/v1/events/{event}/{path}");
    let event_id = shardstock::domain::ids::EventId::parse(event.to_owned())
        .map_err(|e| anyhow::anyhow!("event id {event:?}: {e}"))?;
    let next = AtomicU64::new(0);
    let start = Instant::now();
    let seconds: Vec<AtomicU64> = (0..3_600).map(|_| AtomicU64::new(0)).collect();
    let more = |i: u64| match until {
        Until::Requests(n) => i < n,
        Until::Elapsed(d) => start.elapsed() < d,
    };
    let client_loop = |c: usize| {
        let (url, next, seconds, more, event_id) = (&url, &next, &seconds, &more, &event_id);
        async move {
            let mut seen = Seen::new()?;
            let mut rng = (c as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if !more(i) {
                    return anyhow::Ok(seen);
                }
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let user = rng % 1_000_000;
                let body = match request {
                    Request::Purchase => {
                        format!(r#"{{"user_id":"u{user}","quantity":1,"request_id":"{tag}-{i}"}}"#)
                    }
                    Request::TokenPurchase { key } => {
                        let token = shardstock::domain::token::mint(
                            key,
                            event_id,
                            &format!("u{user}"),
                            super::TOKEN_ALLOWANCE,
                            FAR_EXPIRY,
                        );
                        format!(
                            r#"{{"user_id":"u{user}","quantity":1,"request_id":"{tag}-{i}","access_token":"{token}"}}"#
                        )
                    }
                    Request::Entry => format!(r#"{{"user_id":"e{tag}-{i}"}}"#),
                };
                let sent = Instant::now();
                let answer = client
                    .post(url.as_str())
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await;
                let status = match answer {
                    Ok(r) => {
                        let status = r.status().as_u16();
                        let _ = r.bytes().await;
                        Ok(status)
                    }
                    Err(e) => Err(e.to_string()),
                };
                seen.record(status, sent.elapsed());
                let second = start.elapsed().as_secs() as usize;
                if let Some(s) = seconds.get(second) {
                    s.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    };
    let mut clients: FuturesUnordered<_> = (0..concurrency).map(client_loop).collect();
    let mut all = Seen::new()?;
    while let Some(seen) = clients.next().await {
        all.merge(seen?)?;
    }
    let elapsed = start.elapsed();
    let last = (elapsed.as_secs_f64().ceil() as usize).min(seconds.len());
    // The last, partial second is left out of the per-second series.
    let whole = (elapsed.as_secs() as usize).min(last);
    Ok(Load {
        requests: all.created + all.refused + all.errors,
        created: all.created,
        refused: all.refused,
        errors: all.errors,
        first_error: all.first_error,
        elapsed,
        latency_us: all.latency_us,
        per_second: seconds[..whole]
            .iter()
            .map(|s| s.load(Ordering::Relaxed))
            .collect(),
    })
}

/// A token row's tokens expire long after any run (2099, Unix seconds).
const FAR_EXPIRY: i64 = 4_070_908_800;

/// One client's tally.
struct Seen {
    created: u64,
    refused: u64,
    errors: u64,
    first_error: Option<String>,
    latency_us: Histogram<u64>,
}

impl Seen {
    fn new() -> anyhow::Result<Self> {
        Ok(Self {
            created: 0,
            refused: 0,
            errors: 0,
            first_error: None,
            latency_us: Histogram::new_with_bounds(1, 60_000_000, 3)?,
        })
    }

    fn record(&mut self, status: Result<u16, String>, took: Duration) {
        let _ = self
            .latency_us
            .record((took.as_micros() as u64).clamp(1, 60_000_000));
        match status {
            Ok(201) => self.created += 1,
            Ok(409) => self.refused += 1,
            Ok(other) => self.error(format!("HTTP {other}")),
            Err(e) => self.error(e),
        }
    }

    fn error(&mut self, e: String) {
        self.errors += 1;
        self.first_error.get_or_insert(e);
    }

    fn merge(&mut self, other: Seen) -> anyhow::Result<()> {
        self.created += other.created;
        self.refused += other.refused;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.latency_us.add(&other.latency_us)?;
        Ok(())
    }
}
