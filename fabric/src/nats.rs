//! Connecting to NATS and publishing contract types as MessagePack.

use async_nats::{Client, ConnectOptions, HeaderMap, ServerAddr};
use serde::Serialize;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use switchyard_config::NatsSecurity;

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

/// `url` without the user info (`nats://user:secret@host` → `nats://***@host`), for
/// messages; each of a comma-separated list.
pub fn display_url(url: &str) -> String {
    let one = |url: &str| match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => format!("{}***{}", &url[..scheme + 3], &url[at..]),
        (None, Some(at)) => format!("***{}", &url[at..]),
        _ => url.to_string(),
    };
    url.split(',').map(|u| one(u.trim())).collect::<Vec<_>>().join(",")
}

/// The servers `url` names: one URL, or several separated by commas (members of a
/// cluster, e.g. `nats://a:4222,nats://b:4222`). The client connects to one of them
/// and reconnects to any of them — and to the members the servers advertise, unless
/// they are configured with `no_advertise`, when only these are known.
pub fn server_list(url: &str) -> Result<Vec<ServerAddr>, String> {
    let urls: Vec<&str> = url.split(',').map(str::trim).filter(|u| !u.is_empty()).collect();
    if urls.is_empty() {
        return Err("no NATS server URL given".into());
    }
    urls.iter()
        .map(|u| {
            u.parse::<ServerAddr>().map_err(|e| {
                format!(
                    "{:?} is not a NATS server URL ({e}); give one URL or several separated by commas, \
                     e.g. nats://a:4222,nats://b:4222",
                    display_url(u)
                )
            })
        })
        .collect()
}

/// The NATS server `client` is connected to, for logs and `status`: its name (or id)
/// and the address it reported.
pub fn connected_server(client: &Client) -> String {
    let info = client.server_info();
    let name = if info.server_name.is_empty() {
        &info.server_id
    } else {
        &info.server_name
    };
    format!("{name} ({}:{})", info.host, info.port)
}

/// The connect options for `security` (credentials, TLS, inbox prefix).
async fn options(
    security: &NatsSecurity,
    name: &str,
    current: Arc<OnceLock<Client>>,
) -> Result<ConnectOptions, String> {
    let mut opts = ConnectOptions::new()
        .name(name)
        .connection_timeout(Duration::from_secs(2))
        // Which server a process is on, and when it moves (a cluster member died).
        .event_callback(move |event| {
            let current = current.clone();
            async move {
                match event {
                    async_nats::Event::Connected => match current.get() {
                        Some(c) => tracing::info!(server = %connected_server(c), "reconnected to NATS"),
                        None => tracing::debug!("connected to NATS"),
                    },
                    async_nats::Event::Disconnected => {
                        tracing::warn!("disconnected from the NATS server; reconnecting to any server it knows")
                    }
                    // E.g. a permissions violation: say it where the user looks.
                    async_nats::Event::ServerError(e) => tracing::warn!("NATS server error: {e}"),
                    other => tracing::debug!("NATS: {other}"),
                }
            }
        });
    if !security.user.is_empty() {
        opts = opts.user_and_password(security.user.clone(), security.password.clone());
    }
    if !security.token.is_empty() {
        opts = opts.token(security.token.clone());
    }
    if !security.nkey_file.is_empty() {
        let seed = std::fs::read_to_string(&security.nkey_file)
            .map_err(|e| format!("reading nats.nkey_file {}: {e}", security.nkey_file))?;
        let seed = seed.trim().to_string();
        if !seed.starts_with('S') || nkeys::KeyPair::from_seed(&seed).is_err() {
            return Err(format!(
                "nats.nkey_file {} holds no nkey seed (SU…)",
                security.nkey_file
            ));
        }
        opts = opts.nkey(seed);
    }
    if !security.creds_file.is_empty() {
        opts = opts
            .credentials_file(&security.creds_file)
            .await
            .map_err(|e| format!("nats.creds_file {}: {e}", security.creds_file))?;
    }
    if !security.tls_ca_file.is_empty() {
        opts = opts.add_root_certificates(security.tls_ca_file.clone().into());
    }
    if !security.tls_cert_file.is_empty() {
        opts = opts.add_client_certificate(
            security.tls_cert_file.clone().into(),
            security.tls_key_file.clone().into(),
        );
    }
    if security.tls() {
        opts = opts.require_tls(true);
    }
    if !security.inbox_prefix.is_empty() {
        opts = opts.custom_inbox_prefix(&security.inbox_prefix);
    }
    Ok(opts)
}

/// A failure that retrying cannot cure, explained with the settings to look at.
fn fatal(e: &async_nats::ConnectError, security: &NatsSecurity) -> Option<String> {
    use async_nats::ConnectErrorKind as K;
    let methods = security.auth_methods();
    let using = if methods.is_empty() {
        "no credentials were given (set nats.user/nats.password, nats.token, nats.nkey_file or nats.creds_file)"
            .to_string()
    } else {
        format!("check {}", methods.join(", "))
    };
    // A failed handshake (an unknown issuer, a certificate the server rejects) comes
    // back as an IO error from rustls: recognise it by what it says.
    let text = error_chain(e);
    let lower = text.to_ascii_lowercase();
    let tls_failure = ["certificate", "handshake", "tls", "peer sent"]
        .iter()
        .any(|w| lower.contains(w));
    match e.kind() {
        K::Io if tls_failure => Some(tls_message(&text, security)),
        K::AuthorizationViolation => Some(format!("the server refused the credentials: {using}")),
        K::Authentication => Some(format!("authentication failed ({e}): {using}")),
        K::Tls => Some(tls_message(&text, security)),
        K::ServerParse => Some(format!("{e} (check the URL, nats.url / --nats)")),
        _ => None,
    }
}

fn tls_message(error: &str, security: &NatsSecurity) -> String {
    format!(
        "TLS failed: {error} (check nats.tls_ca_file{}; the server's certificate must be signed by that CA and name this host)",
        if security.tls_cert_file.is_empty() {
            ", and nats.tls_cert_file/nats.tls_key_file if the server asks for a client certificate"
        } else {
            ", nats.tls_cert_file and nats.tls_key_file"
        }
    )
}

/// An error and its sources, joined.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// Connects with a client name (shown by `nats server report connections`) and the
/// given credentials and TLS, retrying an unreachable server for up to `wait`. A
/// refused credential, an untrusted certificate or a missing client certificate fails
/// at once with the setting to look at; secrets never appear in the message.
pub async fn connect(url: &str, security: &NatsSecurity, name: &str, wait: Duration) -> Result<Client, NatsError> {
    let shown = display_url(url);
    let fail = |reason: String| NatsError::Connect {
        url: shown.clone(),
        reason,
    };
    let servers = server_list(url).map_err(fail)?;
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let current = Arc::new(OnceLock::new());
        let opts = options(security, name, current.clone()).await.map_err(fail)?;
        let attempt =
            tokio::time::timeout(Duration::from_secs(3), ConnectOptions::connect(opts, servers.clone())).await;
        let reason = match attempt {
            Ok(Ok(client)) => {
                tracing::info!(server = %connected_server(&client), client = name, "connected to NATS");
                let _ = current.set(client.clone());
                return Ok(client);
            }
            Ok(Err(e)) => {
                if let Some(reason) = fatal(&e, security) {
                    return Err(fail(reason));
                }
                error_chain(&e)
            }
            Err(_) => "timed out".to_string(),
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(fail(reason));
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

/// Drains `client` (unsubscribes everything, delivers what already arrived, closes)
/// and waits, up to `bound`, until the connection has closed. `Client::drain` only
/// asks for it: until the server has the unsubscribes, requests can still land here.
/// Returns whether it closed within the bound.
pub async fn drain_closed(client: &Client, bound: Duration) -> bool {
    if client.drain().await.is_err() {
        return true;
    }
    let closed = async {
        // A flush fails once the connection's handler has finished the drain and exited.
        while client.flush().await.is_ok() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(bound, closed).await.is_ok()
}

/// Bytes a message takes against the server's `max_payload`: NATS counts the header
/// block (`NATS/1.0\r\n`, each `name: value\r\n`, a closing `\r\n`) with the payload.
pub fn message_size(headers: Option<&HeaderMap>, payload_len: usize) -> usize {
    let header_bytes = headers.map_or(0, |h| {
        12 + h
            .iter()
            .map(|(name, values)| {
                values
                    .iter()
                    .map(|v| AsRef::<[u8]>::as_ref(name).len() + v.as_str().len() + 4)
                    .sum::<usize>()
            })
            .sum::<usize>()
    });
    header_bytes + payload_len
}

/// Whether a message of `size` bytes (see [`message_size`]) fits the connected
/// server's `max_payload`.
pub fn fits(client: &Client, size: usize) -> Result<(), usize> {
    let max = client.server_info().max_payload;
    if max > 0 && size > max {
        Err(max)
    } else {
        Ok(())
    }
}

/// A reply body that fits `max_payload`: `body` itself, or — when it does not fit —
/// an encoded `ErrorReply` with `reply_too_large` saying how big it was, so the
/// caller gets an answer instead of silence. `what` names the reply in the message.
pub fn fit_reply(client: &Client, body: Vec<u8>, what: &str) -> Vec<u8> {
    match fits(client, body.len()) {
        Ok(()) => body,
        Err(max) => {
            tracing::warn!(
                size = body.len(),
                max,
                "{what}: reply over max_payload; answering reply_too_large"
            );
            switchyard_messages::encode(&switchyard_messages::ErrorReply {
                v: switchyard_messages::PROTOCOL_VERSION,
                error: switchyard_messages::WireError::new(
                    switchyard_messages::ErrorCode::ReplyTooLarge,
                    format!(
                        "the {what} reply is {} bytes, over the NATS server's max_payload of {max}; ask for less \
                         (fewer prompts, no logits) or raise max_payload",
                        body.len()
                    ),
                ),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{display_url, server_list};

    #[test]
    fn urls_lose_their_user_info_when_shown() {
        assert_eq!(display_url("nats://u:secret@10.0.0.5:4222"), "nats://***@10.0.0.5:4222");
        assert_eq!(display_url("tls://tok@nats.lan"), "tls://***@nats.lan");
        assert_eq!(display_url("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
        assert_eq!(
            display_url("nats://u:pw@a:4222, nats://b:4222"),
            "nats://***@a:4222,nats://b:4222"
        );
    }

    #[test]
    fn a_cluster_is_a_comma_separated_list_of_servers() {
        let servers = server_list("nats://a:4222, nats://b:5222,tls://c").unwrap();
        let shown: Vec<String> = servers.iter().map(|s| format!("{}:{}", s.host(), s.port())).collect();
        assert_eq!(shown, ["a:4222", "b:5222", "c:4222"]);
        assert_eq!(server_list("nats://a:4222").unwrap().len(), 1);
        let err = server_list("nats://a:4222,nats://u:secret@b:notaport").unwrap_err();
        assert!(
            err.contains("nats://***@b:notaport") && !err.contains("secret"),
            "{err}"
        );
        assert!(server_list(" , ").is_err());
    }
}
