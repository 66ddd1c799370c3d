//! KV that travels between workers (protocol 1.11), end to end on a real nats-server
//! with real CPU workers: a document prefilled on worker A is pulled by worker B when
//! a request on it is pinned to B (the coordinator names A in `Sy-Kv-Peer`), and B's
//! answer is token for token the one A computed cold — greedy and seeded, on
//! SmolLM2, on Gemma 3 (sliding-window rings) and with a LoRA adapter. A peer that
//! corrupts a chunk, sends KV of another format, sends a short chunk or dies
//! mid-transfer leaves B computing the rest, with the same answer; a pull naming
//! another format or adapter is refused by the source.

mod common;

use common::*;
use futures::StreamExt;
use std::path::Path;
use std::time::{Duration, Instant};
use switchyard::node;
use switchyard::{Client, Completion, GenerateRequest};
use switchyard_messages::kv_transfer::KV_TRANSFER_VERSION;
use switchyard_messages::subjects::HEADER_DIGEST;
use switchyard_messages::{
    decode, encode, Heartbeat, KvChunk, KvEvent, KvPullRequest, KvSnapshot, KvTransferStats, Subjects, WorkerRole,
    WorkerStatus,
};

const NAME: &str = "smol";

struct Fleet {
    _nats: switchyard_procs::nats_server::NatsServer,
    url: String,
    coordinator: switchyard_coordinator::CoordinatorHandle,
    workers: Vec<(switchyard_workers::WorkerHandle, node::Loaded)>,
    client: Client,
}

impl Fleet {
    /// A coordinator and workers `ids` serving `model` as [`NAME`], each with the
    /// adapters given.
    async fn start(model: &Path, ids: &[&str], adapters: Vec<switchyard_config::AdapterConfig>) -> Fleet {
        let workers: Vec<_> = ids.iter().map(|id| (*id, WorkerRole::Both)).collect();
        Self::start_as(model, &workers, adapters).await
    }

    /// The same with each worker's role in disaggregated prefill/decode.
    async fn start_as(
        model: &Path,
        workers: &[(&str, WorkerRole)],
        adapters: Vec<switchyard_config::AdapterConfig>,
    ) -> Fleet {
        let ids: Vec<&str> = workers.iter().map(|(id, _)| *id).collect();
        let nats = nats();
        let url = nats.url();
        let mut config = fleet_config(&url);
        config.worker.model = model.display().to_string();
        config.worker.model_name = NAME.into();
        config.worker.threads = 1;
        config.worker.adapters = adapters;
        let coordinator = node::start_coordinator(&config).await.unwrap();
        let mut started = Vec::new();
        for (id, role) in workers {
            let mut c = config.clone();
            c.worker.id = id.to_string();
            c.worker.role = *role;
            c.validate().unwrap();
            let loaded = node::load(&c).await.unwrap();
            started.push((node::start_worker(&c, &loaded).await.unwrap(), loaded));
        }
        let workers = started;
        let client = client(&url, Duration::from_secs(60)).await;
        wait_for_workers(&client, &ids, Duration::from_secs(10)).await;
        // KV travels once each worker has hashed its model and says so.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let s = client.status().await.unwrap();
            if s.workers.iter().all(|w| w.status.models[0].kv_format.is_some()) {
                break;
            }
            assert!(Instant::now() < deadline, "workers never announced a KV format");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Fleet {
            _nats: nats,
            url,
            coordinator,
            workers,
            client,
        }
    }

    async fn status(&self, worker: &str) -> WorkerStatus {
        let s = self.client.status().await.unwrap();
        s.workers
            .into_iter()
            .find(|w| w.status.worker_id == worker)
            .unwrap()
            .status
    }

    async fn transfer(&self, worker: &str) -> KvTransferStats {
        settle(&self.client).await;
        self.status(worker).await.kv.transfer
    }

    async fn stop(self) {
        for (w, mut loaded) in self.workers {
            w.shutdown(Duration::from_secs(5)).await;
            loaded.stop();
        }
        self.coordinator.shutdown().await;
    }
}

/// `prompt` pinned to `worker`, greedy or sampled with `seed`.
async fn ask(client: &Client, worker: &str, prompt: &str, seed: Option<u64>, adapter: Option<&str>) -> Completion {
    ask_pinned(client, NAME, worker, prompt, seed, adapter).await
}

/// A document A computes cold, then B (pinned) pulls from A: the same tokens, most of
/// the prompt pulled, not computed.
async fn pulled_equals_cold(f: &Fleet, topic: &str, sections: usize, seed: Option<u64>, adapter: Option<&str>) {
    let prompt = format!(
        "{}Question: who cared for the {topic}?\nAnswer:",
        document(topic, sections)
    );
    let cold = ask(&f.client, "w-a", &prompt, seed, adapter).await;
    assert!(
        cold.metrics.cached_tokens < 32,
        "A computes it cold: {:?}",
        cold.metrics
    );
    let before = f.transfer("w-b").await;
    let pulled = ask(&f.client, "w-b", &prompt, seed, adapter).await;
    let m = &pulled.metrics;
    let prompt_tokens = m.prompt_tokens as usize;
    assert_eq!(
        m.pulled_tokens as usize,
        prompt_tokens - 1,
        "B pulled every whole block of the prompt and its tail (all but its last token) from A: {m:?}"
    );
    assert!(m.cached_tokens >= m.pulled_tokens, "{m:?}");
    assert_eq!(
        token_ids(&pulled),
        token_ids(&cold),
        "{topic} (seed {seed:?}, adapter {adapter:?}): B's answer after the pull is A's cold answer"
    );
    let after = f.transfer("w-b").await;
    assert_eq!(after.pulls, before.pulls + 1, "{after:?}");
    assert_eq!(after.pulled_tokens - before.pulled_tokens, u64::from(m.pulled_tokens));
    assert_eq!(after.pull_fallbacks, before.pull_fallbacks);
    let served = f.transfer("w-a").await;
    assert!(
        served.served_bytes >= after.pulled_bytes - before.pulled_bytes,
        "{served:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_pulls_a_peers_prefix_and_answers_as_if_it_had_computed_it() {
    let f = Fleet::start(&demo_model(), &["w-a", "w-b"], Vec::new()).await;
    // About 1,500 tokens, greedy; then another document, seeded sampling.
    pulled_equals_cold(&f, "river", 36, None, None).await;
    pulled_equals_cold(&f, "harbour", 12, Some(7), None).await;

    // B holds the head of a document (its first twelve sections, from a shorter
    // question) and pulls only the rest.
    let long = format!("{}Question: who cared for the canal?\nAnswer:", document("canal", 30));
    let short = format!("{}Question: what was seen?\nAnswer:", document("canal", 12));
    let cold = ask(&f.client, "w-a", &long, None, None).await;
    let head = ask(&f.client, "w-b", &short, None, None).await;
    let rest = ask(&f.client, "w-b", &long, None, None).await;
    let m = &rest.metrics;
    let held = (head.metrics.prompt_tokens as usize - 12) / 32;
    assert!(held >= 10, "{:?}", head.metrics);
    assert!(
        m.pulled_tokens > 0 && (m.pulled_tokens as usize) <= m.prompt_tokens as usize - 1 - held * 32,
        "B pulled only what it lacked: {m:?}"
    );
    assert_eq!(m.cached_tokens as usize, m.prompt_tokens as usize - 1, "{m:?}");
    assert_eq!(
        token_ids(&rest),
        token_ids(&cold),
        "the head B held and the rest it pulled answer as A did"
    );

    // A pull of another format, or naming an adapter the source lacks, is refused.
    let nc = async_nats::connect(&f.url).await.unwrap();
    let subjects = Subjects::default();
    let format = f.status("w-a").await.models[0].kv_format.clone().unwrap();
    let pull = |format: String, adapter: Option<&str>| KvPullRequest {
        v: 1,
        transfer: KV_TRANSFER_VERSION,
        request_id: "t".into(),
        format,
        adapter: adapter.map(str::to_string),
        adapter_key: adapter.map(|a| format!("{a}|1|00")),
        tokens: vec![1; 64],
        first_block: 0,
        blocks: 1,
        part: 0,
        parts: 1,
        tail: 0,
    };
    let refused = |req: KvPullRequest| {
        let nc = nc.clone();
        let subject = subjects.kv_pull("w-a");
        async move {
            let reply = nc.request(subject, encode(&req).into()).await.unwrap();
            let chunk: KvChunk = decode(&reply.payload).unwrap();
            assert!(chunk.data.is_empty());
            chunk.error.expect("refused").message
        }
    };
    let other = switchyard_messages::KvFormat {
        model_sha256: "0".repeat(64),
        ..format.clone()
    };
    let why = refused(pull(other.key(), None)).await;
    assert!(why.contains("KV format mismatch"), "{why}");
    let why = refused(pull(format.key(), Some("nope"))).await;
    assert!(why.contains("nope"), "{why}");
    let why = refused(KvPullRequest {
        transfer: 99,
        ..pull(format.key(), None)
    })
    .await;
    assert!(why.contains("version"), "{why}");

    // `switchyard status` shows what moved.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["--nats", &f.url, "status"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && table.contains("KV between workers"), "{table}");
    let b = f.status("w-b").await.kv.transfer;
    let want = ["w-b".to_string(), b.pulls.to_string(), b.pulled_tokens.to_string()];
    assert!(
        table
            .lines()
            .any(|l| l.split_whitespace().take(3).eq(want.iter().map(String::as_str))),
        "w-b's pulls ({want:?}) in the table:\n{table}"
    );
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sliding_window_and_adapter_kv_travel_exactly() {
    if let Some(gemma) = gemma_model() {
        let f = Fleet::start(&gemma, &["w-a", "w-b"], Vec::new()).await;
        // Longer than Gemma 3's 512-token window: the rings lost the head, which
        // comes from the source's block store.
        pulled_equals_cold(&f, "lighthouse", 24, None, None).await;
        pulled_equals_cold(&f, "orchard", 8, Some(11), None).await;
        f.stop().await;
    }
    let dir = tempfile::tempdir().unwrap();
    let one = make_lora(dir.path(), 1);
    let adapter = switchyard_config::AdapterConfig {
        name: "one".into(),
        path: one.display().to_string(),
        scale: 1.0,
    };
    let f = Fleet::start(&demo_model(), &["w-a", "w-b"], vec![adapter]).await;
    pulled_equals_cold(&f, "meadow", 10, None, Some("one")).await;
    // The base model's KV of the same prompt is not the adapter's: nothing pulled.
    let prompt = format!("{}Question: who cared for the meadow?\nAnswer:", document("meadow", 10));
    let base = ask(&f.client, "w-a", &prompt, None, None).await;
    assert_eq!(base.metrics.cached_tokens, 0, "{:?}", base.metrics);
    f.stop().await;
}

/// How the impersonating peer misbehaves, after `good` chunks answered faithfully.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// A byte of the chunk flipped, its digest left as sent.
    Corrupt,
    /// KV of another format.
    Foreign,
    /// Half the chunk's bytes, with a digest that matches them.
    Short,
    /// No more answers (a source that died).
    Dies,
}

/// Poses as worker `fake` holding what `real` holds (its heartbeat and holdings), and
/// answers pulls by asking `real`, until the fault.
async fn impersonate(url: &str, real: &str, fake: &str, fault: Fault, good: usize) -> tokio::task::JoinHandle<()> {
    let nc = async_nats::connect(url).await.unwrap();
    let subjects = Subjects::default();
    let snapshot = nc.request(subjects.kv_snapshot(real), Vec::new().into()).await.unwrap();
    let snapshot: KvSnapshot = decode(&snapshot.payload).unwrap();
    let mut pulls = nc.subscribe(subjects.kv_pull(fake)).await.unwrap();
    let mut snapshots = nc.subscribe(subjects.kv_snapshot(fake)).await.unwrap();
    let status = Client::connect(url).await.unwrap().status().await.unwrap();
    let mut me = status
        .workers
        .into_iter()
        .find(|w| w.status.worker_id == real)
        .unwrap()
        .status;
    me.worker_id = fake.into();
    me.in_flight = 0;
    me.queued = 0;
    let mut beat = Heartbeat {
        status: me,
        speed: Default::default(),
    };
    nc.publish(subjects.heartbeat(fake), encode(&beat).into())
        .await
        .unwrap();
    let held = KvSnapshot {
        worker_id: fake.into(),
        ..snapshot
    };
    let event = KvEvent {
        v: 1,
        worker_id: fake.into(),
        seq: 1,
        precise: true,
        holdings: held.holdings.clone(),
        ..Default::default()
    };
    nc.publish(subjects.kv(fake), encode(&event).into()).await.unwrap();
    nc.flush().await.unwrap();
    let (real, nc2, fake) = (real.to_string(), nc.clone(), fake.to_string());
    tokio::spawn(async move {
        let mut n = 0;
        let mut beats = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                _ = beats.tick() => {
                    beat.status.seq += 1;
                    let _ = nc2.publish(subjects.heartbeat(&fake), encode(&beat).into()).await;
                }
                Some(s) = snapshots.next() => {
                    if let Some(r) = s.reply { let _ = nc2.publish(r, encode(&held).into()).await; }
                }
                Some(msg) = pulls.next() => {
                    let reply = msg.reply.unwrap();
                    if n >= good && matches!(fault, Fault::Dies) {
                        // Dead: it never answers again.
                        let _ = pulls.unsubscribe().await;
                        continue;
                    }
                    let answer = nc2.request(subjects.kv_pull(&real), msg.payload.clone()).await.unwrap();
                    let mut headers = answer.headers.clone().unwrap();
                    let mut payload = answer.payload.to_vec();
                    if n >= good {
                        match fault {
                            Fault::Corrupt => {
                                let at = payload.len() / 2;
                                payload[at] ^= 0x40;
                            }
                            Fault::Foreign | Fault::Short => {
                                let mut chunk: KvChunk = decode(&payload).unwrap();
                                if matches!(fault, Fault::Foreign) {
                                    chunk.format = chunk.format.replace("switchyard-cpu", "candle-cuda");
                                } else {
                                    chunk.data.truncate(chunk.data.len() / 2);
                                }
                                payload = encode(&chunk);
                                headers.insert(HEADER_DIGEST, switchyard_fabric::transfer::digest(&payload).as_str());
                            }
                            Fault::Dies => unreachable!(),
                        }
                    }
                    n += 1;
                    let _ = nc2.publish_with_headers(reply, headers, payload.into()).await;
                }
                else => return,
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bad_or_dying_source_leaves_the_rest_to_compute_and_the_answer_unchanged() {
    let f = Fleet::start(&demo_model(), &["w-a", "w-b"], Vec::new()).await;
    for (i, (fault, good)) in [
        (Fault::Corrupt, 2),
        (Fault::Foreign, 1),
        (Fault::Short, 0),
        (Fault::Dies, 3),
    ]
    .into_iter()
    .enumerate()
    {
        let topic = format!("{fault:?} quarry");
        let prompt = format!("{}Question: who cared for it?\nAnswer:", document(&topic, 8));
        let cold = ask(&f.client, "w-a", &prompt, None, None).await;
        // "z-…" sorts after "w-a": between equal holders the coordinator names it.
        let fake = format!("z-fake-{i}");
        let peer = impersonate(&f.url, "w-a", &fake, fault, good).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = f.transfer("w-b").await;
        let got = ask(&f.client, "w-b", &prompt, None, None).await;
        assert_eq!(token_ids(&got), token_ids(&cold), "{fault:?}: the answer is unchanged");
        assert_eq!(
            got.metrics.pulled_tokens as usize,
            good * 32,
            "{fault:?}: only the {good} good chunks were imported: {:?}",
            got.metrics
        );
        let after = f.transfer("w-b").await;
        assert_eq!(after.pull_fallbacks, before.pull_fallbacks + 1, "{fault:?}: {after:?}");
        peer.abort();
    }
    f.stop().await;
}

/// A request on `topic` (a document of `sections` sections), pinned to w-a, greedy
/// or sampled with `seed`, long enough to be interrupted.
fn story(topic: &str, sections: usize, seed: Option<u64>, adapter: Option<&str>) -> GenerateRequest {
    let prompt = format!(
        "{}Tell the whole story of the {topic}, year by year:\n",
        document(topic, sections)
    );
    let mut req = GenerateRequest::generate(Client::new_request_id(), NAME, prompt);
    req.head.worker = Some("w-a".into());
    req.head.adapter = adapter.map(str::to_string);
    req.config.max_tokens = 160;
    if let Some(seed) = seed {
        req.config.temperature = 0.8;
        req.config.seed = Some(seed);
    }
    req
}

/// A stream of `req`, read until it has at least 8 tokens.
async fn started(client: &Client, req: GenerateRequest) -> Started {
    let mut stream = client.generate(req).await.unwrap().without_resume();
    let mut ids = Vec::new();
    while ids.len() < 8 {
        match stream.next().await.unwrap().unwrap() {
            switchyard::StreamEvent::Tokens(t) => ids.extend(t.iter().map(|t| t.id)),
            switchyard::StreamEvent::Done { .. } => panic!("the stream ended before the drain"),
        }
    }
    Started { stream, ids }
}

struct Started {
    stream: switchyard::client::ResponseStream,
    ids: Vec<u32>,
}

impl Started {
    /// Reads the rest: every token, the final metrics, the worker that ended it and
    /// the longest wait between two chunks.
    async fn finish(mut self) -> (Vec<u32>, switchyard_messages::GenerateMetrics, String, Duration) {
        let mut gap = Duration::ZERO;
        let mut last = Instant::now();
        loop {
            let ev = self.stream.next().await.expect("the stream goes on");
            gap = gap.max(last.elapsed());
            last = Instant::now();
            match ev.unwrap_or_else(|e| panic!("the handed-over stream failed: {e}")) {
                switchyard::StreamEvent::Tokens(t) => self.ids.extend(t.iter().map(|t| t.id)),
                switchyard::StreamEvent::Done { metrics, .. } => {
                    return (self.ids, metrics, self.stream.worker_id().to_string(), gap)
                }
            }
        }
    }
}

/// Streams of `cases` (topic, sections, seed) run on w-a, which is drained (what
/// SIGTERM does) once each has 8 tokens; each must end on w-b (`taker`) or, with no
/// taker, on w-a, token for token the run w-a gave undisturbed. Returns each final
/// metrics.
async fn drained_mid_stream(
    f: &Fleet,
    cases: &[(&str, usize, Option<u64>)],
    adapter: Option<&str>,
    taker: Option<&str>,
) -> Vec<switchyard_messages::GenerateMetrics> {
    let mut want = Vec::new();
    for &(topic, sections, seed) in cases {
        let reference = f
            .client
            .generate(story(topic, sections, seed, adapter))
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        assert!(
            reference.tokens.len() > 60,
            "a stream long enough to move: {}",
            reference.text
        );
        want.push(token_ids(&reference));
    }
    let mut running = Vec::new();
    for &(topic, sections, seed) in cases {
        running.push(started(&f.client, story(topic, sections, seed, adapter)).await);
    }
    let a = f.workers[0].0.clone();
    let drained = tokio::spawn(async move { a.shutdown(Duration::from_secs(60)).await });
    let mut all = Vec::new();
    for ((case, want), run) in cases.iter().zip(want).zip(running) {
        let (ids, m, worker, gap) = run.finish().await;
        eprintln!("{case:?} {adapter:?}: longest gap between chunks {gap:?}, {m:?}");
        assert_eq!(ids, want, "{case:?}: the stream equals the undisturbed run");
        assert_eq!(worker, taker.unwrap_or("w-a"), "{case:?}: where it finished");
        all.push(m);
    }
    drained.await.unwrap();
    all
}

/// SIGTERM's drain on a worker running two streams (greedy and seeded): each is
/// handed to the other worker, which pulls the KV of its prompt and tokens so far
/// and streams on to the same client — the same tokens as an undisturbed run, no
/// sequence gap, `handovers: 1`, and nothing computed again (the taker computes only
/// the token sampled last, which no worker had run yet). The same on Gemma 3 (past
/// its sliding window) and with a LoRA adapter. A
/// lone worker, with nobody to take its streams, finishes them itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_draining_worker_hands_its_streams_on_with_their_kv() {
    let f = Fleet::start(&demo_model(), &["w-a", "w-b"], Vec::new()).await;
    let cases = [("lighthouse", 6, None), ("orchard", 6, Some(11))];
    for m in drained_mid_stream(&f, &cases, None, Some("w-b")).await {
        assert_eq!(m.handovers, 1, "{m:?}");
        assert!(m.pulled_tokens > 0, "its KV was pulled, not computed: {m:?}");
        // The prompt the taker computes is w-a's prompt and tokens so far: its
        // whole blocks and its tail are pulled, and only the token sampled last
        // (whose logits pick the next) is computed.
        assert_eq!(m.prompt_tokens - m.cached_tokens, 1, "nothing computed again: {m:?}");
    }
    let b = f.transfer("w-b").await;
    assert_eq!(b.taken_over, 2, "{b:?}");
    assert!(b.pulls >= 2, "{b:?}");
    f.stop().await;

    if let Some(gemma) = gemma_model() {
        let f = Fleet::start(&gemma, &["w-a", "w-b"], Vec::new()).await;
        // Past Gemma 3's 512-token window: the head comes from w-a's block store.
        let m = drained_mid_stream(&f, &[("canal", 14, None)], None, Some("w-b")).await;
        assert!(m[0].handovers == 1 && m[0].pulled_tokens >= 512, "{:?}", m[0]);
        assert_eq!(m[0].prompt_tokens - m[0].cached_tokens, 1, "{:?}", m[0]);
        f.stop().await;
    }

    let dir = tempfile::tempdir().unwrap();
    let adapter = switchyard_config::AdapterConfig {
        name: "one".into(),
        path: make_lora(dir.path(), 1).display().to_string(),
        scale: 1.0,
    };
    let f = Fleet::start(&demo_model(), &["w-a", "w-b"], vec![adapter]).await;
    let m = drained_mid_stream(&f, &[("meadow", 6, Some(5))], Some("one"), Some("w-b")).await;
    assert!(m[0].handovers == 1 && m[0].pulled_tokens > 0, "{:?}", m[0]);
    assert_eq!(m[0].prompt_tokens - m[0].cached_tokens, 1, "{:?}", m[0]);
    f.stop().await;

    // Nobody to take it: the stream finishes where it runs, unchanged.
    let f = Fleet::start(&demo_model(), &["w-a"], Vec::new()).await;
    let m = drained_mid_stream(&f, &cases[..1], None, None).await;
    assert_eq!(m[0].handovers, 0, "{:?}", m[0]);
    f.stop().await;
}

/// Disaggregated prefill/decode on CPU workers: with a `prefill` and a `decode`
/// worker, a long prompt (unpinned) goes to the decode worker — the prefill worker
/// takes no routed requests — whose coordinator names the prefill worker; it
/// computes the prompt, the decode worker pulls every whole block of it and streams
/// the answer, token for token the one a single worker gives, greedy and seeded — on
/// SmolLM2, on Gemma 3 past its sliding window and with a LoRA adapter. A short
/// prompt stays whole; a request pinned to the prefill worker is served there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_decode_worker_streams_what_a_prefill_worker_computed() {
    let cases = [("harbour", None), ("lighthouse", Some(9))];
    let f = disaggregated_equals_whole(&demo_model(), &cases, 36, Vec::new(), None).await;
    // Short prompts stay whole.
    let short = f
        .client
        .generate(greedy("The capital of France is", 4))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(short.worker_id, "w-d");
    assert_eq!((short.metrics.remote_prefill_us, short.metrics.pulled_tokens), (0, 0));
    // The prefill worker serves what is pinned to it, whole.
    let pinned = ask(&f.client, "w-p", "Once upon a time", None, None).await;
    assert_eq!(pinned.metrics.remote_prefill_us, 0);
    let (p, d) = (f.transfer("w-p").await, f.transfer("w-d").await);
    assert_eq!(
        (p.prefills_served, d.remote_prefills, d.remote_prefill_fallbacks),
        (2, 2, 0),
        "{p:?} {d:?}"
    );
    f.stop().await;

    // Gemma 3, past its 512-token sliding window, and a LoRA adapter: the same.
    if let Some(gemma) = gemma_model() {
        let f =
            disaggregated_equals_whole(&gemma, &[("canal", None), ("orchard", Some(3))], 20, Vec::new(), None).await;
        f.stop().await;
    }
    let dir = tempfile::tempdir().unwrap();
    let adapter = switchyard_config::AdapterConfig {
        name: "one".into(),
        path: make_lora(dir.path(), 1).display().to_string(),
        scale: 1.0,
    };
    let f = disaggregated_equals_whole(&demo_model(), &[("meadow", Some(5))], 24, vec![adapter], Some("one")).await;
    f.stop().await;
}

/// Each case's question on a document of `sections` parts, answered by a single
/// worker and then (unpinned) by a `decode` worker that has a `prefill` worker compute
/// the prompt: token for token the same, every whole block pulled. Returns the
/// disaggregated fleet (`w-p`, `w-d`).
async fn disaggregated_equals_whole(
    model: &Path,
    cases: &[(&str, Option<u64>)],
    sections: usize,
    adapters: Vec<switchyard_config::AdapterConfig>,
    adapter: Option<&str>,
) -> Fleet {
    let question = |topic: &str| {
        format!(
            "{}Question: who cared for the {topic}?\nAnswer:",
            document(topic, sections)
        )
    };
    let f = Fleet::start(model, &["w-a"], adapters.clone()).await;
    let mut want = Vec::new();
    for &(topic, seed) in cases {
        want.push(token_ids(&ask(&f.client, "w-a", &question(topic), seed, adapter).await));
    }
    f.stop().await;

    let roles = [("w-p", WorkerRole::Prefill), ("w-d", WorkerRole::Decode)];
    let f = Fleet::start_as(model, &roles, adapters).await;
    for (&(topic, seed), want) in cases.iter().zip(&want) {
        let mut req = GenerateRequest::generate(Client::new_request_id(), NAME, question(topic));
        req.config.max_tokens = 24;
        req.head.adapter = adapter.map(str::to_string);
        if let Some(seed) = seed {
            req.config.temperature = 0.8;
            req.config.seed = Some(seed);
        }
        let done = f.client.generate(req).await.unwrap().collect().await.unwrap();
        let m = &done.metrics;
        eprintln!("{topic} ({adapter:?}): {m:?}");
        assert_eq!(done.worker_id, "w-d", "the decode worker streams it");
        assert_eq!(
            &token_ids(&done),
            want,
            "{topic} ({adapter:?}): as a single worker answers"
        );
        assert!(m.remote_prefill_us > 0, "prefilled on w-p: {m:?}");
        assert_eq!(
            m.pulled_tokens as usize,
            m.prompt_tokens as usize - 1,
            "every token pulled but the last, none computed here: {m:?}"
        );
        settle(&f.client).await;
    }
    f
}

/// A session (seed 002) moves with its KV when its worker drains (protocol 1.13):
/// w-b adopts it, pulls the resident prefix, suffix and generated tokens from w-a,
/// and answers on the same session id and fence; the caller keeps calling through
/// the move and no call fails; the next decode (greedy, then seeded) is token for
/// token what the undisturbed session gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_draining_worker_moves_its_sessions_with_their_kv() {
    use switchyard_messages::session::{ContextManifest, OpenSessionRequest};
    use switchyard_messages::GenerateConfig;
    let f = Fleet::start(&demo_model(), &["w-a", "w-b"], Vec::new()).await;
    let manifest = ContextManifest {
        profile: "reader".into(),
        model: "smol".into(),
        ..ContextManifest::default()
    };
    let open = |worker: &str| OpenSessionRequest {
        fence: "owner-1".into(),
        worker_id: worker.into(),
        ..OpenSessionRequest::default()
    };
    let prefix = document("harbour", 20);
    let suffix = "\nQuestion: who kept the harbour lights?\nAnswer:";
    let greedy_cfg = GenerateConfig {
        max_tokens: 12,
        ..GenerateConfig::default()
    };
    let seeded_cfg = GenerateConfig {
        max_tokens: 12,
        temperature: 0.8,
        seed: Some(7),
        ..GenerateConfig::default()
    };
    let ids = |c: &Completion| c.tokens.iter().map(|t| t.id).collect::<Vec<_>>();
    // The undisturbed session, on w-a (w-b must not hold this prefix: it pulls it).
    let reference = f.client.open_session(open("w-a")).await.unwrap();
    reference.ensure_prefix(&prefix, &manifest).await.unwrap();
    reference.prefill_suffix(suffix, &manifest).await.unwrap();
    let mut want = Vec::new();
    for cfg in [&greedy_cfg, &greedy_cfg, &seeded_cfg] {
        let c = reference.decode(cfg.clone()).await.unwrap().collect().await.unwrap();
        want.push(ids(&c));
    }
    reference.close().await.unwrap();

    let s = f.client.open_session(open("w-a")).await.unwrap();
    s.ensure_prefix(&prefix, &manifest).await.unwrap();
    s.prefill_suffix(suffix, &manifest).await.unwrap();
    let first = s.decode(greedy_cfg.clone()).await.unwrap().collect().await.unwrap();
    assert_eq!((ids(&first), first.worker_id.as_str()), (want[0].clone(), "w-a"));
    let before = s.explain().await.unwrap();
    // SIGTERM's drain while the caller keeps calling: every call is answered.
    let a = f.workers[0].0.clone();
    let drain = tokio::spawn(async move { a.shutdown(Duration::from_secs(60)).await });
    let mut calls = 0;
    while !drain.is_finished() {
        let r = s.explain().await.expect("a call during the move");
        assert_eq!(r.resident_tokens, before.resident_tokens, "{r:?}");
        calls += 1;
    }
    drain.await.unwrap();
    let after = s.explain().await.unwrap();
    eprintln!("{calls} calls during the move; before {before:?}; after {after:?}");
    assert_eq!(
        (
            after.resident_tokens,
            after.prefix_tokens,
            &after.stable_token_hash,
            &after.manifest_digest
        ),
        (
            before.resident_tokens,
            before.prefix_tokens,
            &before.stable_token_hash,
            &before.manifest_digest
        ),
        "the session's state moved"
    );
    for (cfg, want) in [(&greedy_cfg, &want[1]), (&seeded_cfg, &want[2])] {
        let c = s.decode(cfg.clone()).await.unwrap().collect().await.unwrap();
        assert_eq!(c.worker_id, "w-b", "the adopter decodes");
        assert_eq!(&ids(&c), want, "as the undisturbed session");
    }
    let b = f.transfer("w-b").await;
    assert_eq!(b.sessions_adopted, 1, "{b:?}");
    assert!(
        b.pulled_tokens as u32 >= before.resident_tokens / 32 * 32 - 32,
        "its KV was pulled: {b:?}"
    );
    s.close().await.unwrap();
    f.stop().await;
}
