//! The Redis key layout. Every name a backend writes is built here.
//!
//! ```text
//! ss:events                      SET   ids of the open events (what background work visits)
//! ss:retired                     SET   ids of closed, fully flushed events (still listed and readable)
//! ss:{<event>}:meta              HASH  event definition, status, generation, seq, sold-out mark
//! ss:{<event>}:lease             HASH  mover lease o (owner), t (token) (PX): who may move units now (a STR "owner|token" before; records::LeaseHolder)
//! ss:{<event>}:token             STR   fencing token counter (INCR)
//! ss:{<event>}:leader            HASH  rebalancer leadership o (owner), t (term) (PX, heartbeat; a STR "owner|term" before)
//! ss:{<event>}:term              STR   leadership term counter (INCR)
//! ss:{<event>}:xsettled          HASH  layout generation -> the token below which its transfers are all closed
//! ss:{<event>#<gen>#<b>}:stock   STR   remaining units of bucket b
//! ss:{<event>#<gen>#<b>}:users   HASH  user -> units held (users whose home is b)
//! ss:{<event>#<gen>#<b>}:reqs    HASH  request id -> outcome record
//! ss:{<event>#<gen>#<b>}:pend    ZSET  request ids of sagas pending at home b -> start ms (the sweeper's list)
//! ss:{<event>#<gen>#<b>}:tk:<rid>:<pass>  STR/HASH  probe marker of saga rid, pass, in b (PX marker_ttl_ms; a held release line's "T" none, until its "K" or "U"): "T|oid", "U|oid", "K|oid", or a short decision's HASH a, n (records::ProbeMarker)
//! ss:{<event>#<gen>#<b>}:orders  STREAM order and cancel records taken from b (shapes: stream.rs)
//! ss:{<event>#<gen>#<b>}:idx     HASH  order id -> order entry (orders of users homed at b)
//! ss:{<event>#<gen>#<b>}:fence   STR   highest fencing token b has accepted
//! ss:{<event>#<gen>#<b>}:xfer    HASH  transfers out of b: xid -> "target|units|token|o" (open) or "…|d" (a tombstone until the fence passes its token)
//! ss:{<event>#<gen>#<b>}:xin     HASH  transfers applied into b: xid -> "source|units" (until its layout's settled token passes the xid's)
//! ss:{<event>#<gen>#<b>}:adds    STR   count of steps that added units to b (cancel, IN, untake) or moved them out (OUT)
//! ss:{<event>#<gen>#<b>}:sealed  STR   present once b is sealed (closed, or an old layout)
//! ss:{<event>#<gen>#<b>}:demand  STR   units asked for by buyers homed at b (rebalancer signal)
//! ss:{<event>#<gen>#<b>}:empty   STR   "epoch|left": at that epoch the whole event was found to hold at most left units (records::EmptyMark)
//! ss:{<event>#<gen>#<b>}:epoch   STR   bumped on every bucket when units come back to a sold-out event
//! ss:{<event>#<gen>#<b>}:holds   ZSET  order ids of live holds of users homed at b -> pay-by ms (the deadline index)
//! ss:{<event>#<gen>#<b>}:hunits  STR   units in live holds of users homed at b
//! ss:{<event>#<gen>#<b>}:hq      LIST  "pay_by|order id" of holds bought on the fast path, in deadline order (the hot path's deadline queue; entries of confirmed or cancelled orders are dropped when due)
//! ss:{<event>#<gen>#<b>}:tok     HASH  access tokens of users homed at b (`token` events): "u:<token id>" -> units bought, "r:<token id>" -> units reserved by sagas in flight, "s:<rid>" -> the token id a pending saga reserved
//! ss:{<event>#<gen>#<b>}:wl      HASH  the bucket's share of a draw's waiting list: on ("1" once the draw opened it: returned units go aside, "0" once nobody is left in line), aside (units aside, no ticket yet), units (aside + reserved + offered), seq (the last ticket), t:<ticket> -> ticket record (domain::offer::Ticket)
//! ss:{<event>#<gen>#<b>}:wo      ZSET  tickets reserved (-1) or offered (-> deadline ms) in b
//! ss:holds                       ZSET  buckets that may hold holds ("<event>#<gen>#<b>") -> when to sweep them next
//! ss:{u#<user>}:rate             STR   the user's theoretical arrival time for the shared per-user rate, µs (PX)
//! ss:{d#<event>}:draw            HASH  a draw's seed (hex, secret until drawn) and, once drawn, done = "drawn_at|entries|winners" (domain::draw::DrawDone)
//! ss:{d#<event>#<k>}:ent         ZSET  entrants of a draw whose user hash % 16 is k (score 0: listed by id)
//! ss:{d#<event>#<k>}:shut        STR   present once shard k's entries are closed (the draw closes each before it reads)
//! ss:{d#<event>#<k>}:rank        HASH  user -> rank in the draw (1-based), written by the draw
//! ss:{w#<event>}:line            HASH  a draw's waiting line: position (1 first) -> user, written by the draw
//! ss:{w#<event>}:list            HASH  the line's offers: len, next (the next position to offer), a:<bucket>:<ticket> -> position (0: nobody left), o:<position> -> "<bucket>|<ticket>"
//! ss:releases                    SET   ids of the releases (what the release sweeper visits)
//! ss:{r#<release>}:spec          STR   the release's spec (domain::release::ReleaseSpec, JSON)
//! ss:{r#<release>#h<h>}:units    HASH  user -> units counted against the release-wide limit (users whose home is h)
//! ss:{r#<release>#h<h>}:reqs     HASH  request id -> home record (domain::release::HomeRecord: P, B, R, X, L, H)
//! ss:{r#<release>#h<h>}:oids     HASH  order id -> request id of a bought order (a read, confirm or cancel finds it by its id)
//! ss:{r#<release>#h<h>}:pend     ZSET  request ids of orders pending or refused and not released -> start ms (the release sweeper's list)
//! ```
//! Each bucket has its own hash tag, so one hot event spreads over every master
//! of a Cluster, while all keys one script touches share a slot. The generation
//! (`gen`) changes when an event is resharded: a stale instance that still routes
//! with the old bucket count finds the old buckets sealed and reloads, instead of
//! writing into a layout that no longer exists. Ids are validated (`crate::domain::ids`)
//! before they get here, so no `{` or `}` can move a key.

use crate::domain::ids::EventId;

/// The deadline index of every bucket with holds, in namespace `ns`
/// (one key, beside `ss:events`).
pub(crate) fn hold_index_key(ns: &str) -> String {
    format!("{ns}:holds")
}

/// A buyer's shared rate-limit state in namespace `ns`, under the user's own
/// hash tag (users spread over a Cluster's masters).
pub(crate) fn user_rate_key(ns: &str, user: &crate::domain::ids::UserId) -> String {
    format!("{ns}:{{u#{user}}}:rate")
}

/// A draw's record on its own slot in namespace `ns`. `d#` cannot start
/// an event id (no `#` in ids), so no event's meta slot shares this tag.
pub(crate) fn draw_key(ns: &str, event: &EventId) -> String {
    format!("{ns}:{{d#{event}}}:draw")
}

/// Key `name` (`ent`, `shut`, `rank`) of a draw's entry shard `shard`:
/// each shard its own hash tag, fixed whatever the buckets do.
pub(crate) fn entry_key(ns: &str, event: &EventId, shard: u32, name: &str) -> String {
    format!("{ns}:{{d#{event}#{shard}}}:{name}")
}

/// Key `name` (`line`, `list`) of a draw's waiting list: one slot of its
/// own. `w#` cannot start an event id (no `#` in ids).
pub(crate) fn list_key(ns: &str, event: &EventId, name: &str) -> String {
    format!("{ns}:{{w#{event}}}:{name}")
}

/// The set of release ids in namespace `ns`.
pub(crate) fn releases_key(ns: &str) -> String {
    format!("{ns}:releases")
}

/// A release's spec in namespace `ns`. `r#` cannot start an event id (no
/// `#` in ids), so no event's meta slot shares this tag.
pub(crate) fn release_spec_key(ns: &str, release: &EventId) -> String {
    format!("{ns}:{{r#{release}}}:spec")
}

/// One home slot of a release: where its users' limit counts and request
/// records live, one Cluster slot each (`{r#<release>#h<h>}`: the `h` keeps
/// the tag apart from a bucket's `{<event>#<gen>#<b>}`, whose last part is a
/// number).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HomeRef {
    pub release: EventId,
    pub index: u32,
}

impl HomeRef {
    pub fn new(release: &EventId, index: u32) -> Self {
        Self {
            release: release.clone(),
            index,
        }
    }

    /// The home's hash tag.
    pub fn tag(&self) -> String {
        format!("{{r#{}#h{}}}", self.release, self.index)
    }

    /// One key of this home in namespace `ns`: `units`, `reqs`, `pend` or
    /// `oids`.
    pub(crate) fn key_in(&self, ns: &str, name: &str) -> String {
        format!("{ns}:{}:{name}", self.tag())
    }
}

/// The keys of one event's meta slot.
#[derive(Debug, Clone)]
pub struct EventKeys {
    pub meta: String,
    pub lease: String,
    pub token: String,
    pub leader: String,
    pub term: String,
    pub(crate) xsettled: String,
}

/// The default key namespace (`ss:`); a store can use another one (tests do,
/// to keep their events apart on a shared Redis).
pub(crate) const NAMESPACE: &str = "ss";

impl EventKeys {
    pub fn new(event: &EventId) -> Self {
        Self::in_namespace(NAMESPACE, event)
    }

    pub fn in_namespace(ns: &str, event: &EventId) -> Self {
        let tag = format!("{ns}:{{{event}}}");
        Self {
            meta: format!("{tag}:meta"),
            lease: format!("{tag}:lease"),
            token: format!("{tag}:token"),
            leader: format!("{tag}:leader"),
            term: format!("{tag}:term"),
            xsettled: format!("{tag}:xsettled"),
        }
    }
}

/// Which bucket: event, layout generation and index.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BucketRef {
    pub event: EventId,
    pub generation: u32,
    pub index: u32,
}

impl BucketRef {
    pub fn new(event: &EventId, generation: u32, index: u32) -> Self {
        Self {
            event: event.clone(),
            generation,
            index,
        }
    }

    /// `<event>#<gen>#<b>`: the ledger's name for the bucket's stream, and the
    /// order id of the bucket's leftover record.
    pub fn name(&self) -> String {
        format!("{}#{}#{}", self.event, self.generation, self.index)
    }

    /// The bucket's hash tag, `{<event>#<gen>#<b>}`: one Cluster slot per bucket.
    pub fn tag(&self) -> String {
        format!("{{{}}}", self.name())
    }

    /// All keys of this bucket.
    pub fn keys(&self) -> BucketKeys {
        self.keys_in(NAMESPACE)
    }

    /// All keys of this bucket in namespace `ns`.
    pub fn keys_in(&self, ns: &str) -> BucketKeys {
        let p = format!("{ns}:{}", self.tag());
        BucketKeys {
            stock: format!("{p}:stock"),
            users: format!("{p}:users"),
            reqs: format!("{p}:reqs"),
            orders: format!("{p}:orders"),
            idx: format!("{p}:idx"),
            fence: format!("{p}:fence"),
            xfer: format!("{p}:xfer"),
            xin: format!("{p}:xin"),
            adds: format!("{p}:adds"),
            sealed: format!("{p}:sealed"),
            demand: format!("{p}:demand"),
            empty: format!("{p}:empty"),
            epoch: format!("{p}:epoch"),
            pend: format!("{p}:pend"),
            holds: format!("{p}:holds"),
            hunits: format!("{p}:hunits"),
            hq: format!("{p}:hq"),
            tok: format!("{p}:tok"),
            wl: format!("{p}:wl"),
            wo: format!("{p}:wo"),
        }
    }

    /// One key of this bucket in namespace `ns` (`name` as in [`BucketKeys`]'s
    /// field names): for a caller that needs one, where [`BucketRef::keys_in`]
    /// formats all twenty (the flusher reads every bucket's stream every round).
    pub(crate) fn key_in(&self, ns: &str, name: &str) -> String {
        format!("{ns}:{}:{name}", self.tag())
    }

    /// Parses [`BucketRef::name`] back (event ids have no `#`).
    pub(crate) fn parse_name(name: &str) -> Option<Self> {
        let mut parts = name.rsplitn(3, '#');
        let index = parts.next()?.parse().ok()?;
        let generation = parts.next()?.parse().ok()?;
        let event = EventId::parse(parts.next()?).ok()?;
        Some(Self::new(&event, generation, index))
    }

    /// The probe marker of saga `rid`'s pass `pass` in this bucket (`take.lua`).
    /// Its own key, beside the bucket's hashes: no request id or user id can
    /// collide with it, and it expires on its own.
    pub fn marker_in(&self, ns: &str, rid: &str, pass: u32) -> String {
        format!("{ns}:{}:tk:{rid}:{pass}", self.tag())
    }
}

/// One key of a bucket, by its [`BucketKeys`] field: how a store step names
/// the keys it touches (`store::redis::steps`), formatted with
/// [`BucketRef::key_in`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BucketKey {
    Stock,
    Users,
    Reqs,
    Orders,
    Idx,
    Fence,
    Xfer,
    Xin,
    Adds,
    Sealed,
    Demand,
    Empty,
    Epoch,
    Pend,
    Holds,
    Hunits,
    Hq,
    Tok,
    Wl,
    Wo,
}

impl BucketKey {
    /// The key's last part, as in its [`BucketKeys`] field name.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Stock => "stock",
            Self::Users => "users",
            Self::Reqs => "reqs",
            Self::Orders => "orders",
            Self::Idx => "idx",
            Self::Fence => "fence",
            Self::Xfer => "xfer",
            Self::Xin => "xin",
            Self::Adds => "adds",
            Self::Sealed => "sealed",
            Self::Demand => "demand",
            Self::Empty => "empty",
            Self::Epoch => "epoch",
            Self::Pend => "pend",
            Self::Holds => "holds",
            Self::Hunits => "hunits",
            Self::Hq => "hq",
            Self::Tok => "tok",
            Self::Wl => "wl",
            Self::Wo => "wo",
        }
    }
}

/// One key of an event's meta slot, by its [`EventKeys`] field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKey {
    Meta,
    Lease,
    Token,
    Leader,
    Term,
    Xsettled,
}

impl EventKey {
    /// The key's last part, as in its [`EventKeys`] field name.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Meta => "meta",
            Self::Lease => "lease",
            Self::Token => "token",
            Self::Leader => "leader",
            Self::Term => "term",
            Self::Xsettled => "xsettled",
        }
    }

    /// This key of `event` in namespace `ns` (one of [`EventKeys::in_namespace`]).
    pub fn of(self, ns: &str, event: &EventId) -> String {
        format!("{ns}:{{{event}}}:{}", self.name())
    }
}

/// The keys of one bucket (see the module docs for their types).
#[derive(Debug, Clone)]
pub struct BucketKeys {
    pub stock: String,
    pub users: String,
    pub(crate) reqs: String,
    pub orders: String,
    pub idx: String,
    pub fence: String,
    pub xfer: String,
    pub xin: String,
    pub adds: String,
    pub sealed: String,
    pub demand: String,
    pub empty: String,
    pub epoch: String,
    pub(crate) pend: String,
    pub holds: String,
    pub(crate) hunits: String,
    pub(crate) hq: String,
    pub(crate) tok: String,
    pub(crate) wl: String,
    pub(crate) wo: String,
}

impl BucketKeys {
    /// Every key, for expiry and deletion.
    pub fn all(&self) -> [&str; 20] {
        [
            &self.stock,
            &self.users,
            &self.reqs,
            &self.orders,
            &self.idx,
            &self.fence,
            &self.xfer,
            &self.xin,
            &self.adds,
            &self.sealed,
            &self.demand,
            &self.empty,
            &self.epoch,
            &self.pend,
            &self.holds,
            &self.hunits,
            &self.hq,
            &self.tok,
            &self.wl,
            &self.wo,
        ]
    }
}

/// The Redis Cluster hash slot of a key (CRC16/XMODEM of its hash tag, mod 16384).
///
/// Used by tests and diagnostics to show that buckets land on different slots.
pub fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        rest.iter()
            .position(|&b| b == b'}')
            .filter(|&close| close > 0)
            .map(|close| &rest[..close])
    });
    crc16(tagged.unwrap_or(bytes)) % 16384
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(s: &str) -> EventId {
        EventId::parse(s).unwrap()
    }

    #[test]
    fn a_key_formatted_alone_is_the_same_key() {
        let b = BucketRef::new(&event("sneaker-42"), 3, 5);
        let all = b.keys_in("ns");
        assert_eq!(b.key_in("ns", "orders"), all.orders);
        assert_eq!(b.key_in("ns", "stock"), all.stock);
    }

    #[test]
    fn all_keys_of_a_bucket_share_one_slot() {
        let keys = BucketRef::new(&event("sneaker-42"), 0, 5).keys();
        let s = slot(&keys.stock);
        assert!(keys.all().iter().all(|k| slot(k) == s));
        let b = BucketRef::new(&event("sneaker-42"), 0, 5);
        assert_eq!(slot(&b.marker_in("ss", "t:x/r1", 2)), s);
        assert_eq!(keys.stock, "ss:{sneaker-42#0#5}:stock");
    }

    #[test]
    fn a_bucket_name_parses_back() {
        let b = BucketRef::new(&event("sneaker-42.x"), 3, 17);
        assert_eq!(BucketRef::parse_name(&b.name()), Some(b));
        assert_eq!(BucketRef::parse_name("e#1"), None);
    }

    #[test]
    fn buckets_of_one_event_spread_over_slots() {
        let e = event("sneaker-42");
        let slots: std::collections::HashSet<u16> = (0..16)
            .map(|b| slot(&BucketRef::new(&e, 0, b).keys().stock))
            .collect();
        assert_eq!(slots.len(), 16);
    }

    #[test]
    fn the_slot_function_matches_redis() {
        // Values from `CLUSTER KEYSLOT`.
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        assert_eq!(slot("123456789"), 12739);
    }

    #[test]
    fn a_key_named_by_its_field_is_the_same_key() {
        let b = BucketRef::new(&event("sneaker-42"), 3, 5);
        let all = b.keys_in("ns");
        let fields = [
            BucketKey::Stock,
            BucketKey::Users,
            BucketKey::Reqs,
            BucketKey::Orders,
            BucketKey::Idx,
            BucketKey::Fence,
            BucketKey::Xfer,
            BucketKey::Xin,
            BucketKey::Adds,
            BucketKey::Sealed,
            BucketKey::Demand,
            BucketKey::Empty,
            BucketKey::Epoch,
            BucketKey::Pend,
            BucketKey::Holds,
            BucketKey::Hunits,
            BucketKey::Hq,
            BucketKey::Tok,
            BucketKey::Wl,
            BucketKey::Wo,
        ];
        let named: Vec<String> = fields.iter().map(|f| b.key_in("ns", f.name())).collect();
        assert_eq!(named, all.all());
        let e = event("e1");
        let k = EventKeys::in_namespace("ns", &e);
        let ev = [
            (EventKey::Meta, &k.meta),
            (EventKey::Lease, &k.lease),
            (EventKey::Token, &k.token),
            (EventKey::Leader, &k.leader),
            (EventKey::Term, &k.term),
            (EventKey::Xsettled, &k.xsettled),
        ];
        for (f, key) in ev {
            assert_eq!(&f.of("ns", &e), key);
        }
    }

    #[test]
    fn a_release_home_shares_no_tag_with_a_bucket() {
        let home = HomeRef::new(&event("0"), 3);
        let bucket = BucketRef::new(&event("r"), 0, 3);
        assert_eq!(home.tag(), "{r#0#h3}");
        assert_ne!(home.tag(), bucket.tag());
        assert_eq!(
            slot(&home.key_in("ss", "units")),
            slot(&home.key_in("ss", "pend"))
        );
    }

    #[test]
    fn the_meta_keys_share_the_event_slot() {
        let k = EventKeys::new(&event("e1"));
        assert_eq!(slot(&k.meta), slot(&k.lease));
        assert_eq!(slot(&k.meta), slot(&k.token));
    }
}
