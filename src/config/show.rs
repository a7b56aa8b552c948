//! What `shardstock check-config` prints: where the settings came from, then
//! the resolved settings as TOML (a file `serve --config` reads back), with
//! the secrets masked: the admin token, and the password of every URL
//! ([`mask_url`], which the start-up errors that name a URL use too).

use std::fmt::Write;

use super::{ConfigError, ConfigSource, Settings};

/// What a secret is shown as.
const MASK: &str = "********";

/// The report of `check-config`: comment lines (the source, whether the
/// admin endpoints are on, the events and releases declared), then the
/// settings.
pub fn show(settings: &Settings, source: &ConfigSource) -> Result<String, ConfigError> {
    let specs = settings.event_specs()?;
    let mut masked = settings.clone();
    let token_set = !masked.server.admin_token.is_empty();
    if token_set {
        masked.server.admin_token = MASK.into();
    }
    masked.store.redis_url = masked.store.redis_url.as_deref().map(mask_url);
    masked.database.url = mask_url(&masked.database.url);
    masked.outbox.nats_url = masked.outbox.nats_url.as_deref().map(mask_url);
    for hook in &mut masked.outbox.webhooks {
        hook.url = mask_url(&hook.url);
        hook.secrets.iter_mut().for_each(|s| *s = MASK.into());
    }
    let toml = toml::to_string(&masked).map_err(|e| ConfigError::Show(e.to_string()))?;
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(out, "# {source}");
    let _ = writeln!(
        out,
        "# what `shardstock serve` runs with (the file, then flags and environment), \
         secrets masked:"
    );
    if !token_set {
        let _ = writeln!(
            out,
            "# no admin token is configured: the admin endpoints are disabled (they answer \
             401); set [server] admin_token or SHARDSTOCK_ADMIN_TOKEN"
        );
    }
    for spec in &specs {
        let _ = writeln!(
            out,
            "# event {}: {} units in {} buckets",
            spec.id, spec.stock, spec.buckets
        );
    }
    for spec in settings.release_specs()? {
        let pools: Vec<String> = spec
            .pools
            .iter()
            .map(|p| format!("{} ({} units)", p.name, p.stock))
            .collect();
        let _ = writeln!(out, "# release {}: pools {}", spec.id, pools.join(", "));
    }
    out.push_str(&toml);
    Ok(out)
}

/// `url` with its password masked: `scheme://user:secret@host` becomes
/// `scheme://user:********@host` (`redis://:secret@host` too), and so does
/// the value of a `password=` query parameter (which PostgreSQL URLs take).
/// A user without a password is kept (`postgres://postgres@host`).
pub fn mask_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:{MASK}@{host}"),
            None => authority.to_owned(),
        },
        None => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((key, _)) if key.eq_ignore_ascii_case("password") => {
                        format!("{key}={MASK}")
                    }
                    _ => pair.to_owned(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => tail.to_owned(),
    };
    format!("{scheme}://{authority}{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_urls_are_masked_and_the_rest_kept() {
        for (url, shown) in [
            (
                "postgres://app:hunter2@db:5432/shop",
                "postgres://app:********@db:5432/shop",
            ),
            (
                "redis://:s3cret@127.0.0.1:6379",
                "redis://:********@127.0.0.1:6379",
            ),
            (
                "redis-cluster://u:p@h:7001?node=h:7002&node=h:7003",
                "redis-cluster://u:********@h:7001?node=h:7002&node=h:7003",
            ),
            (
                "postgres://db/shop?user=app&password=hunter2&sslmode=require",
                "postgres://db/shop?user=app&password=********&sslmode=require",
            ),
            (
                "postgres://postgres@127.0.0.1:5432/shardstock",
                "postgres://postgres@127.0.0.1:5432/shardstock",
            ),
            ("sqlite://data/shardstock.db", "sqlite://data/shardstock.db"),
            ("sqlite::memory:", "sqlite::memory:"),
        ] {
            assert_eq!(mask_url(url), shown);
        }
    }

    #[test]
    fn the_report_reads_back_as_the_same_settings_with_secrets_masked() {
        let mut s = Settings::default();
        s.server.admin_token = "t0ken-t0ken".into();
        s.database.url = "postgres://app:hunter2@db/shop".into();
        s.store.redis_url = Some("redis://:s3cret@127.0.0.1:6379".into());
        let source = ConfigSource::File("/etc/shardstock.toml".into());
        let report = show(&s, &source).unwrap();
        for secret in ["t0ken-t0ken", "hunter2", "s3cret"] {
            assert!(!report.contains(secret), "{secret} shown:\n{report}");
        }
        assert!(report.starts_with("# read the configuration file /etc/shardstock.toml\n"));
        let back = Settings::parse(&report, std::path::Path::new("report")).unwrap();
        assert_eq!(back.server.admin_token, MASK);
        assert_eq!(back.server.listen, s.server.listen);
        assert_eq!(back.database.flush_batch, s.database.flush_batch);
        assert_eq!(back.rebalancer.skew_threshold, s.rebalancer.skew_threshold);
        assert!(!report.contains("admin endpoints are disabled"));
        let report = show(&Settings::default(), &source).unwrap();
        assert!(report.contains("no admin token is configured"), "{report}");
    }

    #[test]
    fn the_report_names_each_release_and_reads_back_with_it() {
        let text = "[[releases]]\nid = \"drop\"\nper_user_limit = 2\n\
                    pools = [{ id = \"s42\", stock = 5, buckets = 1 }, { id = \"s43\", stock = 7, buckets = 2 }]\n";
        let s = Settings::parse(text, std::path::Path::new("t")).unwrap();
        let report = show(&s, &ConfigSource::File("t".into())).unwrap();
        assert!(
            report.contains("# release drop: pools s42 (5 units), s43 (7 units)\n"),
            "{report}"
        );
        let back = Settings::parse(&report, std::path::Path::new("report")).unwrap();
        assert_eq!(back.release_specs().unwrap(), s.release_specs().unwrap());
    }
}
