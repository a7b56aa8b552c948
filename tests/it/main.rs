//! The integration tests: one binary, one module per suite, one harness.
//!
//! A test's name says where it runs and what it shows, e.g.
//! `engine::cluster::the_fast_path_buys_from_the_home_bucket` or
//! `api::admin::on_redis::close_ends_the_sale_and_the_audit_balances_throughout`;
//! `cargo test --test it engine::` runs one suite.
//!
//! # Layout
//! - `harness`: backends, namespaces, private Redis servers, the shared
//!   Cluster, `TestApp`, `on_every_backend!` (the one backend matrix),
//!   purchase requests, a sale over HTTP, waiting for conditions.
//! - `engine`: the engine's conformance suite, on every backend.
//! - `bounds`: every accepted setting at its bounds (the largest batch, the
//!   largest flush over a backlog).
//! - `concurrency`: 64 tasks against one event, checked by invariants.
//! - `sagas`: the purchase saga under faults — a step failing after the home
//!   step, a caller gone, the sweeper, probe markers (issue 13).
//! - `holds`: purchases held until confirmed; unpaid holds expire and sell
//!   again (issue 14), swept under faults, across a reshard, a rebalancer
//!   move and a close.
//! - `ledger`: flusher, ledger, audit and close: every order reaches the
//!   database once.
//! - `rebalancer`: fencing, crash recovery, skew control, live resharding,
//!   the end of a sale window.
//! - `adaptive`: an adaptive bucket count grown from one bucket and shrunk
//!   back mid-sale by the leader; the leader dying at every step of an
//!   automatic reshard (issue 17).
//! - `interplay`: where features meet, over HTTP: holds and a reshard cut
//!   off and resumed, holds moved by a reshard and then a close, retries
//!   after the sale window and after the close; the oracle from the
//!   database alone.
//! - `reshard`: reshards and closes crashed, stalled and raced at named
//!   checkpoints: nothing stranded, nothing overwritten, closed stays closed.
//! - `redis_faults`: SCRIPT FLUSH mid-sale and round trips counted, on
//!   private servers.
//! - `replicas`: the durability setting (`WAIT`): a purchase acknowledged
//!   only once a replica has it.
//! - `api`: the HTTP API of `API.md` on memory and Redis.
//! - `cli`: the binary as an operator meets it: `check-config`, `audit` on
//!   the embedded store, and what `serve` says at start.
//! - `model_replay`: random traces of the model's actions
//!   (`shardstock-model`) replayed on every backend, the store compared
//!   with the model after every step.
//! - `faults`: randomized schedules of purchases, holds, confirms, cancels,
//!   expiry, replays (also after the window and the close), transfers,
//!   reshards, closes, checkpoint crashes and dropped calls over `Faulty`
//!   stores, then the promises checked, the last from the database alone.
//! - `releases`: multi-line orders over a release's pools, all or nothing:
//!   64 tasks with retries, faults in every step, an engine gone between
//!   lines, the sweeper; each pool read from the database after.
//! - `release_cuts`: a release pool resharded or closed while an order
//!   with a line there is not ended: the take given back, the order refused
//!   once, the database agreeing.
//! - `release_replay`: the release model's traces replayed on the store's
//!   release steps, on every backend.
//! - `release_reshards`: a release pool resharded 4 → 8 → 2 under 48 tasks
//!   buying orders of 1–3 lines: every order answered (none
//!   outcome-unknown), the promises, each pool read from the database after.
//! - `stall`: a Cluster master stopped for 3 s under multi-unit purchases.
//! - `telemetry`: a probing purchase as one trace under the caller's
//!   `traceparent` (in-memory exporter); JSON log lines with the request's ids.
//! - `upgrade`: records an older binary's scripts assembled (string markers,
//!   `owner|token` leases, `d` records of every kind) read by the new ones.
//! - `topology`: a Cluster grown to 4 masters and shrunk back mid-sale; one
//!   slot held mid-migration.
//! - `durability`: a killed service, a database outage, a crashed Redis.
//! - `failover`: a Cluster master killed mid-sale and replaced by its
//!   replica, with the durability setting on and off.
//! - `partial_loss`: Redis back from an AOF missing its last writes: the
//!   loss found by the audits, repaired or refused until recovered.
//! - `outbox`: order events out (issue 47): a sale's changes from the
//!   changes endpoint and from NATS JetStream, exactly the ledger's, each
//!   order's in order; a relay killed mid-way.
//! - `webhooks`: the outbox's changes POSTed to a receiver the test
//!   starts: exactly the ledger's changes, signed (checked by Python's
//!   `hmac`), through a 500 spell, a pause and a resume.
//! - `idle`: idle cost that does not grow with the number of events; dirty
//!   buckets and the stream scan bring every order to the ledger; retired events.
//! - `hardening`: slow clients, a bounded shutdown with Redis stalled,
//!   metric labels from made-up ids, dot-only event ids.
//! - `draws`: the `draw` access mode: entries, the draw recomputed from its
//!   revealed seed, winners buying with their tokens, the API and its timer.
//! - `tokens`: the `token` access mode: signed tokens checked and consumed
//!   with the take at the buyer's home, under many buyers at once, forged,
//!   expired, another user's and replayed.
//! - `live_page`: `/ui` rendered by headless Chromium.
//! - `quickstart`: the README's quickstart, run as written.
//! - `deploy_local`: the local topology, its dashboards and alert rules.
//!
//! Suites share one process: the machine's Redis is split by a namespace per
//! suite, PostgreSQL by a database per process, and tests that stop, crash or
//! flush a Redis get a private one.

mod harness;

mod adaptive;
mod api;
mod bounds;
mod cli;
mod concurrency;
mod deploy_local;
mod draws;
mod durability;
mod engine;
mod failover;
mod faults;
mod hardening;
mod holds;
mod idle;
mod interplay;
mod ledger;
mod live_page;
mod model_replay;
mod offers;
mod outbox;
mod partial_loss;
mod quickstart;
mod rebalancer;
mod redis_faults;
mod release_cuts;
mod release_hold_sweeps;
mod release_holds;
mod release_replay;
mod release_reshards;
mod releases;
mod replicas;
mod reshard;
mod sagas;
mod stall;
mod telemetry;
mod tokens;
mod topology;
mod upgrade;
mod webhooks;
mod webhooks_tls;
