//! Logs and traces (issue 16): a probing purchase is one trace under the
//! caller's `traceparent`, with the engine's steps as child spans (the SDK's
//! in-memory exporter); `--log-format json` writes one JSON object per line,
//! each line of a request carrying its request id, event and user, and never
//! the admin token.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use opentelemetry::trace::{SpanId, TraceId};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tracing_subscriber::layer::SubscriberExt;

use crate::harness::{
    Backend, TOKEN, TestApp, eid, free_port, settings, sqlite_url, user_homed_at, wait_until,
};

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_SPAN: &str = "00f067aa0ba902b7";

/// The spans of `trace` the exporter has, once the request span is among them.
async fn trace_spans(exporter: &InMemorySpanExporter, trace: TraceId) -> Vec<SpanData> {
    for _ in 0..500 {
        let spans: Vec<SpanData> = exporter
            .get_finished_spans()
            .unwrap()
            .into_iter()
            .filter(|s| s.span_context.trace_id() == trace)
            .collect();
        if spans.iter().any(|s| s.name.starts_with("POST ")) {
            return spans;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no request span of trace {trace} was exported");
}

/// The whole test runs on one thread (a current-thread runtime) so the
/// subscriber set for this thread sees every task of the app, and no other
/// test's spans.
async fn a_probing_purchase_is_one_trace_under_the_callers_trace_id(b: Backend) {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber =
        tracing_subscriber::registry().with(shardstock::telemetry::trace_layer(&provider));
    let _guard = tracing::subscriber::set_default(subscriber);

    let app = TestApp::spawn_with(settings(b)).await;
    let id = eid("trace-probe");
    // One unit in each of 2 buckets; the first buyer empties bucket 0, so the
    // second buyer homed there must probe bucket 1.
    app.create(&id, 2, 2, json!({})).await;
    let first = app.buy(&id, &user_homed_at(0, 2, "tr-a"), 1, None).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    // `tracing` caches each callsite's interest across every live
    // dispatcher. A callsite first registered by another test's thread while
    // this test's subscriber was being registered can keep the interest it
    // computed without it (`never`, for a `debug_span!` under a warn-level
    // subscriber): CI once saw the trace without its `home` span. The first
    // purchase has registered the engine's callsites; computing every
    // interest again now, with this subscriber live, closes that window.
    tracing::callsite::rebuild_interest_cache();
    let r = app
        .client
        .post(app.url(&format!("/v1/events/{id}/purchases")))
        .header("traceparent", format!("00-{TRACE_ID}-{PARENT_SPAN}-01"))
        .json(&json!({"user_id": user_homed_at(0, 2, "tr-b"), "quantity": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let order: Value = r.json().await.unwrap();
    assert_eq!(order["probes"], 1, "{order}");

    let trace = TraceId::from_hex(TRACE_ID).unwrap();
    let spans = trace_spans(&exporter, trace).await;
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();
    let request = spans
        .iter()
        .find(|s| s.name == "POST /v1/events/{id}/purchases")
        .unwrap_or_else(|| panic!("no request span in {names:?}"));
    assert_eq!(
        request.parent_span_id,
        SpanId::from_hex(PARENT_SPAN).unwrap(),
        "the request span is the caller's child"
    );
    for step in ["home", "probe_pass", "finish"] {
        assert!(names.contains(&step), "no {step} span in {names:?}");
    }
    // Every span of the trace descends from the request span.
    let ids: Vec<SpanId> = spans.iter().map(|s| s.span_context.span_id()).collect();
    for s in &spans {
        if s.span_context.span_id() != request.span_context.span_id() {
            assert!(
                ids.contains(&s.parent_span_id),
                "{} has a parent outside the trace",
                s.name
            );
        }
    }
    // The other purchase (no traceparent) is a trace of its own, without probes.
    let others: Vec<SpanData> = exporter
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .filter(|s| s.span_context.trace_id() != trace && s.name == "probe_pass")
        .collect();
    assert!(
        others.is_empty(),
        "the fast-path purchase probed: {others:?}"
    );
    app.stop().await;
    provider.shutdown().unwrap();
}

mod on_memory {
    #[tokio::test]
    async fn a_probing_purchase_is_one_trace_under_the_callers_trace_id() {
        super::a_probing_purchase_is_one_trace_under_the_callers_trace_id(
            crate::harness::Backend::Memory,
        )
        .await;
    }
}

mod on_redis {
    #[tokio::test]
    async fn a_probing_purchase_is_one_trace_under_the_callers_trace_id() {
        super::a_probing_purchase_is_one_trace_under_the_callers_trace_id(
            crate::harness::Backend::Redis,
        )
        .await;
    }
}

/// The binary with `--log-format json` and debug lines on: every line is a
/// JSON object; every line logged inside a request's span carries the
/// request id, and, once the handler parsed them, the event and the user.
#[test]
fn json_logs_are_one_object_per_line_with_the_requests_ids_and_no_token() {
    let port = free_port();
    let dir =
        std::env::temp_dir().join(format!("shardstock-jsonlog-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("shardstock.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\nadmin_token = \"{TOKEN}\"\n[database]\nurl = \"{}\"\n",
            sqlite_url()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_shardstock"))
        .args(["serve", "--log-format", "json", "--config"])
        .arg(&config)
        .env("RUST_LOG", "shardstock=debug")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Drained as it comes, so a full pipe never stalls the service.
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<String>>()
    });
    wait_until("the service to listen", Duration::from_secs(30), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let base = format!("http://127.0.0.1:{port}");
    let event = eid("jsonlog");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = reqwest::Client::new();
        let r = client
            .post(format!("{base}/v1/events"))
            .bearer_auth(TOKEN)
            .json(&json!({"id": event, "stock": 4, "buckets": 2}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
        let r = client
            .post(format!("{base}/v1/events/{event}/purchases"))
            .header("x-request-id", "req-json-1")
            .json(&json!({"user_id": "u-json", "quantity": 1}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
    });
    let _ = child.kill();
    let _ = child.wait();
    let lines = reader.join().unwrap();
    assert!(!lines.is_empty(), "no log lines");
    let mut purchase_lines = 0;
    for line in &lines {
        assert!(
            !line.contains(TOKEN),
            "the admin token reached the log: {line}"
        );
        let v: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(
            v["timestamp"].is_string() && v["level"].is_string(),
            "{line}"
        );
        let Some(request) = v["spans"]
            .as_array()
            .and_then(|spans| spans.iter().find(|s| s["name"] == "request"))
        else {
            continue;
        };
        assert!(request["request_id"].is_string(), "{line}");
        if request["route"] == "/v1/events/{id}/purchases" {
            purchase_lines += 1;
            assert_eq!(request["request_id"], "req-json-1", "{line}");
            assert_eq!(request["event"], event.as_str(), "{line}");
            assert_eq!(request["user"], "u-json", "{line}");
        }
    }
    assert!(
        purchase_lines > 0,
        "no line logged inside the purchase: {lines:#?}"
    );
}
