//! The live page (`GET /ui`) in a real browser: headless Chromium (Debian's
//! `chromium`) renders it after a sale, and the numbers it shows for the event
//! must be the API's.

use std::process::Command;

use serde_json::json;

use crate::harness::{Backend, TOKEN, TestApp, eid, settings_in};

const CHROMIUM: &str = "/usr/bin/chromium";

/// Chromium, headless, as this machine allows it; returns its stdout.
fn chromium(args: &[&str]) -> String {
    crate::harness::ensure_test_tools();
    assert!(
        std::path::Path::new(CHROMIUM).exists(),
        "Chromium is not installed; install it with:\n  apt-get install -y --no-install-recommends chromium"
    );
    let profile =
        std::env::temp_dir().join(format!("shardstock-chromium-{}", rand::random::<u32>()));
    let out = Command::new(CHROMIUM)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=3000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .output()
        .expect("run chromium");
    let _ = std::fs::remove_dir_all(&profile);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The markup of the event's card.
fn card<'a>(dom: &'a str, event: &str) -> &'a str {
    dom.split(&format!("data-event=\"{event}\""))
        .nth(1)
        .expect("the event's card")
        .split("</section>")
        .next()
        .unwrap()
}

/// The text of the element with `data-testid=id` inside the event's card.
fn shown(dom: &str, event: &str, id: &str) -> String {
    let after = card(dom, event)
        .split(&format!("data-testid=\"{id}\">"))
        .nth(1)
        .expect(id);
    after.split('<').next().unwrap().replace(',', "")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_live_page_shows_the_events_numbers() {
    // Its own namespace: the page lists every event of the app's namespace.
    let app = TestApp::spawn_with(settings_in("live_page", Backend::Redis)).await;
    let id = eid("live");
    app.create(&id, 5_000, 12, json!({})).await;
    for i in 0..300 {
        let user = format!("u-{}", i % 97);
        app.buy(&id, &user, 1 + (i % 3), None).await;
    }
    // An event with holds shows its held units.
    let held_id = eid("live-held");
    app.create(&held_id, 100, 4, json!({"hold_seconds": 600}))
        .await;
    for i in 0..7 {
        app.buy(&held_id, &format!("h-{i}"), 1, None).await;
    }
    // An adaptive event resharded twice shows its bucket count over time.
    let auto_id = eid("live-auto");
    app.create(
        &auto_id,
        5_000,
        2,
        json!({"buckets": {"min": 2, "max": 64}}),
    )
    .await;
    for (i, to) in [8, 4].into_iter().enumerate() {
        app.buy(&auto_id, &format!("a-{i}"), 1, None).await;
        let r = app
            .client
            .put(format!("{}/v1/events/{auto_id}/buckets", app.base))
            .bearer_auth(TOKEN)
            .json(&json!({"buckets": to}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    }
    let auto_view = app.view(&auto_id).await;
    let layouts: Vec<(u64, &str)> = auto_view["bucket_history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["buckets"].as_u64().unwrap(),
                l["reason"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(layouts, [(2, "created"), (8, "manual"), (4, "manual")]);
    assert_eq!(auto_view["auto_buckets"], json!({"min": 2, "max": 64}));
    let view = app.view(&id).await;
    let dom = chromium(&["--dump-dom", &format!("{}/ui", app.base)]);
    assert_eq!(
        shown(&dom, &auto_id, "bucket-history").replace("&gt;", ">"),
        "2 → 8 → 4",
        "the bucket count over time"
    );
    assert_eq!(shown(&dom, &auto_id, "reasons"), "(manual manual)");
    assert_eq!(shown(&dom, &auto_id, "buckets"), "4");
    let auto_card = card(&dom, &auto_id);
    assert!(
        auto_card.contains("auto 2–64") && auto_card.contains("<path d=\"M0 "),
        "{auto_card}"
    );
    assert_eq!(shown(&dom, &held_id, "held"), "7", "held units");
    assert!(
        !card(&dom, &id).contains("data-testid=\"held\""),
        "an event without holds shows no held count"
    );
    assert!(
        dom.contains("data-loaded=\"true\""),
        "the page loaded its data:\n{dom}"
    );
    for field in ["sold", "remaining", "stock"] {
        assert_eq!(shown(&dom, &id, field), view[field].to_string(), "{field}");
    }
    assert_eq!(shown(&dom, &id, "buckets"), "12");
    assert_eq!(
        shown(&dom, &id, "skew"),
        format!("{:.2}", view["skew"].as_f64().unwrap())
    );
    let bars = card(&dom, &id).matches("data-bucket=").count();
    assert_eq!(bars, 12, "a bar per bucket");
    let first: Vec<u64> = view["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["remaining"].as_u64().unwrap())
        .collect();
    assert!(dom.contains(&format!(
        "data-bucket=\"0\" data-remaining=\"{}\"",
        first[0]
    )));
    // And a picture of it, for people (the README's screenshot is made the same way).
    let png = std::env::temp_dir().join(format!("shardstock-live-{}.png", std::process::id()));
    chromium(&[
        "--window-size=1280,720",
        &format!("--screenshot={}", png.display()),
        &format!("{}/ui?event={id}", app.base),
    ]);
    assert!(
        std::fs::metadata(&png)
            .map(|m| m.len() > 5_000)
            .unwrap_or(false),
        "a screenshot was written"
    );
    let _ = std::fs::remove_file(png);
}
