//! Connecting to NATS and publishing contract types as MessagePack.

use async_nats::{Client, ConnectOptions, HeaderMap};
use serde::Serialize;
use std::time::Duration;

/// Errors talking to NATS.
#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    /// Could not connect.
    #[error("connecting to NATS at {url}: {reason}")]
    Connect {
        /// The server URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// Could not publish.
    #[error("publishing to {subject}: {reason}")]
    Publish {
        /// The subject.
        subject: String,
        /// Why.
        reason: String,
    },
}

/// Connects with a client name (shown by `nats server report connections`), retrying
/// the first connection for up to `wait`.
pub async fn connect(url: &str, name: &str, wait: Duration) -> Result<Client, NatsError> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let opts = ConnectOptions::new()
            .name(name)
            .connection_timeout(Duration::from_secs(2))
            .retry_on_initial_connect();
        let attempt = tokio::time::timeout(Duration::from_secs(3), ConnectOptions::connect(opts, url)).await;
        let reason = match attempt {
            Ok(Ok(client)) => {
                // `retry_on_initial_connect` returns before the handshake; wait for it.
                let ready = tokio::time::timeout(Duration::from_secs(3), client.flush()).await;
                match ready {
                    Ok(Ok(())) => return Ok(client),
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => "no answer from the server".to_string(),
                }
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => "timed out".to_string(),
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(NatsError::Connect {
                url: url.to_string(),
                reason,
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Publishes `value` encoded as MessagePack.
pub async fn publish<T: Serialize>(client: &Client, subject: String, value: &T) -> Result<(), NatsError> {
    let payload = switchyard_messages::encode(value);
    client
        .publish(subject.clone(), payload.into())
        .await
        .map_err(|e| NatsError::Publish {
            subject,
            reason: e.to_string(),
        })
}

/// Publishes `value` with headers.
pub async fn publish_with_headers<T: Serialize>(
    client: &Client,
    subject: String,
    headers: HeaderMap,
    value: &T,
) -> Result<(), NatsError> {
    let payload = switchyard_messages::encode(value);
    client
        .publish_with_headers(subject.clone(), headers, payload.into())
        .await
        .map_err(|e| NatsError::Publish {
            subject,
            reason: e.to_string(),
        })
}

/// Adds endpoint `name` on `subject` to a NATS micro `service` and serves it: every
/// request runs `handle` in a task of its own, so a slow one never holds up the
/// next. The returned task ends when the service stops; abort it to stop early.
pub async fn serve_endpoint<F, Fut>(
    service: &async_nats::service::Service,
    name: &str,
    subject: String,
    handle: F,
) -> Result<tokio::task::JoinHandle<()>, String>
where
    F: Fn(async_nats::service::Request) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    use futures::StreamExt;
    let mut endpoint = service
        .endpoint_builder()
        .name(name)
        .add(subject)
        .await
        .map_err(|e| format!("adding endpoint {name}: {e}"))?;
    Ok(tokio::spawn(async move {
        while let Some(request) = endpoint.next().await {
            tokio::spawn(handle(request));
        }
    }))
}
