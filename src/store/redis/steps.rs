//! Every store step the Redis backend runs, declared once: its script, its
//! KEYS as [`domain::keys`](crate::domain::keys) fields in order, its ARGV as
//! typed columns (repeated groups included), its reply and the records it
//! writes.
//!
//! A step with a fixed list of columns is a struct whose fields are its ARGV
//! in order ([`steps!`] writes the struct, its [`Decl`] and its argument
//! builder from one list); the adapter builds the struct and runs it with
//! [`RedisStore::run`](super::RedisStore), which derives the KEYS. A step
//! whose ARGV repeats per entry (`purchase`, `restore`, `stream_ack`, …) is
//! a [`Decl`] constant next to the others; its builder lives beside its
//! decoder and a test holds the builder to the declaration.
//!
//! The script registry ([`super::scripts::Scripts`]) is built from
//! [`all`], and `contract.rs` checks every `lua/*.lua` header's `KEYS[n]`
//! and `ARGV[n]` lines against these declarations without a Redis.
//!
//! One file on purpose: it is the list of every step, read top to bottom
//! like the `lua/` folder; split, a reader would lose the one place that
//! says what each script takes and writes.

use crate::domain::keys::{BucketKey, EventKey};

use super::scripts::reply;

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

// Short names for the declarations below.
use BucketKey::*;
use EventKey::{Lease as LEASE_KEY, Meta, Xsettled};
const fn b(k: BucketKey) -> K {
    K::Bucket(k)
}
const META: K = K::Event(Meta);

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

        /// The steps with fixed columns.
        const FIXED: &[&Decl] = &[$(<$ty as Step>::DECL),*];
    };
}

steps! {
    // ---- events.rs: the event's meta slot ----
    /// Creates an event's meta unless it exists.
    CreateEvent = create_event {
        keys: [META],
        argv: {
            id: String, stock: u64, buckets: u32, per_user_limit: u32,
            max_per_order: u32, starts_at: String, ends_at: String, now: i64,
            hold_seconds: String, auto_buckets: String,
        },
        reply: Reply::Codes(&[reply::OK, reply::EXISTS]),
        writes: [Meta],
    }
    /// Moves the status from `from` to `to`.
    SetStatus = set_status {
        keys: [META],
        argv: { from: &'static str, to: &'static str },
        reply: Reply::Flag,
        writes: [Meta],
    }
    /// Switches the layout the meta routes to.
    SetLayout = set_layout {
        keys: [META],
        argv: { generation: u32, buckets: u32, layouts: String },
        reply: Reply::Flag,
        writes: [Meta],
    }
    /// Records which old layouts still hold records.
    SetRetired = set_retired {
        keys: [META],
        argv: { generation: u32, layouts: String },
        reply: Reply::Flag,
        writes: [Meta],
    }
    /// Bumps the event's sequence number.
    BumpSeq = bump_seq {
        keys: [META],
        argv: {},
        reply: Reply::Values,
        writes: [Meta],
    }
    /// Notes that every bucket's epoch was bumped.
    EpochsBumped = epochs_bumped {
        keys: [META],
        argv: { due: u64 },
        reply: Reply::Flag,
        writes: [Meta],
    }
    /// Marks the event sold out, unless units came back since `seq`.
    MarkSoldOut = mark_sold_out {
        keys: [META],
        argv: { seq: u64, mark: String },
        reply: Reply::Flag,
        writes: [Meta],
    }
    /// Starts a reshard to a new layout.
    BeginReshard = begin_reshard {
        keys: [META],
        argv: { generation: u32, buckets: u32 },
        reply: Reply::Flag,
        writes: [Meta],
    }
    /// Switches to the reshard's layout, under the mover lease.
    EndReshard = end_reshard {
        keys: [META, K::Event(LEASE_KEY)],
        argv: {
            generation: u32, buckets: u32, layouts: String, owner: String,
            token: u64, now: i64, why: String, history: usize, legacy: String,
        },
        reply: Reply::Codes(&[reply::OK, reply::NOT_RESHARDING, reply::FENCED]),
        writes: [Meta],
    }

    // ---- buckets.rs: the hot path and the purchase saga ----
    /// Makes a bucket: its stock and its stream's consumer group.
    InitBucket = init_bucket {
        keys: [b(Stock), b(Orders)],
        argv: { units: u64, group: &'static str },
        reply: Reply::Nothing,
        writes: [],
    }
    /// The saga's probe of bucket j.
    Take = take {
        keys: [b(Stock), K::Given("tk"), b(Orders), b(Xfer), b(Adds), b(Sealed)],
        argv: { qty: u32, order: String, taken: String, record: String, marker: u64 },
        reply: Reply::Codes(&[reply::STALE, reply::TAKEN, reply::SHORT]),
        writes: [Marker, Stream],
    }
    /// Gives back what a take took.
    Untake = untake {
        keys: [b(Stock), K::Given("tk"), b(Orders), b(Adds)],
        argv: { qty: u32, taken: String, undone: String, record: String, marker: u64 },
        reply: Reply::Codes(&[reply::STALE, reply::OK, reply::NO_TAKE]),
        writes: [Marker, Stream],
    }
    /// Ends a saga at its home bucket.
    Finish = finish {
        keys: [b(Stock), b(Users), b(Reqs), b(Idx), b(Pend)],
        more_keys: [b(Holds), b(Hunits), b(Orders)],
        argv: {
            rid: String, outcome: &'static str, user: String, qty: u32, order: String,
            entry: String, record: String, limited: bool, saga: String,
            pay_by: Option<i64>, hold: Option<String>,
        },
        reply: Reply::Codes(&[reply::STALE, reply::OK, reply::REPLAY, reply::NO_RECORD]),
        writes: [OrderEntry, Request, Stream],
    }
    /// Sagas pending at a home bucket since before a bound.
    StalePending = stale_pending {
        keys: [b(Pend), b(Reqs)],
        argv: { bound: i64, count: u32 },
        reply: Reply::Values,
        writes: [],
    }
    /// Cancels an order.
    Cancel = cancel {
        keys: [
            b(Stock), b(Users), b(Idx), b(Orders), b(Adds), b(Sealed), b(Holds),
            b(Hunits),
        ],
        argv: { order: String, head: String },
        reply: Reply::Codes(&[
            reply::STALE, reply::OK, reply::ALREADY_CANCELLED, reply::NOT_FOUND,
        ]),
        writes: [OrderEntry, Stream],
    }
    /// A bucket's addition count and epoch.
    Counters = counters {
        keys: [b(Adds), b(Epoch)],
        argv: {},
        reply: Reply::Values,
        writes: [],
    }
    /// Marks the event found sold out, on one bucket.
    SetEmpty = set_empty {
        keys: [b(Empty), b(Epoch)],
        argv: { epoch: u64, ttl: u64, mark: String },
        reply: Reply::Flag,
        writes: [EmptyMark],
    }
    /// A bucket's state in one read.
    BucketState = bucket_state {
        keys: [
            b(Stock), b(Xfer), b(Fence), b(Adds), b(Demand), b(Hunits), b(Sealed),
        ],
        argv: {},
        reply: Reply::Codes(&[reply::STALE]),
        writes: [],
    }

    // ---- holds.rs ----
    /// Confirms a held order (or finds it expired).
    Confirm = confirm {
        keys: [
            b(Stock), b(Users), b(Idx), b(Orders), b(Adds), b(Sealed), b(Holds),
            b(Hunits), b(Hq),
        ],
        argv: { now: i64, order: String, confirm: String, expire: String },
        reply: Reply::Codes(&[
            reply::STALE, reply::OK, reply::ALREADY_CONFIRMED, reply::HOLD_EXPIRED,
            reply::HOLD_CANCELLED, reply::NOT_FOUND,
        ]),
        writes: [OrderEntry, Stream],
    }
    /// Expires the due holds of a bucket (or voids every one).
    ExpireHolds = expire_holds {
        keys: [
            b(Stock), b(Users), b(Idx), b(Orders), b(Adds), b(Sealed), b(Holds),
            b(Hunits), b(Hq),
        ],
        argv: { now: i64, count: u32, head: String, void: bool },
        reply: Reply::Codes(&[reply::STALE, reply::OK]),
        writes: [OrderEntry, Stream],
    }
    /// Moves a bucket's entry in the deadline index.
    HoldIndex = hold_index {
        keys: [K::Given("holds")],
        argv: { bucket: String, seen: i64, next: String },
        reply: Reply::Flag,
        writes: [],
    }

    // ---- leases.rs ----
    /// Takes a lease (or leadership) unless another owner holds it.
    LeaseAcquire = lease_acquire {
        keys: [K::Given("lease"), K::Given("token")],
        argv: { owner: String, ttl: u64, seize: Option<&'static str> },
        reply: Reply::Codes(&[reply::OK, reply::HELD]),
        writes: [Lease],
    }
    /// Extends or releases a lease the owner holds.
    LeaseRenew = lease_renew {
        keys: [K::Given("lease")],
        argv: { owner: String, token: u64, ttl: u64, legacy: String },
        reply: Reply::Flag,
        writes: [Lease],
    }

    // ---- limits.rs ----
    /// Admits a request under the user's shared rate.
    RateAdmit = rate_admit {
        keys: [K::Given("rate")],
        argv: { interval: u64, tolerance: u64 },
        reply: Reply::Number,
        writes: [],
    }

    // ---- transfers.rs ----
    /// OUT: units leave a bucket into the transfer journal.
    TransferOut = transfer_out {
        keys: [b(Stock), b(Xfer), b(Fence), b(Sealed), b(Adds)],
        argv: { token: u64, xid: String, units: u64, entry: String, sealed_ok: bool },
        reply: Reply::Codes(&[
            reply::STALE, reply::FENCED, reply::DUPLICATE, reply::APPLIED, reply::SHORT_STOCK,
        ]),
        writes: [Transfer],
    }
    /// A new leader's token, raised on a bucket.
    RaiseFence = raise_fence {
        keys: [b(Fence), b(Xfer), b(Xin)],
        argv: { token: u64, mover_below: u64, reshard_below: u64 },
        reply: Reply::Number,
        writes: [],
    }
    /// Notes the token below which a layout's transfers are all closed.
    SettleTransfers = settle_transfers {
        keys: [K::Event(Xsettled)],
        argv: { generation: u32, token: u64 },
        reply: Reply::Flag,
        writes: [],
    }
    /// IN: units arrive, once per transfer id.
    TransferIn = transfer_in {
        keys: [b(Stock), b(Xin), b(Fence), b(Adds), b(Sealed)],
        argv: { token: u64, xid: String, units: u64, entry: String },
        reply: Reply::Codes(&[reply::STALE, reply::FENCED, reply::DUPLICATE, reply::APPLIED]),
        writes: [Transfer],
    }
    /// Closes a transfer's journal entry.
    TransferClear = transfer_clear {
        keys: [b(Stock), b(Xfer), b(Fence)],
        argv: { token: u64, xid: String, open: String, done: String },
        reply: Reply::Codes(&[
            reply::STALE, reply::FENCED, reply::DUPLICATE, reply::APPLIED, reply::CHANGED,
        ]),
        writes: [Transfer],
    }

    // ---- streams.rs ----
    /// Reads a bucket's stream (claiming what a dead consumer held).
    StreamRead = stream_read {
        keys: [b(Orders)],
        argv: { group: &'static str, consumer: String, count: usize, claim: String },
        reply: Reply::Values,
        writes: [],
    }

    // ---- retire.rs ----
    /// Seals a bucket.
    Seal = seal {
        keys: [b(Stock), b(Sealed)],
        argv: {},
        reply: Reply::Number,
        writes: [],
    }
    /// Takes units out of a sealed bucket for good.
    Forfeit = forfeit {
        keys: [b(Stock), b(Sealed), b(Adds)],
        argv: { units: u64 },
        reply: Reply::Number,
        writes: [],
    }
    /// Retires a sealed bucket: its leftover into the stream.
    Retire = retire {
        keys: [b(Stock), b(Sealed), b(Orders)],
        argv: { record: String },
        reply: Reply::Codes(&[reply::STALE, reply::OK, reply::NOT_SEALED]),
        writes: [Stream],
    }
    /// Everything the audit equation reads of a bucket.
    AuditBucket = audit_bucket {
        keys: [b(Stock), b(Xfer), b(Xin), b(Adds), b(Orders), b(Sealed), b(Hunits)],
        argv: { page: usize },
        reply: Reply::Codes(&[reply::STALE]),
        writes: [],
    }
}

/// `purchase.lua`: the HOME step for a batch of entries of one bucket.
/// Its columns are built by `buckets::purchase_args` (the user and
/// quantity columns only where the fast path reads them, limit, keep and
/// pending only for a call that is not uniform, the queue column only with
/// holds).
pub(super) const PURCHASE: &Decl = &Decl {
    name: "purchase",
    lua: lua!(purchase),
    keys: &[
        b(Stock),
        b(Users),
        b(Reqs),
        b(Orders),
        b(Idx),
        b(Sealed),
        b(Demand),
        b(Empty),
        b(Epoch),
        b(Pend),
    ],
    more_keys: &[b(Holds), b(Hunits), b(Hq)],
    argv: &[
        Arg::One("now"),
        Arg::One("b"),
        Arg::One("n"),
        Arg::One("uniform"),
        Arg::One("limit"),
        Arg::One("total"),
        Arg::Each {
            count: "n",
            index: 'i',
            cols: &["rid", "record"],
        },
        Arg::Each {
            count: "n",
            index: 'i',
            cols: &["order", "entry"],
        },
        Arg::Each {
            count: "n",
            index: 'i',
            cols: &["user"],
        },
        Arg::Each {
            count: "n",
            index: 'i',
            cols: &["qty"],
        },
        Arg::Each {
            count: "n",
            index: 'i',
            cols: &["limit"],
        },
        Arg::Each {
            count: "n",
            index: 'i',
            cols: &["keep"],
        },
        Arg::Each {
            count: "n",
            index: 'i',
            cols: &["pending"],
        },
        Arg::Each {
            count: "n",
            index: 'i',
            cols: &["queue"],
        },
    ],
    reply: Reply::Codes(&[
        reply::STALE,
        reply::ALL_BOUGHT,
        reply::BOUGHT,
        reply::REPLAY,
        reply::LIMIT,
        reply::SOLD_OUT,
        reply::PENDING,
        reply::WANT_COLUMNS,
    ]),
    writes: &[
        Record::Request,
        Record::OrderEntry,
        Record::Stream,
        Record::HoldQueue,
    ],
};

/// `purchase_groups.lua`: several buckets' `purchase` calls in one.
pub(super) const PURCHASE_GROUPS: &Decl = &Decl {
    name: "purchase_groups",
    lua: lua!(purchase_groups),
    keys: &[K::Groups(PURCHASE)],
    more_keys: &[],
    argv: &[
        Arg::One("g"),
        Arg::Each {
            count: "g",
            index: 'i',
            cols: &["keys", "args"],
        },
        Arg::Groups(PURCHASE),
    ],
    reply: Reply::Values,
    writes: PURCHASE.writes,
};

/// `bucket_states.lua`: several buckets' `bucket_state` in one.
pub(super) const BUCKET_STATES: &Decl = &Decl {
    name: "bucket_states",
    lua: lua!(bucket_states),
    keys: &[K::Groups(<BucketState as Step>::DECL)],
    more_keys: &[],
    argv: &[],
    reply: Reply::Values,
    writes: &[],
};

/// `clear_markers.lua`: a saga's probe markers in one bucket, one a pass.
pub(super) const CLEAR_MARKERS: &Decl = &Decl {
    name: "clear_markers",
    lua: lua!(clear_markers),
    keys: &[K::Each("tk")],
    more_keys: &[],
    argv: &[],
    reply: Reply::Number,
    writes: &[],
};

/// `stream_ack.lua`: acknowledges stream entries (the rest of ARGV).
pub(super) const STREAM_ACK: &Decl = &Decl {
    name: "stream_ack",
    lua: lua!(stream_ack),
    keys: &[b(Orders)],
    more_keys: &[],
    argv: &[
        Arg::One("group"),
        Arg::Each {
            count: "n",
            index: 'i',
            cols: &["id"],
        },
    ],
    reply: Reply::Number,
    writes: &[],
};

/// `restore.lua`: a bucket's users, orders and request records put back.
pub(super) const RESTORE: &Decl = &Decl {
    name: "restore",
    lua: lua!(restore),
    keys: &[b(Users), b(Idx), b(Reqs), b(Fence), b(Holds), b(Hunits)],
    more_keys: &[],
    argv: &[
        Arg::One("token"),
        Arg::One("n"),
        Arg::Each {
            count: "n",
            index: 'i',
            cols: &["user", "units"],
        },
        Arg::One("m"),
        Arg::Each {
            count: "m",
            index: 'j',
            cols: &["order", "entry"],
        },
        Arg::One("r"),
        Arg::Each {
            count: "r",
            index: 'k',
            cols: &["rid", "record"],
        },
    ],
    reply: Reply::Codes(&[reply::OK, reply::FENCED]),
    writes: &[Record::OrderEntry, Record::Request],
};

/// The steps whose columns repeat: built beside their decoders.
const REPEATED: &[&Decl] = &[
    PURCHASE,
    PURCHASE_GROUPS,
    BUCKET_STATES,
    CLEAR_MARKERS,
    STREAM_ACK,
    RESTORE,
];

/// Every step the Redis store runs.
pub(super) fn all() -> impl Iterator<Item = &'static Decl> {
    FIXED.iter().chain(REPEATED).copied()
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
