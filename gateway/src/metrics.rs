//! GenAI client metrics the gateway records for each request it relays
//! (`gen_ai.client.operation.duration`, OpenTelemetry's GenAI conventions). Token
//! usage is counted once, by the worker that computed it.

use opentelemetry::metrics::Histogram;
use opentelemetry::KeyValue;
use std::sync::OnceLock;
use std::time::Instant;

const DURATION_BUCKETS: [f64; 14] = [
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];

fn duration() -> &'static Histogram<f64> {
    static H: OnceLock<Histogram<f64>> = OnceLock::new();
    H.get_or_init(|| {
        opentelemetry::global::meter("switchyard")
            .f64_histogram("gen_ai.client.operation.duration")
            .with_unit("s")
            .with_description("GenAI operation duration as the gateway's clients see it")
            .with_boundaries(DURATION_BUCKETS.to_vec())
            .build()
    })
}

/// One relayed request, timed from its arrival.
pub struct Operation {
    started: Instant,
    operation: &'static str,
    model: String,
    recorded: bool,
}

impl Operation {
    /// Starts timing a `chat` or `text_completion` for `model`.
    pub fn start(operation: &'static str, model: &str) -> Self {
        Self {
            started: Instant::now(),
            operation,
            model: model.to_string(),
            recorded: false,
        }
    }

    /// Records the duration, with `error.type` when it failed.
    pub fn finish(&mut self, error: Option<&str>) {
        if self.recorded {
            return;
        }
        self.recorded = true;
        let mut attrs = vec![
            KeyValue::new("gen_ai.operation.name", self.operation),
            KeyValue::new("gen_ai.provider.name", "switchyard"),
            KeyValue::new("gen_ai.request.model", self.model.clone()),
            KeyValue::new("switchyard.component", "gateway"),
        ];
        if let Some(e) = error {
            attrs.push(KeyValue::new("error.type", e.to_string()));
        }
        duration().record(self.started.elapsed().as_secs_f64(), &attrs);
    }
}

/// A request dropped before it finished (the HTTP client went away) counts as
/// cancelled.
impl Drop for Operation {
    fn drop(&mut self) {
        self.finish(Some("cancelled"));
    }
}
