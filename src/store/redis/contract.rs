//! The Lua side of each step's declaration, checked without a Redis: every
//! `lua/*.lua` header's `KEYS[n]` and `ARGV[n]` lines are parsed and held to
//! the step's [`Decl`] (names, order, count, repeated groups too).
//!
//! A header declares an entry as `KEYS[n] <key pattern> …` or
//! `ARGV[n] <name> …`, at the start of a line or after two spaces (a
//! mention inside a sentence is not a declaration). `n` is a number, a
//! range `1..n` (one key an entry), or an offset such as `6 + 2n + 2i - 1`
//! where `i` (or `j`, `k`) numbers the entries of a repeated group and `n`
//! (or `m`, `r`, `g`) counts them. A key is named by the last part of its
//! pattern (`ss:{e#g#b}:stock` is `stock`, `ss:{e#g#j}:tk:<rid>:<pass>` is
//! `tk`); an argument by its first word. Groups of another step's KEYS or
//! ARGV are checked by the header naming that step's script
//! (`each group's purchase.lua KEYS`).
//!
//! It also holds the scripts to "Lua compares, stores and returns records;
//! it never assembles a record format" ([`assembles_records`]): a record is
//! encoded in `domain/` and handed to the script as an argument; where a
//! number only the script knows belongs in it, as a format the script fills
//! (`string.format(ARGV[7], …)`, purchase.lua's refusals); where an order
//! changes state, as the new state the script puts in place of the stored
//! entry's first field.

use std::collections::BTreeMap;

use super::steps::{Arg, Decl, K};

/// The value each count takes in the check (distinct, so that an offset
/// that mixes up two counts, or an entry's columns, lands elsewhere).
fn sample(count: &str) -> usize {
    match count {
        "n" => 3,
        "m" => 2,
        "r" => 4,
        "g" => 5,
        "t" => 6,
        _ => 3,
    }
}

/// The declaration's entries by 1-based position, and the step whose
/// groups follow them, if any.
type Layout = (BTreeMap<usize, String>, Option<&'static Decl>);

fn declared_keys(step: &Decl) -> Layout {
    let mut at = BTreeMap::new();
    let mut push = |name: &str| {
        let pos = at.len() + 1;
        at.insert(pos, name.to_owned());
    };
    for key in step.keys.iter().chain(step.more_keys) {
        match key {
            K::Bucket(k) => push(k.name()),
            K::Event(k) => push(k.name()),
            K::Given(name) => push(name),
            K::Each(name) => (0..sample("n")).for_each(|_| push(name)),
            K::Groups(inner) => return (at, Some(*inner)),
        }
    }
    (at, None)
}

fn declared_argv(step: &Decl) -> Layout {
    let mut at = BTreeMap::new();
    let mut push = |name: &str| {
        let pos = at.len() + 1;
        at.insert(pos, name.to_owned());
    };
    for arg in step.argv {
        match arg {
            Arg::One(name) => push(name),
            Arg::Each { count, cols, .. } => {
                for _ in 0..sample(count) {
                    cols.iter().for_each(|c| push(c));
                }
            }
            Arg::Groups(inner) => return (at, Some(*inner)),
        }
    }
    (at, None)
}

/// The count each entry index letter runs over, from the declaration.
fn index_counts(step: &Decl) -> BTreeMap<char, &'static str> {
    let mut out = BTreeMap::new();
    for arg in step.argv {
        if let Arg::Each { count, index, .. } = arg {
            out.insert(*index, *count);
        }
    }
    out.entry('i').or_insert("n");
    out
}

/// One `KEYS[..]` / `ARGV[..]` declaration of a header: its index
/// expression and its name.
#[derive(Debug)]
struct Item {
    expr: String,
    name: String,
}

/// The header (the `--[[ … ]]` block) of a script.
fn header(lua: &str) -> &str {
    lua.split_once("\n]]").map_or(lua, |(h, _)| h)
}

/// Every declaration of `kind` (`KEYS` or `ARGV`) in a header.
fn items(header: &str, kind: &str) -> Vec<Item> {
    let open = format!("{kind}[");
    let mut out = Vec::new();
    for line in header.lines() {
        let mut from = 0;
        while let Some(found) = line[from..].find(&open) {
            let start = from + found;
            from = start + open.len();
            let before = &line[..start];
            if !(before.trim().is_empty() || before.ends_with("  ")) {
                continue;
            }
            let Some(close) = line[from..].find(']') else {
                continue;
            };
            let expr = line[from..from + close].trim().to_owned();
            let rest = &line[from + close + 1..];
            let Some(rest) = rest.strip_prefix(' ') else {
                continue;
            };
            let token = rest.split_whitespace().next().unwrap_or("");
            out.push(Item {
                expr,
                name: token.to_owned(),
            });
        }
    }
    out
}

/// A key pattern's name: its last part (`ss:{e#g#b}:stock` → `stock`).
fn key_name(token: &str) -> String {
    let t = token.strip_prefix("ss:").unwrap_or(token);
    let t = match t.strip_prefix('{') {
        Some(tagged) => tagged.split_once("}:").map_or("", |(_, rest)| rest),
        None => t,
    };
    let t = t.split(':').next().unwrap_or("");
    t.trim_end_matches([',', ';', ')']).to_owned()
}

fn arg_name(token: &str) -> String {
    token.trim_end_matches([',', ';', ':']).to_owned()
}

/// The value of an offset such as `6 + 2n + 2i - 1`.
fn eval(expr: &str, vars: &BTreeMap<char, usize>) -> Result<usize, String> {
    let mut total: i64 = 0;
    let compact: String = expr.chars().filter(|c| !c.is_whitespace()).collect();
    let mut term = String::new();
    let mut sign = 1;
    let mut terms = Vec::new();
    for c in compact.chars().chain(std::iter::once('+')) {
        if c == '+' || c == '-' {
            if !term.is_empty() {
                terms.push((sign, std::mem::take(&mut term)));
            }
            sign = if c == '-' { -1 } else { 1 };
        } else {
            term.push(c);
        }
    }
    for (sign, term) in terms {
        let digits: String = term.chars().take_while(char::is_ascii_digit).collect();
        let var: String = term.chars().skip(digits.len()).collect();
        let factor: i64 = if digits.is_empty() {
            1
        } else {
            digits.parse().map_err(|_| format!("bad offset {expr:?}"))?
        };
        let value = match var.as_str() {
            "" => 1,
            v if v.len() == 1 => {
                let c = v.chars().next().unwrap_or(' ');
                *vars
                    .get(&c)
                    .ok_or_else(|| format!("offset {expr:?} names an unknown {c}"))?
                    as i64
            }
            _ => return Err(format!("bad offset {expr:?}")),
        };
        total += sign * factor * value;
    }
    usize::try_from(total).map_err(|_| format!("offset {expr:?} is negative"))
}

/// The header's entries of `kind` by position.
fn documented(step: &Decl, header: &str, kind: &str) -> Result<BTreeMap<usize, String>, String> {
    let counts = index_counts(step);
    let mut at = BTreeMap::new();
    let mut put = |pos: usize, name: String| match at.insert(pos, name) {
        Some(old) => Err(format!(
            "{}.lua: {kind}[{pos}] is declared twice (also {old:?})",
            step.name
        )),
        None => Ok(()),
    };
    for item in items(header, kind) {
        let name = if kind == "KEYS" {
            key_name(&item.name)
        } else {
            arg_name(&item.name)
        };
        let mut vars: BTreeMap<char, usize> = ["n", "m", "r", "g", "t"]
            .iter()
            .map(|c| (c.chars().next().unwrap_or(' '), sample(c)))
            .collect();
        if let Some((first, last)) = item.expr.split_once("..") {
            let first = eval(first, &vars)?;
            for pos in first..=eval(last, &vars)? {
                put(pos, name.clone())?;
            }
            continue;
        }
        let index = item.expr.chars().find(|c| counts.contains_key(c));
        match index {
            None => put(eval(&item.expr, &vars)?, name)?,
            Some(letter) => {
                for e in 1..=sample(counts[&letter]) {
                    vars.insert(letter, e);
                    put(eval(&item.expr, &vars)?, name.clone())?;
                }
            }
        }
    }
    Ok(at)
}

/// Whether the header documents what the declaration says, for one kind.
fn compare(
    step: &Decl,
    header: &str,
    kind: &str,
    (declared, groups): Layout,
) -> Result<(), String> {
    let documented = documented(step, header, kind)?;
    if documented != declared {
        return Err(format!(
            "{}.lua {kind}: the header says {documented:?}, the declaration {declared:?}",
            step.name
        ));
    }
    if let Some(inner) = groups {
        let mention = format!("{}.lua {kind}", inner.name);
        if !header.contains(&mention) {
            return Err(format!("{}.lua does not say {mention:?}", step.name));
        }
    }
    Ok(())
}

/// Checks a script's header (`lua`, the script's text) against `step`.
pub(super) fn check(step: &Decl, lua: &str) -> Result<(), String> {
    let header = header(lua);
    compare(step, header, "KEYS", declared_keys(step))?;
    compare(step, header, "ARGV", declared_argv(step))
}

/// One token of a script, as far as the record check needs: a string
/// literal (its text), the concatenation operator, or anything else.
#[derive(Debug, PartialEq)]
enum Token {
    Str(String),
    Concat,
    Other(String),
}

/// The tokens of a script's code: comments (`-- …`, `--[[ … ]]`, the
/// header) are skipped, string literals kept whole.
fn tokens(lua: &str) -> Vec<(usize, Token)> {
    let b = lua.as_bytes();
    let (mut i, mut line, mut out) = (0, 1, Vec::new());
    while i < b.len() {
        let c = b[i];
        if c == b'\n' {
            line += 1;
            i += 1;
        } else if lua[i..].starts_with("--[[") {
            let end = lua[i..].find("]]").map_or(b.len(), |e| i + e + 2);
            line += lua[i..end].matches('\n').count();
            i = end;
        } else if lua[i..].starts_with("--") {
            i = lua[i..].find('\n').map_or(b.len(), |e| i + e);
        } else if c == b'\'' || c == b'"' {
            let mut j = i + 1;
            let mut text = String::new();
            while j < b.len() && b[j] != c {
                if b[j] == b'\\' && j + 1 < b.len() {
                    j += 1;
                }
                text.push(b[j] as char);
                j += 1;
            }
            out.push((line, Token::Str(text)));
            i = j + 1;
        } else if lua[i..].starts_with("..") {
            out.push((line, Token::Concat));
            i += 2;
        } else if c.is_ascii_whitespace() {
            i += 1;
        } else {
            let j = (i + 1..b.len())
                .find(|&j| !(b[j].is_ascii_alphanumeric() || b[j] == b'_'))
                .filter(|_| c.is_ascii_alphanumeric() || c == b'_')
                .unwrap_or(i + 1);
            out.push((line, Token::Other(lua[i..j].to_owned())));
            i = j;
        }
    }
    out
}

/// Where a script assembles a record format: a string literal holding a
/// `|` (a separator, or a tag such as `'X|'`) or a lone capital (a state or
/// record letter, such as `'X' .. string.sub(entry, 2)`) joined with `..`, or
/// a `string.format` whose format holds a `|`. Reading a record with a
/// pattern (`string.match(v, '^(%a)|')`) or comparing its letter
/// (`state == 'H'`) is fine: nothing is built.
pub(super) fn assembles_records(lua: &str) -> Vec<String> {
    let t = tokens(lua);
    let mut found = Vec::new();
    let is_bar = |k: Option<&(usize, Token)>| {
        matches!(k, Some((_, Token::Str(s)))
            if s.contains('|') || (s.len() == 1 && s.bytes().all(|c| c.is_ascii_uppercase())))
    };
    for (k, (line, token)) in t.iter().enumerate() {
        let concat = *token == Token::Concat
            && (is_bar(k.checked_sub(1).and_then(|p| t.get(p))) || is_bar(t.get(k + 1)));
        let format = *token == Token::Other("format".into())
            && matches!(t.get(k + 1), Some((_, Token::Other(p))) if p == "(")
            && is_bar(t.get(k + 2));
        if concat || format {
            found.push(format!("line {line}"));
        }
    }
    found.dedup();
    found
}

#[cfg(test)]
mod tests {
    use super::super::steps::{self, Step};
    use super::*;

    #[test]
    fn every_script_header_documents_the_keys_and_arguments_its_step_declares() {
        let errors: Vec<String> = steps::all()
            .filter_map(|step| check(step, step.lua).err())
            .collect();
        assert!(errors.is_empty(), "{}", errors.join("\n"));
    }

    /// `lua` with `from` replaced once (the test's broken copy).
    fn broken(lua: &str, from: &str, to: &str) -> String {
        assert!(lua.contains(from), "the copy breaks {from:?}");
        lua.replacen(from, to, 1)
    }

    #[test]
    fn a_header_whose_keys_are_out_of_order_fails_the_check() {
        let step = steps::Take::DECL;
        let lua = broken(
            step.lua,
            "KEYS[4] ss:{e#g#j}:xfer",
            "KEYS[4] ss:{e#g#j}:adds",
        );
        let lua = broken(&lua, "KEYS[5] ss:{e#g#j}:adds", "KEYS[5] ss:{e#g#j}:xfer");
        assert!(check(step, &lua).unwrap_err().contains("take.lua KEYS"));
    }

    #[test]
    fn a_header_missing_an_argument_fails_the_check() {
        let step = steps::Cancel::DECL;
        let lua = broken(step.lua, "\nARGV[2] head", "\n");
        assert!(check(step, &lua).unwrap_err().contains("cancel.lua ARGV"));
    }

    #[test]
    fn a_repeated_column_at_the_wrong_offset_fails_the_check() {
        let step = steps::PURCHASE;
        let lua = broken(step.lua, "ARGV[8 + 5n + i] qty", "ARGV[8 + 4n + i] qty");
        assert!(check(step, &lua).is_err());
        let lua = broken(step.lua, "ARGV[8 + 5n + i] qty", "ARGV[8 + 5n + i] user");
        assert!(check(step, &lua).unwrap_err().contains("purchase.lua ARGV"));
    }

    #[test]
    fn no_script_assembles_a_record_format() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/lua");
        let mut bad = Vec::new();
        let mut scripts = 0;
        for entry in std::fs::read_dir(dir).expect("lua/ is readable") {
            let path = entry.expect("a lua/ entry").path();
            if path.extension().is_none_or(|e| e != "lua") {
                continue;
            }
            scripts += 1;
            let name = path
                .file_stem()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            let lua = std::fs::read_to_string(&path).expect("a script is readable");
            let found = assembles_records(&lua);
            if !found.is_empty() {
                bad.push(format!("{name}.lua: {found:?}"));
            }
        }
        assert!(scripts > 30, "only {scripts} scripts found in {dir}");
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }

    #[test]
    fn a_script_that_concatenates_a_record_is_caught() {
        let bad = "--[[ header: 'a|' .. b is only words here ]]\n\
                   local ok = string.match(v, '^(%a)|([^|]*)$')\n\
                   redis.call('SET', KEYS[1], ARGV[1] .. '|' .. ARGV[2])\n\
                   redis.call('SET', KEYS[2], 'T|' .. ARGV[3]) -- 'x|' .. y\n\
                   local s = string.format('%d|%d', 1, 2)\n\
                   redis.call('HSET', KEYS[3], ARGV[1], 'X' .. string.sub(entry, 2))\n";
        assert_eq!(
            assembles_records(bad),
            ["line 3", "line 4", "line 5", "line 6"]
        );
        let fine = "local a = ARGV[1] .. ':' .. ARGV[2]\n\
                    local k, v = string.match(x, '^(%a)|(.*)$')\n\
                    redis.call('HSET', KEYS[1], 'd', ARGV[1]) -- was 'a|' .. b\n\
                    if string.sub(entry, 1, 1) == 'H' then x = ARGV[3] .. string.sub(entry, 2) end\n\
                    local r = string.format(ARGV[7], ARGV[8], held)\n";
        assert_eq!(assembles_records(fine), Vec::<String>::new());
    }

    #[test]
    fn offsets_count_entries_and_groups() {
        let vars: BTreeMap<char, usize> = [('n', 3), ('i', 2)].into_iter().collect();
        assert_eq!(eval("6 + 2n + 2i - 1", &vars), Ok(15));
        assert_eq!(eval("6+4n+i", &vars), Ok(20));
        assert_eq!(key_name("ss:{e#g#j}:tk:<rid>:<pass>"), "tk");
        assert_eq!(key_name("ss:holds"), "holds");
        assert_eq!(key_name("ss:{u#<user>}:rate"), "rate");
    }
}
