//! The small records the Redis scripts store beside the stock: a probe's
//! marker, a lease's holder and a bucket's sold-out mark.
//!
//! Each is encoded here and handed to its script as an argument, which
//! compares and stores it verbatim: no script assembles one. A number only
//! the script knows (a fresh fencing token, a short probe's counts) is kept
//! as a value of its own beside the record, never spliced into it. The
//! decoders also read what scripts wrote before (`"S|available|adds"`
//! markers, `"owner|token"` holders): a binary that starts on a Redis an
//! older one filled finds those until they expire.

/// What one probe of a saga (`take.lua`, per request id and pass) decided
/// in a bucket, in its marker key.
///
/// A take, and its undo, is a string the engine encodes (technique 1: every
/// field known before the call). A short decision's counts are known only
/// to the script: its marker is a hash whose fields `a` (available) and `n`
/// (adds) are those numbers as the script read them (technique 3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeMarker {
    /// `T|<order id>`: units taken here for that order.
    Taken(String),
    /// `U|<order id>`: that take was given back (`untake.lua`).
    Undone(String),
    /// `K|<order id>`: a held release order's line taken here and confirmed
    /// (`confirm_line.lua`): the take stands for good.
    Confirmed(String),
    /// Too few units here: stock plus units journaled out, and the bucket's
    /// addition count when decided. Stored as a hash; `S|available|adds`
    /// before.
    Short { available: u64, adds: u64 },
}

impl ProbeMarker {
    /// The string form of a take or an undo (a short marker has none: it is
    /// a hash, see the type's doc).
    pub fn encode(&self) -> Option<String> {
        match self {
            Self::Taken(oid) => Some(format!("T|{oid}")),
            Self::Undone(oid) => Some(format!("U|{oid}")),
            Self::Confirmed(oid) => Some(format!("K|{oid}")),
            Self::Short { .. } => None,
        }
    }

    /// A string marker: a take, an undo, or an older short decision.
    pub fn decode(s: &str) -> Option<Self> {
        let (tag, rest) = s.split_once('|')?;
        match tag {
            "T" => Some(Self::Taken(rest.to_owned())),
            "U" => Some(Self::Undone(rest.to_owned())),
            "K" => Some(Self::Confirmed(rest.to_owned())),
            "S" => {
                let (available, adds) = rest.split_once('|')?;
                Some(Self::Short {
                    available: available.parse().ok()?,
                    adds: adds.parse().ok()?,
                })
            }
            _ => None,
        }
    }
}

/// Who holds a lease (the mover lease, or the rebalancer's leadership) and
/// under which fencing token (or term).
///
/// The token is drawn by `lease_acquire.lua` (INCR), so the script stores
/// the holder as a hash: `o` the owner as given, `t` the token (technique 3).
/// Holders written before were strings `owner|token`; [`LeaseHolder::legacy`]
/// encodes that form so a script can compare with one it finds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseHolder {
    pub owner: String,
    pub token: u64,
}

impl LeaseHolder {
    /// The string form `owner|token` holders had before they were hashes.
    pub fn legacy(&self) -> String {
        format!("{}|{}", self.owner, self.token)
    }

    /// Reads an `owner|token` string (the owner holds no `|`).
    pub fn decode_legacy(s: &str) -> Option<Self> {
        let (owner, token) = s.rsplit_once('|')?;
        Some(Self {
            owner: owner.to_owned(),
            token: token.parse().ok()?,
        })
    }
}

/// A bucket's copy of "the whole event holds at most `left` units, as long
/// as the bucket's epoch is still `epoch`" (`set_empty.lua` stores it,
/// `purchase.lua` reads it): `epoch|left`, encoded whole by the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmptyMark {
    pub epoch: u64,
    pub left: u64,
}

impl EmptyMark {
    pub fn encode(&self) -> String {
        format!("{}|{}", self.epoch, self.left)
    }

    /// Reads `epoch|left`, or the older `epoch` (nothing left).
    pub fn decode(s: &str) -> Option<Self> {
        let (epoch, left) = s.split_once('|').unwrap_or((s, "0"));
        Some(Self {
            epoch: epoch.parse().ok()?,
            left: left.parse().ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_take_and_its_undo_round_trip_their_marker() {
        for m in [
            ProbeMarker::Taken("e.1.2".into()),
            ProbeMarker::Undone("e.1.2".into()),
            ProbeMarker::Confirmed("e.1.2".into()),
        ] {
            assert_eq!(ProbeMarker::decode(&m.encode().unwrap()), Some(m));
        }
        assert_eq!(ProbeMarker::Taken("o".into()).encode().unwrap(), "T|o");
        assert_eq!(
            ProbeMarker::Short {
                available: 1,
                adds: 2
            }
            .encode(),
            None
        );
    }

    #[test]
    fn an_older_short_marker_string_is_still_read() {
        assert_eq!(
            ProbeMarker::decode("S|7|3"),
            Some(ProbeMarker::Short {
                available: 7,
                adds: 3
            })
        );
        assert_eq!(ProbeMarker::decode("S|7"), None);
        assert_eq!(ProbeMarker::decode("Q|x"), None);
    }

    #[test]
    fn an_older_lease_holder_string_is_still_read() {
        let h = LeaseHolder {
            owner: "inst-1".into(),
            token: 42,
        };
        assert_eq!(h.legacy(), "inst-1|42");
        assert_eq!(LeaseHolder::decode_legacy("inst-1|42"), Some(h));
        assert_eq!(LeaseHolder::decode_legacy("inst-1"), None);
    }

    #[test]
    fn an_empty_mark_round_trips_and_an_older_one_is_read() {
        let m = EmptyMark { epoch: 4, left: 9 };
        assert_eq!(m.encode(), "4|9");
        assert_eq!(EmptyMark::decode("4|9"), Some(m));
        assert_eq!(
            EmptyMark::decode("4"),
            Some(EmptyMark { epoch: 4, left: 0 })
        );
        assert_eq!(EmptyMark::decode("x|1"), None);
    }
}
