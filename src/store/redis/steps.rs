//! How the Redis backend declares its steps, once each: a step's script,
//! its KEYS as [`domain::keys`](crate::domain::keys) fields in order, its
//! ARGV as typed columns (repeated groups included), its reply and the
//! records it writes.
//!
//! Each section's steps are declared at the top of its own file
//! (`redis/<section>.rs`, with `use super::steps::prelude::*`), next to the
//! calls that run them. A step with a fixed list of columns is a struct
//! whose fields are its ARGV in order ([`steps!`] writes the struct, its
//! [`Decl`] and its argument builder from one list, and the section's
//! `FIXED`); the adapter builds the struct and runs it with
//! [`RedisStore::run`](super::RedisStore), which derives the KEYS. A step
//! whose ARGV repeats per entry (`purchase`, `restore`, `stream_ack`, …) is
//! a [`Decl`] constant in its section's `REPEATED`, its builder beside its
//! decoder, and a test holds the builder to the declaration.
//!
//! The script registry ([`super::scripts::Scripts`]) is built from
//! [`all`], and `contract.rs` checks every `lua/*.lua` header's `KEYS[n]`
//! and `ARGV[n]` lines against these declarations without a Redis.

use crate::domain::keys::{BucketKey, EventKey};

/// The text of `lua/<name>.lua`.
macro_rules! lua {
    ($name:ident) => {
        include_str!(concat!("../../../lua/", stringify!($name), ".lua"))
    };
}
pub(super) use lua;

/// One KEYS entry of a step.
// Read by the header check (`contract.rs`) and by readers: a declaration.
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Debug, Clone, Copy)]
pub(super) enum K {
    /// A key of the bucket the step runs on.
    Bucket(BucketKey),
    /// A key of the event's meta slot.
    Event(EventKey),
    /// A key the caller names (a probe marker, the deadline index, a lease
    /// holder, a user's rate): named as the header's pattern ends.
    Given(&'static str),
    /// One key of that name an entry, `i = 1..n` (the markers of a saga).
    Each(&'static str),
    /// Each group's KEYS of another step, one group after another.
    Groups(&'static Decl),
}

/// One ARGV entry (or group of entries) of a step.
// Read by the header check (`contract.rs`) and by readers: a declaration.
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Debug, Clone, Copy)]
pub(super) enum Arg {
    /// One value.
    One(&'static str),
    /// `cols` once per entry, interleaved (entry i's are together), `count`
    /// entries: the number a column before names (`n`) or the rest of ARGV.
    /// `index` is the letter the header's offsets use for the entry.
    Each {
        count: &'static str,
        index: char,
        cols: &'static [&'static str],
    },
    /// Each group's ARGV of another step, one group after another.
    Groups(&'static Decl),
}

/// What a step answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reply {
    /// Nothing the caller reads.
    Nothing,
    /// 1 (applied) or 0.
    Flag,
    /// A number (or "ST" for a step on a bucket that may be gone).
    Number,
    /// A fixed array of values (or "ST").
    Values,
    /// An array whose first value is one of these codes (or "ST").
    Codes(&'static [&'static str]),
}

/// A stored record a step writes (each one's format lives in `domain/`).
// Read by the header check (`contract.rs`) and by readers: a declaration.
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Record {
    /// `reqs`: a request's outcome (`domain::model::RequestRecord`).
    Request,
    /// `idx`: an order entry (`domain::model::OrderEntry`).
    OrderEntry,
    /// `orders`: a stream record (`domain::stream::StreamEntry`).
    Stream,
    /// `hq`: a fast-path hold's queue entry "pay_by|oid".
    HoldQueue,
    /// `xfer` / `xin`: a transfer journal entry (`domain::transfer`).
    Transfer,
    /// `tk:<rid>:<pass>`: a probe marker (`domain::records::ProbeMarker`).
    Marker,
    /// `meta`: fields of the event's meta (`domain::model::EventMeta`).
    Meta,
    /// `empty`: the sold-out mark (`domain::records::EmptyMark`).
    EmptyMark,
    /// A lease holder (`domain::records::LeaseHolder`).
    Lease,
}

/// One step: everything the Rust side knows about its script.
// Read by the header check (`contract.rs`) and by readers: a declaration.
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Debug)]
pub(super) struct Decl {
    pub name: &'static str,
    pub lua: &'static str,
    pub keys: &'static [K],
    /// KEYS after `keys`, only in a call that carries the optional last
    /// columns (events with holds).
    pub(crate) more_keys: &'static [K],
    pub(crate) argv: &'static [Arg],
    pub reply: Reply,
    pub writes: &'static [Record],
}

/// A step with fixed columns: its declaration and its ARGV.
pub(super) trait Step {
    const DECL: &'static Decl;
    /// The ARGV, in the declared order.
    fn args(self) -> Vec<String>;
}

/// A value as a script takes it.
pub(super) trait Column {
    fn push(self, args: &mut Vec<String>);
}

macro_rules! column_to_string {
    ($($t:ty),*) => {$(
        impl Column for $t {
            fn push(self, args: &mut Vec<String>) {
                args.push(self.to_string());
            }
        }
    )*};
}
column_to_string!(u32, u64, i64, usize, String, &'static str);

/// A flag: "1" or "0".
impl Column for bool {
    fn push(self, args: &mut Vec<String>) {
        args.push(if self { "1" } else { "0" }.to_owned());
    }
}

/// An optional last column: absent (not empty) when `None`, so a script
/// tells the two apart by `ARGV[n]` being nil.
impl<T: Column> Column for Option<T> {
    fn push(self, args: &mut Vec<String>) {
        if let Some(v) = self {
            v.push(args);
        }
    }
}

// Short names for the declarations (`prelude`).
use EventKey::Meta;
pub(super) const fn b(k: BucketKey) -> K {
    K::Bucket(k)
}
pub(super) const META: K = K::Event(Meta);

/// Declares steps with fixed columns: each a struct of its ARGV, in order.
macro_rules! steps {
    ($(
        $(#[$doc:meta])*
        $ty:ident = $name:ident {
            keys: [$($key:expr),* $(,)?],
            $(more_keys: [$($more:expr),* $(,)?],)?
            argv: {$($col:ident: $cty:ty),* $(,)?},
            reply: $reply:expr,
            writes: [$($rec:ident),* $(,)?],
        }
    )*) => {
        $(
            $(#[$doc])*
            pub(super) struct $ty {
                $(pub $col: $cty,)*
            }

            impl Step for $ty {
                const DECL: &'static Decl = &Decl {
                    name: stringify!($name),
                    lua: lua!($name),
                    keys: &[$($key),*],
                    more_keys: &[$($($more),*)?],
                    argv: &[$(Arg::One(stringify!($col))),*],
                    reply: $reply,
                    writes: &[$(Record::$rec),*],
                };

                #[allow(unused_mut)]
                fn args(self) -> Vec<String> {
                    let mut args = Vec::new();
                    $(Column::push(self.$col, &mut args);)*
                    args
                }
            }
        )*

        /// The section's steps with fixed columns.
        pub(super) const FIXED: &[&Decl] = &[$(<$ty as Step>::DECL),*];
    };
}
pub(super) use steps;

/// Every step the Redis store runs: each section's declarations.
pub(super) fn all() -> impl Iterator<Item = &'static Decl> {
    [
        super::events::FIXED,
        super::buckets::FIXED,
        super::buckets::REPEATED,
        super::holds::FIXED,
        super::leases::FIXED,
        super::limits::FIXED,
        super::transfers::FIXED,
        super::streams::FIXED,
        super::streams::REPEATED,
        super::retire::FIXED,
        super::retire::REPEATED,
        super::releases::FIXED,
        super::draws::FIXED,
        super::draws::REPEATED,
        super::offers::FIXED,
    ]
    .into_iter()
    .flatten()
    .copied()
}

/// Every section's step structs and declarations, so `steps::Take` names
/// one wherever it is declared.
#[allow(unused_imports)]
pub(super) use super::{
    buckets::*, draws::*, events::*, holds::*, leases::*, limits::*, offers::*, releases::*,
    retire::*, streams::*, transfers::*,
};

/// What a section's declarations name: `steps! { … }` at the top of each
/// `redis/<section>.rs`, below its imports.
pub(super) mod prelude {
    pub(in crate::store::redis) use super::{
        Arg, Column, Decl, K, META, Record, Reply, Step, b, lua, steps,
    };
    pub(in crate::store::redis) use crate::domain::keys::BucketKey as Bk;
    pub(in crate::store::redis) use crate::domain::keys::EventKey::{Lease as LEASE_KEY, Xsettled};
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scripts run by steps of other names (each step's doc says so).
    const SERVES: &[(&str, &[&str])] = &[
        (
            "lease_acquire",
            &["acquire_leadership", "acquire_lease", "seize_lease"],
        ),
        (
            "lease_renew",
            &["renew_lease", "release_leadership", "release_lease"],
        ),
        ("rate_admit", &["admit"]),
        ("hold_index", &["reschedule_holds"]),
        ("bucket_states", &["bucket_state"]),
        (
            "decide_order",
            &["commit_order", "abort_order", "hold_order", "move_hold"],
        ),
        ("undo_line", &["undo_line", "give_back_line"]),
        ("entries_page", &["entries_page", "entry_count"]),
    ];

    #[test]
    fn every_script_runs_a_store_step_of_its_name_or_names_the_steps_it_serves() {
        let steps = &*crate::store::STEPS;
        for step in all() {
            let own = [step.name];
            let served = SERVES
                .iter()
                .find(|(script, _)| *script == step.name)
                .map_or(&own[..], |(_, served)| served);
            for name in served {
                assert!(
                    steps.contains(name),
                    "{}.lua runs {name}, which store::STEPS does not list",
                    step.name
                );
            }
        }
    }

    #[test]
    fn a_step_builds_its_columns_in_the_declared_order() {
        let step = SetEmpty {
            epoch: 7,
            ttl: 100,
            mark: "7|3".into(),
        };
        assert_eq!(
            SetEmpty::DECL
                .argv
                .iter()
                .map(|a| match a {
                    Arg::One(name) => *name,
                    _ => "?",
                })
                .collect::<Vec<_>>(),
            ["epoch", "ttl", "mark"]
        );
        assert_eq!(step.args(), ["7", "100", "7|3"]);
        let lease = LeaseAcquire {
            owner: "o".into(),
            ttl: 5,
            seize: None,
        };
        assert_eq!(
            lease.args(),
            ["o", "5"],
            "an absent last column is not sent"
        );
    }
}
