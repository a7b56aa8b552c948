//! The service against hostile clients and a stalled backend, with real sockets
//! and real processes: slow-header clients are cut off and the connections a
//! process holds are bounded; shutdown ends within its grace period even when
//! Redis stops answering; made-up event ids cannot grow `/metrics`; event ids
//! that URL libraries normalize away are refused.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::{Backend, RedisServer, Service, TestApp, eid, pg_url, problem, sqlite_url};

/// A slowloris client: a request line, then one header line at a time, never
/// the blank line that ends the headers.
fn slow_client(port: u16) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"POST /v1/events/e/purchases HTTP/1.1\r\nHost: shardstock\r\n")
        .unwrap();
    s.set_nonblocking(true).unwrap();
    s
}

/// Whether the server has closed this connection (a read sees the end, or a reset).
fn closed_by_server(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 256];
    match s.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(_) => true,
    }
}

/// 300 slowloris clients against a service that allows 64 connections and
/// 1 s for a request's headers: the process never holds more than its bound,
/// every slow client is cut off, and a normal client is served afterwards.
/// (Before: every slow connection stayed open, one descriptor each, forever.)
#[test]
fn slow_header_clients_are_cut_off_and_connections_are_bounded() {
    let service = Service::with_config(
        "slowloris",
        &format!(
            "header_read_timeout_ms = 1000\nmax_connections = 64\n[database]\nurl = \"{}\"\n",
            sqlite_url()
        ),
    );
    let port = service.port;
    let idle = service.sockets();
    let mut clients: Vec<TcpStream> = (0..300).map(|_| slow_client(port)).collect();
    let mut most = 0;
    let start = Instant::now();
    let mut open = clients.len();
    while open > 0 && start.elapsed() < Duration::from_secs(30) {
        // One more header line from every client still open: each line comes
        // well inside the timeout, so only a bound on the whole header ends it.
        open = 0;
        for c in &mut clients {
            if !closed_by_server(c) && c.write_all(b"X-Slow: 1\r\n").is_ok() {
                open += 1;
            }
        }
        most = most.max(service.sockets().saturating_sub(idle));
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(open, 0, "slow clients still connected after 30 s");
    assert!(
        most <= 64,
        "the process held {most} client sockets, over its bound of 64"
    );
    let mut ok = TcpStream::connect(("127.0.0.1", port)).unwrap();
    ok.write_all(b"GET /healthz HTTP/1.1\r\nHost: shardstock\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    ok.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// SIGTERM while Redis is stopped (SIGSTOP: connections open, nothing
/// answers): the service gives its final drain the grace period, then exits
/// non-zero, since orders may be left in the streams. (Before: it logged
/// "flusher stopped without a final drain" and never exited.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_redis_stalled_ends_within_the_grace_and_exits_non_zero() {
    let redis = RedisServer::start();
    let event = eid("stall");
    let mut service = Service::with_config(
        "stall",
        &format!(
            "shutdown_grace_ms = 2000\n\
         [store]\nredis_url = \"{}\"\ncommand_timeout_ms = 30000\n\
         [database]\nurl = \"{}\"\naudit_interval_ms = 0\n\
         [[events]]\nid = \"{event}\"\nstock = 1000\nbuckets = 4\n",
            redis.url(),
            pg_url(),
        ),
    );
    let port = service.port;
    let client = reqwest::Client::new();
    for i in 0..20 {
        let r = client
            .post(format!(
                "http://127.0.0.1:{port}/v1/events/{event}/purchases"
            ))
            .json(&json!({"user_id": format!("u-{i}"), "quantity": 1}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
    }
    let redis_pid = redis.pid();
    let signal = |sig: &str, pid: &str| {
        assert!(
            Command::new("kill")
                .args([sig, pid])
                .status()
                .unwrap()
                .success()
        );
    };
    signal("-STOP", &redis_pid);
    signal("-TERM", &service.child.id().to_string());
    let start = Instant::now();
    let status = loop {
        if let Some(status) = service.child.try_wait().unwrap() {
            break Some(status);
        }
        if start.elapsed() > Duration::from_secs(20) {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    signal("-CONT", &redis_pid);
    let status = status.expect("the service did not exit 20 s after SIGTERM (grace: 2 s)");
    assert!(
        !status.success(),
        "it could not drain, so it must say so: {status}"
    );
}

/// 300 purchases for made-up event ids add no `/metrics` series with those
/// ids; they are counted under `event="unknown"`. (Before: the URL's id became
/// a label value, so anyone could grow the series set without bound.)
#[tokio::test]
async fn purchases_for_unknown_events_add_no_metric_series() {
    let app = TestApp::spawn(Backend::Memory).await;
    let ghosts: Vec<String> = (0..300).map(|_| eid("ghost")).collect();
    for (i, ghost) in ghosts.iter().enumerate() {
        let body = if i % 3 == 0 {
            json!({"user_id": "bad user", "quantity": 1})
        } else {
            json!({"user_id": "u-1", "quantity": 1})
        };
        let r = app
            .post(&format!("/v1/events/{ghost}/purchases"), body)
            .await;
        assert!(r.status().is_client_error(), "{}", r.status());
    }
    let metrics = app.metrics().await;
    let leaked: Vec<&String> = ghosts.iter().filter(|g| metrics.contains(*g)).collect();
    assert!(leaked.is_empty(), "{} ids became series", leaked.len());
    assert!(
        metrics.contains(r#"event="unknown""#),
        "unknown events are counted under one label"
    );
}

/// `.` and `..` as event ids are refused: no client could address such an
/// event, since URL libraries normalize those path segments away.
#[tokio::test]
async fn event_ids_of_dots_only_are_refused() {
    let app = TestApp::spawn(Backend::Memory).await;
    for id in [".", ".."] {
        let r = app
            .admin_post("/v1/events", json!({"id": id, "stock": 10, "buckets": 1}))
            .await;
        problem(r, 400, "invalid-request").await;
    }
}

/// The recorder keeps a series `server.metrics_retention_ms` after its last
/// update: a closed and archived event's series leave `/metrics` (a
/// 16-bucket event added 20-odd series that stayed for the life of the
/// process), while an open event's stay, refreshed within the retention
/// however idle it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_closed_events_series_leave_metrics_and_an_idle_open_events_stay() {
    use crate::harness::TOKEN;
    let service = Service::with_config(
        "retention",
        &format!(
            "gauges_interval_ms = 50\nmetrics_retention_ms = 1500\n[database]\nurl = \"{}\"\n",
            sqlite_url()
        ),
    );
    let base = format!("http://127.0.0.1:{}", service.port);
    let client = reqwest::Client::new();
    let (gone, kept) = (
        crate::harness::eid("retention-gone"),
        crate::harness::eid("retention-kept"),
    );
    for (id, buckets) in [(&gone, 16), (&kept, 4)] {
        let r = client
            .post(format!("{base}/v1/events"))
            .bearer_auth(TOKEN)
            .json(&serde_json::json!({"id": id, "stock": 100, "buckets": buckets}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
    }
    let r = client
        .post(format!("{base}/v1/events/{gone}/purchases"))
        .json(&serde_json::json!({"user_id": "u-1", "quantity": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let series = async |event: &str| -> usize {
        let text = client
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let label = format!("event=\"{event}\"");
        text.lines()
            .filter(|l| !l.starts_with('#') && l.contains(&label))
            .count()
    };
    crate::harness::eventually("the events' series", Duration::from_secs(10), async || {
        (series(&gone).await > 16 && series(&kept).await > 4).then_some(())
    })
    .await;
    for call in ["close", ""] {
        let r = if call.is_empty() {
            client.delete(format!("{base}/v1/events/{gone}"))
        } else {
            client
                .post(format!("{base}/v1/events/{gone}/close"))
                .json(&serde_json::json!({}))
        }
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
        assert!(r.status().is_success(), "{call}: {}", r.status());
    }
    let started = Instant::now();
    crate::harness::eventually(
        "the archived event's series to go",
        Duration::from_secs(20),
        async || {
            let left = series(&gone).await;
            (left == 0).then_some(())
        },
    )
    .await;
    // Well past the retention since the open event last sold (never): its
    // series are still there.
    assert!(started.elapsed() >= Duration::from_millis(1_000));
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    assert!(
        series(&kept).await > 4,
        "the idle open event keeps its series"
    );
}
