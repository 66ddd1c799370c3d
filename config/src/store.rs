//! The `[store]` section: models kept in NATS JetStream's object store
//! (docs/models.md) and the local cache workers fetch them into.

use serde::{Deserialize, Serialize};

/// Where models live on the bus and on this machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// The object-store bucket holding the fleet's models (JetStream stream
    /// `OBJ_{bucket}`).
    pub bucket: String,
    /// Copies JetStream keeps of the bucket when `models push` creates it (1–5; a
    /// cluster of three servers survives losing one with 3).
    pub replicas: u32,
    /// The bucket's size limit when `models push` creates it, bytes; 0 = only the
    /// server's own JetStream limits. A push that would not fit is refused before
    /// it sends a byte.
    pub max_bytes: u64,
    /// Bytes per object-store chunk (one NATS message each; at most the server's
    /// `max_payload`, 1 MiB by default).
    pub chunk_bytes: u32,
    /// Where fetched models are kept; empty = `{cache}/models/store`.
    pub cache_dir: String,
    /// JetStream's storage directory for the nats-server that `up` starts; empty =
    /// `{cache}/jetstream` (models pushed to a single node survive restarts).
    pub jetstream_dir: String,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            bucket: "switchyard-models".into(),
            replicas: 1,
            max_bytes: 0,
            chunk_bytes: 512 * 1024,
            cache_dir: String::new(),
            jetstream_dir: String::new(),
        }
    }
}

impl StoreConfig {
    /// The directory fetched models are kept in.
    pub fn cache_path(&self) -> std::path::PathBuf {
        match self.cache_dir.is_empty() {
            true => crate::cache_dir().join("models").join("store"),
            false => self.cache_dir.clone().into(),
        }
    }

    /// JetStream's storage directory for `up`'s own nats-server.
    pub fn jetstream_path(&self) -> std::path::PathBuf {
        match self.jetstream_dir.is_empty() {
            true => crate::cache_dir().join("jetstream"),
            false => self.jetstream_dir.clone().into(),
        }
    }

    pub(crate) fn validate(&self) -> Result<(), crate::ConfigError> {
        let invalid = |field, value: String, reason| Err(crate::ConfigError::Invalid { field, value, reason });
        if self.bucket.is_empty()
            || !self
                .bucket
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return invalid(
                "store.bucket",
                self.bucket.clone(),
                "must be letters, digits, '-' and '_' (a JetStream bucket name)",
            );
        }
        if !(1..=5).contains(&self.replicas) {
            return invalid("store.replicas", self.replicas.to_string(), "must be 1 to 5");
        }
        if !(1024..=8 << 20).contains(&self.chunk_bytes) {
            return invalid(
                "store.chunk_bytes",
                self.chunk_bytes.to_string(),
                "must be 1 KiB to 8 MiB (and at most the server's max_payload)",
            );
        }
        Ok(())
    }
}
