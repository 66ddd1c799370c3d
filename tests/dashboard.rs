//! The Grafana dashboard in `dashboards/` is valid JSON and queries only metrics
//! switchyard exports (under the Prometheus naming of the OTel collector: dots to
//! underscores, unit suffixes, `_total` on counters — the names switchyard's own scrape
//! endpoint, `telemetry.prometheus_listen`, serves too). tests/prometheus.rs runs every
//! query against a real Prometheus scraping a fleet.

mod common;

use common::repo;

/// Every exported instrument as Prometheus names (histograms as their series).
const EXPORTED: &[&str] = &[
    "gen_ai_server_time_to_first_token_seconds",
    "gen_ai_server_time_per_output_token_seconds",
    "gen_ai_server_request_duration_seconds",
    "gen_ai_client_token_usage",
    "switchyard_worker_admission_rejections_total",
    "switchyard_worker_requests_in_flight",
    "switchyard_worker_requests_queued",
    "switchyard_kv_slots_used",
    "switchyard_kv_slots_total",
    "switchyard_kv_resident_tokens",
    "switchyard_kv_store_bytes",
    "switchyard_kv_store_budget_bytes",
    "switchyard_kv_hit_ratio",
    "switchyard_model_weights_bytes",
    "switchyard_routing_decisions_total",
    "switchyard_heartbeats_missed_total",
    "switchyard_backend_restarts_total",
    "switchyard_queue_wait_seconds",
    "switchyard_queue_depth",
];

/// Labels the queries group or filter by.
const LABELS: &[&str] = &[
    "gen_ai_request_model",
    "gen_ai_token_type",
    "switchyard_routing_reason",
    "switchyard_priority",
    "switchyard_tenant",
];

#[test]
fn the_dashboard_queries_only_exported_metrics() {
    let text = std::fs::read_to_string(repo().join("dashboards/switchyard.json")).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).unwrap();
    let panels = dash["panels"].as_array().unwrap();
    assert!(panels.len() >= 10);
    let mut used = 0;
    for p in panels {
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if !(word.starts_with("gen_ai_") || word.starts_with("switchyard_")) || word.ends_with("_id") {
                    continue;
                }
                if LABELS.contains(&word) {
                    continue;
                }
                let base = ["_bucket", "_count", "_sum"]
                    .iter()
                    .find_map(|s| word.strip_suffix(s))
                    .unwrap_or(word);
                assert!(
                    EXPORTED.contains(&base),
                    "{:?} queries unknown metric {word}",
                    p["title"]
                );
                used += 1;
            }
        }
    }
    assert!(used >= 15);
}
