//! `Sale`: the load a test crashes, cuts or restarts things under — clients
//! buying one unit each over HTTP until stopped, every purchase and its first
//! answer kept.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::eventually;

/// How long [`Sale::sells`] waits for the sale to move on (a loaded machine,
/// a service restarting, a backend coming back).
const WAIT: Duration = Duration::from_secs(60);

/// One purchase sent: its body, its first answer (status 0 and the error
/// when none came), and when that came.
pub struct Sent {
    pub body: Value,
    pub status: u16,
    pub answer: Value,
    pub at: Instant,
}

/// Clients buying one unit each, a fresh user and request id a purchase
/// (`u-<client>-<n>`, `r-<client>-<n>`), until stopped. A 409 (sold out, not
/// on sale) ends a client; after any other answer but 201, or none (the
/// service or a backend gone), it pauses 20 ms and goes on.
pub struct Sale {
    sent: Arc<Mutex<Vec<Sent>>>,
    bought: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    clients: tokio::task::JoinSet<()>,
}

impl Sale {
    /// `clients` clients buying `event` from the service at `base`.
    pub fn start(base: &str, event: &str, clients: usize) -> Self {
        let sent: Arc<Mutex<Vec<Sent>>> = Arc::default();
        let bought: Arc<AtomicUsize> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let mut tasks = tokio::task::JoinSet::new();
        for c in 0..clients {
            let (http, sent, bought, stop) =
                (http.clone(), sent.clone(), bought.clone(), stop.clone());
            let url = format!("{base}/v1/events/{event}/purchases");
            tasks.spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let body = json!({"user_id": format!("u-{c}-{i}"), "quantity": 1, "request_id": format!("r-{c}-{i}")});
                    let (status, answer) = match http.post(&url).json(&body).send().await {
                        Ok(r) => {
                            let status = r.status().as_u16();
                            (status, r.json().await.unwrap_or(Value::Null))
                        }
                        Err(e) => (0, json!(e.to_string())),
                    };
                    sent.lock().unwrap().push(Sent {
                        body,
                        status,
                        answer,
                        at: Instant::now(),
                    });
                    match status {
                        201 => {
                            bought.fetch_add(1, Ordering::Relaxed);
                        }
                        409 => return,
                        _ => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
            });
        }
        Self {
            sent,
            bought,
            stop,
            clients: tasks,
        }
    }

    /// Purchases answered 201 so far.
    pub fn bought(&self) -> usize {
        self.bought.load(Ordering::Relaxed)
    }

    /// The request body of the first purchase answered 201, if any yet.
    pub fn first_bought(&self) -> Option<Value> {
        let sent = self.sent.lock().unwrap();
        sent.iter()
            .find(|s| s.status == 201)
            .map(|s| s.body.clone())
    }

    /// Waits until `more` further purchases are answered 201.
    pub async fn sells(&self, more: usize, what: &str) {
        let want = self.bought() + more;
        eventually(what, WAIT, async || (self.bought() >= want).then_some(())).await;
    }

    /// Stops the clients; every purchase sent, in the order answered.
    pub async fn stop(mut self) -> Vec<Sent> {
        self.stop.store(true, Ordering::Relaxed);
        while let Some(client) = self.clients.join_next().await {
            client.unwrap();
        }
        std::mem::take(&mut *self.sent.lock().unwrap())
    }
}

/// The order ids of the purchases answered 201.
pub fn answered(sent: &[Sent]) -> HashSet<String> {
    sent.iter()
        .filter(|s| s.status == 201)
        .map(|s| {
            s.answer["order_id"]
                .as_str()
                .unwrap_or_else(|| panic!("a 201 without its order id: {}", s.answer))
                .to_owned()
        })
        .collect()
}
