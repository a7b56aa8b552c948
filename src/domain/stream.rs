//! A bucket's order stream: what its entries say and how they are written.
//!
//! Every step that changes who owns units (a purchase, a saga's take or its
//! undo, a cancel, a closed bucket's leftover) appends one entry to the bucket's
//! stream in the same atomic step. The flusher carries the entries to the ledger,
//! the audit counts the ones not flushed yet. The records are encoded here and
//! handed to the scripts as arguments; a script stores them, or stores the
//! stored record it copies, and never assembles one. In Redis an entry is one
//! of these shapes (told apart by its first field):
//! - `d` [`StreamEntry::data`]: a record the engine encoded whole (a take, an
//!   undo, a hold); and, when the step alone knows the units (a leftover),
//!   `d` with qty 0 then `q` the units ([`StreamEntry::with_qty`]);
//! - `k` [`CopyHead`], `o` order id, `h` the order's index entry as the
//!   script found it: a cancel, confirm or expiry, whose user, quantity and
//!   request id are the stored entry's ([`StreamEntry::from_copy`]);
//! - the orders a purchase call buys at home, all in one entry, a field per
//!   order: its order id, valued with its index entry
//!   ([`StreamEntry::from_order`]). Such an entry's orders are its *parts*,
//!   numbered from 0 in field order; a record is keyed by its entry's id and
//!   its part.
//!
//! Entries written before the scripts stopped assembling records are `d`
//! records of every kind (`c|…`, `k|…`, `e|…`, `l|…` with their numbers in
//! place): [`StreamEntry::from_data`] still reads them. The memory store
//! keeps the decoded values.

/// What a stream entry says happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordKind {
    /// Units sold (`k=o`).
    Order,
    /// Units given back by a cancel (`k=c`).
    Cancel,
    /// A saga's take undone (`k=v`): those units were never sold.
    Void,
    /// A retired bucket's leftover stock at the end of the sale (`k=l`).
    Leftover,
    /// An order taken as a hold by a saga (`k=h`, in its home bucket's
    /// stream, written with the order's index entry; `at_ms` is the pay-by
    /// deadline). Moves no units: the take's own record counts them. (A hold
    /// bought on the fast path is its order record's `pay_by`.)
    Hold,
    /// A held order confirmed before its deadline (`k=k`). Moves no units.
    Confirm,
    /// A held order that reached its deadline unconfirmed, or was voided by
    /// a close (`k=e`): its units are back on sale, like a cancel's.
    Expire,
}

impl RecordKind {
    /// Whether the record gives units back (cancel, void, expiry): the
    /// ledger's `released`.
    pub fn releases(self) -> bool {
        matches!(self, Self::Cancel | Self::Void | Self::Expire)
    }

    pub fn code(self) -> &'static str {
        match self {
            Self::Order => "o",
            Self::Cancel => "c",
            Self::Void => "v",
            Self::Leftover => "l",
            Self::Hold => "h",
            Self::Confirm => "k",
            Self::Expire => "e",
        }
    }

    pub fn parse(code: &str) -> Option<Self> {
        Some(match code {
            "o" => Self::Order,
            "c" => Self::Cancel,
            "v" => Self::Void,
            "l" => Self::Leftover,
            "h" => Self::Hold,
            "k" => Self::Confirm,
            "e" => Self::Expire,
            _ => return None,
        })
    }
}

/// A Redis stream entry id, `<ms>-<seq>`; ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct StreamId {
    pub ms: u64,
    pub seq: u64,
}

impl StreamId {
    pub fn parse(s: &str) -> Option<Self> {
        let (ms, seq) = s.split_once('-')?;
        Some(Self {
            ms: ms.parse().ok()?,
            seq: seq.parse().ok()?,
        })
    }
}

impl std::fmt::Display for StreamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// One entry of a bucket's order stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamEntry {
    pub id: StreamId,
    pub kind: RecordKind,
    pub order_id: String,
    pub user: String,
    pub qty: u64,
    /// The bucket whose stock changed.
    pub bucket: u32,
    /// The user's home bucket.
    pub home: u32,
    /// The stored request id (`<user>/<id>`, internal `~…`, or empty).
    pub rid: String,
    pub at_ms: i64,
    /// An order record of a purchase taken as a hold: its pay-by deadline
    /// (unix ms). `None` on every other record.
    pub pay_by: Option<i64>,
    /// Its place among the orders of one stream entry (0 for a `d` record):
    /// with [`StreamEntry::id`], the record's key in the ledger.
    pub part: u32,
}

/// What a step that copies a stored index entry into its stream record
/// knows before the call: `kind|bucket|home|at`, `bucket` empty for "the
/// entry's" (a confirm: the bucket the units came from).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyHead {
    pub kind: RecordKind,
    /// The bucket whose stock changed; `None`: the index entry's.
    pub bucket: Option<u32>,
    pub home: u32,
    pub at_ms: i64,
}

impl CopyHead {
    /// The `k` field of a copy record.
    pub fn encode(&self) -> String {
        let bucket = self.bucket.map(|b| b.to_string()).unwrap_or_default();
        format!("{}|{bucket}|{}|{}", self.kind.code(), self.home, self.at_ms)
    }

    pub fn decode(s: &str) -> Option<Self> {
        let mut f = s.split('|');
        let head = Self {
            kind: RecordKind::parse(f.next()?)?,
            bucket: match f.next()? {
                "" => None,
                b => Some(b.parse().ok()?),
            },
            home: f.next()?.parse().ok()?,
            at_ms: f.next()?.parse().ok()?,
        };
        f.next().is_none().then_some(head)
    }
}

impl StreamEntry {
    /// A retired bucket's leftover record (`retire.lua`'s `d` field): qty 0,
    /// the units being the script's own field `q`.
    pub fn leftover(id: String, bucket: u32, now_ms: i64) -> Self {
        Self {
            id: StreamId::default(),
            kind: RecordKind::Leftover,
            order_id: id,
            user: String::new(),
            qty: 0,
            bucket,
            home: bucket,
            rid: String::new(),
            at_ms: now_ms,
            pay_by: None,
            part: 0,
        }
    }

    /// A `d` record followed by a `q` field: the units the script counted.
    pub fn with_qty(self, q: &str) -> Option<Self> {
        Some(Self {
            qty: q.parse().ok()?,
            ..self
        })
    }

    /// A copy record: head `k`, order id `o`, and the order's index entry
    /// `h` as it stood when the step read it (`S|user|qty|bucket|rid|at`,
    /// then `|pay_by` for a hold). A cancel's record carries no request id
    /// (as cancel records never did: the ledger keeps the order's).
    pub fn from_copy(id: StreamId, head: &str, order_id: &str, entry: &str) -> Option<Self> {
        let head = CopyHead::decode(head)?;
        let mut f = entry.split('|');
        let mut next = || f.next();
        let (_state, user, qty, bucket, rid, _at) =
            (next()?, next()?, next()?, next()?, next()?, next()?);
        if let Some(p) = next() {
            p.parse::<i64>().ok()?;
        }
        if next().is_some() {
            return None;
        }
        Some(Self {
            id,
            kind: head.kind,
            order_id: order_id.to_owned(),
            user: user.to_owned(),
            qty: qty.parse().ok()?,
            bucket: match head.bucket {
                Some(b) => b,
                None => bucket.parse().ok()?,
            },
            home: head.home,
            rid: if head.kind == RecordKind::Cancel {
                String::new()
            } else {
                rid.to_owned()
            },
            at_ms: head.at_ms,
            pay_by: None,
            part: 0,
        })
    }

    /// The entry's `d` field as the Lua scripts store it,
    /// `kind|order id|user|qty|bucket|home|rid|at`, then `|pay_by` when the
    /// order is held (the id is the stream's).
    pub fn data(&self) -> String {
        use std::fmt::Write;
        let mut data =
            String::with_capacity(self.order_id.len() + self.user.len() + self.rid.len() + 48);
        let _ = write!(
            data,
            "{}|{}|{}|{}|{}|{}|{}|{}",
            self.kind.code(),
            self.order_id,
            self.user,
            self.qty,
            self.bucket,
            self.home,
            self.rid,
            self.at_ms
        );
        if let Some(pay_by) = self.pay_by {
            let _ = write!(data, "|{pay_by}");
        }
        data
    }

    /// The entry with stream id `id` whose `d` field is `data` (the flusher
    /// decodes every record it writes: fields are read in place, no list of
    /// them is built).
    pub(crate) fn from_data(id: StreamId, data: &str) -> Option<Self> {
        let mut f = data.split('|');
        let mut next = || f.next();
        let (kind, order_id, user) = (next()?, next()?, next()?);
        let (qty, bucket, home, rid, at_ms) = (next()?, next()?, next()?, next()?, next()?);
        let pay_by = match next() {
            None => None,
            Some(p) => Some(p.parse().ok()?),
        };
        if next().is_some() {
            return None;
        }
        Some(Self {
            id,
            kind: RecordKind::parse(kind)?,
            order_id: order_id.to_owned(),
            user: user.to_owned(),
            qty: qty.parse().ok()?,
            bucket: bucket.parse().ok()?,
            home: home.parse().ok()?,
            rid: rid.to_owned(),
            at_ms: at_ms.parse().ok()?,
            pay_by,
            part: 0,
        })
    }

    /// Order `part` of a purchase call's entry `id`: a field named by the
    /// order id, whose value is the order's index entry as its home bucket
    /// keeps it, `S|user|qty|bucket|rid|at` (`S` = `C`, or `H` and
    /// `|pay_by` for a hold; see `OrderEntry`). An order bought at home:
    /// its home is its bucket, its rid the client's (empty for an internal
    /// one, which the ledger does not keep).
    pub(crate) fn from_order(id: StreamId, part: u32, order_id: &str, entry: &str) -> Option<Self> {
        let mut f = entry.split('|');
        let mut next = || f.next();
        let (state, user, qty, bucket, rid, at_ms) =
            (next()?, next()?, next()?, next()?, next()?, next()?);
        let pay_by = match (state, next()) {
            ("C", None) => None,
            ("H", Some(p)) => Some(p.parse().ok()?),
            _ => return None,
        };
        if next().is_some() {
            return None;
        }
        let bucket = bucket.parse().ok()?;
        Some(Self {
            id,
            kind: RecordKind::Order,
            order_id: order_id.to_owned(),
            user: user.to_owned(),
            qty: qty.parse().ok()?,
            bucket,
            home: bucket,
            rid: rid.to_owned(),
            at_ms: at_ms.parse().ok()?,
            pay_by,
            part,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_round_trips_its_data_field() {
        let entry = StreamEntry {
            id: StreamId { ms: 5, seq: 1 },
            kind: RecordKind::Void,
            order_id: "e.1.2".into(),
            user: "u-1".into(),
            qty: 3,
            bucket: 2,
            home: 0,
            rid: "u-1/r".into(),
            at_ms: 17,
            pay_by: None,
            part: 0,
        };
        assert_eq!(entry.data(), "v|e.1.2|u-1|3|2|0|u-1/r|17");
        assert_eq!(
            StreamEntry::from_data(entry.id, &entry.data()),
            Some(entry.clone())
        );
        assert_eq!(StreamEntry::from_data(StreamId::default(), "x|a"), None);
        let held = StreamEntry {
            kind: RecordKind::Order,
            pay_by: Some(900),
            ..entry
        };
        assert_eq!(held.data(), "o|e.1.2|u-1|3|2|0|u-1/r|17|900");
        assert_eq!(StreamEntry::from_data(held.id, &held.data()), Some(held));
        assert_eq!(
            StreamEntry::from_data(StreamId::default(), "o|a|u|1|0|0||5|x"),
            None
        );
    }

    #[test]
    fn an_order_of_a_purchase_call_is_read_from_its_index_entry() {
        let id = StreamId { ms: 9, seq: 2 };
        let order = StreamEntry::from_order(id, 3, "e.1.2", "C|u-1|2|5|u-1/r|17").unwrap();
        assert_eq!(
            order,
            StreamEntry {
                id,
                kind: RecordKind::Order,
                order_id: "e.1.2".into(),
                user: "u-1".into(),
                qty: 2,
                bucket: 5,
                home: 5,
                rid: "u-1/r".into(),
                at_ms: 17,
                pay_by: None,
                part: 3,
            }
        );
        let held = StreamEntry::from_order(id, 0, "e.1.3", "H|u-1|1|5||17|900").unwrap();
        assert_eq!((held.pay_by, held.rid.as_str()), (Some(900), ""));
        for bad in [
            "C|u-1|2|5|u-1/r|17|900",
            "H|u-1|2|5|u-1/r|17",
            "X|u-1|2|5|u-1/r|17",
            "C|u-1|two|5|u-1/r|17",
            "C|u-1|2|5",
        ] {
            assert_eq!(StreamEntry::from_order(id, 0, "e.1.2", bad), None, "{bad}");
        }
    }

    fn record(kind: RecordKind, bucket: u32, rid: &str, qty: u64) -> StreamEntry {
        StreamEntry {
            id: StreamId { ms: 8, seq: 0 },
            kind,
            order_id: "e.1.2".into(),
            user: "u-1".into(),
            qty,
            bucket,
            home: 4,
            rid: rid.into(),
            at_ms: 30,
            pay_by: None,
            part: 0,
        }
    }

    #[test]
    fn a_copy_record_reads_the_index_entry_it_copies() {
        let id = StreamId { ms: 8, seq: 0 };
        let held = "H|u-1|2|6|u-1/r|17|900";
        let head = |kind, bucket| {
            CopyHead {
                kind,
                bucket,
                home: 4,
                at_ms: 30,
            }
            .encode()
        };
        assert_eq!(head(RecordKind::Confirm, None), "k||4|30");
        // A confirm: the units' bucket is the entry's.
        assert_eq!(
            StreamEntry::from_copy(id, &head(RecordKind::Confirm, None), "e.1.2", held),
            Some(record(RecordKind::Confirm, 6, "u-1/r", 2))
        );
        // An expiry: back in the home bucket, the rid kept.
        assert_eq!(
            StreamEntry::from_copy(id, &head(RecordKind::Expire, Some(4)), "e.1.2", held),
            Some(record(RecordKind::Expire, 4, "u-1/r", 2))
        );
        // A cancel of a confirmed order: no rid, as cancel records never had.
        assert_eq!(
            StreamEntry::from_copy(
                id,
                &head(RecordKind::Cancel, Some(4)),
                "e.1.2",
                "C|u-1|3|6|u-1/r|17"
            ),
            Some(record(RecordKind::Cancel, 4, "", 3))
        );
        for (head, entry) in [
            ("c|4|4", "C|u-1|3|6|u-1/r|17"),
            ("x|4|4|30", "C|u-1|3|6|u-1/r|17"),
            ("c|4|4|30", "C|u-1|three|6|u-1/r|17"),
            ("c|4|4|30", "C|u-1|3|6"),
        ] {
            assert_eq!(
                StreamEntry::from_copy(id, head, "o", entry),
                None,
                "{head} {entry}"
            );
        }
    }

    #[test]
    fn a_leftover_counted_by_its_script_takes_the_q_field() {
        let d = StreamEntry::leftover("ev#0#4".into(), 4, 30).data();
        assert_eq!(d, "l|ev#0#4||0|4|4||30");
        let read = StreamEntry::from_data(StreamId::default(), &d).and_then(|r| r.with_qty("12"));
        assert_eq!(
            read.map(|r| (r.kind, r.qty)),
            Some((RecordKind::Leftover, 12))
        );
    }

    /// Records written before the scripts stopped assembling them: a cancel,
    /// a confirm, an expiry and a leftover, each a `d` record with every
    /// field in place, as `cancel.lua`, `confirm.lua`, `expire_holds.lua` and
    /// `retire.lua` wrote them.
    #[test]
    fn records_in_the_older_d_format_are_still_read() {
        let id = StreamId { ms: 8, seq: 0 };
        let cases = [
            (
                "c|e.1.2|u-1|3|4|4||30",
                record(RecordKind::Cancel, 4, "", 3),
            ),
            (
                "k|e.1.2|u-1|2|6|4|u-1/r|30",
                record(RecordKind::Confirm, 6, "u-1/r", 2),
            ),
            (
                "e|e.1.2|u-1|2|4|4|u-1/r|30",
                record(RecordKind::Expire, 4, "u-1/r", 2),
            ),
            (
                "o|e.1.2|u-1|2|4|4|u-1/r|30",
                record(RecordKind::Order, 4, "u-1/r", 2),
            ),
            (
                "v|e.1.2|u-1|2|4|4|u-1/r|30",
                record(RecordKind::Void, 4, "u-1/r", 2),
            ),
        ];
        for (data, want) in cases {
            assert_eq!(StreamEntry::from_data(id, data), Some(want), "{data}");
        }
        let leftover = StreamEntry::from_data(id, "l|ev#0#4||12|4|4||30").unwrap();
        assert_eq!(
            (leftover.kind, leftover.qty, leftover.bucket),
            (RecordKind::Leftover, 12, 4)
        );
    }

    #[test]
    fn stream_ids_order_by_time_then_sequence() {
        assert_eq!(StreamId::parse("12-3"), Some(StreamId { ms: 12, seq: 3 }));
        assert!(StreamId { ms: 1, seq: 9 } < StreamId { ms: 2, seq: 0 });
        assert_eq!(StreamId { ms: 7, seq: 0 }.to_string(), "7-0");
    }
}
