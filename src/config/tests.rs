//! The settings' parse and validation rules: an empty file, every field's
//! bounds and cross-field rules, unknown keys and the errors that name them.

use std::path::Path;

use super::*;

fn parse(text: &str) -> Result<Settings, ConfigError> {
    Settings::parse(text, Path::new("test.toml"))
}

fn field_of(e: ConfigError) -> String {
    match e {
        ConfigError::Invalid { field, .. } => field,
        ConfigError::Parse { message, .. } => message,
        other => other.to_string(),
    }
}

#[test]
fn an_empty_file_is_the_embedded_default() {
    let s = parse("").unwrap();
    assert!(s.store.redis_url.is_none());
    assert!(s.database.url.starts_with("sqlite:"));
    assert!(s.events.is_empty());
}

#[test]
fn the_shipped_config_parses() {
    let s = Settings::load(Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/shardstock.toml"
    )))
    .unwrap();
    assert!(!s.event_specs().unwrap().is_empty());
}

#[test]
fn events_are_validated_with_the_field_named() {
    let e = parse("[[events]]\nid = \"a\"\nstock = 5\nbuckets = 0\n").unwrap_err();
    assert_eq!(field_of(e), "events[0].buckets");
    let e = parse("[[events]]\nid = \"a{b}\"\nstock = 5\nbuckets = 2\n").unwrap_err();
    assert_eq!(field_of(e), "events[0].id");
    let e = parse("[[events]]\nid = \"a\"\nstock = 5\nbuckets = 2\nstarts_at = \"tomorrow\"\n")
        .unwrap_err();
    assert_eq!(field_of(e), "events[0].starts_at");
    let e =
        parse("[[events]]\nid = \"a\"\nstock = 5\nbuckets = 2\nhold_seconds = 0\n").unwrap_err();
    assert_eq!(field_of(e), "events[0].hold_seconds");
    let held =
        parse("[[events]]\nid = \"a\"\nstock = 5\nbuckets = 2\nhold_seconds = 600\n").unwrap();
    assert_eq!(held.events[0].spec(0).unwrap().hold_seconds, Some(600));
    let twice = "[[events]]\nid = \"a\"\nstock = 5\nbuckets = 2\n[[events]]\nid = \"a\"\nstock = 1\nbuckets = 1\n";
    assert_eq!(field_of(parse(twice).unwrap_err()), "events[1].id");
    let auto = parse("[[events]]\nid = \"a\"\nstock = 5\nbuckets = \"auto\"\n").unwrap();
    let spec = auto.events[0].spec(0).unwrap();
    assert_eq!(
        (spec.buckets, spec.auto_buckets),
        (1, Some(BucketRange::AUTO))
    );
    let range =
        parse("[[events]]\nid = \"a\"\nstock = 5\nbuckets = { min = 2, max = 8 }\n").unwrap();
    let spec = range.events[0].spec(0).unwrap();
    assert_eq!(
        (spec.buckets, spec.auto_buckets),
        (2, Some(BucketRange { min: 2, max: 8 }))
    );
    for bad in [
        "\"many\"",
        "{ min = 0, max = 4 }",
        "{ min = 8, max = 2 }",
        "{ min = 1, max = 2000 }",
    ] {
        let text = format!("[[events]]\nid = \"a\"\nstock = 5\nbuckets = {bad}\n");
        assert_eq!(
            field_of(parse(&text).unwrap_err()),
            "events[0].buckets",
            "{bad}"
        );
    }
    // This file is TOML: its error quotes the range as TOML (the API's, as JSON).
    let text = "[[events]]\nid = \"a\"\nstock = 5\nbuckets = { min = 8, max = 2 }\n";
    let e = parse(text).unwrap_err().to_string();
    assert!(e.contains("{ min = 8, max = 2 }"), "{e}");
}

#[test]
fn unknown_keys_and_bad_values_are_errors_naming_the_key() {
    let msg = field_of(parse("[server]\nlisten_addr = \"x\"\n").unwrap_err());
    assert!(msg.contains("listen_addr"), "{msg}");
    assert_eq!(
        field_of(parse("[server]\nlisten = \"nope\"\n").unwrap_err()),
        "server.listen"
    );
    assert_eq!(
        field_of(parse("[store]\nredis_url = \"http://x\"\n").unwrap_err()),
        "store.redis_url"
    );
    let msg = field_of(parse("[database]\nflush_batch = \"many\"\n").unwrap_err());
    assert!(msg.contains("flush_batch"), "{msg}");
    assert_eq!(
        field_of(parse("[batching]\nmax_wait_us = 1000000\n").unwrap_err()),
        "batching.max_wait_us"
    );
    assert_eq!(
        field_of(parse("[batching]\nshared_lanes = 0\n").unwrap_err()),
        "batching.shared_lanes"
    );
    assert_eq!(
        field_of(parse("[rebalancer]\ngrow_max_one_server = 0\n").unwrap_err()),
        "rebalancer.grow_max_one_server"
    );
    assert_eq!(
        parse("[batching]\nshared_lanes = 4\n")
            .unwrap()
            .batching
            .shared_lanes,
        4
    );
    assert_eq!(
        parse("[batching]\nmax_wait_us = 500\n")
            .unwrap()
            .batching
            .max_wait_us,
        500
    );
}

#[test]
fn the_sweeper_bounds_are_checked_against_each_other() {
    let field = |text: &str| field_of(parse(text).unwrap_err());
    assert_eq!(
        field("[server]\nrequest_timeout_ms = 40000\n"),
        "engine.stale_saga_after_ms"
    );
    assert_eq!(
        field("[engine]\nsweep_interval_ms = 0\n"),
        "engine.sweep_interval_ms"
    );
    assert_eq!(
        field("[engine]\nmarker_ttl_ms = 60000\n"),
        "engine.marker_ttl_ms"
    );
    let ok = "[server]\nrequest_timeout_ms = 100\n[engine]\nstale_saga_after_ms = 200\nsweep_interval_ms = 50\nmarker_ttl_ms = 1000\n";
    assert_eq!(parse(ok).unwrap().engine.stale_saga_after_ms, 200);
}

#[test]
fn a_nats_url_without_order_events_is_refused_naming_both() {
    let off = "[outbox]\nnats_url = \"nats://127.0.0.1:4222\"\n";
    let e = parse(off).unwrap_err();
    let text = e.to_string();
    assert_eq!(field_of(e), "outbox.nats_url");
    assert!(text.contains("outbox.enabled"), "{text}");
    let on = parse("[outbox]\nenabled = true\nnats_url = \"nats://127.0.0.1:4222\"\n").unwrap();
    assert!(on.outbox.enabled);
    assert!(!parse("").unwrap().outbox.enabled, "off by default");
}

#[test]
fn a_webhook_subscription_names_the_field_it_gets_wrong() {
    let hook = |extra: &str| {
        format!(
            "[outbox]\nenabled = true\n[[outbox.webhooks]]\nid = \"pay\"\nurl = \"http://127.0.0.1:9/h\"\nsecrets = [\"0123456789abcdef\"]\n{extra}"
        )
    };
    let ok = parse(&hook("types = [\"order.created\"]\n")).unwrap();
    assert_eq!(ok.outbox.webhooks[0].types, ["order.created"]);
    let unknown = parse(&hook("secret = \"x\"\n")).unwrap_err().to_string();
    assert!(unknown.contains("unknown field `secret`"), "{unknown}");
    let e = parse(&hook("types = [\"order.made\"]\n")).unwrap_err();
    assert_eq!(field_of(e), "outbox.webhooks[0].types");
    let twice = format!(
        "{}[[outbox.webhooks]]\nid = \"pay\"\nurl = \"http://x\"\nsecrets = [\"0123456789abcdef\"]\n",
        hook("")
    );
    assert_eq!(
        field_of(parse(&twice).unwrap_err()),
        "outbox.webhooks[1].id"
    );
    let off = hook("").replace("enabled = true", "enabled = false");
    assert_eq!(field_of(parse(&off).unwrap_err()), "outbox.webhooks");
    let tls = hook("").replace("http://127.0.0.1:9/h", "https://pay.example/h");
    assert_eq!(
        parse(&tls).unwrap().outbox.webhooks[0].url,
        "https://pay.example/h"
    );
}

#[test]
fn a_webhook_ca_file_is_read_at_start_naming_the_field() {
    let dir = std::env::temp_dir().join(format!("ss-ca-{:08x}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir).unwrap();
    let with = |path: &std::path::Path| {
        parse(&format!(
            "[outbox]\nenabled = true\nwebhook_ca_file = {:?}\n",
            path.display().to_string()
        ))
    };
    let missing = with(&dir.join("absent.pem")).unwrap_err();
    let text = missing.to_string();
    assert_eq!(field_of(missing), "outbox.webhook_ca_file");
    assert!(text.contains("cannot read"), "{text}");
    let empty = dir.join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    let text = with(&empty).unwrap_err().to_string();
    assert!(text.contains("no PEM certificate"), "{text}");
    let big = dir.join("big.pem");
    std::fs::write(&big, vec![b'a'; (1 << 20) + 1]).unwrap();
    let text = with(&big).unwrap_err().to_string();
    assert!(text.contains("more than a CA file's"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn releases_are_validated_with_the_field_named() {
    let ok = "[[releases]]\nid = \"r\"\npools = [{ id = \"42\", stock = 5, buckets = 1 }, { id = \"43\", stock = 5, buckets = \"auto\" }]\nper_user_limit = 2\n";
    let s = parse(ok).unwrap();
    assert_eq!(s.release_specs().unwrap()[0].pools.len(), 2);
    let cases = [
        (
            "[[releases]]\nid = \"r\"\npools = []\n",
            "releases[0].pools",
        ),
        (
            "[[releases]]\nid = \"r\"\npools = [{ id = \"a\", stock = 5, buckets = 0 }]\n",
            "releases[0].pools[0].buckets",
        ),
        (
            "[[releases]]\nid = \"r\"\npools = [{ id = \"a\", stock = 5, buckets = 1 }, { id = \"a\", stock = 5, buckets = 1 }]\n",
            "releases[0].pools[1].id",
        ),
        (
            "[[releases]]\nid = \"r\"\npools = [{ id = \"a\", stock = 5, buckets = 1 }]\nhold_seconds = 0\n",
            "releases[0].hold_seconds",
        ),
        (
            "[[releases]]\nid = \"a-release-id-longer-than-31-chars\"\npools = [{ id = \"a\", stock = 5, buckets = 1 }]\n",
            "releases[0].id",
        ),
    ];
    for (text, field) in cases {
        assert_eq!(field_of(parse(text).unwrap_err()), field, "{text}");
    }
    let unknown = parse(
        "[[releases]]\nid = \"r\"\npools = [{ id = \"a\", stock = 5, buckets = 1, stok = 1 }]\n",
    )
    .unwrap_err()
    .to_string();
    assert!(unknown.contains("stok"), "{unknown}");
}
