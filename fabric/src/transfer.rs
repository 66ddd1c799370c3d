//! Chunked transfers between two processes over NATS request/reply: the puller sends
//! one request per chunk, at most a window of them outstanding, and gets each reply
//! checked against the SHA-256 digest its sender put in `Sy-Digest`. Used by KV pulls
//! between workers (`switchyard_workers::worker::kv_transfer`).
//!
//! Flow control is the window: the sender answers one request with one chunk, so a
//! puller holds at most `in_flight` chunks and a sender at most the one it is
//! answering. A dead or slow sender costs the puller one timeout, never a hang; a
//! corrupted or digest-less reply ends the transfer. Everything that fails is the
//! caller's normal path: it uses the chunks it got and computes the rest.

use async_nats::{Client, HeaderMap, Subject};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use sha2::{Digest, Sha256};
use std::time::Duration;
use switchyard_messages::subjects::HEADER_DIGEST;

/// How many chunk requests may be outstanding, and how long one may take.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub in_flight: usize,
    pub timeout: Duration,
}

impl Default for Window {
    fn default() -> Self {
        Self {
            in_flight: 4,
            timeout: Duration::from_secs(5),
        }
    }
}

/// Why a transfer stopped early.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TransferError {
    #[error("chunk {chunk}: nobody serves {subject}")]
    NoResponders { chunk: usize, subject: String },
    #[error("chunk {chunk}: no answer within {ms} ms")]
    TimedOut { chunk: usize, ms: u64 },
    #[error("chunk {chunk}: its bytes do not match their digest ({reason})")]
    Digest { chunk: usize, reason: String },
    #[error("chunk {chunk}: {reason}")]
    Request { chunk: usize, reason: String },
}

/// `sha256=<hex>` of `bytes`, as `Sy-Digest` carries it.
pub fn digest(bytes: &[u8]) -> String {
    let sum = Sha256::digest(bytes);
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256=");
    for b in sum {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// Answers one chunk request: `payload` to `reply`, with its digest.
pub async fn respond(client: &Client, reply: Subject, payload: Vec<u8>) -> Result<(), async_nats::PublishError> {
    let mut headers = HeaderMap::new();
    headers.insert(HEADER_DIGEST, digest(&payload).as_str());
    client.publish_with_headers(reply, headers, payload.into()).await
}

/// The server's `max_payload` less room for headers and the envelope around a
/// chunk's bytes: what one chunk's data may take.
pub fn chunk_budget(client: &Client) -> usize {
    client.server_info().max_payload.saturating_sub(8 * 1024).max(4 * 1024)
}

/// Sends each of `requests` to `subject`, at most `window.in_flight` outstanding,
/// and yields the replies' payloads in request order, digest-checked. The stream
/// ends after the first error (yielded) or the last reply; dropping it stops the
/// transfer (answers still on their way are discarded).
pub fn fetch(
    client: Client,
    subject: String,
    requests: Vec<Bytes>,
    window: Window,
) -> impl Stream<Item = Result<Bytes, TransferError>> + Send {
    let sends = requests.into_iter().enumerate().map(move |(chunk, payload)| {
        let (client, subject) = (client.clone(), subject.clone());
        async move {
            let request = async_nats::Request::new()
                .payload(payload)
                .timeout(Some(window.timeout));
            let answer = client.send_request(subject.clone(), request).await;
            check(chunk, &subject, window.timeout, answer)
        }
    });
    futures::stream::iter(sends)
        .buffered(window.in_flight.max(1))
        .scan(false, |failed, r| {
            if *failed {
                return futures::future::ready(None);
            }
            *failed = r.is_err();
            futures::future::ready(Some(r))
        })
}

fn check(
    chunk: usize,
    subject: &str,
    timeout: Duration,
    answer: Result<async_nats::Message, async_nats::RequestError>,
) -> Result<Bytes, TransferError> {
    use async_nats::RequestErrorKind;
    let msg = answer.map_err(|e| match e.kind() {
        RequestErrorKind::NoResponders => TransferError::NoResponders {
            chunk,
            subject: subject.to_string(),
        },
        RequestErrorKind::TimedOut => TransferError::TimedOut {
            chunk,
            ms: timeout.as_millis() as u64,
        },
        _ => TransferError::Request {
            chunk,
            reason: e.to_string(),
        },
    })?;
    let said = msg
        .headers
        .as_ref()
        .and_then(|h| h.get(HEADER_DIGEST))
        .map(|v| v.as_str().to_string());
    match said {
        None => Err(TransferError::Digest {
            chunk,
            reason: "the reply has none".into(),
        }),
        Some(said) if said != digest(&msg.payload) => Err(TransferError::Digest {
            chunk,
            reason: format!("{} bytes", msg.payload.len()),
        }),
        Some(_) => Ok(msg.payload),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_sha256_hex() {
        assert_eq!(
            digest(b"abc"),
            "sha256=ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
