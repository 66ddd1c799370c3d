//! Property-based fuzzing of every decoder of the wire contract: each type a process
//! decodes from the network (see `TARGETS`) is fed random bytes, byte-level mutations
//! of a valid encoding, structure-level mutations of a valid encoding (a field's value
//! replaced, a field added, removed or repeated) and MessagePack documents built from
//! the contract's field names. Decoding must return `Ok` or `Err`, never panic, never
//! allocate more than `MEMORY_LIMIT` (a declared length is not a size to allocate); a
//! value that decodes must pass through what a receiver does next (validation, routing
//! keys, digests) without a panic and must re-encode to bytes that decode to the same
//! bytes again.
//!
//! Each property runs `DEFAULT_CASES` cases; `PROPTEST_CASES=N` overrides that for a
//! long run (`PROPTEST_RNG_SEED=S` replays one). Failure-persistence files are off, so
//! a run writes nothing into the source tree.
//!
//! `deep_nesting_does_not_overflow_the_stack` found that unoptimized decoders
//! overflowed a 2 MiB stack before rmp-serde's own depth limit (1024) stopped them;
//! `codec::decode` now caps nesting at `codec::MAX_DEPTH`.
//!
//! Not decoded, so not here: cancel messages (`{p}.v1.cancel.{id}`: the id is read
//! from the subject, the payload is ignored), discovery pings and snapshot requests
//! (empty payloads, only the reply subject is used).

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};
use switchyard_messages::kv::{leading_overlap, prefix_blocks, routing_key};
use switchyard_messages::session::{
    ContextManifest, ContextReport, DecodeRequest, OpenSessionRequest, PrefixStatus, SegmentRequest, SessionCall,
    SessionConfig, SessionModelInfo, SessionOpened, SuffixStatus,
};
use switchyard_messages::*;

/// Cases per property when `PROPTEST_CASES` is not set.
const DEFAULT_CASES: u32 = 512;

/// Most bytes one decode of a fuzz input (a few KiB) may hold at once, and the largest
/// single allocation it may ask for.
const MEMORY_LIMIT: usize = 32 << 20;

// ---------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------

/// `DEFAULT_CASES` unless `PROPTEST_CASES` is set: `Config::default()` has already
/// read every `PROPTEST_*` variable, so it is the base and only `cases` is changed,
/// and only when the variable is absent. No failure-persistence files.
fn config() -> Config {
    let base = Config::default();
    Config {
        cases: if std::env::var_os("PROPTEST_CASES").is_some() {
            base.cases
        } else {
            DEFAULT_CASES
        },
        failure_persistence: None,
        ..base
    }
}

/// Runs `test` over `strategy` for `config().cases` cases; on failure, panics with
/// the (shrunk) input and the reason. `test` returns how many decoders accepted its
/// input; the share of inputs some decoder accepted is printed (with `--nocapture`),
/// to show how far past the first byte a property gets.
fn check<S: Strategy>(property: &str, strategy: S, test: impl Fn(S::Value) -> Result<usize, TestCaseError>)
where
    S::Value: std::fmt::Debug,
{
    let config = config();
    let cases = config.cases;
    let started = Instant::now();
    let (ran, accepted) = (Cell::new(0u32), Cell::new(0u32));
    let mut runner = TestRunner::new(config);
    let result = runner.run(&strategy, |input| {
        let n = test(input)?;
        ran.set(ran.get() + 1);
        accepted.set(accepted.get() + u32::from(n > 0));
        Ok(())
    });
    match result {
        Ok(()) => eprintln!(
            "{property}: {cases} cases in {:.1?}; {} of {} inputs decoded as some type",
            started.elapsed(),
            accepted.get(),
            ran.get()
        ),
        Err(TestError::Fail(reason, input)) => panic!("{property} failed: {reason}\nminimal input: {input:?}"),
        Err(e) => panic!("{property}: {e}"),
    }
}

// ---------------------------------------------------------------------------------
// Memory accounting: per thread, so tests running in parallel do not mix.
// ---------------------------------------------------------------------------------

struct Tracking;

thread_local! {
    /// Bytes allocated minus bytes freed by this thread.
    static LIVE: Cell<isize> = const { Cell::new(0) };
    /// Highest `LIVE` since the last `measure` started.
    static PEAK: Cell<isize> = const { Cell::new(0) };
    /// Largest single allocation since the last `measure` started.
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn account(grow: usize, shrink: usize) {
    let _ = LIVE.try_with(|live| {
        let now = live.get() + grow as isize - shrink as isize;
        live.set(now);
        let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
    });
    let _ = LARGEST.try_with(|l| l.set(l.get().max(grow)));
}

unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        account(layout.size(), 0);
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        account(layout.size(), 0);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        account(new_size, layout.size());
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        account(0, layout.size());
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Tracking = Tracking;

/// Runs `f`; returns its result, the most bytes it held at once and its largest
/// single allocation.
fn measure<R>(f: impl FnOnce() -> R) -> (R, usize, usize) {
    let start = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(start));
    LARGEST.with(|l| l.set(0));
    let r = f();
    let held = (PEAK.with(Cell::get) - start).max(0) as usize;
    (r, held, LARGEST.with(Cell::get))
}

// ---------------------------------------------------------------------------------
// The decoders
// ---------------------------------------------------------------------------------

/// One type a process decodes from the network.
struct Target {
    name: &'static str,
    /// Decodes `bytes`, and when that succeeds does what a receiver does next.
    /// Returns whether it decoded.
    run: fn(&[u8]) -> bool,
    /// Valid encodings of realistic values.
    seeds: fn() -> Vec<Vec<u8>>,
}

/// `encode(decoded)` must decode again, to a value that encodes to the same bytes.
fn reencodes<T: serde::Serialize + serde::de::DeserializeOwned>(v: &T) {
    let once = encode(v);
    let back: T = decode(&once).unwrap_or_else(|e| panic!("our own encoding {} does not decode: {e}", hex(&once)));
    let twice = encode(&back);
    assert_eq!(hex(&once), hex(&twice), "re-encoding is not stable");
}

macro_rules! target {
    ($t:ty, $seeds:expr, |$v:ident| $then:block) => {
        Target {
            name: stringify!($t),
            run: |bytes| match decode::<$t>(bytes) {
                Ok($v) => {
                    let _ = format!("{:?}", $v);
                    $then
                    reencodes(&$v);
                    true
                }
                Err(e) => {
                    let _ = e.to_string();
                    false
                }
            },
            seeds: || $seeds.iter().map(|v| encode(v)).collect(),
        }
    };
}

/// The limits receivers check against: the defaults, and tight ones so every "over
/// the limit" branch is reached too.
#[allow(clippy::needless_update)] // a limit added later keeps its default here
fn limits() -> [InputLimits; 2] {
    [
        InputLimits::default(),
        InputLimits {
            max_prompt_bytes: 4,
            max_messages: 1,
            max_stop_strings: 1,
            max_stop_bytes: 1,
            max_stop_tokens: 1,
            max_tokens: 1,
            max_batch_prompts: 1,
            max_classify_prompts: 1,
            max_logits_prompts: 0,
            max_session_text_bytes: 4,
            ..InputLimits::default()
        },
    ]
}

fn error_text(e: &WireError) {
    let _ = (e.to_string(), e.code.as_str(), e.code.retryable());
}

/// Every type a process decodes from the network (coordinator, worker, client).
const TARGETS: &[Target] = &[
    target!(GenerateRequest, seed_generate(), |r| {
        for l in limits() {
            for chat in [false, true] {
                if let Err(e) = validate_request(&r, chat, &l) {
                    error_text(&e);
                }
            }
        }
        let _ = (check_deadline(&r, 0), check_deadline(&r, u64::MAX));
        let blocks = prefix_blocks(&routing_key(r.prompt.as_deref(), r.messages.as_deref()));
        let _ = leading_overlap(&blocks, |h| h % 2 == 0);
    }),
    target!(ClassifyRequest, seed_classify(), |r| {
        for l in limits() {
            let _ = validate_classify(&r, &l);
        }
    }),
    target!(EmbedRequest, seed_embed(), |r| {
        for l in limits() {
            let _ = validate_embed(&r, &l);
        }
    }),
    target!(EmbedReply, seed_embed_reply(), |r| {
        for item in &r.results {
            if let Some(e) = &item.error {
                error_text(e);
            }
        }
    }),
    target!(BatchRequest, seed_batch(), |r| {
        for l in limits() {
            let _ = validate_batch(&r, &l);
        }
    }),
    target!(RequestHead, [seed_head()], |h| {
        let _ = (check_version(h.v), check_request_id(&h.request_id));
    }),
    target!(StreamChunk, seed_chunks(), |c| {
        let _ = c.finish_reason.map(FinishReason::as_str);
        if let Some(e) = &c.error {
            error_text(e);
        }
    }),
    target!(Admission, seed_admissions(), |a| {
        if let Some(e) = &a.error {
            error_text(e);
        }
    }),
    target!(WorkerStatus, [seed_status()], |s| {
        let _ = (BackendKind::rank(&s.backend), s.backend.parse::<BackendKind>());
        let _ = s.device.parse::<Device>().map(|d| d.to_string());
    }),
    target!(KvEvent, [seed_kv_event()], |e| {
        let _ = leading_overlap(&e.stored, |h| !e.removed.contains(&h));
    }),
    target!(KvSnapshot, [seed_kv_snapshot()], |s| {
        let _ = leading_overlap(&s.blocks, |h| h != 0);
    }),
    target!(OpenSessionRequest, [seed_open()], |r| {
        let _ = (validate_open(&r), r.config.digest());
    }),
    target!(SegmentRequest, [seed_segment()], |r| {
        for l in limits() {
            let _ = validate_segment(&r, &l);
        }
        let _ = r.manifest.digest();
    }),
    target!(DecodeRequest, [seed_decode()], |r| {
        for l in limits() {
            let _ = validate_decode(&r, &l);
        }
    }),
    target!(SessionCall, [seed_session_call()], |c| {
        let _ = validate_session_call(c.v);
    }),
    target!(SessionOpened, [seed_opened()], |_o| {}),
    target!(PrefixStatus, [seed_prefix_status()], |_s| {}),
    target!(SuffixStatus, [seed_suffix_status()], |_s| {}),
    target!(ContextReport, [seed_context_report()], |r| {
        let _ = r.manifest.digest();
    }),
    target!(SessionModelInfo, [seed_model_info()], |_i| {}),
    target!(ErrorReply, [seed_error_reply()], |r| {
        error_text(&r.error);
    }),
    target!(FleetStatus, [seed_fleet()], |f| {
        for w in &f.workers {
            let _ = BackendKind::rank(&w.status.backend);
        }
    }),
    target!(ModelsReply, [seed_models()], |_m| {}),
    target!(ClassifyReply, [seed_classify_reply()], |_r| {}),
    target!(BatchReply, [seed_batch_reply()], |_r| {}),
    // A worker that refuses a request it cannot decode as a GenerateRequest reads
    // `request_id` from it untyped, to address the error chunk.
    target!(serde_json::Value, seed_generate(), |v| {
        let _ = v.get("request_id").and_then(|r| r.as_str());
    }),
];

/// Feeds `bytes` to every decoder; a panic, an unstable re-encoding or too much
/// memory fails, naming the decoder and the input. Returns how many decoded it.
fn decode_all(bytes: &[u8]) -> Result<usize, TestCaseError> {
    TARGETS
        .iter()
        .try_fold(0, |n, t| decode_one(t, bytes).map(|ok| n + usize::from(ok)))
}

/// One decoder (see `decode_all`); returns whether it decoded `bytes`.
fn decode_one(t: &Target, bytes: &[u8]) -> Result<bool, TestCaseError> {
    decode_within(t, bytes, MEMORY_LIMIT)
}

/// `decode_one` with its own memory limit.
fn decode_within(t: &Target, bytes: &[u8], limit: usize) -> Result<bool, TestCaseError> {
    let (outcome, held, largest) = measure(|| catch_unwind(AssertUnwindSafe(|| (t.run)(bytes))));
    let decoded = match outcome {
        Ok(decoded) => decoded,
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            return Err(TestCaseError::fail(format!(
                "decode::<{}> panicked: {msg}\ninput ({} bytes): {}",
                t.name,
                bytes.len(),
                hex(bytes)
            )));
        }
    };
    if held > limit || largest > limit {
        return Err(TestCaseError::fail(format!(
            "decode::<{}> held {held} bytes (largest allocation {largest}) for a {}-byte input: {}",
            t.name,
            bytes.len(),
            hex(bytes)
        )));
    }
    Ok(decoded)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

// ---------------------------------------------------------------------------------
// Seeds: realistic values with every optional field set, so mutations reach them.
// ---------------------------------------------------------------------------------

fn seed_error() -> WireError {
    WireError::new(ErrorCode::Overloaded, "queue full").with_retry_after(250)
}

fn seed_config() -> GenerateConfig {
    GenerateConfig {
        max_tokens: 64,
        temperature: 0.7,
        top_k: 40,
        top_p: 0.9,
        min_p: 0.05,
        repeat_penalty: 1.1,
        repeat_last_n: 64,
        presence_penalty: 0.5,
        frequency_penalty: -0.25,
        seed: Some(42),
        stop_tokens: vec![2, 32_000],
        stop: vec!["\n\n".into(), "</s>".into()],
        return_logits: true,
        rng_position: 3,
        fit_max_tokens: true,
        logit_bias: vec![(7, -100.0), (1234, 2.5)],
        logprobs: Some(5),
        constraint: Some(switchyard_messages::Constraint::JsonSchema {
            schema: r#"{"type":"object","properties":{"a":{"type":"integer"}}}"#.into(),
        }),
        // In-process only: it does not travel.
        adapter: None,
    }
}

fn seed_head() -> RequestHead {
    RequestHead {
        backend: Some("cpu".into()),
        worker: Some("w-0".into()),
        deadline_ms: Some(1_700_000_000_000),
        tenant: Some("team-a".into()),
        priority: Some(switchyard_messages::Priority::Batch),
        queue_ms: Some(5_000),
        ..RequestHead::new("req-1", "smollm2")
    }
}

fn seed_generate() -> Vec<GenerateRequest> {
    let mut full = GenerateRequest::generate("req-1", "smollm2", "Once upon a time, é");
    full.head = seed_head();
    // Generation may name a LoRA adapter (classify and embed may not).
    full.head.adapter = Some("support-tone".into());
    full.config = seed_config();
    let mut chat = GenerateRequest::chat(
        "req-2",
        "smollm2",
        vec![Message::new("system", "Be brief."), Message::new("user", "hi")],
    );
    chat.config = seed_config();
    chat.config.constraint = None;
    let mut tools = GenerateRequest::chat("req-3", "smollm2", vec![Message::new("user", "time?")]);
    let mut call = Message::new("assistant", "");
    call.tool_calls = vec![switchyard_messages::ToolCall {
        id: "call_1".into(),
        name: "get_time".into(),
        arguments: "{}".into(),
    }];
    let mut answer = Message::new("tool", "12:00");
    answer.tool_call_id = Some("call_1".into());
    tools.messages.as_mut().unwrap().extend([call, answer]);
    tools.tools = vec![switchyard_messages::Tool {
        name: "get_time".into(),
        description: "the time".into(),
        parameters: r#"{"type":"object"}"#.into(),
    }];
    tools.tool_choice = switchyard_messages::ToolChoice::Function {
        name: "get_time".into(),
    };
    tools.parallel_tool_calls = false;
    vec![full, chat, tools, GenerateRequest::generate("r", "", "x")]
}

fn seed_classify() -> Vec<ClassifyRequest> {
    vec![ClassifyRequest {
        head: seed_head(),
        prompts: vec!["The sky is".into(), "2 + 2 =".into()],
        return_logits: true,
    }]
}

fn seed_embed() -> Vec<EmbedRequest> {
    vec![EmbedRequest {
        head: seed_head(),
        inputs: vec![
            EmbedInput::Text("The sky is blue.".into()),
            EmbedInput::Tokens(vec![1, 2, 3]),
        ],
    }]
}

fn seed_embed_reply() -> Vec<EmbedReply> {
    vec![EmbedReply {
        v: 1,
        request_id: "req-1".into(),
        worker_id: "w-0".into(),
        results: vec![
            EmbedItem {
                embedding: vec![0.6, -0.8],
                tokens: 4,
                error: None,
            },
            EmbedItem {
                embedding: Vec::new(),
                tokens: 0,
                error: Some(seed_error()),
            },
        ],
    }]
}

fn seed_batch() -> Vec<BatchRequest> {
    vec![BatchRequest {
        head: seed_head(),
        prompts: vec!["a".into(), "b".into()],
        config: seed_config(),
    }]
}

fn seed_token() -> Token {
    Token {
        id: 7,
        text: "é".into(),
        logprob: None,
        reasoning: false,
    }
}

fn seed_chunks() -> Vec<StreamChunk> {
    vec![
        StreamChunk {
            v: 1,
            request_id: "req-1".into(),
            seq: 3,
            tokens: vec![
                seed_token(),
                Token {
                    id: 8,
                    text: "".into(),
                    logprob: Some(switchyard_messages::TokenLogprob {
                        logprob: -0.25,
                        bytes: vec![0xe2, 0x82],
                        top: vec![switchyard_messages::TopLogprob {
                            id: 9,
                            bytes: b"x".to_vec(),
                            logprob: -1.5,
                        }],
                    }),
                    reasoning: false,
                },
            ],
            done: true,
            finish_reason: Some(FinishReason::Length),
            metrics: Some(GenerateMetrics {
                prompt_tokens: 5,
                cached_tokens: 1,
                generated_tokens: 2,
                prefill_us: 10,
                decode_us: 20,
                total_us: 40,
                queue_us: 3,
                prefill_tokens_per_sec: 500.5,
                decode_tokens_per_sec: 100.25,
                resumes: 1,
                peak_memory_bytes: 1 << 30,
                active_memory_bytes: 1 << 29,
                fleet_queue_us: 2_500,
                draft_tokens: 9,
                accepted_tokens: 7,
                predicted_cached_tokens: Some(1),
                block_predicted_cached_tokens: Some(0),
                pulled_tokens: 1,
                pull_us: 1_500,
                handovers: 1,
                remote_prefill_us: 250_000,
                stop_sequence: Some("END".into()),
            }),
            error: Some(seed_error()),
            worker_id: Some("w-0".into()),
            tool_calls: Vec::new(),
        },
        StreamChunk::failed("req-1", 0, WireError::new(ErrorCode::NoWorker, "none")),
    ]
}

fn seed_admissions() -> Vec<Admission> {
    vec![
        Admission {
            v: 1,
            worker_id: "w-0".into(),
            accepted: false,
            error: Some(seed_error()),
        },
        Admission {
            v: 1,
            worker_id: "w-0".into(),
            accepted: true,
            error: None,
        },
    ]
}

fn seed_model_info_struct() -> ModelInfo {
    ModelInfo {
        architecture: "llama".into(),
        vocab_size: 49_152,
        num_layers: 30,
        hidden_size: 576,
        quant_bits: 4,
        quant_group: 32,
        context_len: 8192,
        kernels: "avx2".into(),
        embedding_dim: 576,
        embedding_only: false,
        pipeline: None,
    }
}

fn seed_status() -> WorkerStatus {
    WorkerStatus {
        v: 1,
        worker_id: "w-0".into(),
        device: "rocm:1(cpu)".into(),
        backend: "llama_cpp".into(),
        models: vec![ServedModel {
            name: "smollm2".into(),
            path: "/models/smollm2.gguf".into(),
            info: seed_model_info_struct(),
            adapters: vec![switchyard_messages::ServedAdapter {
                name: "support-tone".into(),
                path: "/adapters/support-tone".into(),
                scale: 0.5,
                exclusive: false,
            }],
            kv_format: Some(switchyard_messages::KvFormat {
                engine: "switchyard-cpu/1".into(),
                model_sha256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08".into(),
                dtype: "f16".into(),
                layers: 30,
                kv_heads: 3,
                head_dim: 64,
                block_tokens: 32,
                params: "rope=100000/64/10000/norm,swa=0/0".into(),
            }),
        }],
        capacity: 4,
        queue_capacity: 16,
        in_flight: 2,
        queued: 1,
        available: true,
        draining: false,
        host: "node-1".into(),
        pid: 1234,
        started_at_ms: 1_700_000_000_000,
        seq: 99,
        completed: 1000,
        version: "0.1.0".into(),
        kv: KvUsage {
            slots: 4,
            busy: 2,
            sessions: 1,
            resident_tokens: 4096,
            resident_bytes: 1 << 24,
            store_blocks: 12,
            store_bytes: 1 << 20,
            store_budget_bytes: 1 << 26,
            hit_ratio: 0.5,
            transfer: switchyard_messages::KvTransferStats {
                pulls: 3,
                pulled_tokens: 960,
                pulled_bytes: 22_118_400,
                pull_fallbacks: 1,
                recomputed: 2,
                served_chunks: 30,
                served_bytes: 22_118_400,
                handed_over: 2,
                taken_over: 1,
                handover_fallbacks: 1,
                prefills_served: 4,
                remote_prefills: 3,
                remote_prefill_fallbacks: 1,
                sessions_moved: 2,
                sessions_adopted: 1,
            },
        },
        recent: RecentLatency {
            requests: 64,
            ttft_ms: 12.5,
            tpot_ms: 3.25,
            draft_tokens: 900,
            accepted_tokens: 700,
        },
        nats_server: "n1 (10.0.0.5:4222)".into(),
        role: switchyard_messages::WorkerRole::Decode,
    }
}

fn seed_kv_event() -> KvEvent {
    KvEvent {
        v: 1,
        worker_id: "w-0".into(),
        seq: 5,
        stored: vec![1, u64::MAX, 0xdead_beef],
        removed: vec![2],
        precise: true,
        holdings: vec![seed_kv_holding()],
        released: vec![7],
    }
}

fn seed_kv_holding() -> switchyard_messages::KvHolding {
    switchyard_messages::KvHolding {
        id: 9,
        key: "user\0hi\0assistant\0".into(),
        bounds: vec![0, 5, 8, 19, 20],
        min_reuse: 0,
        granule: 1,
        min_share: 100,
        adapter: Some("support-tone".into()),
    }
}

fn seed_kv_snapshot() -> KvSnapshot {
    KvSnapshot {
        v: 1,
        worker_id: "w-0".into(),
        seq: 5,
        blocks: vec![1, 2, u64::MAX],
        precise: true,
        holdings: vec![seed_kv_holding()],
    }
}

fn seed_manifest() -> ContextManifest {
    ContextManifest {
        profile: "default".into(),
        model: "smollm2".into(),
        tokenizer_digest: "0011223344556677".into(),
        template_digest: "8899aabbccddeeff".into(),
        runtime_digest: "0123456789abcdef".into(),
        disable_bos: true,
        stable_hash: "aa".into(),
        volatile_hash: "bb".into(),
    }
}

fn seed_open() -> OpenSessionRequest {
    OpenSessionRequest {
        model_type: "gguf".into(),
        digest: "sha256:00".into(),
        path: "/models/smollm2.gguf".into(),
        config: SessionConfig {
            num_ctx: 4096,
            num_batch: 512,
            num_threads: 0,
            num_gpu_layers: -1,
            tensor_split: vec![0.5, 0.5],
            flash_attn: true,
            kv_cache_type: "f16".into(),
            prompt_format: "chatml".into(),
            prompt_template_digest: "cafe".into(),
            disable_bos: false,
        },
        backend: "cpu".into(),
        worker_id: "w-0".into(),
        ..OpenSessionRequest::new("owner-1", "smollm2")
    }
}

fn seed_segment() -> SegmentRequest {
    SegmentRequest {
        v: 1,
        fence: "owner-1".into(),
        text: "You are a helpful assistant.".into(),
        manifest: seed_manifest(),
    }
}

fn seed_decode() -> DecodeRequest {
    DecodeRequest {
        v: 1,
        fence: "owner-1".into(),
        request_id: "req-3".into(),
        config: seed_config(),
    }
}

fn seed_session_call() -> SessionCall {
    SessionCall {
        v: 1,
        fence: "owner-1".into(),
    }
}

fn seed_model_info() -> SessionModelInfo {
    SessionModelInfo {
        model_max_context: 8192,
        effective_context: 4096,
        kv_bytes_per_token: 1 << 14,
        free_bytes: 1 << 33,
        weights_bytes: 1 << 28,
    }
}

fn seed_opened() -> SessionOpened {
    SessionOpened {
        v: 1,
        session_id: "s-1".into(),
        worker_id: "w-0".into(),
        num_ctx: 4096,
        info: seed_model_info(),
    }
}

fn seed_prefix_status() -> PrefixStatus {
    PrefixStatus {
        reused_tokens: 10,
        prefilled_tokens: 5,
        dropped_tokens: 1,
        prefix_tokens: 15,
        resident_tokens: 15,
        available_tokens: 4081,
        stable_byte_hash: "01".into(),
        stable_token_hash: "02".into(),
        manifest_digest: "03".into(),
    }
}

fn seed_suffix_status() -> SuffixStatus {
    SuffixStatus {
        suffix_tokens: 3,
        reused_tokens: 1,
        prefilled_tokens: 2,
        dropped_tokens: 4,
        resident_tokens: 18,
        available_tokens: 4078,
        volatile_byte_hash: "04".into(),
    }
}

fn seed_context_report() -> ContextReport {
    ContextReport {
        resident_tokens: 18,
        prefix_tokens: 15,
        num_ctx: 4096,
        available_tokens: 4078,
        stable_byte_hash: "01".into(),
        stable_token_hash: "02".into(),
        manifest_digest: "03".into(),
        manifest: seed_manifest(),
        closed: true,
    }
}

fn seed_error_reply() -> ErrorReply {
    ErrorReply {
        v: 1,
        error: seed_error(),
    }
}

fn seed_fleet() -> FleetStatus {
    FleetStatus {
        v: 1,
        coordinator_id: "c-0".into(),
        workers: vec![WorkerView {
            status: seed_status(),
            age_ms: 150,
        }],
        queues: vec![switchyard_messages::QueueView {
            model: "smollm2".into(),
            priority: switchyard_messages::Priority::Batch,
            tenant: "team-a".into(),
            waiting: 3,
            bytes: 900,
            oldest_ms: 1200,
        }],
    }
}

fn seed_models() -> ModelsReply {
    ModelsReply {
        v: 1,
        models: vec![ModelEntry {
            name: "smollm2".into(),
            workers: vec!["w-0".into(), "w-1".into()],
            backends: vec!["cpu".into()],
            info: seed_model_info_struct(),
            adapters: vec![switchyard_messages::AdapterEntry {
                name: "support-tone".into(),
                workers: vec!["w-1".into()],
            }],
        }],
    }
}

fn seed_classify_reply() -> ClassifyReply {
    ClassifyReply {
        v: 1,
        request_id: "req-1".into(),
        worker_id: "w-0".into(),
        results: vec![
            ClassifyItem {
                result: Some(ClassifyResult {
                    token: seed_token(),
                    logits: vec![0.5, -1.0, f32::MIN_POSITIVE],
                }),
                error: None,
            },
            ClassifyItem {
                result: None,
                error: Some(seed_error()),
            },
        ],
    }
}

fn seed_batch_reply() -> BatchReply {
    BatchReply {
        v: 1,
        request_id: "req-1".into(),
        worker_id: "w-0".into(),
        results: vec![
            BatchResult {
                tokens: vec![seed_token()],
                finish_reason: Some(FinishReason::Length),
                error: None,
            },
            BatchResult {
                tokens: vec![],
                finish_reason: Some(FinishReason::Error),
                error: Some(seed_error()),
            },
        ],
    }
}

/// Every seed of every target.
fn all_seeds() -> Vec<Vec<u8>> {
    TARGETS.iter().flat_map(|t| (t.seeds)()).collect()
}

// ---------------------------------------------------------------------------------
// A small MessagePack model: parse a seed, edit it, write it back (canonically or
// with every length and number at its widest, which is valid but unusual).
// ---------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Mp {
    Nil,
    Bool(bool),
    Uint(u64),
    Int(i64),
    F32(f32),
    F64(f64),
    /// Not necessarily UTF-8.
    Str(Vec<u8>),
    Bin(Vec<u8>),
    Arr(Vec<Mp>),
    Map(Vec<(Mp, Mp)>),
    Ext(i8, Vec<u8>),
    /// Written as is (e.g. a length header without its body).
    Raw(Vec<u8>),
}

fn write(v: &Mp, wide: bool, out: &mut Vec<u8>) {
    fn len_header(out: &mut Vec<u8>, n: usize, wide: bool, fix: Option<(u8, usize)>, m8: Option<u8>, m16: u8, m32: u8) {
        match (fix, m8) {
            (Some((base, max)), _) if !wide && n <= max => out.push(base | n as u8),
            (_, Some(m)) if !wide && n <= 0xff => out.extend([m, n as u8]),
            _ if !wide && n <= 0xffff => {
                out.push(m16);
                out.extend((n as u16).to_be_bytes());
            }
            _ => {
                out.push(m32);
                out.extend((n as u32).to_be_bytes());
            }
        }
    }
    match v {
        Mp::Nil => out.push(0xc0),
        Mp::Bool(b) => out.push(if *b { 0xc3 } else { 0xc2 }),
        Mp::Uint(u) => match *u {
            u if !wide && u < 0x80 => out.push(u as u8),
            u if !wide && u <= 0xff => out.extend([0xcc, u as u8]),
            u if !wide && u <= 0xffff => {
                out.push(0xcd);
                out.extend((u as u16).to_be_bytes());
            }
            u if !wide && u <= 0xffff_ffff => {
                out.push(0xce);
                out.extend((u as u32).to_be_bytes());
            }
            u => {
                out.push(0xcf);
                out.extend(u.to_be_bytes());
            }
        },
        Mp::Int(i) => match *i {
            i if i >= 0 => write(&Mp::Uint(i as u64), wide, out),
            i if !wide && i >= -32 => out.push(i as u8),
            i if !wide && i >= i8::MIN as i64 => out.extend([0xd0, i as u8]),
            i if !wide && i >= i16::MIN as i64 => {
                out.push(0xd1);
                out.extend((i as i16).to_be_bytes());
            }
            i if !wide && i >= i32::MIN as i64 => {
                out.push(0xd2);
                out.extend((i as i32).to_be_bytes());
            }
            i => {
                out.push(0xd3);
                out.extend(i.to_be_bytes());
            }
        },
        Mp::F32(f) => {
            out.push(0xca);
            out.extend(f.to_be_bytes());
        }
        Mp::F64(f) => {
            out.push(0xcb);
            out.extend(f.to_be_bytes());
        }
        Mp::Str(s) => {
            len_header(out, s.len(), wide, Some((0xa0, 31)), Some(0xd9), 0xda, 0xdb);
            out.extend(s);
        }
        Mp::Bin(b) => {
            len_header(out, b.len(), wide, None, Some(0xc4), 0xc5, 0xc6);
            out.extend(b);
        }
        Mp::Arr(items) => {
            len_header(out, items.len(), wide, Some((0x90, 15)), None, 0xdc, 0xdd);
            for i in items {
                write(i, wide, out);
            }
        }
        Mp::Map(entries) => {
            len_header(out, entries.len(), wide, Some((0x80, 15)), None, 0xde, 0xdf);
            for (k, v) in entries {
                write(k, wide, out);
                write(v, wide, out);
            }
        }
        Mp::Ext(t, data) => {
            let fixed = [(1, 0xd4), (2, 0xd5), (4, 0xd6), (8, 0xd7), (16, 0xd8)];
            match fixed.iter().find(|(n, _)| *n == data.len()) {
                Some((_, m)) if !wide => out.push(*m),
                _ => len_header(out, data.len(), wide, None, Some(0xc7), 0xc8, 0xc9),
            }
            out.push(*t as u8);
            out.extend(data);
        }
        Mp::Raw(bytes) => out.extend(bytes),
    }
}

fn to_bytes(v: &Mp, wide: bool) -> Vec<u8> {
    let mut out = Vec::new();
    write(v, wide, &mut out);
    out
}

/// Parses one MessagePack value from the front of `b` (for our own seeds).
fn parse(b: &mut &[u8]) -> Option<Mp> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if b.len() < n {
            return None;
        }
        let (head, rest) = b.split_at(n);
        *b = rest;
        Some(head)
    }
    fn be(b: &mut &[u8], n: usize) -> Option<u64> {
        Some(take(b, n)?.iter().fold(0u64, |acc, x| acc << 8 | u64::from(*x)))
    }
    fn items(b: &mut &[u8], n: usize) -> Option<Vec<Mp>> {
        (0..n).map(|_| parse(b)).collect()
    }
    fn entries(b: &mut &[u8], n: usize) -> Option<Vec<(Mp, Mp)>> {
        (0..n).map(|_| Some((parse(b)?, parse(b)?))).collect()
    }
    let m = take(b, 1)?[0];
    Some(match m {
        0x00..=0x7f => Mp::Uint(u64::from(m)),
        0x80..=0x8f => Mp::Map(entries(b, usize::from(m & 0x0f))?),
        0x90..=0x9f => Mp::Arr(items(b, usize::from(m & 0x0f))?),
        0xa0..=0xbf => Mp::Str(take(b, usize::from(m & 0x1f))?.to_vec()),
        0xc0 => Mp::Nil,
        0xc2 => Mp::Bool(false),
        0xc3 => Mp::Bool(true),
        0xc4..=0xc6 => {
            let n = be(b, 1 << (m - 0xc4))? as usize;
            Mp::Bin(take(b, n)?.to_vec())
        }
        0xc7..=0xc9 => {
            let n = be(b, 1 << (m - 0xc7))? as usize;
            let t = take(b, 1)?[0] as i8;
            Mp::Ext(t, take(b, n)?.to_vec())
        }
        0xca => Mp::F32(f32::from_bits(be(b, 4)? as u32)),
        0xcb => Mp::F64(f64::from_bits(be(b, 8)?)),
        0xcc..=0xcf => Mp::Uint(be(b, 1 << (m - 0xcc))?),
        0xd0 => Mp::Int(i64::from(be(b, 1)? as u8 as i8)),
        0xd1 => Mp::Int(i64::from(be(b, 2)? as u16 as i16)),
        0xd2 => Mp::Int(i64::from(be(b, 4)? as u32 as i32)),
        0xd3 => Mp::Int(be(b, 8)? as i64),
        0xd4..=0xd8 => {
            let t = take(b, 1)?[0] as i8;
            Mp::Ext(t, take(b, 1 << (m - 0xd4))?.to_vec())
        }
        0xd9..=0xdb => {
            let n = be(b, 1 << (m - 0xd9))? as usize;
            Mp::Str(take(b, n)?.to_vec())
        }
        0xdc | 0xdd => {
            let n = be(b, 2 << (m - 0xdc))? as usize;
            Mp::Arr(items(b, n)?)
        }
        0xde | 0xdf => {
            let n = be(b, 2 << (m - 0xde))? as usize;
            Mp::Map(entries(b, n)?)
        }
        0xe0..=0xff => Mp::Int(i64::from(m as i8)),
        0xc1 => return None,
    })
}

fn parse_all(bytes: &[u8]) -> Mp {
    let mut b = bytes;
    let v = parse(&mut b).unwrap_or_else(|| panic!("a seed that does not parse: {}", hex(bytes)));
    assert!(b.is_empty(), "trailing bytes after a seed");
    v
}

/// Nodes in `v` (itself included; map keys excluded).
fn count(v: &Mp) -> usize {
    1 + match v {
        Mp::Arr(items) => items.iter().map(count).sum(),
        Mp::Map(entries) => entries.iter().map(|(_, v)| count(v)).sum(),
        _ => 0,
    }
}

/// The `n`th node of `v` in pre-order (as `count` counts).
fn nth_mut<'a>(v: &'a mut Mp, n: &mut usize) -> Option<&'a mut Mp> {
    if *n == 0 {
        return Some(v);
    }
    *n -= 1;
    match v {
        Mp::Arr(items) => items.iter_mut().find_map(|i| nth_mut(i, n)),
        Mp::Map(entries) => entries.iter_mut().find_map(|(_, v)| nth_mut(v, n)),
        _ => None,
    }
}

fn node<'a>(v: &'a mut Mp, at: &Index) -> &'a mut Mp {
    let mut n = at.index(count(v));
    nth_mut(v, &mut n).expect("an index below count")
}

/// Every map key (field name) in the seeds.
fn field_names() -> Vec<Vec<u8>> {
    fn walk(v: &Mp, out: &mut Vec<Vec<u8>>) {
        match v {
            Mp::Arr(items) => items.iter().for_each(|i| walk(i, out)),
            Mp::Map(entries) => {
                for (k, v) in entries {
                    if let Mp::Str(s) = k {
                        out.push(s.clone());
                    }
                    walk(v, out);
                }
            }
            _ => {}
        }
    }
    let mut names = Vec::new();
    for seed in all_seeds() {
        walk(&parse_all(&seed), &mut names);
    }
    names.sort();
    names.dedup();
    names
}

/// Strings a receiver gives meaning to, and some it should refuse.
fn interesting_strings() -> Vec<Vec<u8>> {
    let mut s: Vec<Vec<u8>> = [
        "",
        "req-1",
        "a.b",
        "a b",
        "*",
        "é",
        "stop",
        "length",
        "cancelled",
        "error",
        "cpu",
        "llama_cpp",
        "cuda:0",
        "cuda:x",
        "rocm:1(cpu)",
        "rocm:",
        "metal",
        "user",
        "system",
        "\0",
        "\n\n",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    s.extend(ErrorCode::ALL.iter().map(|c| c.as_str().as_bytes().to_vec()));
    s.push(vec![b'x'; 200]);
    s.push(vec![0xc3, 0x28]); // invalid UTF-8
    s.push(vec![0xff, 0xfe]);
    s.push(vec![0xed, 0xa0, 0x80]); // a surrogate
    s
}

fn any_mp(names: Vec<Vec<u8>>) -> BoxedStrategy<Mp> {
    let strings: Vec<Vec<u8>> = names.iter().cloned().chain(interesting_strings()).collect();
    let uint = prop_oneof![
        0..300u64,
        Just(u64::from(u32::MAX)),
        Just(u64::from(u32::MAX) + 1),
        Just(u64::MAX),
        Just(PROTOCOL_VERSION as u64 + 1),
        any::<u64>(),
    ];
    let int = prop_oneof![Just(-1i64), Just(i64::MIN), Just(i64::from(i32::MIN)), any::<i64>()];
    let f64s = prop_oneof![
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(-0.0),
        Just(1e300),
        Just(f64::MIN_POSITIVE / 2.0),
        Just(0.5),
        any::<f64>(),
    ];
    let f32s = prop_oneof![
        Just(f32::NAN),
        Just(f32::INFINITY),
        Just(-1.0f32),
        Just(f32::MAX),
        Just(2.0f32),
        any::<f32>(),
    ];
    let leaf = prop_oneof![
        Just(Mp::Nil),
        any::<bool>().prop_map(Mp::Bool),
        uint.prop_map(Mp::Uint),
        int.prop_map(Mp::Int),
        f32s.prop_map(Mp::F32),
        f64s.prop_map(Mp::F64),
        prop::sample::select(strings).prop_map(Mp::Str),
        prop::collection::vec(any::<u8>(), 0..40).prop_map(Mp::Str),
        prop::collection::vec(any::<u8>(), 0..40).prop_map(Mp::Bin),
        (any::<i8>(), prop::collection::vec(any::<u8>(), 0..20)).prop_map(|(t, d)| Mp::Ext(t, d)),
        prop::sample::select(MARKERS).prop_map(|m| Mp::Raw(m.to_vec())),
    ];
    let keys = prop::sample::select(names);
    leaf.prop_recursive(4, 48, 6, move |inner| {
        let key = prop_oneof![
            6 => keys.clone().prop_map(Mp::Str),
            1 => inner.clone(),
        ];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Mp::Arr),
            prop::collection::vec((key, inner), 0..6).prop_map(Mp::Map),
        ]
    })
    .boxed()
}

/// An edit of a parsed seed.
#[derive(Debug, Clone)]
enum Edit {
    /// Replace a node (a field's value, an element, the whole document).
    Replace(Index, Mp),
    /// Add a field (named from the contract, so mostly a known one) to a map.
    AddField(Index, Vec<u8>, Mp),
    /// Remove an entry of a map or an array.
    Remove(Index, Index),
    /// Repeat an entry of a map (a duplicate field) or an array.
    Repeat(Index, Index),
}

fn edit_strategy(names: Vec<Vec<u8>>) -> impl Strategy<Value = Edit> {
    let mp = any_mp(names.clone());
    prop_oneof![
        3 => (any::<Index>(), mp.clone()).prop_map(|(i, v)| Edit::Replace(i, v)),
        2 => (any::<Index>(), prop::sample::select(names), mp).prop_map(|(i, k, v)| Edit::AddField(i, k, v)),
        1 => (any::<Index>(), any::<Index>()).prop_map(|(i, j)| Edit::Remove(i, j)),
        1 => (any::<Index>(), any::<Index>()).prop_map(|(i, j)| Edit::Repeat(i, j)),
    ]
}

fn apply_edit(doc: &mut Mp, edit: &Edit) {
    match edit {
        Edit::Replace(at, v) => *node(doc, at) = v.clone(),
        Edit::AddField(at, k, v) => {
            if let Mp::Map(entries) = node(doc, at) {
                entries.push((Mp::Str(k.clone()), v.clone()));
            } else if let Mp::Map(entries) = doc {
                entries.push((Mp::Str(k.clone()), v.clone()));
            }
        }
        Edit::Remove(at, which) => match node(doc, at) {
            Mp::Map(e) if !e.is_empty() => drop(e.remove(which.index(e.len()))),
            Mp::Arr(e) if !e.is_empty() => drop(e.remove(which.index(e.len()))),
            _ => {}
        },
        Edit::Repeat(at, which) => match node(doc, at) {
            Mp::Map(e) if !e.is_empty() => e.push(e[which.index(e.len())].clone()),
            Mp::Arr(e) if !e.is_empty() => e.push(e[which.index(e.len())].clone()),
            _ => {}
        },
    }
}

// ---------------------------------------------------------------------------------
// Byte-level mutations
// ---------------------------------------------------------------------------------

/// MessagePack markers a decoder must meet gracefully anywhere: empty containers,
/// nil, NaN and infinities, the biggest integers, lengths far beyond the input, the
/// never-used byte, invalid UTF-8.
const MARKERS: &[&[u8]] = &[
    &[0x90],
    &[0x80],
    &[0xa0],
    &[0xc0],
    &[0xc1],
    &[0xc2],
    &[0xc3],
    &[0xff],
    &[0xcb, 0x7f, 0xf8, 0, 0, 0, 0, 0, 0],
    &[0xcb, 0x7f, 0xf0, 0, 0, 0, 0, 0, 0],
    &[0xcb, 0xff, 0xf0, 0, 0, 0, 0, 0, 0],
    &[0xca, 0x7f, 0xc0, 0, 0],
    &[0xce, 0xff, 0xff, 0xff, 0xff],
    &[0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
    &[0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0],
    &[0xdc, 0xff, 0xff],
    &[0xdd, 0xff, 0xff, 0xff, 0xff],
    &[0xde, 0xff, 0xff],
    &[0xdf, 0xff, 0xff, 0xff, 0xff],
    &[0xd9, 0xff],
    &[0xda, 0xff, 0xff],
    &[0xdb, 0xff, 0xff, 0xff, 0xff],
    &[0xc4, 0xff],
    &[0xc6, 0xff, 0xff, 0xff, 0xff],
    &[0xc9, 0xff, 0xff, 0xff, 0xff, 0x01],
    &[0xd4, 0xff, 0x00],
    &[0xa2, 0xc3, 0x28],
    &[0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91],
];

#[derive(Debug, Clone)]
enum ByteEdit {
    Flip(Index, u8),
    Set(Index, u8),
    Insert(Index, Vec<u8>),
    Delete(Index, usize),
    Truncate(Index),
    /// Insert (or, with `true`, overwrite with) a marker.
    Marker(Index, usize, bool),
    /// Copy a run of the input to another place (repeats fields, nests values).
    Copy(Index, Index, usize),
}

fn byte_edit() -> impl Strategy<Value = ByteEdit> {
    prop_oneof![
        3 => (any::<Index>(), 1..=255u8).prop_map(|(i, m)| ByteEdit::Flip(i, m)),
        2 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| ByteEdit::Set(i, b)),
        1 => (any::<Index>(), prop::collection::vec(any::<u8>(), 1..8)).prop_map(|(i, b)| ByteEdit::Insert(i, b)),
        2 => (any::<Index>(), 1..16usize).prop_map(|(i, n)| ByteEdit::Delete(i, n)),
        1 => any::<Index>().prop_map(ByteEdit::Truncate),
        3 => (any::<Index>(), 0..MARKERS.len(), any::<bool>()).prop_map(|(i, m, o)| ByteEdit::Marker(i, m, o)),
        1 => (any::<Index>(), any::<Index>(), 1..64usize).prop_map(|(f, t, n)| ByteEdit::Copy(f, t, n)),
    ]
}

fn apply_byte_edit(b: &mut Vec<u8>, edit: &ByteEdit) {
    // Positions in `0..=len` (an insertion may go at the end).
    let pos = |i: &Index, b: &Vec<u8>| i.index(b.len() + 1);
    match edit {
        ByteEdit::Flip(i, m) if !b.is_empty() => {
            let p = i.index(b.len());
            b[p] ^= m;
        }
        ByteEdit::Set(i, v) if !b.is_empty() => {
            let p = i.index(b.len());
            b[p] = *v;
        }
        ByteEdit::Insert(i, bytes) => {
            let p = pos(i, b);
            b.splice(p..p, bytes.iter().copied());
        }
        ByteEdit::Delete(i, n) => {
            let p = pos(i, b);
            let end = (p + n).min(b.len());
            b.drain(p..end);
        }
        ByteEdit::Truncate(i) => {
            let p = pos(i, b);
            b.truncate(p);
        }
        ByteEdit::Marker(i, m, overwrite) => {
            let p = pos(i, b);
            let marker = MARKERS[*m];
            let end = if *overwrite { (p + marker.len()).min(b.len()) } else { p };
            b.splice(p..end, marker.iter().copied());
        }
        ByteEdit::Copy(from, to, n) => {
            let f = pos(from, b);
            let run = b[f..(f + n).min(b.len())].to_vec();
            let t = pos(to, b);
            b.splice(t..t, run);
        }
        _ => {}
    }
}

// ---------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------

/// Arbitrary bytes, often behind a map or array header so decoders get past the first
/// byte and into their fields.
#[test]
fn random_bytes_never_panic() {
    let prefixes: &[&[u8]] = &[
        &[],
        &[0x81],
        &[0x83],
        &[0x8f],
        &[0x93],
        &[0xde, 0x00, 0x10],
        &[0xdf, 0, 0, 0, 3],
    ];
    let strategy = (
        prop::sample::select(prefixes),
        prop::collection::vec(any::<u8>(), 0..4096),
    );
    check("random_bytes_never_panic", strategy, |(prefix, body)| {
        let mut bytes = prefix.to_vec();
        bytes.extend(body);
        decode_all(&bytes)
    });
}

/// A valid encoding of some target with byte-level damage, fed to every decoder.
#[test]
fn mutated_encodings_never_panic() {
    let seeds = all_seeds();
    let strategy = (prop::sample::select(seeds), prop::collection::vec(byte_edit(), 1..8));
    check("mutated_encodings_never_panic", strategy, |(seed, edits)| {
        let mut bytes = seed;
        for e in &edits {
            apply_byte_edit(&mut bytes, e);
        }
        decode_all(&bytes)
    });
}

/// A valid encoding of some target with well-formed but wrong structure: a field's
/// value replaced by any MessagePack value (NaN, huge integers, wrong types, invalid
/// UTF-8, nested containers, length headers without a body), fields added, removed or
/// repeated; written canonically or at the widest encodings. Much of it decodes, so
/// validation and what follows it see hostile values.
#[test]
fn restructured_encodings_never_panic() {
    let names = field_names();
    let seeds: Vec<Mp> = all_seeds().iter().map(|s| parse_all(s)).collect();
    let strategy = (
        prop::sample::select(seeds),
        prop::collection::vec(edit_strategy(names), 1..4),
        any::<bool>(),
    );
    check(
        "restructured_encodings_never_panic",
        strategy,
        |(mut doc, edits, wide)| {
            for e in &edits {
                apply_edit(&mut doc, e);
            }
            decode_all(&to_bytes(&doc, wide))
        },
    );
}

/// MessagePack documents built from scratch out of the contract's field names.
#[test]
fn generated_documents_never_panic() {
    let names = field_names();
    let strategy = (
        prop::collection::vec((prop::sample::select(names.clone()), any_mp(names.clone())), 0..12),
        any_mp(names),
        any::<bool>(),
        any::<bool>(),
    );
    check(
        "generated_documents_never_panic",
        strategy,
        |(fields, other, as_map, wide)| {
            let doc = if as_map {
                Mp::Map(fields.into_iter().map(|(k, v)| (Mp::Str(k), v)).collect())
            } else {
                other
            };
            decode_all(&to_bytes(&doc, wide))
        },
    );
}

// ---------------------------------------------------------------------------------
// Deterministic regressions
// ---------------------------------------------------------------------------------

/// The seeds are what the properties start from: each must decode, pass validation
/// (requests), re-encode stably, and be seen by the MessagePack model as it is.
#[test]
fn seeds_are_valid() {
    for t in TARGETS {
        for seed in (t.seeds)() {
            assert!((t.run)(&seed), "a {} seed does not decode", t.name);
            let doc = parse_all(&seed);
            assert_eq!(
                to_bytes(&doc, false),
                seed,
                "{}: the model writes a seed back differently",
                t.name
            );
            assert!((t.run)(&to_bytes(&doc, true)), "{} at its widest encoding", t.name);
        }
    }
    let l = InputLimits::default();
    for r in seed_generate() {
        validate_request(&r, r.messages.is_some(), &l).unwrap();
    }
    validate_classify(&seed_classify()[0], &l).unwrap();
    validate_batch(&seed_batch()[0], &l).unwrap();
    validate_open(&seed_open()).unwrap();
    validate_segment(&seed_segment(), &l).unwrap();
    validate_decode(&seed_decode(), &l).unwrap();
    assert!(field_names().len() > 50, "field names come from the seeds");
}

/// A declared length is not a size to allocate: a 4 GiB array, map, string, binary or
/// extension header with no body behind it — alone, with a little body, or in place
/// of any value of any seed — must fail at once, with little memory.
#[test]
fn huge_declared_lengths_do_not_allocate() {
    let headers: &[&[u8]] = &[
        &[0xdd, 0xff, 0xff, 0xff, 0xff],
        &[0xdf, 0xff, 0xff, 0xff, 0xff],
        &[0xdb, 0xff, 0xff, 0xff, 0xff],
        &[0xc6, 0xff, 0xff, 0xff, 0xff],
        &[0xc9, 0xff, 0xff, 0xff, 0xff, 0x01],
        &[0xdc, 0xff, 0xff],
        &[0xde, 0xff, 0xff],
        &[0xda, 0xff, 0xff],
        &[0xc5, 0xff, 0xff],
        &[0xc8, 0xff, 0xff, 0x01],
    ];
    // The regression itself: a 4 GiB array header and nothing else, to every decoder.
    let started = Instant::now();
    for t in TARGETS {
        let (decoded, held, largest) = measure(|| (t.run)(&[0xdd, 0xff, 0xff, 0xff, 0xff]));
        assert!(!decoded, "decode::<{}> accepted a bare 4 GiB array header", t.name);
        assert!(
            held < 64 << 10 && largest < 64 << 10,
            "decode::<{}> of a bare 4 GiB array header held {held} bytes (largest allocation {largest})",
            t.name
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?}",
        started.elapsed()
    );

    // Every header alone, before a 4 KiB body, and in place of every value of every
    // seed. serde preallocates at most 1 MiB for a declared length, so 4 MiB is plenty.
    let mut inputs: Vec<Vec<u8>> = Vec::new();
    for h in headers {
        inputs.push(h.to_vec());
        // Flat fillers: deep nesting is `deep_nesting_does_not_overflow_the_stack`'s.
        for filler in [0x00u8, 0xc0, 0xa1, 0x90] {
            let mut b = h.to_vec();
            b.extend(std::iter::repeat_n(filler, 4096));
            inputs.push(b);
        }
    }
    for seed in all_seeds() {
        let doc = parse_all(&seed);
        for n in 0..count(&doc) {
            for h in headers {
                let mut d = doc.clone();
                *nth_mut(&mut d, &mut n.clone()).unwrap() = Mp::Raw(h.to_vec());
                inputs.push(to_bytes(&d, false));
            }
        }
    }
    for bytes in &inputs {
        for t in TARGETS {
            let decoded = decode_within(t, bytes, 4 << 20).unwrap_or_else(|e| panic!("{e}"));
            // Every declared length here is beyond the input, so nothing may decode.
            assert!(!decoded, "decode::<{}> accepted {}", t.name, hex(bytes));
        }
    }
    eprintln!("{} huge-length inputs in {:.1?}", inputs.len(), started.elapsed());
}

/// Set in the child process `deep_nesting_does_not_overflow_the_stack` runs itself in.
const DEEP_CHILD: &str = "SWITCHYARD_FUZZ_DEEP_CHILD";

/// Deep nesting — bare, or as the value of a known or an unknown field (which decoders
/// skip) — up to and past rmp-serde's depth limit (1024) must be refused or skipped
/// without overflowing a 2 MiB stack (tokio's default for worker threads, where every
/// decoder runs). A stack overflow aborts the process, so the decoding runs in a child
/// process and this test reports the decoder and input the child died on.
#[test]
fn deep_nesting_does_not_overflow_the_stack() {
    if std::env::var_os(DEEP_CHILD).is_some() {
        return deep_nesting_child();
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "deep_nesting_does_not_overflow_the_stack",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(DEEP_CHILD, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().rfind(|l| l.starts_with("decoding ")).unwrap_or("(none)");
    let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
    assert!(
        out.status.success() && stderr.contains("deep nesting: all decoded"),
        "the child died ({}) at: {last}\n{tail:?}",
        out.status
    );
}

fn deep_nesting_child() {
    let nest = |depth: usize, open: &[u8], leaf: &[u8]| -> Vec<u8> {
        let mut b: Vec<u8> = open.iter().copied().cycle().take(open.len() * depth).collect();
        b.extend(leaf);
        b
    };
    let mut inputs: Vec<(String, Vec<u8>)> = Vec::new();
    for depth in [100, 256, 512, 768, 1000, 1023, 1024, 1025, 100_000] {
        inputs.push((format!("[[..nil..]] depth {depth}"), nest(depth, &[0x91], &[0xc0])));
        inputs.push((
            format!("{{v: {{v: ..1..}}}} depth {depth}"),
            nest(depth, &[0x81, 0xa1, b'v'], &[0x01]),
        ));
        inputs.push((
            format!("array32 of 1, no leaf, depth {depth}"),
            nest(depth, &[0xdd, 0, 0, 0, 1], &[]),
        ));
        for (t, seed) in TARGETS
            .iter()
            .flat_map(|t| (t.seeds)().into_iter().map(move |s| (t, s)))
        {
            let Mp::Map(mut entries) = parse_all(&seed) else {
                continue;
            };
            entries.push((Mp::Str(b"zz_unknown".to_vec()), Mp::Raw(nest(depth, &[0x91], &[0xc0]))));
            let label = format!(
                "a {} seed + unknown field zz_unknown: [[..nil..]] depth {depth}",
                t.name
            );
            inputs.push((label, to_bytes(&Mp::Map(entries.clone()), false)));
            let last = entries.len() - 2;
            let Mp::Str(name) = &entries[last].0 else { continue };
            let label = format!(
                "a {} seed with field {} = {{v: {{v: ..1..}}}} depth {depth}",
                t.name,
                String::from_utf8_lossy(name)
            );
            entries[last].1 = Mp::Raw(nest(depth, &[0x81, 0xa1, b'v'], &[0x01]));
            inputs.push((label, to_bytes(&Mp::Map(entries), false)));
        }
    }
    std::thread::Builder::new()
        .name("decode-2MiB-stack".into())
        .stack_size(2 << 20)
        .spawn(move || {
            for (label, bytes) in &inputs {
                for t in TARGETS {
                    eprintln!("decoding {} ({} bytes): {label}", t.name, bytes.len());
                    decode_one(t, bytes).unwrap_or_else(|e| panic!("{e}"));
                }
            }
            eprintln!("deep nesting: all decoded");
        })
        .unwrap()
        .join()
        .unwrap();
}
