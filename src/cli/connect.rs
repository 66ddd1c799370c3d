//! The client a command uses, and how a fleet's error becomes its exit code.

use anyhow::Context;
use std::process::ExitCode;
use std::time::Duration;
use switchyard::{Client, ClientError, ClientOptions, Config};

/// Exit code for a request the fleet answered with an error.
const EXIT_REMOTE: u8 = 2;

fn nats_url_for_client(config: &Config) -> String {
    if config.nats.url.is_empty() {
        "nats://127.0.0.1:4222".to_string()
    } else {
        config.nats.url.clone()
    }
}

pub async fn client(config: &Config, stall_ms: Option<u64>) -> anyhow::Result<Client> {
    let opts = ClientOptions {
        prefix: config.nats.prefix.clone(),
        security: config.nats.security(),
        stall_timeout: Duration::from_millis(stall_ms.unwrap_or(config.client.stall_timeout_ms)),
        request_timeout: Duration::from_millis(config.client.request_timeout_ms),
        ..ClientOptions::default()
    };
    let url = nats_url_for_client(config);
    Client::connect_with(&url, opts)
        .await
        .with_context(|| format!("connecting to {}", switchyard_fabric::nats::display_url(&url)))
}

pub fn report(e: ClientError) -> anyhow::Result<ExitCode> {
    match e {
        ClientError::Remote { error, received } => {
            if !received.is_empty() {
                println!();
            }
            eprintln!(
                "error: {}: {} (retryable: {})",
                error.code, error.message, error.retryable
            );
            Ok(ExitCode::from(EXIT_REMOTE))
        }
        other => Err(other.into()),
    }
}
