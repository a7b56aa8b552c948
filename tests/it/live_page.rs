//! The live page (`GET /ui`) in a real browser: headless Chromium (Debian's
//! `chromium`) renders it after a sale, and the numbers it shows for each event
//! must be the API's. The page reads `GET /v1/live` (every event in one
//! answer); Chromium's virtual time budget lets its first refreshes run, and
//! the test reads the DOM only once the page marked its data loaded.
//!
//! What it draws is checked against the views: bars scaled to each bucket's
//! share of the stock (a nearly sold-out event shows nearly empty bars), a
//! 1,024-bucket event in 64 bars of 16 buckets, a closed event as a compact
//! card with its leftover, a skew above the rebalancer's threshold
//! highlighted, and a release's pools side by side in one section with the
//! release's totals.

use std::process::Command;

use serde_json::{Value, json};

use crate::harness::{Backend, TOKEN, TestApp, eid, sample, settings_in, user_homed_at};

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

/// Each bar of the event's card: (remaining, height in px), in order.
fn bars(dom: &str, event: &str) -> Vec<(u64, u64)> {
    card(dom, event)
        .split("data-remaining=\"")
        .skip(1)
        .map(|bar| {
            let remaining = bar.split('"').next().unwrap().parse().unwrap();
            let height = bar
                .split("height:")
                .nth(1)
                .and_then(|h| h.split("px").next())
                .expect("a bar's height")
                .parse()
                .unwrap();
            (remaining, height)
        })
        .collect()
}

/// The height the page must give a bar of `remaining` units out of `share`:
/// its fraction of the 140 px, at least 2 px while it holds anything.
fn expected_height(remaining: u64, share: f64) -> u64 {
    if remaining == 0 {
        return 1;
    }
    ((remaining as f64 / share * 140.0).round() as u64).clamp(2, 140)
}

/// The view's per-bucket remaining.
fn remaining_per_bucket(view: &Value) -> Vec<u64> {
    view["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["remaining"].as_u64().unwrap())
        .collect()
}

/// Buys `qty` units, which must succeed.
async fn bought(app: &TestApp, event: &str, user: &str, qty: u32) {
    let r = app.buy(event, user, qty, None).await;
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_live_page_shows_the_events_numbers() {
    // Its own namespace: the page lists every event of the app's namespace.
    // No rebalancer, so the skew made below stays as made; gauges at their
    // default pace (a 1,024-bucket event is read on every round).
    let mut settings = settings_in("live_page", Backend::Redis);
    settings.rebalancer.enabled = false;
    settings.server.gauges_interval_ms = 1_000;
    let app = TestApp::spawn_with(settings).await;
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
    // An event 96% sold: its bars must be nearly empty, not scaled up to
    // the fullest bucket.
    let sold_id = eid("live-sold");
    app.create(&sold_id, 1_000, 4, json!({})).await;
    for i in 0..96 {
        bought(&app, &sold_id, &format!("s-{i}"), 10).await;
    }
    // An event of 1,024 buckets: drawn as 64 bars of 16 buckets.
    let wide_id = eid("live-wide");
    app.create(&wide_id, 102_400, 1_024, json!({})).await;
    for i in 0..40 {
        bought(&app, &wide_id, &format!("w-{i}"), 5).await;
    }
    // A closed event: a compact card with its leftover.
    let closed_id = eid("live-closed");
    app.create(&closed_id, 100, 2, json!({})).await;
    for i in 0..3 {
        bought(&app, &closed_id, &format!("c-{i}"), 10).await;
    }
    app.close(&closed_id).await;
    // A skewed event: two of its four buckets emptied by their own buyers
    // (skew 10 ÷ 5 = 2.0, over the default threshold of 1.5).
    let skew_id = eid("live-skew");
    app.create(&skew_id, 40, 4, json!({})).await;
    for bucket in [0, 1] {
        bought(&app, &skew_id, &user_homed_at(bucket, 4, "skew"), 10).await;
    }

    // A release of three pools: shown as one section, its pools side by
    // side in the release's order (not the ids' order), with its totals.
    let rel_id = eid("live-rel");
    let r = app
        .admin_post(
            "/v1/releases",
            json!({"id": rel_id, "per_user_limit": 4, "max_per_order": 4, "pools": [
                {"id": "s44", "stock": 30, "buckets": 2},
                {"id": "s42", "stock": 20, "buckets": 2},
                {"id": "s43", "stock": 10, "buckets": 1},
            ]}),
        )
        .await;
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    for i in 0..5 {
        let r = app
            .post(
                &format!("/v1/releases/{rel_id}/orders"),
                json!({"user_id": format!("r-{i}"), "request_id": format!("ro-{i}"),
                       "lines": [{"pool": "s44", "quantity": 2}, {"pool": "s43", "quantity": 1}]}),
            )
            .await;
        assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
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
    let sold_view = app.view(&sold_id).await;
    let wide_view = app.view(&wide_id).await;
    let closed_view = app.view(&closed_id).await;
    let skew_view = app.view(&skew_id).await;
    assert_eq!(skew_view["skew"], 2.0, "{skew_view}");
    assert_eq!(closed_view["leftover"], 70, "{closed_view}");

    let dom = chromium(&["--dump-dom", &format!("{}/ui", app.base)]);
    assert!(
        dom.contains("data-loaded=\"true\""),
        "the page loaded its data:\n{dom}"
    );
    // It read them all in one request a refresh, not a view per event.
    let live_reads = sample(
        &app.metrics().await,
        "shardstock_http_requests_total",
        &[("route", "/v1/live"), ("status", "200")],
    );
    assert!(live_reads.unwrap_or(0.0) >= 1.0, "the page reads /v1/live");

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
    for field in ["sold", "remaining", "stock"] {
        assert_eq!(shown(&dom, &id, field), view[field].to_string(), "{field}");
    }
    assert_eq!(shown(&dom, &id, "buckets"), "12");
    assert_eq!(
        shown(&dom, &id, "skew"),
        format!("{:.2}", view["skew"].as_f64().unwrap())
    );
    let bars_count = card(&dom, &id).matches("data-bucket=").count();
    assert_eq!(bars_count, 12, "a bar per bucket");
    let first = remaining_per_bucket(&view);
    assert!(dom.contains(&format!(
        "data-bucket=\"0\" data-remaining=\"{}\"",
        first[0]
    )));

    // Bars are each bucket's remaining against its share of the stock.
    for (event, v) in [(&id, &view), (&sold_id, &sold_view)] {
        let share = v["stock"].as_f64().unwrap() / v["bucket_count"].as_f64().unwrap();
        let drawn = bars(&dom, event);
        let want: Vec<u64> = remaining_per_bucket(v);
        assert_eq!(
            drawn.iter().map(|b| b.0).collect::<Vec<_>>(),
            want,
            "{event}"
        );
        for (remaining, height) in drawn {
            assert!(
                height.abs_diff(expected_height(remaining, share)) <= 1,
                "{event}: a bar of {remaining} units out of {share} is {height} px"
            );
        }
    }
    let tallest = bars(&dom, &sold_id).iter().map(|b| b.1).max().unwrap();
    assert!(
        tallest <= 35,
        "an event 96% sold shows nearly empty bars, not full ones ({tallest} px of 140)"
    );

    // 1,024 buckets: 64 bars of 16, each the sum of its buckets.
    let wide = card(&dom, &wide_id);
    assert_eq!(wide.matches("data-bucket=").count(), 0, "no bar per bucket");
    assert_eq!(wide.matches("data-group=").count(), 64, "{wide}");
    assert_eq!(
        shown(&dom, &wide_id, "grouping"),
        "1024 buckets in 64 bars of 16"
    );
    let per_bucket = remaining_per_bucket(&wide_view);
    let groups = bars(&dom, &wide_id);
    for (g, chunk) in per_bucket.chunks(16).enumerate() {
        assert_eq!(groups[g].0, chunk.iter().sum::<u64>(), "group {g}");
        assert_eq!(groups[g].1, expected_height(groups[g].0, 1_600.0));
    }
    assert!(wide.contains("data-group=\"1008–1023\""), "{wide}");

    // A closed event: a compact card, sold and leftover, no bars.
    let closed = card(&dom, &closed_id);
    assert!(
        dom.contains(&format!(
            "class=\"event closed\" data-event=\"{closed_id}\""
        )),
        "a compact card: {closed}"
    );
    assert_eq!(shown(&dom, &closed_id, "status"), "closed");
    assert_eq!(shown(&dom, &closed_id, "leftover"), "70");
    assert_eq!(shown(&dom, &closed_id, "sold"), "30");
    assert!(!closed.contains("class=\"bar"), "{closed}");

    // The release: one section, its pools inside in the release's order,
    // each pool's numbers its view's, the totals their sums.
    let section = dom
        .split(&format!("data-release=\"{rel_id}\""))
        .nth(1)
        .expect("the release's section");
    let pools = ["s44", "s42", "s43"].map(|p| format!("{rel_id}.{p}"));
    let at: Vec<usize> = pools
        .iter()
        .map(|p| {
            section
                .find(&format!("data-event=\"{p}\""))
                .unwrap_or_else(|| panic!("{p} in its release's section"))
        })
        .collect();
    assert!(
        at.windows(2).all(|w| w[0] < w[1]),
        "pools in the release's order: {at:?}"
    );
    assert_eq!(
        dom.matches(&format!("data-event=\"{}\"", pools[0])).count(),
        1,
        "a pool shows once"
    );
    let mut totals = [0u64; 3];
    for p in &pools {
        let v = app.view(p).await;
        for (k, field) in ["sold", "remaining", "stock"].into_iter().enumerate() {
            assert_eq!(shown(&dom, p, field), v[field].to_string(), "{p} {field}");
            totals[k] += v[field].as_u64().unwrap();
        }
    }
    assert_eq!(totals, [15, 45, 60], "10 units of s44 and 5 of s43 sold");
    let release_shown = |id: &str| {
        section
            .split(&format!("data-testid=\"{id}\">"))
            .nth(1)
            .and_then(|rest| rest.split('<').next())
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(release_shown("release-sold"), "15");
    assert_eq!(release_shown("release-remaining"), "45");
    assert_eq!(release_shown("release-stock"), "60");

    // A skew over the threshold is highlighted, and only there.
    let skewed = card(&dom, &skew_id);
    assert_eq!(shown(&dom, &skew_id, "skew"), "2.00");
    assert!(
        skewed.contains("data-skewed=\"true\"")
            && skewed.contains("the rebalancer's skew threshold"),
        "{skewed}"
    );
    assert!(
        !card(&dom, &id).contains("data-skewed"),
        "skew {} is under the threshold",
        view["skew"]
    );

    // And a picture of it, for people. The README's screenshot
    // (docs/live-page.png) is this one, kept by running this test with
    // SHARDSTOCK_LIVE_SCREENSHOT=<path>.
    let keep = std::env::var_os("SHARDSTOCK_LIVE_SCREENSHOT").map(std::path::PathBuf::from);
    let png = keep.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("shardstock-live-{}.png", std::process::id()))
    });
    let shown_events = [&sold_id, &skew_id, &id, &wide_id, &closed_id]
        .map(|e| e.as_str())
        .join(",");
    chromium(&[
        "--window-size=1280,840",
        &format!("--screenshot={}", png.display()),
        &format!("{}/ui?event={shown_events}", app.base),
    ]);
    assert!(
        std::fs::metadata(&png)
            .map(|m| m.len() > 5_000)
            .unwrap_or(false),
        "a screenshot was written"
    );
    if keep.is_none() {
        let _ = std::fs::remove_file(png);
    }
}

/// A draw event's card: its entries and the seed's published hash until it
/// is drawn; once drawn (by the admin call: no `draw_at`, so the page's
/// first reading cannot race the timer), its winners and the revealed
/// seed, as `POST /v1/events/{id}/draw` answered them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_live_page_shows_a_draw_before_and_after() {
    let app = TestApp::spawn(Backend::Memory).await;
    let id = eid("livedraw");
    let at = |ms: i64| shardstock::domain::model::rfc3339_ms::format(ms);
    let until = shardstock::engine::Clock::system().now_ms() + 3_000;
    let view = app
        .create(
            &id,
            2,
            2,
            json!({"access": "draw", "token_keys": ["live-draw-key-0123456789"],
                   "draw": {"entries_until": at(until)}}),
        )
        .await;
    let hash = view["draw"]["seed_hash"].as_str().unwrap().to_owned();
    for u in ["u-1", "u-2", "u-3", "u-4", "u-5"] {
        let r = app
            .post(&format!("/v1/events/{id}/entries"), json!({"user_id": u}))
            .await;
        assert_eq!(r.status(), 201);
    }
    let page = format!("{}/ui?event={id}", app.base);
    let dom = chromium(&["--dump-dom", &page]);
    assert!(dom.contains("data-loaded=\"true\""), "{dom}");
    assert_eq!(shown(&dom, &id, "entries"), "5");
    assert!(
        card(&dom, &id).contains(&format!("<code title=\"{hash}\">{}", &hash[..12])),
        "the seed's hash is shown: {}",
        card(&dom, &id)
    );
    assert!(
        !card(&dom, &id).contains("data-testid=\"seed\""),
        "no seed before the draw"
    );

    let drawn: Value = crate::harness::eventually(
        "the draw, once its entries closed",
        std::time::Duration::from_secs(30),
        async || {
            let r = app
                .admin_post(&format!("/v1/events/{id}/draw"), json!({}))
                .await;
            (r.status() == 200).then_some(())?;
            Some(r.json::<Value>().await.unwrap())
        },
    )
    .await;
    let seed = drawn["seed"].as_str().unwrap();
    let dom = chromium(&["--dump-dom", &page]);
    assert_eq!(shown(&dom, &id, "winners"), drawn["winners"].to_string());
    assert_eq!(shown(&dom, &id, "entries"), "5");
    assert!(
        card(&dom, &id).contains(&format!("<code title=\"{seed}\">{}", &seed[..12])),
        "the revealed seed is shown: {}",
        card(&dom, &id)
    );
}
