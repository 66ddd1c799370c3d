//! API keys: stored as SHA-256, checked in constant time, each with its allowed
//! models, requests and tokens per minute, and concurrent requests.

use super::errors::ApiError;
use anyhow::Context;
use axum::http::{HeaderMap, StatusCode};
use sha2::{Digest, Sha256};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use subtle::ConstantTimeEq;
use switchyard_config::{ApiKey, GatewayConfig};

/// The lowercase hex SHA-256 of `key`: what the config stores.
pub fn hash_key(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One key's usage in the current minute.
#[derive(Default)]
struct Usage {
    window: Option<Instant>,
    requests: u32,
    tokens: u32,
    open: u32,
}

struct Entry {
    key: ApiKey,
    hash: [u8; 32],
    usage: Mutex<Usage>,
}

/// The configured keys; empty = no authentication.
#[derive(Clone, Default)]
pub struct KeyStore {
    entries: Arc<Vec<Entry>>,
}

/// A request admitted under a key: releases its concurrency slot when dropped and
/// charges generated tokens to the key.
pub struct Admitted {
    entry: Option<(KeyStore, usize)>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysFile {
    #[serde(default)]
    keys: Vec<ApiKey>,
}

const MINUTE: Duration = Duration::from_secs(60);

fn unhex(s: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    if s.len() != 64 {
        return None;
    }
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

impl KeyStore {
    /// The keys of `gateway.keys` and `gateway.keys_file`.
    pub fn load(config: &GatewayConfig) -> anyhow::Result<Self> {
        let mut keys = config.keys.clone();
        if !config.keys_file.is_empty() {
            let text = std::fs::read_to_string(&config.keys_file)
                .with_context(|| format!("gateway.keys_file {}", config.keys_file))?;
            let file: KeysFile =
                toml::from_str(&text).with_context(|| format!("gateway.keys_file {}", config.keys_file))?;
            keys.extend(file.keys);
        }
        let mut entries = Vec::new();
        for key in keys {
            let hash = unhex(&key.sha256)
                .with_context(|| format!("API key {:?}: sha256 must be 64 lowercase hex digits", key.name))?;
            entries.push(Entry {
                key,
                hash,
                usage: Mutex::default(),
            });
        }
        Ok(Self {
            entries: Arc::new(entries),
        })
    }

    /// Whether any key is configured.
    pub fn enabled(&self) -> bool {
        !self.entries.is_empty()
    }

    /// Checks `Authorization: Bearer …` (or `x-api-key`) and the key's limits for a request on
    /// `model`: 401 (no or unknown key), 403 (model not allowed), 429 (a limit).
    pub fn admit(&self, headers: &HeaderMap, model: &str) -> Result<Admitted, ApiError> {
        if !self.enabled() {
            return Ok(Admitted { entry: None });
        }
        let unauthorized =
            |m: &str| ApiError::new(StatusCode::UNAUTHORIZED, "authentication_error", "invalid_api_key", m);
        let bearer = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                // The scheme is case-insensitive (RFC 9110): `bearer` and `BEARER` too.
                let (scheme, key) = v.trim_start().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then_some(key)
            })
            // Anthropic's clients send the key as `x-api-key`.
            .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
            .ok_or_else(|| unauthorized("no API key: send Authorization: Bearer <key> (or x-api-key: <key>)"))?;
        let presented: [u8; 32] = Sha256::digest(bearer.trim().as_bytes()).into();
        // Compare against every key, without stopping at a match.
        let mut found = None;
        for (i, e) in self.entries.iter().enumerate() {
            if bool::from(e.hash.ct_eq(&presented)) {
                found = Some(i);
            }
        }
        let i = found.ok_or_else(|| unauthorized("invalid API key"))?;
        let e = &self.entries[i];
        if !e.key.models.is_empty() && !e.key.models.iter().any(|m| m == model) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "permission_error",
                "model_not_allowed",
                format!(
                    "key {:?} may not use model {model:?} (allowed: {:?})",
                    e.key.name, e.key.models
                ),
            ));
        }
        let mut u = e.usage.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let start = *u.window.get_or_insert(now);
        if now.duration_since(start) >= MINUTE {
            u.window = Some(now);
            u.requests = 0;
            u.tokens = 0;
        }
        let wait = MINUTE
            .saturating_sub(now.duration_since(u.window.unwrap_or(now)))
            .as_secs();
        let limited = |what: &str, limit: u32| {
            ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                "rate_limit_exceeded",
                format!("key {:?}: {what} limit of {limit} reached", e.key.name),
            )
        };
        let k = &e.key;
        if k.requests_per_min > 0 && u.requests >= k.requests_per_min {
            return Err(limited("requests per minute", k.requests_per_min).retry_after(wait));
        }
        if k.tokens_per_min > 0 && u.tokens >= k.tokens_per_min {
            return Err(limited("tokens per minute", k.tokens_per_min).retry_after(wait));
        }
        if k.max_streams > 0 && u.open >= k.max_streams {
            return Err(limited("concurrent requests", k.max_streams).retry_after(1));
        }
        u.requests += 1;
        u.open += 1;
        Ok(Admitted {
            entry: Some((self.clone(), i)),
        })
    }

    /// The key's name for logs, if a key admitted the request.
    fn usage(&self, i: usize) -> std::sync::MutexGuard<'_, Usage> {
        self.entries[i].usage.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Admitted {
    /// Charges `tokens` generated tokens to the key.
    pub fn charge(&self, tokens: u32) {
        if let Some((store, i)) = &self.entry {
            let mut u = store.usage(*i);
            u.tokens = u.tokens.saturating_add(tokens);
        }
    }

    /// The key's default priority, if it sets one.
    pub fn priority(&self) -> Option<switchyard_messages::Priority> {
        let (store, i) = self.entry.as_ref()?;
        switchyard_messages::Priority::parse(&store.entries[*i].key.priority)
    }

    /// The key's name, for logs.
    pub fn name(&self) -> &str {
        match &self.entry {
            Some((store, i)) => &store.entries[*i].key.name,
            None => "",
        }
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if let Some((store, i)) = &self.entry {
            let mut u = store.usage(*i);
            u.open = u.open.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer(key: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("authorization", format!("Bearer {key}").parse().unwrap());
        h
    }

    fn store(keys: Vec<ApiKey>) -> KeyStore {
        KeyStore::load(&GatewayConfig {
            keys,
            ..GatewayConfig::default()
        })
        .unwrap()
    }

    #[test]
    fn keys_are_checked_with_their_limits() {
        let s = store(vec![
            ApiKey {
                name: "a".into(),
                sha256: hash_key("key-a"),
                models: vec!["m1".into()],
                tokens_per_min: 10,
                max_streams: 1,
                ..ApiKey::default()
            },
            ApiKey {
                name: "b".into(),
                sha256: hash_key("key-b"),
                requests_per_min: 2,
                ..ApiKey::default()
            },
        ]);
        let status = |r: Result<Admitted, ApiError>| r.err().map(|e| e.status.as_u16());
        assert_eq!(status(s.admit(&HeaderMap::new(), "m1")), Some(401));
        assert_eq!(status(s.admit(&bearer("key-c"), "m1")), Some(401));
        for scheme in ["bearer", "BEARER", "BeArEr"] {
            let mut h = HeaderMap::new();
            h.insert("authorization", format!("{scheme} key-a").parse().unwrap());
            assert!(s.admit(&h, "m1").is_ok(), "{scheme}");
        }
        let mut h = HeaderMap::new();
        h.insert("authorization", "Basic key-a".parse().unwrap());
        assert_eq!(status(s.admit(&h, "m1")), Some(401));
        assert_eq!(status(s.admit(&bearer("key-a"), "m2")), Some(403));
        // max_streams 1: a second concurrent request waits for the first to end.
        let first = s.admit(&bearer("key-a"), "m1").unwrap();
        assert_eq!(first.name(), "a");
        assert_eq!(status(s.admit(&bearer("key-a"), "m1")), Some(429));
        first.charge(10);
        drop(first);
        // tokens_per_min 10, all used: refused, with Retry-After.
        let e = s.admit(&bearer("key-a"), "m1").err().unwrap();
        assert_eq!(e.status.as_u16(), 429);
        assert!(e.retry_after.is_some_and(|s| (1..=60).contains(&s)), "{e:?}");
        // requests_per_min 2.
        drop(s.admit(&bearer("key-b"), "any").unwrap());
        drop(s.admit(&bearer("key-b"), "any").unwrap());
        assert_eq!(status(s.admit(&bearer("key-b"), "any")), Some(429));
    }

    #[test]
    fn a_keys_file_is_read_and_no_keys_admits_everyone() {
        let dir = std::env::temp_dir().join(format!("sy-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("keys.toml");
        std::fs::write(
            &file,
            format!("[[keys]]\nname = \"f\"\nsha256 = \"{}\"\n", hash_key("from-file")),
        )
        .unwrap();
        let s = KeyStore::load(&GatewayConfig {
            keys_file: file.display().to_string(),
            ..GatewayConfig::default()
        })
        .unwrap();
        assert!(s.admit(&bearer("from-file"), "x").is_ok());
        assert!(s.admit(&bearer("other"), "x").is_err());
        std::fs::write(&file, "[[keys]]\nname = \"bad\"\nsha256 = \"KEY\"\n").unwrap();
        let e = KeyStore::load(&GatewayConfig {
            keys_file: file.display().to_string(),
            ..GatewayConfig::default()
        })
        .err()
        .unwrap();
        assert!(format!("{e:#}").contains("sha256"), "{e:#}");
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(KeyStore::default().admit(&HeaderMap::new(), "x").is_ok());
    }
}
