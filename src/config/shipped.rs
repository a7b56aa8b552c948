//! The shipped `config/shardstock.toml` against the defaults. The file says
//! "values shown are the defaults unless marked otherwise"; this test keeps
//! it true. The defaults are written once, in this module's `Default` impls,
//! and the layers' options take theirs from them (`app::options`), so a
//! default changed in one place and not the other fails `cargo test`.

use std::path::Path;

use super::Settings;

/// Keys the shipped file sets to something else on purpose, each marked so
/// in the file (a demo value).
const MARKED: &[&str] = &["server.admin_token"];

/// Where `text` differs from `defaults`: a default it leaves out or states
/// wrong, a key or section that has none (`[[events]]` aside: there are no
/// default events).
fn drift(text: &str, defaults: &Settings) -> Vec<String> {
    let shipped: toml::Table = toml::from_str(text).unwrap();
    let defaults = toml::Table::try_from(defaults).unwrap();
    let empty = toml::Table::new();
    let mut wrong = Vec::new();
    for (section, keys) in &defaults {
        let keys = keys.as_table().unwrap();
        let file = match shipped.get(section) {
            Some(file) => file.as_table().unwrap(),
            None => {
                wrong.push(format!("[{section}] is missing"));
                &empty
            }
        };
        for (key, value) in keys {
            let name = format!("{section}.{key}");
            match file.get(key) {
                _ if MARKED.contains(&name.as_str()) => {}
                Some(v) if v == value => {}
                Some(v) => wrong.push(format!("{name} = {v}, the default is {value}")),
                None => wrong.push(format!("{name} is missing (the default is {value})")),
            }
        }
        // An optional key left unset by default (`redis_url`, `lost_state`,
        // `burst`) is shown commented out; set, it is not the default.
        for key in file.keys().filter(|k| !keys.contains_key(*k)) {
            wrong.push(format!("{section}.{key} is set, and is not a default"));
        }
    }
    for section in shipped.keys() {
        if !defaults.contains_key(section) && section != "events" {
            wrong.push(format!("[{section}] is not a section with defaults"));
        }
    }
    wrong
}

fn shipped() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/shardstock.toml");
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn the_shipped_config_states_every_default_as_it_is() {
    let wrong = drift(&shipped(), &Settings::default());
    assert!(wrong.is_empty(), "config/shardstock.toml: {wrong:#?}");
}

#[test]
fn a_default_changed_on_one_side_only_is_drift() {
    let mut changed = Settings::default();
    changed.engine.max_passes += 1;
    changed.rebalancer.skew_threshold = 2.0;
    assert_eq!(
        drift(&shipped(), &changed),
        [
            "engine.max_passes = 4, the default is 5",
            "rebalancer.skew_threshold = 1.5, the default is 2.0",
        ]
    );
    let text = shipped().replace("namespace = \"ss\"\n", "");
    assert_eq!(
        drift(&text, &Settings::default()),
        ["store.namespace is missing (the default is \"ss\")"]
    );
    let text = shipped().replace(
        "# redis_url = \"redis://127.0.0.1:6379\"",
        "redis_url = \"redis://127.0.0.1:6379\"",
    );
    assert_eq!(
        drift(&text, &Settings::default()),
        ["store.redis_url is set, and is not a default"]
    );
}
