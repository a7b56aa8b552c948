//! Transfer ids, and which of them a bucket may forget.
//!
//! A transfer of units between two buckets is known by its id everywhere it
//! leaves a trace: the source's journal (`xfer`: open, then a tombstone once
//! cleared, so a late duplicate OUT is refused) and the target's applied set
//! (`xin`, so a second IN adds nothing). Both would grow with every transfer
//! an event ever made, and every short take, view, rebalancer plan and audit
//! reads them whole; so each id carries the fencing token it was made under,
//! and a bucket forgets what no step can ever ask about again
//! ([`Forget`]):
//! - a tombstone whose token is below the bucket's fence: an OUT under that
//!   token is refused by the fence before it reads the journal;
//! - an applied id below the *settled* token of its source layout: a mover
//!   holding that token fenced every bucket of the layout and then completed
//!   every transfer open there, so every transfer made under a lower token
//!   is closed at its source and none can open again (the fence refuses its
//!   OUT). A reshard's ids into a layout are all closed once that layout is
//!   current (the switch waits for the old layout to hold no open transfer).
//!
//! The formats are what the scripts parse too (`lua/raise_fence.lua`).
//! [`OutEntry`] and [`InEntry`] encode the journal entries; the scripts
//! store them as given (`transfer_out.lua`, `transfer_in.lua`) and never
//! assemble one.

/// A transfer id made by a mover (a rebalancer round, a saga's
/// consolidation): `<token>.<from>.<to>.<8 hex>`, random so two transfers of
/// one token never share it.
pub(crate) fn mover_xid(token: u64, from: u32, to: u32, nonce: u32) -> String {
    format!("{token}.{from}.{to}.{nonce:08x}")
}

/// The transfer id of a reshard's move from old bucket `from` into bucket `to`
/// of layout `generation`, in pass `pass` of the run holding `token`.
/// Self-describing, so whoever completes it knows the target is in another
/// layout; unique per run and pass, so an id is never reused for another
/// amount (a resumed run replans from what the buckets hold, and a reused id
/// would answer "done" with the old amount while the planner counted the new).
pub fn reshard_xid(generation: u32, from: u32, to: u32, token: u64, pass: u32) -> String {
    format!("rs.{generation}.{from}.{to}.{token}.{pass}")
}

/// The layout a transfer's target lives in: a reshard's new one, or the source's.
pub fn target_generation(xid: &str, default: u32) -> u32 {
    xid.strip_prefix("rs.")
        .and_then(|rest| rest.split('.').next())
        .and_then(|g| g.parse().ok())
        .unwrap_or(default)
}

/// Whether `xid` is a reshard's, and the token it was made under; `None`
/// for an id of another shape (kept: nothing forgets what it cannot read).
pub(crate) fn token_of(xid: &str) -> Option<(bool, u64)> {
    match xid.strip_prefix("rs.") {
        Some(rest) => rest.split('.').nth(3)?.parse().ok().map(|t| (true, t)),
        None => xid.split('.').next()?.parse().ok().map(|t| (false, t)),
    }
}

/// An entry of a source bucket's journal `xfer`: `target|units|token|o`
/// while open, `…|d` once cleared (a tombstone). Every field is the mover's
/// before the OUT, so the engine encodes it whole; `transfer_out.lua` moves
/// the units only when the bucket holds all of them, and answers how many it
/// holds otherwise, for a second call with an entry of that many (technique
/// "read first, pass the expected record": transfers are off the purchase
/// path). `transfer_clear.lua` replaces the open entry the adapter read
/// with its tombstone, both encoded here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutEntry {
    pub target: u32,
    pub units: u64,
    pub token: u64,
    pub open: bool,
}

impl OutEntry {
    pub fn encode(&self) -> String {
        let state = if self.open { 'o' } else { 'd' };
        format!("{}|{}|{}|{state}", self.target, self.units, self.token)
    }

    pub fn decode(s: &str) -> Option<Self> {
        let mut f = s.split('|');
        let entry = Self {
            target: f.next()?.parse().ok()?,
            units: f.next()?.parse().ok()?,
            token: f.next()?.parse().ok()?,
            open: match f.next()? {
                "o" => true,
                "d" => false,
                _ => return None,
            },
        };
        f.next().is_none().then_some(entry)
    }
}

/// An entry of a target bucket's applied set `xin`: `source|units`, encoded
/// by the engine and stored by `transfer_in.lua` as given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InEntry {
    pub source: u32,
    pub units: u64,
}

impl InEntry {
    pub fn encode(&self) -> String {
        format!("{}|{}", self.source, self.units)
    }

    pub fn decode(s: &str) -> Option<Self> {
        let (source, units) = s.split_once('|')?;
        Some(Self {
            source: source.parse().ok()?,
            units: units.parse().ok()?,
        })
    }
}

/// What a bucket may forget of the transfers it applied, given with a new
/// fence (`Transfers::raise_fence`): ids below these tokens (the module docs
/// say why each is safe).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Forget {
    /// Movers' ids made under a lower token: the settled token of the
    /// bucket's own layout (a mover moves within one layout).
    pub mover_below: u64,
    /// Reshards' ids made under a lower token: every one (`u64::MAX`) once the
    /// bucket's layout is or was the event's current one, none (0) while a
    /// reshard fills it.
    pub reshard_below: u64,
}

impl Forget {
    /// Whether an applied transfer `xid` may be forgotten.
    pub fn applied(&self, xid: &str) -> bool {
        match token_of(xid) {
            Some((true, t)) => t < self.reshard_below,
            Some((false, t)) => t < self.mover_below,
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_carry_their_token_and_target_layout() {
        assert_eq!(token_of(&mover_xid(42, 1, 3, 0xab)), Some((false, 42)));
        assert_eq!(token_of(&reshard_xid(7, 2, 5, 99, 3)), Some((true, 99)));
        assert_eq!(token_of("made-up"), None);
        assert_eq!(target_generation(&reshard_xid(7, 2, 5, 99, 3), 6), 7);
        assert_eq!(target_generation(&mover_xid(1, 0, 1, 0), 6), 6);
    }

    #[test]
    fn journal_entries_round_trip_in_the_format_scripts_store() {
        let open = OutEntry {
            target: 3,
            units: 12,
            token: 7,
            open: true,
        };
        assert_eq!(open.encode(), "3|12|7|o");
        assert_eq!(OutEntry::decode("3|12|7|o"), Some(open));
        let done = OutEntry {
            open: false,
            ..open
        };
        assert_eq!(OutEntry::decode("3|12|7|d"), Some(done));
        assert_eq!(OutEntry::decode("3|12|7|x"), None);
        let applied = InEntry {
            source: 2,
            units: 5,
        };
        assert_eq!(applied.encode(), "2|5");
        assert_eq!(InEntry::decode("2|5"), Some(applied));
    }

    #[test]
    fn a_bucket_forgets_only_below_the_settled_tokens() {
        let forget = Forget {
            mover_below: 10,
            reshard_below: 0,
        };
        assert!(forget.applied(&mover_xid(9, 0, 1, 1)));
        assert!(!forget.applied(&mover_xid(10, 0, 1, 1)));
        assert!(
            !forget.applied(&reshard_xid(3, 0, 1, 2, 1)),
            "a layout being filled"
        );
        assert!(!forget.applied("made-up"));
        let current = Forget {
            mover_below: 0,
            reshard_below: u64::MAX,
        };
        assert!(current.applied(&reshard_xid(3, 0, 1, 2, 1)));
        assert!(!current.applied(&mover_xid(1, 0, 1, 1)));
    }
}
