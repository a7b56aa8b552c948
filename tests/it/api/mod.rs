//! The API suite: the real application on port 0, over HTTP, on memory and
//! on Redis (see `harness::TestApp`).

mod admin;
mod contract;
mod events;
mod holds;
mod live;
mod lookup;
mod ops;
mod orders;
mod purchases;
mod releases;
mod two_instances;
