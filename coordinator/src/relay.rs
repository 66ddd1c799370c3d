//! Streams relayed by draining workers (protocol 1.12, `{p}.v1.relay.*`): what their
//! headers say and the answer the relaying worker waits for.

use switchyard_messages::subjects::{HEADER_ADMIT_BY, HEADER_HANDOVER, HEADER_KV_PEER};
use switchyard_messages::{encode, Admission, WireError, PROTOCOL_VERSION};

/// The relaying worker's `Sy-Admit-By`: past it, it goes on with the stream itself.
pub fn admit_by(msg: &async_nats::Message) -> u64 {
    msg.headers
        .as_ref()
        .and_then(|h| h.get(HEADER_ADMIT_BY))
        .and_then(|v| v.as_str().parse().ok())
        .unwrap_or(u64::MAX)
}

/// A relayed stream's hand-over (`Sy-Handover`) with its `Sy-Kv-Peer`: the worker
/// that ran it and the tokens whose KV it holds.
pub fn handover_peer(msg: &async_nats::Message) -> Option<(String, String)> {
    let headers = msg.headers.as_ref()?;
    headers.get(HEADER_HANDOVER)?;
    let (peer, tokens) = headers.get(HEADER_KV_PEER)?.as_str().split_once(',')?;
    tokens.parse::<u32>().ok()?;
    Some((peer.to_string(), tokens.to_string()))
}

/// Answers a relaying worker: a worker admitted its stream, or why none did.
pub async fn answer(
    client: &async_nats::Client,
    relay: async_nats::Subject,
    worker_id: &str,
    error: Option<WireError>,
) {
    let answer = Admission {
        v: PROTOCOL_VERSION,
        worker_id: worker_id.to_string(),
        accepted: error.is_none(),
        error,
    };
    let _ = client.publish(relay, encode(&answer).into()).await;
}
