//! Reading settings: parse TOML, load a file, and validate the whole
//! (each field's bounds from `bounds`, then the rules between fields), every
//! error naming its field.

use std::path::Path;

use super::*;

impl Settings {
    /// Parses TOML text; `path` only names the source in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let settings: Self = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        settings.validate()?;
        Ok(settings)
    }

    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// The release specs, validated.
    pub(crate) fn release_specs(
        &self,
    ) -> Result<Vec<crate::domain::release::ReleaseSpec>, ConfigError> {
        let specs: Vec<_> = self
            .releases
            .iter()
            .enumerate()
            .map(|(i, r)| r.spec(i))
            .collect::<Result<_, _>>()?;
        for (i, s) in specs.iter().enumerate() {
            if specs[..i].iter().any(|o| o.id == s.id) {
                return Err(invalid(
                    format!("releases[{i}].id"),
                    format!("{} is declared twice", s.id),
                ));
            }
        }
        Ok(specs)
    }

    /// The event specs, validated.
    pub(crate) fn event_specs(&self) -> Result<Vec<EventSpec>, ConfigError> {
        let specs: Vec<EventSpec> = self
            .events
            .iter()
            .enumerate()
            .map(|(i, e)| e.spec(i))
            .collect::<Result<_, _>>()?;
        for (i, s) in specs.iter().enumerate() {
            if specs[..i].iter().any(|o| o.id == s.id) {
                return Err(invalid(
                    format!("events[{i}].id"),
                    format!("{} is declared twice", s.id),
                ));
            }
        }
        Ok(specs)
    }

    /// Checks what serde cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for n in NUMERIC {
            let v = (n.get)(self);
            if !(n.min <= v && v <= n.max) {
                return Err(invalid(n.name, n.range()));
            }
        }
        self.server
            .listen
            .parse::<std::net::SocketAddr>()
            .map_err(|e| invalid("server.listen", e))?;
        if let Some(url) = &self.store.redis_url
            && !(url.starts_with("redis://")
                || url.starts_with("rediss://")
                || url.starts_with("redis-cluster://"))
        {
            return Err(invalid(
                "store.redis_url",
                format!(
                    "{url:?}: expected redis://host:port or redis-cluster://host:port?node=host:port"
                ),
            ));
        }
        let ns = &self.store.namespace;
        if ns.is_empty()
            || ns.len() > 32
            || !ns
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        {
            return Err(invalid(
                "store.namespace",
                "1 to 32 letters, digits, '_', '-' or '.'",
            ));
        }
        let db = &self.database.url;
        if !(db.starts_with("sqlite:")
            || db.starts_with("postgres://")
            || db.starts_with("postgresql://"))
        {
            return Err(invalid(
                "database.url",
                format!("{db:?}: expected sqlite:… or postgres://…"),
            ));
        }
        let r = &self.rebalancer;
        if !(r.grow_target_per_bucket > 0.0 && r.grow_above_per_bucket >= r.grow_target_per_bucket)
        {
            return Err(invalid(
                "rebalancer.grow_above_per_bucket",
                "must be at least grow_target_per_bucket, which must be above 0",
            ));
        }
        let e = &self.engine;
        if e.stale_saga_after_ms < self.server.request_timeout_ms {
            return Err(invalid(
                "engine.stale_saga_after_ms",
                "must be at least server.request_timeout_ms (a saga still answering its request is not stale)",
            ));
        }
        if !(10..=e.stale_saga_after_ms).contains(&e.sweep_interval_ms) {
            return Err(invalid(
                "engine.sweep_interval_ms",
                "must be between 10 and stale_saga_after_ms",
            ));
        }
        if e.marker_ttl_ms < 4 * (e.stale_saga_after_ms + e.sweep_interval_ms) {
            return Err(invalid(
                "engine.marker_ttl_ms",
                "must be at least 4 × (stale_saga_after_ms + sweep_interval_ms): a saga's markers must outlive it",
            ));
        }
        let r = &self.rebalancer;
        if r.lease_ttl_ms < 2 * r.interval_ms {
            return Err(invalid(
                "rebalancer.lease_ttl_ms",
                "must be at least twice interval_ms",
            ));
        }
        if self.outbox.nats_url.is_some() && !self.outbox.enabled {
            return Err(invalid(
                "outbox.nats_url",
                "is set while outbox.enabled = false: the relay publishes the outbox, which is only written with outbox.enabled = true (set it, or remove nats_url)",
            ));
        }
        if !self.outbox.webhooks.is_empty() && !self.outbox.enabled {
            return Err(invalid(
                "outbox.webhooks",
                "are declared while outbox.enabled = false: webhooks deliver the outbox, which is only written with outbox.enabled = true",
            ));
        }
        if self.outbox.webhook_retry_max_ms < self.outbox.webhook_retry_min_ms {
            return Err(invalid(
                "outbox.webhook_retry_max_ms",
                "must be at least webhook_retry_min_ms",
            ));
        }
        if self.outbox.webhooks.len() > crate::domain::webhook::MAX_SUBSCRIPTIONS {
            return Err(invalid(
                "outbox.webhooks",
                format!(
                    "at most {} subscriptions",
                    crate::domain::webhook::MAX_SUBSCRIPTIONS
                ),
            ));
        }
        if let Some(path) = &self.outbox.webhook_ca_file {
            super::read_ca_file(path).map_err(|e| invalid("outbox.webhook_ca_file", e))?;
        }
        let mut ids = std::collections::HashSet::new();
        for (i, hook) in self.outbox.webhooks.iter().enumerate() {
            let field = |name: &str| format!("outbox.webhooks[{i}].{name}");
            crate::domain::webhook::check(&hook.id, &hook.url, &hook.types, &hook.secrets)
                .map_err(|(name, reason)| invalid(field(name), reason))?;
            if !ids.insert(hook.id.as_str()) {
                return Err(invalid(
                    field("id"),
                    format!("{:?} is declared twice", hook.id),
                ));
            }
        }
        self.event_specs().map(drop)?;
        self.release_specs().map(drop)
    }
}
