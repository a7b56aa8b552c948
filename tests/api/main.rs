//! API tests: the real application on port 0, against memory and Redis.

#[path = "../common/mod.rs"]
mod common;
mod helpers;

mod admin;
mod events;
mod ops;
mod orders;
mod purchases;
mod two_instances;
