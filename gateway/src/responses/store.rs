//! Stored responses (`store: true`, `previous_response_id`, `GET`/`DELETE
//! /v1/responses/{id}`) in a JetStream key-value bucket on the fleet's NATS servers,
//! so any gateway continues a conversation another one started. Each key is a
//! response id; its value a [`Record`]: the response as answered, the conversation
//! up to and including it (what a follow-up continues), and this turn's input
//! items. The bucket keeps one revision per key, for `gateway.responses_max_age_s`,
//! within `gateway.responses_max_bytes` (the oldest go first).
//!
//! The bucket is made (or opened) on first use; without JetStream the gateway
//! still answers, storing nothing, and says so on a `previous_response_id` or `GET`.

use crate::errors::ApiError;
use async_nats::jetstream::{self, kv};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::Duration;
use switchyard_client::Message;
use switchyard_config::GatewayConfig;
use tokio::sync::Mutex;

/// What is kept per stored response.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    /// The response object as answered.
    pub response: Value,
    /// The conversation through this response (without its `instructions`, which
    /// apply to one response only).
    pub messages: Vec<Message>,
    /// This turn's input items, as sent (`GET …/input_items`).
    pub input: Vec<Value>,
}

/// The bucket, opened on first use.
pub struct Store {
    nats: async_nats::Client,
    config: kv::Config,
    bucket: Mutex<Opened>,
}

/// The bucket once opened; else when opening it last failed, and why.
#[derive(Default)]
struct Opened {
    bucket: Option<kv::Store>,
    failed: Option<(std::time::Instant, ApiError)>,
}

/// How long a failure to open the bucket is answered without trying again.
const RETRY_AFTER: Duration = Duration::from_secs(30);

fn unavailable(why: String) -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "api_error", "store_unavailable", why)
}

impl Store {
    pub fn new(nats: async_nats::Client, c: &GatewayConfig) -> Self {
        Self {
            nats,
            config: kv::Config {
                bucket: c.responses_bucket.clone(),
                description: "switchyard: stored /v1/responses".into(),
                history: 1,
                max_age: Duration::from_secs(c.responses_max_age_s),
                max_bytes: i64::try_from(c.responses_max_bytes).unwrap_or(i64::MAX),
                storage: jetstream::stream::StorageType::File,
                ..kv::Config::default()
            },
            bucket: Mutex::new(Opened::default()),
        }
    }

    async fn bucket(&self) -> Result<kv::Store, ApiError> {
        let mut open = self.bucket.lock().await;
        if let Some(b) = open.bucket.as_ref() {
            return Ok(b.clone());
        }
        if let Some((_, e)) = open.failed.as_ref().filter(|(at, _)| at.elapsed() < RETRY_AFTER) {
            return Err(e.clone());
        }
        let js = jetstream::new(self.nats.clone());
        let name = &self.config.bucket;
        let opened = match js.get_key_value(name).await {
            Ok(b) => Ok(b),
            Err(_) => js.create_key_value(self.config.clone()).await.map_err(|e| {
                unavailable(format!(
                    "the response store (JetStream bucket {name:?}) is not available: {e}; \
                     the NATS servers need JetStream (docs/gateway.md, \"Stored responses\")"
                ))
            }),
        };
        match opened {
            Ok(b) => {
                *open = Opened {
                    bucket: Some(b.clone()),
                    failed: None,
                };
                Ok(b)
            }
            Err(e) => {
                tracing::warn!("{}", e.message);
                open.failed = Some((std::time::Instant::now(), e.clone()));
                Err(e)
            }
        }
    }

    /// Keeps `record` under `id`.
    pub async fn put(&self, id: &str, record: &Record) -> Result<(), ApiError> {
        let bytes = serde_json::to_vec(record).unwrap_or_default();
        self.bucket()
            .await?
            .put(id, bytes.into())
            .await
            .map(|_| ())
            .map_err(|e| unavailable(format!("storing response {id}: {e}")))
    }

    /// The record of `id`, `None` when there is none (never stored, deleted or
    /// expired).
    pub async fn get(&self, id: &str) -> Result<Option<Record>, ApiError> {
        if !valid_id(id) {
            return Ok(None);
        }
        let got = self
            .bucket()
            .await?
            .get(id)
            .await
            .map_err(|e| unavailable(format!("reading response {id}: {e}")))?;
        Ok(got.and_then(|b| serde_json::from_slice(&b).ok()))
    }

    /// Deletes `id`; whether it was there.
    pub async fn delete(&self, id: &str) -> Result<bool, ApiError> {
        if self.get(id).await?.is_none() {
            return Ok(false);
        }
        self.bucket()
            .await?
            .purge(id)
            .await
            .map_err(|e| unavailable(format!("deleting response {id}: {e}")))?;
        Ok(true)
    }
}

/// Whether `id` can be a key (ours are `resp_` and letters and digits).
pub fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}
