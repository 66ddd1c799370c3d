//! The puller's side: before a generation the coordinator says a peer holds more of
//! (`Sy-Kv-Peer`), fetch the blocks this worker lacks, chunk by chunk, into the
//! model's block store — while [`should_pull`] says that beats computing them.

use super::policy::{should_pull, PullCase};
use super::TransferState;
use crate::worker::context::ServeContext;
use bytes::Bytes;
use futures::StreamExt;
use std::time::{Duration, Instant};
use switchyard_backend::{KvBlocks, Prompt};
use switchyard_fabric::transfer::{self, Window};
use switchyard_messages::kv_transfer::{chunking, KV_TRANSFER_VERSION};
use switchyard_messages::subjects::HEADER_KV_PEER;
use switchyard_messages::{KvChunk, KvPullRequest, PROTOCOL_VERSION};

/// The longest a pull may take in all, whatever it predicted: past it, compute.
const MAX_PULL: Duration = Duration::from_secs(30);

/// The longest one chunk may take: a chunk is at most `max_payload` (1 MiB by
/// default), milliseconds on a LAN; a source that does not answer within this is
/// dead, cut off or too far away to be worth it.
const CHUNK_TIMEOUT: Duration = Duration::from_secs(1);

/// The coordinator's `Sy-Kv-Peer` (`worker_id,tokens`), when it sent one.
fn peer_of(msg: &async_nats::Message) -> Option<(String, usize)> {
    let v = msg.headers.as_ref()?.get(HEADER_KV_PEER)?.as_str();
    let (peer, tokens) = v.split_once(',')?;
    Some((peer.to_string(), tokens.parse().ok()?))
}

/// [`pull`] for a generation streaming to `sink`, after a prefill on the prefill
/// worker the forward names ([`super::prefill::remote`]), if any: its final metrics
/// say what was pulled and how long that (and the prefill elsewhere) took.
pub async fn pull_for(
    ctx: &ServeContext,
    msg: &async_nats::Message,
    head: &switchyard_messages::RequestHead,
    prompt: &Prompt,
    cancel: &switchyard_backend::CancelFlag,
    sink: switchyard_fabric::ChunkSink,
) -> switchyard_fabric::ChunkSink {
    let (request_id, adapter, deadline_ms) = (head.request_id.as_str(), head.adapter.as_deref(), head.deadline_ms);
    let work = async {
        // A prefill worker computes the prompt, then it is pulled like any prefix:
        // always, as the coordinator found that faster.
        let prefilled = super::prefill::remote(ctx, msg, request_id, prompt, adapter, deadline_ms).await;
        let began = Instant::now();
        let (peer, forced, remote_us) = match prefilled {
            Some(p) => (Some((p.peer, p.tokens)), true, p.us),
            None => (peer_of(msg), false, 0),
        };
        let n = pull(ctx, peer, forced, request_id, prompt, adapter).await;
        (n, remote_us, began.elapsed().as_micros() as u64)
    };
    tokio::pin!(work);
    // Keep-alives while it pulls, as while a prompt computes: the client's stall
    // timer must not fire on a slow pull.
    let mut keepalive = tokio::time::interval(ctx.keepalive);
    keepalive.tick().await;
    let pulled = loop {
        tokio::select! {
            n = &mut work => break n,
            _ = keepalive.tick() => {
                // A client that cancelled waits for nothing more (the generation
                // then ends at once, cancelled).
                if cancel.is_cancelled() {
                    break (0, 0, 0);
                }
                sink.tokens(Vec::new()).await;
            }
        }
    };
    let (pulled, remote_us, pull_us) = pulled;
    let sink = sink.remote_prefill(remote_us);
    match pulled {
        0 => sink,
        n => sink.pulled(n as u32, pull_us),
    }
}

/// Pulls the prefix of `prompt` (run with `adapter`) that `peer` (`worker_id`,
/// tokens it holds) holds beyond what the model holds, when that is predicted faster
/// than computing it (or `forced`); returns the prompt tokens whose KV was imported
/// (0: none — nothing to pull, computing predicted faster, or the pull failed and
/// the rest is computed).
pub async fn pull(
    ctx: &ServeContext,
    peer: Option<(String, usize)>,
    forced: bool,
    request_id: &str,
    prompt: &Prompt,
    adapter: Option<&str>,
) -> usize {
    if !ctx.kv_pull {
        return 0;
    }
    let Some((peer, peer_tokens)) = peer.filter(|(p, _)| *p != ctx.worker_id) else {
        return 0;
    };
    let Some(kv) = ctx.model.kv_transfer() else { return 0 };
    let Some(format) = kv.kv_format() else { return 0 };
    let adapter_key = match adapter.map(|a| kv.adapter_key(a)).transpose() {
        Ok(k) => k,
        Err(_) => return 0,
    };
    let Ok(tokens) = kv.prompt_tokens(prompt).await else {
        return 0;
    };
    let bt = format.block_tokens as usize;
    // The last prompt token is always computed (its logits are wanted).
    let usable = peer_tokens.min(tokens.len().saturating_sub(1)) / bt;
    if usable == 0 {
        return 0;
    }
    let prefix = tokens[..usable * bt].to_vec();
    let adapter = adapter.map(str::to_string);
    let held = kv.held_prefix(prefix.clone(), adapter.clone()).await.unwrap_or(0) / bt;
    if held >= usable {
        return 0;
    }
    let (per_chunk, parts) = chunking(format.block_bytes(), transfer::chunk_budget(&ctx.client));
    let window = Window {
        in_flight: Window::default().in_flight,
        timeout: CHUNK_TIMEOUT,
    };
    let ask = |first: usize, blocks: usize, part: usize| KvPullRequest {
        v: PROTOCOL_VERSION,
        transfer: KV_TRANSFER_VERSION,
        request_id: request_id.to_string(),
        format: format.key(),
        adapter: adapter.clone(),
        adapter_key: adapter_key.clone(),
        tokens: prefix.clone(),
        first_block: first as u32,
        blocks: blocks as u32,
        part: part as u32,
        parts: parts as u32,
        tail: 0,
    };
    let mut asks = Vec::new();
    for first in (held..usable).step_by(per_chunk) {
        for part in 0..parts {
            asks.push(ask(first, per_chunk.min(usable - first), part));
        }
    }
    let prefill_tps = ctx.recent.lock().unwrap_or_else(|p| p.into_inner()).speed().prefill_tps;
    let case = |blocks: usize, chunks: usize| PullCase {
        tokens: blocks * bt,
        token_bytes: format.token_bytes(),
        chunks,
        window: window.in_flight,
        prefill_tps,
    };
    if !forced && !should_pull(&case(usable - held, asks.len()), ctx.transfer.link(&peer)) {
        TransferState::add(&ctx.transfer.recomputed, 1);
        return 0;
    }
    let span = tracing::info_span!(
        "kv_pull",
        otel.name = "kv pull",
        switchyard.kv.peer = %peer,
        switchyard.kv.pull_blocks = (usable - held) as i64,
        switchyard.kv.pulled_tokens = tracing::field::Empty,
        switchyard.kv.pulled_bytes = tracing::field::Empty,
        error.type = tracing::field::Empty,
    );
    // The tokens past the last whole block the peer holds (the last prompt token is
    // computed here anyway, for its logits), asked for once the blocks are in.
    let tail = peer_tokens.min(tokens.len() - 1) - usable * bt;
    let tail_ask = (parts == 1 && tail > 0).then(|| KvPullRequest {
        tokens: tokens[..usable * bt + tail].to_vec(),
        blocks: 0,
        tail: tail as u32,
        ..ask(usable, 0, 0)
    });
    let run = Pull {
        ctx,
        peer: &peer,
        prefix: &prefix,
        adapter,
        format_key: format.key(),
        block_bytes: format.block_bytes(),
        parts,
        held,
        block_tokens: bt,
    };
    let started = Instant::now();
    let total = asks.len();
    let requests: Vec<Bytes> = asks.iter().map(|a| switchyard_messages::encode(a).into()).collect();
    let subject = ctx.subjects.kv_pull(&peer);
    let chunks = transfer::fetch(ctx.client.clone(), subject, requests, window);
    // A pull that takes longer than computing would have is given up: half again the
    // predicted compute time (at least a second), or `MAX_PULL` unmeasured.
    let limit = if prefill_tps.is_finite() && prefill_tps > 0.0 {
        Duration::from_secs_f64((1.5 * ((usable - held) * bt) as f64 / prefill_tps).clamp(1.0, MAX_PULL.as_secs_f64()))
    } else {
        MAX_PULL
    };
    let outcome = tracing::Instrument::instrument(run.fetch(chunks, total, case, limit), span.clone()).await;
    let imported = outcome.blocks;
    // (1.14) Every whole block came: the tokens past the last one too.
    let tail = match tail_ask {
        Some(ask) if outcome.stopped.is_none() && imported == usable - held => {
            tracing::Instrument::instrument(run.tail(ask, format.token_bytes()), span.clone()).await
        }
        _ => 0,
    };
    let bytes = imported * format.block_bytes() + tail * format.token_bytes();
    let imported_tokens = imported * bt + tail;
    span.record("switchyard.kv.pulled_tokens", imported_tokens as i64);
    span.record("switchyard.kv.pulled_bytes", bytes as i64);
    if let Some(why) = &outcome.stopped {
        span.record("error.type", "kv_pull");
        tracing::info!(worker = %ctx.worker_id, %peer, imported, "kv pull stopped early, computing the rest: {why}");
        TransferState::add(&ctx.transfer.pull_fallbacks, 1);
    }
    if imported > 0 {
        let secs = started.elapsed().as_secs_f64();
        ctx.transfer
            .observe(&peer, bytes as f64 / secs.max(1e-6), outcome.first_rtt);
        TransferState::add(&ctx.transfer.pulls, 1);
        TransferState::add(&ctx.transfer.pulled_tokens, imported_tokens as u64);
        TransferState::add(&ctx.transfer.pulled_bytes, bytes as u64);
    }
    imported_tokens
}

/// One pull in progress.
struct Pull<'a> {
    ctx: &'a ServeContext,
    peer: &'a str,
    prefix: &'a [u32],
    adapter: Option<String>,
    format_key: String,
    block_bytes: usize,
    parts: usize,
    /// Leading blocks held before the pull: the first one asked for.
    held: usize,
    block_tokens: usize,
}

/// What a pull achieved.
struct Outcome {
    /// Blocks imported, contiguous from the first one asked for.
    blocks: usize,
    /// Why it stopped before the last chunk (`None`: it did not).
    stopped: Option<String>,
    first_rtt: Duration,
}

impl Pull<'_> {
    async fn fetch(
        &self,
        chunks: impl futures::Stream<Item = Result<Bytes, transfer::TransferError>>,
        total: usize,
        case: impl Fn(usize, usize) -> PullCase,
        limit: Duration,
    ) -> Outcome {
        let kv = self.ctx.model.kv_transfer().expect("checked by pull");
        let started = Instant::now();
        let mut out = Outcome {
            blocks: 0,
            stopped: None,
            first_rtt: Duration::ZERO,
        };
        let mut block = Vec::new();
        let mut seen = 0;
        let mut chunks = std::pin::pin!(chunks);
        let deadline = tokio::time::sleep(limit);
        tokio::pin!(deadline);
        loop {
            let next = tokio::select! {
                next = chunks.next() => next,
                _ = &mut deadline => {
                    out.stopped = Some(format!("over {:.1} s, longer than computing it", limit.as_secs_f64()));
                    return out;
                }
            };
            let Some(next) = next else { return out };
            seen += 1;
            if seen == 1 {
                out.first_rtt = started.elapsed();
            }
            let chunk = match next.map_err(|e| e.to_string()).and_then(|b| self.check(&b)) {
                Ok(c) => c,
                Err(why) => {
                    out.stopped = Some(why);
                    return out;
                }
            };
            if chunk.blocks == 0 {
                out.stopped = Some(format!(
                    "{} no longer holds block {} (it holds {})",
                    self.peer, chunk.first_block, chunk.held_blocks
                ));
                return out;
            }
            block.extend_from_slice(&chunk.data);
            if self.parts > 1 && (chunk.part as usize) + 1 < self.parts {
                continue;
            }
            let count = if self.parts > 1 { 1 } else { chunk.blocks as usize };
            let blocks = KvBlocks {
                first_block: chunk.first_block as usize,
                count,
                data: std::mem::take(&mut block),
                held_blocks: 0,
            };
            let imported = kv.import_kv(self.prefix.to_vec(), self.adapter.clone(), blocks).await;
            if let Err(e) = imported {
                out.stopped = Some(format!("import: {e}"));
                return out;
            }
            out.blocks += count;
            // Still worth it at the rate measured so far?
            let left = (self.prefix.len() / self.block_tokens).saturating_sub(self.held + out.blocks);
            let rate = (out.blocks * self.block_bytes) as f64 / started.elapsed().as_secs_f64().max(1e-6);
            let link = super::policy::Link {
                bytes_per_sec: rate,
                rtt: out.first_rtt,
            };
            let chunks_left = total.saturating_sub(seen);
            if left > 0 && !should_pull(&case(left, chunks_left), link) {
                out.stopped = Some(format!("the link ({:.1} MB/s) is slower than computing", rate / 1e6));
                return out;
            }
        }
    }

    /// Pulls the prefix's tail `ask` names and imports it: its tokens (0 when the
    /// source sends none, or anything is amiss: they are computed then).
    async fn tail(&self, ask: KvPullRequest, token_bytes: usize) -> usize {
        let kv = self.ctx.model.kv_transfer().expect("checked by pull");
        let (tokens, tail) = (ask.tokens.clone(), ask.tail as usize);
        let window = Window {
            in_flight: 1,
            timeout: CHUNK_TIMEOUT,
        };
        let request: Bytes = switchyard_messages::encode(&ask).into();
        let subject = self.ctx.subjects.kv_pull(self.peer);
        let mut answer = std::pin::pin!(transfer::fetch(self.ctx.client.clone(), subject, vec![request], window));
        let chunk = match answer.next().await {
            Some(Ok(bytes)) => switchyard_messages::decode::<KvChunk>(&bytes).map_err(|e| e.to_string()),
            Some(Err(e)) => Err(e.to_string()),
            None => Err("no answer".into()),
        };
        let data = chunk.and_then(|c| match c.error {
            Some(e) => Err(format!("refused: {}", e.message)),
            None if c.format != self.format_key => Err("KV of another format".into()),
            None if c.tail as usize != tail || c.data.len() != tail * token_bytes => {
                Err(format!("{} tail tokens in {} bytes", c.tail, c.data.len()))
            }
            None => Ok(c.data),
        });
        let taken = match data {
            Ok(data) => kv
                .import_tail(tokens, self.adapter.clone(), data)
                .await
                .map_err(|e| e.to_string()),
            Err(why) => Err(why),
        };
        match taken {
            Ok(true) => tail,
            Ok(false) => 0,
            Err(why) => {
                tracing::debug!(worker = %self.ctx.worker_id, peer = %self.peer, "kv tail not pulled, computing it: {why}");
                0
            }
        }
    }

    /// Decodes a chunk and checks it is what was asked: the same format, no refusal,
    /// the expected size.
    fn check(&self, bytes: &[u8]) -> Result<KvChunk, String> {
        let chunk: KvChunk = switchyard_messages::decode(bytes).map_err(|e| format!("not a kv chunk: {e}"))?;
        if let Some(e) = chunk.error {
            return Err(format!("{} refused: {}", self.peer, e.message));
        }
        if chunk.format != self.format_key {
            return Err(format!("{} sent KV of another format ({})", self.peer, chunk.format));
        }
        let want = if self.parts > 1 {
            let len = self.block_bytes.div_ceil(self.parts);
            let at = chunk.part as usize * len;
            if chunk.blocks == 0 {
                0
            } else {
                len.min(self.block_bytes.saturating_sub(at))
            }
        } else {
            chunk.blocks as usize * self.block_bytes
        };
        if chunk.data.len() != want {
            return Err(format!(
                "{} sent {} bytes for {} blocks, not {want}",
                self.peer,
                chunk.data.len(),
                chunk.blocks
            ));
        }
        Ok(chunk)
    }
}
