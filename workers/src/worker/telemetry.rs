//! GenAI server metrics (OpenTelemetry semantic conventions) recorded by workers.
//! Without an installed meter provider the instruments are no-ops.

use opentelemetry::metrics::{Counter, Histogram};
use opentelemetry::KeyValue;
use std::sync::OnceLock;
use switchyard_messages::GenerateMetrics;

/// Bucket boundaries the GenAI conventions recommend.
pub const TTFT_BUCKETS: [f64; 16] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];
pub const TPOT_BUCKETS: [f64; 13] = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5];
pub const DURATION_BUCKETS: [f64; 14] = [
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];
pub const TOKEN_BUCKETS: [f64; 14] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 16777216.0,
    67108864.0,
];

/// `gen_ai.provider.name` of switchyard's own serving.
pub const PROVIDER: &str = "switchyard";

struct Instruments {
    ttft: Histogram<f64>,
    tpot: Histogram<f64>,
    duration: Histogram<f64>,
    tokens: Histogram<u64>,
    rejections: Counter<u64>,
    stale: Counter<u64>,
    drafted: Counter<u64>,
    accepted: Counter<u64>,
}

fn instruments() -> &'static Instruments {
    static I: OnceLock<Instruments> = OnceLock::new();
    I.get_or_init(|| {
        let m = opentelemetry::global::meter("switchyard");
        Instruments {
            ttft: m
                .f64_histogram("gen_ai.server.time_to_first_token")
                .with_unit("s")
                .with_description("Time to generate the first token for successful responses")
                .with_boundaries(TTFT_BUCKETS.to_vec())
                .build(),
            tpot: m
                .f64_histogram("gen_ai.server.time_per_output_token")
                .with_unit("s")
                .with_description("Time per output token after the first, for successful responses")
                .with_boundaries(TPOT_BUCKETS.to_vec())
                .build(),
            duration: m
                .f64_histogram("gen_ai.server.request.duration")
                .with_unit("s")
                .with_description("Generative AI server request duration")
                .with_boundaries(DURATION_BUCKETS.to_vec())
                .build(),
            tokens: m
                .u64_histogram("gen_ai.client.token.usage")
                .with_unit("{token}")
                .with_description("Input and output tokens used")
                .with_boundaries(TOKEN_BUCKETS.to_vec())
                .build(),
            stale: m
                .u64_counter("switchyard.worker.stale_forwards")
                .with_unit("{request}")
                .with_description("Forwards dropped unrun because their coordinator had stopped waiting for them")
                .build(),
            drafted: m
                .u64_counter("switchyard.speculative.draft_tokens")
                .with_unit("{token}")
                .with_description("Tokens speculative decoding proposed and the model checked")
                .build(),
            accepted: m
                .u64_counter("switchyard.speculative.accepted_tokens")
                .with_unit("{token}")
                .with_description("Proposed tokens the model kept (generated without a step of their own)")
                .build(),
            rejections: m
                .u64_counter("switchyard.worker.admission.rejections")
                .with_unit("{request}")
                .with_description("Requests a worker refused (full, draining, unavailable)")
                .build(),
        }
    })
}

/// The attributes every GenAI metric carries.
pub fn attributes(operation: &str, model: &str, worker_id: &str, backend: &str) -> Vec<KeyValue> {
    vec![
        KeyValue::new("gen_ai.operation.name", operation.to_string()),
        KeyValue::new("gen_ai.provider.name", PROVIDER),
        KeyValue::new("gen_ai.request.model", model.to_string()),
        KeyValue::new("switchyard.worker.id", worker_id.to_string()),
        KeyValue::new("switchyard.backend", backend.to_string()),
    ]
}

/// A generation finished: time to first token, per output token, duration, token use.
pub fn record_success(attrs: &[KeyValue], m: &GenerateMetrics) {
    let i = instruments();
    i.ttft.record((m.queue_us + m.prefill_us) as f64 / 1e6, attrs);
    if m.generated_tokens > 1 {
        i.tpot
            .record(m.decode_us as f64 / 1e6 / f64::from(m.generated_tokens - 1), attrs);
    }
    i.duration.record(m.total_us as f64 / 1e6, attrs);
    let with = |kind: &'static str| {
        let mut a = attrs.to_vec();
        a.push(KeyValue::new("gen_ai.token.type", kind));
        a
    };
    i.tokens.record(u64::from(m.prompt_tokens), &with("input"));
    i.tokens.record(u64::from(m.generated_tokens), &with("output"));
    if m.draft_tokens > 0 {
        i.drafted.add(u64::from(m.draft_tokens), attrs);
        i.accepted.add(u64::from(m.accepted_tokens), attrs);
    }
}

/// Writes the `queue` (admission to compute start, `queue_us` long) and `prefill`
/// (compute start to the first token) child spans of `parent` with exact bounds.
pub fn record_phases(
    parent: &tracing::Span,
    admitted: std::time::SystemTime,
    queue_us: u64,
    first_token: std::time::SystemTime,
) {
    use opentelemetry::trace::{Span as _, Tracer as _};
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let cx = parent.context();
    let tracer = opentelemetry::global::tracer("switchyard");
    let computing = (admitted + std::time::Duration::from_micros(queue_us)).min(first_token);
    for (name, start, end) in [("queue", admitted, computing), ("prefill", computing, first_token)] {
        let mut span = tracer.build_with_context(
            opentelemetry::trace::SpanBuilder::from_name(name).with_start_time(start),
            &cx,
        );
        span.end_with_timestamp(end);
    }
}

/// A generation failed after `seconds` with the wire code `error_type`.
pub fn record_failure(attrs: &[KeyValue], seconds: f64, error_type: &str) {
    let mut a = attrs.to_vec();
    a.push(KeyValue::new("error.type", error_type.to_string()));
    instruments().duration.record(seconds, &a);
}

/// A worker's supervised child (`llama-server`, `mlx-bridge`) exited; it is restarted
/// with backoff.
pub fn record_restart(worker_id: &str, child: &'static str) {
    static C: OnceLock<Counter<u64>> = OnceLock::new();
    C.get_or_init(|| {
        opentelemetry::global::meter("switchyard")
            .u64_counter("switchyard.backend.restarts")
            .with_unit("{restart}")
            .with_description("Exits of a worker's supervised child process (each followed by a restart)")
            .build()
    })
    .add(
        1,
        &[
            KeyValue::new("switchyard.worker.id", worker_id.to_string()),
            KeyValue::new("switchyard.backend.child", child),
        ],
    );
}

/// A request was refused at admission with `code`.
pub fn record_rejection(worker_id: &str, code: &str) {
    instruments().rejections.add(
        1,
        &[
            KeyValue::new("switchyard.worker.id", worker_id.to_string()),
            KeyValue::new("error.type", code.to_string()),
        ],
    );
}

/// A forward arrived (or was admitted) after its coordinator stopped waiting for the
/// admission answer: dropped before computing anything.
pub fn record_stale_forward(worker_id: &str) {
    instruments()
        .stale
        .add(1, &[KeyValue::new("switchyard.worker.id", worker_id.to_string())]);
}

/// Registers the worker's gauges (load, KV, weights), read from `ctx` at each
/// collection. They hold only a weak reference: a stopped worker reports nothing.
pub fn register_gauges(ctx: &std::sync::Arc<super::context::ServeContext>) {
    use opentelemetry::metrics::AsyncInstrument;
    use std::sync::Weak;
    let m = opentelemetry::global::meter("switchyard");
    let attrs = vec![
        KeyValue::new("switchyard.worker.id", ctx.worker_id.clone()),
        KeyValue::new("switchyard.backend", ctx.backend.clone()),
        KeyValue::new("gen_ai.request.model", ctx.model_name.clone()),
    ];
    type Read = fn(&super::context::ServeContext) -> u64;
    let gauges: [(&'static str, &'static str, &'static str, Read); 8] = [
        (
            "switchyard.worker.requests.in_flight",
            "{request}",
            "Requests computing now",
            |c| u64::from(c.admission.load().0),
        ),
        (
            "switchyard.worker.requests.queued",
            "{request}",
            "Requests admitted and waiting",
            |c| u64::from(c.admission.load().1),
        ),
        (
            "switchyard.kv.slots.used",
            "{slot}",
            "KV slots running a request or held by a session",
            |c| {
                let kv = c.model.kv_usage();
                u64::from(kv.busy + kv.sessions)
            },
        ),
        ("switchyard.kv.slots.total", "{slot}", "KV slots", |c| {
            u64::from(c.model.kv_usage().slots)
        }),
        (
            "switchyard.kv.resident_tokens",
            "{token}",
            "Tokens resident across KV slots",
            |c| c.model.kv_usage().resident_tokens,
        ),
        ("switchyard.kv.store.bytes", "By", "Bytes in the KV block store", |c| {
            c.model.kv_usage().store_bytes
        }),
        (
            "switchyard.kv.store.budget",
            "By",
            "Byte budget of the KV block store",
            |c| c.model.kv_usage().store_budget_bytes,
        ),
        ("switchyard.model.weights", "By", "Bytes of the loaded weights", |c| {
            c.model.memory().weights_bytes
        }),
    ];
    // Each instrument reads the context while it lives.
    let observe = |read: Read| {
        let (weak, attrs): (Weak<super::context::ServeContext>, Vec<KeyValue>) =
            (std::sync::Arc::downgrade(ctx), attrs.clone());
        move |o: &dyn AsyncInstrument<u64>| {
            if let Some(c) = weak.upgrade() {
                o.observe(read(&c), &attrs);
            }
        }
    };
    for (name, unit, description, read) in gauges {
        m.u64_observable_gauge(name)
            .with_unit(unit)
            .with_description(description)
            .with_callback(observe(read))
            .build();
    }
    // KV moved between workers (protocol 1.11), counted since the worker started.
    let counters: [(&'static str, &'static str, &'static str, Read); 11] = [
        (
            "switchyard.kv.transfer.pulls",
            "{pull}",
            "Prefix pulls from peers that imported KV",
            |c| c.transfer.stats().pulls,
        ),
        (
            "switchyard.kv.transfer.pull_fallbacks",
            "{pull}",
            "Pulls given up (refused, bad digest, timeout, slow link): the rest computed",
            |c| c.transfer.stats().pull_fallbacks,
        ),
        (
            "switchyard.kv.transfer.recomputed",
            "{request}",
            "Prefixes a peer held that were computed instead, as predicted faster",
            |c| c.transfer.stats().recomputed,
        ),
        (
            "switchyard.kv.transfer.pulled",
            "By",
            "KV bytes pulled from peers",
            |c| c.transfer.stats().pulled_bytes,
        ),
        (
            "switchyard.kv.transfer.pulled_tokens",
            "{token}",
            "Prompt tokens whose KV was pulled from peers",
            |c| c.transfer.stats().pulled_tokens,
        ),
        ("switchyard.kv.transfer.served", "By", "KV bytes served to peers", |c| {
            c.transfer.stats().served_bytes
        }),
        // (1.12) Live hand-over of streams when a worker drains.
        (
            "switchyard.handover.handed_over",
            "{stream}",
            "Streams handed to another worker while draining",
            |c| c.transfer.stats().handed_over,
        ),
        (
            "switchyard.handover.taken_over",
            "{stream}",
            "Streams continued for a draining worker",
            |c| c.transfer.stats().taken_over,
        ),
        (
            "switchyard.handover.fallbacks",
            "{stream}",
            "Hand-overs no worker took: the stream finished on the draining worker",
            |c| c.transfer.stats().handover_fallbacks,
        ),
        // (1.13) Sessions moved with their KV when a worker drains.
        (
            "switchyard.session.moved",
            "{session}",
            "Sessions moved to another worker while draining",
            |c| c.transfer.stats().sessions_moved,
        ),
        (
            "switchyard.session.adopted",
            "{session}",
            "Sessions adopted from a draining worker",
            |c| c.transfer.stats().sessions_adopted,
        ),
    ];
    for (name, unit, description, read) in counters {
        m.u64_observable_counter(name)
            .with_unit(unit)
            .with_description(description)
            .with_callback(observe(read))
            .build();
    }
    let weak = std::sync::Arc::downgrade(ctx);
    m.f64_observable_gauge("switchyard.kv.hit_ratio")
        .with_unit("1")
        .with_description("Prompt tokens served from KV over the recent requests")
        .with_callback(move |o: &dyn AsyncInstrument<f64>| {
            if let Some(c) = weak.upgrade() {
                let ratio = c.recent.lock().unwrap_or_else(|p| p.into_inner()).hit_ratio();
                o.observe(ratio, &attrs);
            }
        })
        .build();
}
