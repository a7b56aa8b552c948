//! The Lua scripts the Redis store runs, and the reply codes they answer with.
//!
//! The [`Scripts`] registry (each script embedded from `lua/<name>.lua`, the
//! set `SCRIPT LOAD` walks) is built from the step declarations of
//! [`super::steps`]; the tests below check each declared reply code against
//! the Lua text: a code a decoder reads that the script's header or body no
//! longer mentions fails a test, so the Rust side and the Lua contract cannot
//! drift apart silently.

use std::collections::HashMap;

use fred::types::scripts::Script;

/// The reply codes the scripts answer with, as their headers document them.
pub(super) mod reply {
    /// The bucket does not exist (or, for the steps that sell, is sealed).
    pub(crate) const STALE: &str = "ST";
    /// Done (`untake`, `finish`, `cancel`, `retire`, `create_event`, `lease_acquire`,
    /// `restore`, `end_reshard`).
    pub const OK: &str = "OK";

    // purchase.lua, one per entry
    pub(crate) const BOUGHT: &str = "B";
    /// Every entry of the call bought (one reply for the call).
    pub(crate) const ALL_BOUGHT: &str = "A";
    /// The request id has a record already (also `finish`: the saga had ended).
    pub(crate) const REPLAY: &str = "R";
    pub const LIMIT: &str = "L";
    pub(crate) const SOLD_OUT: &str = "S";
    pub(crate) const PENDING: &str = "P";
    /// A `token` event refused the entry's token (its code follows).
    pub(crate) const TOKEN: &str = "K";
    /// purchase.lua: a uniform call that must go entry by entry asks to be
    /// sent again with every column (its pending records among them).
    pub(crate) const WANT_COLUMNS: &str = "W";

    // take.lua
    pub(crate) const TAKEN: &str = "T";
    pub(crate) const SHORT: &str = "S";

    /// take.lua (a release line's take): the line's undone marker is here.
    pub(crate) const UNDONE: &str = "U";
    /// take.lua (a release line's take): the line's confirmed marker is here.
    pub(crate) const LINE_CONFIRMED: &str = "K";

    // untake.lua
    pub(crate) const NO_TAKE: &str = "NO";

    // undo_line.lua (also OK, and SHORT: a short decision, passed)
    /// Nothing decided here: closed to a late walk.
    pub(crate) const CLOSED: &str = "CL";
    /// Undone already.
    pub(crate) const UNDONE_ALREADY: &str = "UD";

    // finish.lua
    pub(crate) const NO_RECORD: &str = "NR";

    // cancel.lua
    pub(crate) const ALREADY_CANCELLED: &str = "AC";
    pub(crate) const NOT_FOUND: &str = "NF";

    // confirm.lua
    pub(crate) const ALREADY_CONFIRMED: &str = "AK";
    pub(crate) const HOLD_EXPIRED: &str = "EX";
    pub(crate) const HOLD_CANCELLED: &str = "CX";

    // create_event.lua
    pub const EXISTS: &str = "EX";

    // lease_acquire.lua
    pub(crate) const HELD: &str = "HELD";

    // transfer_out.lua, transfer_in.lua, transfer_clear.lua (FENCED: also
    // restore.lua, and end_reshard.lua for a lost lease)
    pub(crate) const APPLIED: &str = "A";
    pub(crate) const DUPLICATE: &str = "D";
    pub(crate) const FENCED: &str = "F";
    /// transfer_out.lua: fewer units here than the entry moves (it answers
    /// how many: the caller asks again with an entry of that many).
    pub(crate) const SHORT_STOCK: &str = "SH";
    /// transfer_clear.lua: the open entry is not the one the caller read
    /// (it reads again).
    pub(crate) const CHANGED: &str = "CH";

    // retire.lua
    pub(crate) const NOT_SEALED: &str = "NS";

    // enter.lua (also CLOSED: the shard is closed)
    /// Entered now.
    pub(crate) const ENTERED: &str = "N";
    /// Entered before.
    pub(crate) const ENTERED_BEFORE: &str = "AL";

    // open_offer.lua (also OK, STALE)
    /// The ticket was opened or closed before.
    pub(crate) const OFFER_BEFORE: &str = "AL";
    /// Nobody left in line: the unit is on open sale.
    pub(crate) const TO_SALE: &str = "SL";
    // claim_offer.lua (also OK, STALE, CLOSED, REPLAY)
    pub(crate) const OFFER_PASSED: &str = "PA";
    pub(crate) const NOT_OFFERED: &str = "NO";
    pub(crate) const OFFER_EXPIRED: &str = "EX";
    /// The sale window ended (`now >= ends_at`): not bought.
    pub(crate) const SALE_ENDED: &str = "EN";
    // assign_offer.lua (also OK)
    /// The event has no waiting list (yet).
    pub(crate) const NO_LIST: &str = "W";
    /// Nobody left in line.
    pub(crate) const EXHAUSTED: &str = "X";

    // end_reshard.lua
    /// The event is not resharding to that layout (closed, or switched already).
    pub(crate) const NOT_RESHARDING: &str = "NRS";
}

#[cfg(test)]
use super::steps::Reply;
use super::steps::{self, Decl, lua};

/// The lines of a script that another script's text takes the place of
/// (`purchase_groups.lua` runs `purchase.lua` as a function, and
/// `bucket_states.lua` runs `bucket_state.lua`), and the functions of
/// `lua/lib/`, which are no steps (`give_back`: units back in stock, or
/// aside for a draw's waiting line, in `cancel.lua`, `confirm.lua` and
/// `expire_holds.lua`).
const INCLUDES: [(&str, &str); 3] = [
    ("--#include purchase.lua", lua!(purchase)),
    ("--#include bucket_state.lua", lua!(bucket_state)),
    (
        "--#include lib/give_back.lua",
        include_str!("../../../lua/lib/give_back.lua"),
    ),
];

/// A script's text as it is loaded: with the included script in place of
/// its include line, if it has one.
fn compose(lua: &'static str) -> String {
    INCLUDES.iter().fold(lua.to_owned(), |text, (line, body)| {
        text.replacen(line, body, 1)
    })
}

/// Every script of `lua/` the store runs, by step name: built from the
/// declarations of [`steps`].
pub(super) struct Scripts {
    by_name: HashMap<&'static str, Script>,
}

impl Scripts {
    pub(super) fn new() -> Self {
        Self {
            by_name: steps::all()
                .map(|d| (d.name, Script::from_lua(compose(d.lua))))
                .collect(),
        }
    }

    /// The script of a declared step.
    pub(super) fn get(&self, step: &Decl) -> &Script {
        &self.by_name[step.name]
    }

    /// Every script, for `SCRIPT LOAD`.
    pub(super) fn all(&self) -> impl Iterator<Item = &Script> {
        self.by_name.values()
    }
}

/// The reply codes a step's decoder reads.
#[cfg(test)]
fn codes(step: &Decl) -> &'static [&'static str] {
    match step.reply {
        Reply::Codes(codes) => codes,
        _ => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A script's contract (the `--[[ … ]]` header) and its code.
    fn split(lua: &str) -> (&str, &str) {
        lua.split_once("\n]]")
            .expect("every script opens with its contract in a --[[ ]] block")
    }

    #[test]
    fn every_reply_code_a_decoder_reads_is_in_its_scripts_contract_and_code() {
        for step in steps::all() {
            let (name, (header, body)) = (step.name, split(step.lua));
            for code in codes(step) {
                assert!(
                    header.contains(&format!("\"{code}\"")),
                    "{name}.lua: its contract does not mention the reply \"{code}\""
                );
                assert!(
                    body.contains(&format!("'{code}'")),
                    "{name}.lua: its code never answers '{code}'"
                );
            }
        }
    }

    #[test]
    fn every_script_in_lua_is_declared_and_names_itself_first() {
        let declared: Vec<&str> = steps::all().map(|step| step.name).collect();
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/lua");
        for file in std::fs::read_dir(dir).expect("lua/ is readable") {
            let path = file.expect("lua/ is listable").path();
            if path.is_dir() {
                // lua/lib/: functions the scripts include (`INCLUDES`).
                continue;
            }
            let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
            assert!(declared.contains(&name), "lua/{name}.lua is not declared");
        }
        for step in steps::all() {
            let name = step.name;
            assert!(
                step.lua.starts_with(&format!("--[[ {name}.lua — ")),
                "{name}.lua does not open with its own name and contract"
            );
        }
    }

    #[test]
    fn the_grouped_scripts_run_the_single_ones_as_functions() {
        for (outer, head, inner) in [
            (
                lua!(purchase_groups),
                "local function home(KEYS, ARGV)\n",
                lua!(purchase),
            ),
            (
                lua!(bucket_states),
                "local function one(KEYS)\n",
                lua!(bucket_state),
            ),
        ] {
            let lua = compose(outer);
            assert!(!lua.contains("--#include"), "the include line is replaced");
            let (_, body) = lua.split_once(head).expect("the function");
            assert!(body.starts_with(inner), "the included script is its body");
        }
        assert_eq!(
            compose(lua!(purchase)),
            lua!(purchase),
            "other scripts are as written"
        );
        for outer in [lua!(cancel), lua!(confirm), lua!(expire_holds)] {
            let lua = compose(outer);
            assert!(!lua.contains("--#include"), "the include line is replaced");
            assert!(lua.contains("local function give_back(stock, list, units)\n"));
        }
    }

    #[test]
    fn the_registry_holds_every_declared_script() {
        assert_eq!(Scripts::new().all().count(), steps::all().count());
    }
}
