//! # shardstock
//!
//! Sells hot stock (flash sales, ticket drops, limited releases) at very high
//! request rates without ever overselling and without answering "sold out"
//! while a unit is left. Each event's stock is split into N buckets, each under
//! its own Redis hash tag so a hot event spreads over a Redis Cluster; a buyer
//! is routed to `hash(user) % N` and the ring is probed when that bucket is short.
//!
//! # Layout
//! The layers import one way: `domain` ← `store` ← `engine` ← `control` ←
//! `http`, `app`. The `ledger` sits beside the store (it imports `domain`
//! only) and is joined to it by `control`. The `layering` test below checks it.
//! - [`domain`]: ids, the key layout, routing, the model and the order-stream
//!   entries with their stored encodings (pure).
//! - [`store`]: the `Store` trait of per-bucket atomic steps in nine sections,
//!   and its two backends, `memory` (embedded) and `redis` (Lua scripts from
//!   `lua/`).
//! - [`ledger`]: the database (PostgreSQL or SQLite) behind Redis: orders,
//!   totals and the final guard, one code path through sqlx `Any`.
//! - [`engine`]: the purchase fast path and saga, cancels, views, the clock,
//!   the mover (fenced transfers a saga uses to gather fragments) and `Lease`,
//!   the one way to take the mover lease — written once above `Store`.
//! - [`control`]: close, rebuild, reshard, the rebalancer, the flusher, the
//!   audit and the reconciliation after a partial loss, the gauges and the
//!   saga sweeper: the work beyond the hot path.
//! - [`http`]: the axum API of `API.md`, problem+json errors, guards, the
//!   accept loop.
//! - [`app`]: `Application` (build from settings, run until stopped), the
//!   settings → options map, the operator commands.
//! - [`client`]: a typed client of the HTTP API, written against
//!   `/openapi.json`; the bench's HTTP load and the API tests use it.
//! - [`config`], [`metrics`], [`cli`]: settings (a leaf), metric names, the
//!   command line.
//! - [`telemetry`]: the log subscriber (text or JSON lines), the OTLP trace
//!   exporter when `OTEL_EXPORTER_OTLP_ENDPOINT` is set, W3C trace context.
//!
//! The load generator that measures all this is a workspace member of its own,
//! `bench/` (the `shardstock-bench` package and binary): the service carries
//! none of its code or dependencies.

/// Build and run the service.
pub mod app;
/// The command line.
pub mod cli;
/// A typed client of the HTTP API (the bench and the API tests use it).
pub mod client;
/// Settings from `config/*.toml`.
pub mod config;
/// Close, reshard, rebalance, flush, audit: the work beyond the hot path.
pub mod control;
/// Ids, keys, routing and the model: pure, imported by every layer.
pub mod domain;
/// The purchase saga, cancels, views and the mover, above the store.
pub mod engine;
/// The HTTP API.
pub mod http;
/// The order ledger.
pub mod ledger;
/// Metric names and descriptions.
pub mod metrics;
/// The store trait and its memory and Redis backends.
pub mod store;
/// Logs (text or JSON) and traces (OTLP), and the caller's trace context.
pub mod telemetry;

pub use engine::{Engine, EngineError, EngineOptions};
pub use store::{MemoryStore, RedisStore, Store, StoreError};

/// The layers import one way. Checked here, by reading the sources, so an
/// import against the grain fails a test instead of slowly tangling the crate.
#[cfg(test)]
mod layering {
    use std::collections::BTreeSet;
    use std::path::Path;

    /// Every `crate::<module>` a text names.
    fn scan(text: &str, found: &mut BTreeSet<String>) {
        for (i, _) in text.match_indices("crate::") {
            let name: String = text[i + 7..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            found.insert(name);
        }
    }

    /// Every `crate::<module>` a module of `src/` names (a folder, or a file
    /// `src/<module>.rs`), itself aside.
    fn imports(module: &str) -> BTreeSet<String> {
        fn walk(dir: &Path, found: &mut BTreeSet<String>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    walk(&path, found);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    scan(&std::fs::read_to_string(&path).unwrap(), found);
                }
            }
        }
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut found = BTreeSet::new();
        let (folder, file) = (src.join(module), src.join(format!("{module}.rs")));
        if folder.is_dir() {
            walk(&folder, &mut found);
        }
        if file.is_file() {
            scan(&std::fs::read_to_string(&file).unwrap(), &mut found);
        }
        found.remove(module);
        found
    }

    /// What each top-level module may import (docs/DESIGN.md, "Code map").
    const ALLOWED: &[(&str, &[&str])] = &[
        ("domain", &[]),
        ("metrics", &[]),
        ("config", &["domain"]),
        ("cli", &["config"]),
        ("telemetry", &["config"]),
        ("client", &[]),
        ("store", &["domain", "metrics"]),
        ("ledger", &["domain", "metrics"]),
        ("engine", &["domain", "store", "metrics"]),
        (
            "control",
            &["domain", "store", "ledger", "engine", "metrics", "config"],
        ),
        (
            "http",
            &[
                "domain",
                "store",
                "ledger",
                "engine",
                "control",
                "metrics",
                "telemetry",
            ],
        ),
        (
            "app",
            &[
                "domain",
                "store",
                "ledger",
                "engine",
                "control",
                "http",
                "metrics",
                "config",
                "telemetry",
            ],
        ),
    ];

    #[test]
    fn each_layer_imports_only_the_layers_below_it() {
        for (layer, may) in ALLOWED {
            let stray: Vec<String> = imports(layer)
                .into_iter()
                .filter(|m| !may.contains(&m.as_str()))
                .collect();
            assert!(stray.is_empty(), "{layer} imports {stray:?}");
        }
    }

    #[test]
    fn every_top_level_module_has_its_rule() {
        let lib = include_str!("lib.rs");
        let declared: BTreeSet<&str> = lib
            .lines()
            .filter_map(|l| {
                l.strip_prefix("pub mod ")
                    .or_else(|| l.strip_prefix("mod "))
            })
            .filter_map(|l| l.strip_suffix(';'))
            .collect();
        let ruled: BTreeSet<&str> = ALLOWED.iter().map(|(m, _)| *m).collect();
        assert_eq!(declared, ruled);
    }
}
