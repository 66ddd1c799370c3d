//! The `[gateway]` section: the OpenAI-compatible HTTP gateway (docs/gateway.md).

use serde::{Deserialize, Serialize};

/// How the gateway listens and whom it lets in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayConfig {
    /// Address to listen on, `host:port`. Beyond loopback it needs API keys (or
    /// `allow_no_keys`).
    pub listen: String,
    /// Whether `up` starts a gateway.
    pub enabled: bool,
    /// A TOML file of API keys (`[[keys]]` tables like `gateway.keys`), read at start.
    pub keys_file: String,
    /// API keys, stored hashed (see [`ApiKey`]).
    pub keys: Vec<ApiKey>,
    /// Serve without API keys on a non-loopback address (anyone who reaches it can
    /// use the fleet).
    pub allow_no_keys: bool,
    /// Largest request body, bytes; bigger is 413.
    pub max_body_bytes: u32,
    /// The longest a request waits in the fleet queue for a worker with room,
    /// milliseconds; then 429 with `Retry-After`.
    pub queue_timeout_ms: u64,
    /// Web origins (`https://app.example.com`, or `*` for any) whose pages may call
    /// the gateway from a browser (CORS); empty (the default): no cross-origin access.
    pub cors_origins: Vec<String>,
    /// Model names clients send (`gpt-4o-mini`, `text-embedding-3-small`) → the served
    /// model they mean (`smol`, or `smol:adapter` for a LoRA adapter on it). Listed in
    /// `/v1/models` beside what they name; an alias hides a served model of its name.
    pub aliases: std::collections::BTreeMap<String, String>,
    /// The JetStream key-value bucket where `/v1/responses` keeps stored responses
    /// (`store`, `previous_response_id`), shared by every gateway of the fleet.
    pub responses_bucket: String,
    /// How long a stored response is kept, seconds.
    pub responses_max_age_s: u64,
    /// The most bytes the bucket holds; the oldest responses go first beyond it.
    pub responses_max_bytes: u64,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            enabled: true,
            keys_file: String::new(),
            keys: Vec::new(),
            allow_no_keys: false,
            max_body_bytes: 1 << 20,
            queue_timeout_ms: 60_000,
            cors_origins: Vec::new(),
            aliases: Default::default(),
            responses_bucket: "switchyard-responses".into(),
            responses_max_age_s: 30 * 24 * 3600,
            responses_max_bytes: 1 << 30,
        }
    }
}

impl GatewayConfig {
    pub(crate) fn validate(&self) -> Result<(), crate::ConfigError> {
        let invalid = |field, value: String, reason| Err(crate::ConfigError::Invalid { field, value, reason });
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return invalid(
                "gateway.listen",
                self.listen.clone(),
                "must be host:port, e.g. 127.0.0.1:8080",
            );
        }
        let bucket_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
        if self.responses_bucket.is_empty() || !self.responses_bucket.chars().all(bucket_char) {
            return invalid(
                "gateway.responses_bucket",
                self.responses_bucket.clone(),
                "must be letters, digits, '_' or '-' (a JetStream bucket name)",
            );
        }
        if self.responses_max_age_s == 0 {
            return invalid("gateway.responses_max_age_s", "0".into(), "must be at least 1");
        }
        if !self.keys_file.is_empty() && !std::path::Path::new(&self.keys_file).is_file() {
            return invalid("gateway.keys_file", self.keys_file.clone(), "no such file");
        }
        for k in &self.keys {
            if k.sha256.len() != 64
                || !k
                    .sha256
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            {
                return invalid(
                    "gateway.keys.sha256",
                    k.name.clone(),
                    "must be 64 lowercase hex digits (switchyard gateway --hash-key KEY prints it)",
                );
            }
        }
        for k in &self.keys {
            if !k.priority.is_empty() && switchyard_messages::Priority::parse(&k.priority).is_none() {
                return invalid(
                    "gateway.keys.priority",
                    k.priority.clone(),
                    "must be \"interactive\" or \"batch\"",
                );
            }
        }
        if let Some(o) = self
            .cors_origins
            .iter()
            .find(|o| o.as_str() != "*" && !(o.starts_with("http://") || o.starts_with("https://")) || o.ends_with('/'))
        {
            return invalid(
                "gateway.cors_origins",
                o.clone(),
                "each must be an origin like https://app.example.com (scheme and host, no path) or *",
            );
        }
        for (alias, target) in &self.aliases {
            let bad = |s: &str| s.is_empty() || s.len() > 256 || s.chars().any(|c| c.is_whitespace() || c.is_control());
            if bad(alias) || bad(target) || alias == target {
                return invalid(
                    "gateway.aliases",
                    format!("{alias:?} = {target:?}"),
                    "each maps a name to another, both non-empty, without spaces (\"gpt-4o-mini\" = \"smol\", or \"smol:adapter\")",
                );
            }
            if self.aliases.contains_key(target) {
                return invalid(
                    "gateway.aliases",
                    format!("{alias:?} = {target:?}"),
                    "an alias names a served model, not another alias",
                );
            }
        }
        if self.max_body_bytes < 1024 {
            return invalid(
                "gateway.max_body_bytes",
                self.max_body_bytes.to_string(),
                "must be at least 1024",
            );
        }
        Ok(())
    }
}

/// One API key: its SHA-256 (never the key itself) and what it may do. `0` = no
/// limit for the numeric fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiKey {
    /// A name for logs and metrics (not secret).
    pub name: String,
    /// Lowercase hex SHA-256 of the key (`switchyard gateway --hash-key` prints it).
    pub sha256: String,
    /// Models this key may use; empty = all.
    pub models: Vec<String>,
    /// Requests per minute.
    pub requests_per_min: u32,
    /// Generated tokens per minute.
    pub tokens_per_min: u32,
    /// Streams open at once.
    pub max_streams: u32,
    /// The priority of this key's requests unless one asks for another:
    /// `interactive` (the default when empty) or `batch`.
    pub priority: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_name_served_models_not_aliases_nor_nothing() {
        let with = |pairs: &[(&str, &str)]| GatewayConfig {
            aliases: pairs.iter().map(|(a, t)| (a.to_string(), t.to_string())).collect(),
            ..GatewayConfig::default()
        };
        assert!(with(&[("gpt-4o-mini", "smol"), ("legal", "smol:legal")])
            .validate()
            .is_ok());
        for bad in [
            &[("gpt-4o-mini", "")][..],
            &[("", "smol")],
            &[("a b", "smol")],
            &[("smol", "smol")],
            &[("a", "b"), ("b", "smol")],
        ] {
            assert!(with(bad).validate().is_err(), "{bad:?}");
        }
        let parsed: GatewayConfig = toml::from_str("[aliases]\n\"gpt-4o-mini\" = \"smol\"\n").unwrap();
        assert_eq!(parsed.aliases["gpt-4o-mini"], "smol");
    }
}
