//! `outbox_chaos`: a sale with holds over HTTP whose order changes must reach
//! a JetStream consumer and a webhook receiver exactly as the database has
//! them, while `bench/outbox_chaos.sh` kills the relay's leader, restarts
//! NATS and this receiver answers 500 for a spell.
//!
//! It runs the webhook receiver (`--receiver-port`, answering 500 from
//! `--fail-at` for `--fail-for` seconds after the sale starts), creates the
//! event (`--stock`, holds of `--hold-seconds`), buys `--attempts` one-unit
//! orders at `--concurrency` over the instances of `--targets` (a request
//! that finds an instance down is sent again, same request id, to the
//! next), confirms 60% and cancels 20% of the holds at once and leaves 20%
//! unpaid (expired by their deadline, or by the close), closes the event,
//! then waits for every change of the database's outbox (`--pg`) to reach
//! the stream (`--nats`, stream and subject prefix `--prefix`) and the
//! receiver. Checks, from the database alone: one `order.created` per order
//! answered 201, each order's last change what its client was last told;
//! and for the stream and the receiver, after deduplication by change id,
//! exactly the database's changes, each order's creation before its end.
//! Prints one summary line; exits 1 on any mismatch.
//!
//! `outbox_chaos --targets URL,URL --admin-token T --pg URL --nats URL
//! --prefix P --event ID --receiver-port N [--stock N] [--attempts N]
//! [--concurrency N] [--hold-seconds S] [--fail-at S] [--fail-for S]`

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use futures::StreamExt;
use serde_json::{Value, json};

struct Args {
    targets: Vec<String>,
    token: String,
    pg: String,
    nats: String,
    prefix: String,
    event: String,
    port: u16,
    stock: u64,
    attempts: u64,
    concurrency: usize,
    hold_seconds: u64,
    fail_at: f64,
    fail_for: f64,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        targets: Vec::new(),
        token: String::new(),
        pg: String::new(),
        nats: "nats://127.0.0.1:4222".into(),
        prefix: String::new(),
        event: "chaos".into(),
        port: 0,
        stock: 100_000,
        attempts: 120_000,
        concurrency: 64,
        hold_seconds: 15,
        fail_at: 6.0,
        fail_for: 10.0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut v = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--targets" => a.targets = v()?.split(',').map(str::to_owned).collect(),
            "--admin-token" => a.token = v()?,
            "--pg" => a.pg = v()?,
            "--nats" => a.nats = v()?,
            "--prefix" => a.prefix = v()?,
            "--event" => a.event = v()?,
            "--receiver-port" => a.port = v()?.parse()?,
            "--stock" => a.stock = v()?.parse()?,
            "--attempts" => a.attempts = v()?.parse()?,
            "--concurrency" => a.concurrency = v()?.parse()?,
            "--hold-seconds" => a.hold_seconds = v()?.parse()?,
            "--fail-at" => a.fail_at = v()?.parse()?,
            "--fail-for" => a.fail_for = v()?.parse()?,
            other => bail!("unknown argument {other:?} (see the file's header)"),
        }
    }
    ensure!(!a.targets.is_empty(), "--targets is required");
    ensure!(
        !a.pg.is_empty() && !a.prefix.is_empty(),
        "--pg and --prefix are required"
    );
    ensure!(a.port != 0, "--receiver-port is required");
    Ok(a)
}

/// The webhook receiver: every delivery's body, in arrival order.
#[derive(Default)]
struct Receiver {
    failing: AtomicBool,
    got: Mutex<Vec<Value>>,
    refused: AtomicU64,
}

async fn hook(State(r): State<Arc<Receiver>>, _h: HeaderMap, body: Bytes) -> StatusCode {
    if r.failing.load(Ordering::SeqCst) {
        r.refused.fetch_add(1, Ordering::Relaxed);
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    match serde_json::from_slice::<Value>(&body) {
        Ok(v) => {
            r.got.lock().unwrap().push(v);
            StatusCode::OK
        }
        Err(_) => StatusCode::BAD_REQUEST,
    }
}

/// What a client was last told of its order.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Told {
    Confirmed,
    Cancelled,
    /// Never paid, or a confirm answered `hold-expired`.
    Expired,
}

impl Told {
    fn change(self) -> &'static str {
        match self {
            Told::Confirmed => "order.confirmed",
            Told::Cancelled => "order.cancelled",
            Told::Expired => "order.expired",
        }
    }
}

/// Sends a request until an instance answers (not a connection error, not
/// 503), rotating over the targets; gives up after two minutes.
async fn send(
    http: &reqwest::Client,
    targets: &[String],
    start: usize,
    make: impl Fn(&reqwest::Client, &str) -> reqwest::RequestBuilder,
) -> anyhow::Result<(u16, Value)> {
    let began = Instant::now();
    let mut i = start;
    loop {
        let base = &targets[i % targets.len()];
        match make(http, base).send().await {
            Ok(r) if r.status().as_u16() != 503 => {
                let status = r.status().as_u16();
                let body = r.json::<Value>().await.unwrap_or(Value::Null);
                return Ok((status, body));
            }
            _ if began.elapsed() > Duration::from_secs(120) => {
                bail!("no instance answered for two minutes")
            }
            _ => {
                i += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Arc::new(args()?);
    let receiver = Arc::new(Receiver::default());
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(hook))
        .with_state(receiver.clone());
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", a.port)).await?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;

    let (status, body) = send(&http, &a.targets, 0, |c, base| {
        c.post(format!("{base}/v1/events"))
            .bearer_auth(&a.token)
            .json(&json!({"id": a.event, "stock": a.stock, "buckets": 16, "hold_seconds": a.hold_seconds}))
    })
    .await?;
    ensure!(status == 201, "creating the event: {status} {body}");

    // The receiver's spell of 500s, timed from the sale's start.
    let began = Instant::now();
    {
        let (r, at, dur) = (receiver.clone(), a.fail_at, a.fail_for);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs_f64(at)).await;
            r.failing.store(true, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs_f64(dur)).await;
            r.failing.store(false, Ordering::SeqCst);
        });
    }
    let next = Arc::new(AtomicU64::new(0));
    let told: Arc<Mutex<HashMap<String, Told>>> = Arc::default();
    let tasks: Vec<_> = (0..a.concurrency)
        .map(|t| {
            let (a, http, next, told) = (a.clone(), http.clone(), next.clone(), told.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= a.attempts {
                        return Ok::<_, anyhow::Error>(());
                    }
                    let (status, body) = send(&http, &a.targets, t + i as usize, |c, base| {
                        c.post(format!("{base}/v1/events/{}/purchases", a.event)).json(
                            &json!({"user_id": format!("u{i}"), "quantity": 1, "request_id": format!("r{i}")}),
                        )
                    })
                    .await?;
                    if status == 409 {
                        continue;
                    }
                    ensure!(status == 201, "purchase {i}: {status} {body}");
                    let order = body["order_id"].as_str().context("an order id")?.to_owned();
                    let fate = match i % 5 {
                        0..=2 => Some("confirm"),
                        3 => Some("cancel"),
                        _ => None,
                    };
                    let last = match fate {
                        None => Told::Expired,
                        Some(act) => {
                            let (status, body) =
                                send(&http, &a.targets, t + i as usize + 1, |c, base| {
                                    c.post(format!("{base}/v1/orders/{order}/{act}"))
                                        .json(&json!({}))
                                })
                                .await?;
                            match (status, body["status"].as_str(), body["type"].as_str()) {
                                (200, Some("confirmed"), _) => Told::Confirmed,
                                (200, Some("cancelled"), _) => Told::Cancelled,
                                (200, Some("expired"), _) => Told::Expired,
                                (409, _, Some(t)) if t.ends_with("hold-expired") => Told::Expired,
                                _ => bail!("{act} {order}: {status} {body}"),
                            }
                        }
                    };
                    told.lock().unwrap().insert(order, last);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    let sale_s = began.elapsed().as_secs_f64();
    let (status, body) = send(&http, &a.targets, 0, |c, base| {
        c.post(format!("{base}/v1/events/{}/close", a.event))
            .bearer_auth(&a.token)
            .json(&json!({}))
    })
    .await?;
    ensure!(status == 200, "closing: {status} {body}");
    let told = std::mem::take(&mut *told.lock().unwrap());

    // The database's changes of the event, in seq order.
    let pg = sqlx::PgPool::connect(&a.pg).await?;
    let rows: Vec<(i64, String, String, String)> = sqlx::query_as(
        "SELECT seq, change_id, subject, type FROM outbox_changes WHERE event_id = $1 ORDER BY seq",
    )
    .bind(&a.event)
    .fetch_all(&pg)
    .await?;
    let mut failures = Vec::new();
    let mut last: HashMap<&str, &str> = HashMap::new();
    let mut created = 0usize;
    for (_, _, subject, kind) in &rows {
        if kind == "order.created" {
            created += 1;
        }
        if kind.starts_with("order.") && kind != "order.created" {
            last.insert(subject, kind);
        }
    }
    if created != told.len() {
        failures.push(format!(
            "{created} order.created in the database, {} orders answered 201",
            told.len()
        ));
    }
    let wrong = told
        .iter()
        .filter(|(order, t)| last.get(order.as_str()).copied() != Some(t.change()))
        .count();
    if wrong > 0 {
        failures.push(format!(
            "{wrong} orders end otherwise in the database than their client was told"
        ));
    }
    let want: Vec<&str> = rows.iter().map(|r| r.1.as_str()).collect();
    let want_set: HashSet<&str> = want.iter().copied().collect();

    // Both targets catch up (five minutes at most).
    let nats = async_nats::connect(a.nats.as_str()).await?;
    let jet = async_nats::jetstream::new(nats);
    let caught_up = Instant::now();
    let (stream_got, stream_copies) = loop {
        let (got, copies) = stream_changes(&jet, &a.prefix, &a.event).await?;
        let hooks = receiver.got.lock().unwrap().len();
        let ids: HashSet<&str> = got.iter().filter_map(|v| v["id"].as_str()).collect();
        if (ids == want_set && hooks >= want.len())
            || caught_up.elapsed() > Duration::from_secs(300)
        {
            break (got, copies);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let catch_up_s = caught_up.elapsed().as_secs_f64();
    let hooks: Vec<Value> = receiver
        .got
        .lock()
        .unwrap()
        .iter()
        .filter(|v| v["event_id"] == a.event.as_str())
        .cloned()
        .collect();
    let (hook_got, hook_copies) = dedup(hooks);
    for (name, got) in [("stream", &stream_got), ("webhook", &hook_got)] {
        if let Some(why) = compare(got, &want_set) {
            failures.push(format!("{name}: {why}"));
        }
    }
    println!(
        "outbox_chaos: {} orders ({} confirmed, {} cancelled, {} expired) in {sale_s:.1} s; {} changes in the database; \
         stream {} (+{stream_copies} copies), webhook {} (+{hook_copies} copies, {} answered 500); caught up {catch_up_s:.1} s after the close; {}",
        told.len(),
        told.values().filter(|t| **t == Told::Confirmed).count(),
        told.values().filter(|t| **t == Told::Cancelled).count(),
        told.values().filter(|t| **t == Told::Expired).count(),
        want.len(),
        stream_got.len(),
        hook_got.len(),
        receiver.refused.load(Ordering::Relaxed),
        if failures.is_empty() {
            "every check passed".to_owned()
        } else {
            format!("FAILED: {}", failures.join("; "))
        }
    );
    if !failures.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}

/// First copy of each change id, in arrival order; and how many copies.
fn dedup(all: Vec<Value>) -> (Vec<Value>, usize) {
    let mut seen = HashSet::new();
    let total = all.len();
    let out: Vec<Value> = all
        .into_iter()
        .filter(|v| seen.insert(v["id"].as_str().unwrap_or_default().to_owned()))
        .collect();
    let copies = total - out.len();
    (out, copies)
}

/// Why `got` (deduplicated, in arrival order) is not exactly `want`, each
/// order's creation first; `None` when it is.
fn compare(got: &[Value], want: &HashSet<&str>) -> Option<String> {
    let ids: HashSet<&str> = got.iter().filter_map(|v| v["id"].as_str()).collect();
    let missing = want.difference(&ids).count();
    let extra = ids.difference(want).count();
    let mut created = HashSet::new();
    let mut before = 0;
    for v in got {
        let (subject, kind) = (
            v["subject"].as_str().unwrap_or(""),
            v["type"].as_str().unwrap_or(""),
        );
        if kind == "order.created" {
            created.insert(subject.to_owned());
        } else if kind.starts_with("order.") && !created.contains(subject) {
            before += 1;
        }
    }
    (missing + extra + before > 0).then(|| {
        format!("{missing} changes missing, {extra} not in the database, {before} ends before their creation")
    })
}

/// The stream's messages of `event`, deduplicated by `Nats-Msg-Id`, in
/// stream order; and how many copies.
async fn stream_changes(
    jet: &async_nats::jetstream::Context,
    stream: &str,
    event: &str,
) -> anyhow::Result<(Vec<Value>, usize)> {
    let mut s = jet.get_stream(stream).await?;
    let last = s.info().await?.state.last_sequence;
    let s = Arc::new(s);
    let bodies: Vec<anyhow::Result<Option<Value>>> = futures::stream::iter(1..=last)
        .map(|seq| {
            let s = s.clone();
            async move {
                match s.get_raw_message(seq).await {
                    Ok(m) => Ok(Some(serde_json::from_slice::<Value>(&m.payload)?)),
                    // A message the stream no longer has (none is deleted
                    // here, but a gap is not a failure of this check).
                    Err(_) => Ok(None),
                }
            }
        })
        .buffered(64)
        .collect()
        .await;
    let mut all = Vec::new();
    for b in bodies {
        if let Some(v) = b?
            && v["event_id"] == event
        {
            all.push(v);
        }
    }
    Ok(dedup(all))
}
