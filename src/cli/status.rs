//! `switchyard status`: the fleet as a table (or JSON), once or redrawn.

use super::connect::{client, report};
use super::StatusArgs;
use std::process::ExitCode;
use std::time::Duration;
use switchyard::Config;

pub async fn status(config: &Config, args: StatusArgs) -> anyhow::Result<ExitCode> {
    let client = client(config, None).await?;
    let Some(period) = args.watch else {
        let fleet = match client.status().await {
            Ok(f) => f,
            Err(e) => return report(e),
        };
        if args.json {
            println!("{}", serde_json::to_string_pretty(&fleet)?);
        } else {
            print!("{}", status_table(&fleet));
        }
        return Ok(ExitCode::SUCCESS);
    };
    let stop = tokio::signal::ctrl_c();
    tokio::pin!(stop);
    let mut tick = tokio::time::interval(Duration::from_millis(period.max(100)));
    loop {
        tokio::select! {
            _ = &mut stop => return Ok(ExitCode::SUCCESS),
            _ = tick.tick() => {}
        }
        let text = match client.status().await {
            Ok(fleet) if args.json => format!("{}\n", serde_json::to_string(&fleet)?),
            Ok(fleet) => status_table(&fleet),
            Err(e) => format!("no answer: {e}\n"),
        };
        if args.json {
            print!("{text}");
        } else {
            // Home, draw, clear what is left of the previous frame.
            print!("\x1b[H{}\x1b[J", text.replace('\n', "\x1b[K\n"));
        }
        use std::io::Write;
        std::io::stdout().flush()?;
    }
}

/// The fleet as a table: one line per worker with load, KV state and recent latency.
fn status_table(fleet: &switchyard_messages::FleetStatus) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "coordinator {}: {} worker(s)",
        fleet.coordinator_id,
        fleet.workers.len()
    );
    let _ = writeln!(
        out,
        "{:<28} {:<16} {:<12} {:<9} {:<30} {:>9} {:>6} {:>9} {:>8} {:>9} {:>5} {:>8} {:>7} {:>5} {:>6}  NATS",
        "WORKER",
        "HOST",
        "DEVICE",
        "BACKEND",
        "MODEL",
        "IN-FLIGHT",
        "QUEUED",
        "COMPLETED",
        "KV-SLOTS",
        "KV-TOKENS",
        "HIT%",
        "TTFT-ms",
        "TPOT-ms",
        "SPEC%",
        "AGE"
    );
    for w in &fleet.workers {
        let s = &w.status;
        let model = s.models.iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(",");
        let state = if s.draining {
            " (draining)"
        } else if !s.available {
            " (unavailable)"
        } else {
            ""
        };
        let slots = format!("{}/{}", s.kv.busy + s.kv.sessions, s.kv.slots);
        // The cpu engine's kernel variant, e.g. `cpu/avx512`.
        let device = match s.models.iter().map(|m| m.info.kernels.as_str()).find(|k| !k.is_empty()) {
            Some(k) => format!("{}/{k}", s.device),
            None => s.device.clone(),
        };
        // Speculative decoding's acceptance over the recent requests.
        let spec = match s.recent.draft_tokens {
            0 => "-".to_string(),
            d => format!("{:.0}", s.recent.accepted_tokens as f64 * 100.0 / d as f64),
        };
        let _ = writeln!(
            out,
            "{:<28} {:<16} {:<12} {:<9} {:<30} {:>5}/{:<3} {:>6} {:>9} {:>8} {:>9} {:>5.0} {:>8.1} {:>7.1} {:>5} {:>4}ms  {}{state}",
            s.worker_id,
            s.host,
            device,
            s.backend,
            model,
            s.in_flight,
            s.capacity,
            s.queued,
            s.completed,
            slots,
            s.kv.resident_tokens,
            s.kv.hit_ratio * 100.0,
            s.recent.ttft_ms,
            s.recent.tpot_ms,
            spec,
            w.age_ms,
            if s.nats_server.is_empty() { "-" } else { s.nats_server.as_str() }
        );
    }
    // Models split into pipeline stages (protocol 1.16): their stages.
    for w in &fleet.workers {
        for m in &w.status.models {
            if let Some(p) = &m.info.pipeline {
                let _ = writeln!(
                    out,
                    "{} ({}): {}",
                    m.name,
                    m.info.num_layers,
                    p.describe(&w.status.worker_id)
                );
            }
        }
    }
    // KV moved between workers (protocol 1.11), for the workers that moved any.
    let moved: Vec<_> = fleet
        .workers
        .iter()
        .map(|w| (&w.status.worker_id, w.status.kv.transfer))
        .filter(|(_, t)| {
            t.pulls
                + t.pull_fallbacks
                + t.recomputed
                + t.served_chunks
                + t.handed_over
                + t.taken_over
                + t.sessions_moved
                + t.sessions_adopted
                > 0
        })
        .collect();
    if !moved.is_empty() {
        let _ = writeln!(out, "KV between workers (since each started):");
        let _ = writeln!(
            out,
            "{:<28} {:>6} {:>12} {:>10} {:>10} {:>11} {:>10} {:>9} {:>9} {:>8}",
            "WORKER",
            "PULLS",
            "PULLED-TOK",
            "PULLED-MB",
            "FALLBACKS",
            "RECOMPUTED",
            "SERVED-MB",
            "HANDED-ON",
            "TAKEN-ON",
            "SESSIONS"
        );
        for (id, t) in moved {
            let _ = writeln!(
                out,
                "{:<28} {:>6} {:>12} {:>10.1} {:>10} {:>11} {:>10.1} {:>9} {:>9} {:>8}",
                id,
                t.pulls,
                t.pulled_tokens,
                t.pulled_bytes as f64 / 1e6,
                t.pull_fallbacks,
                t.recomputed,
                t.served_bytes as f64 / 1e6,
                t.handed_over,
                t.taken_over,
                format!("{}/{}", t.sessions_moved, t.sessions_adopted)
            );
        }
    }
    if !fleet.queues.is_empty() {
        let _ = writeln!(out, "waiting for a worker with room (fleet queue):");
        let _ = writeln!(
            out,
            "{:<30} {:<12} {:<20} {:>8} {:>10} {:>10}",
            "MODEL", "PRIORITY", "TENANT", "WAITING", "BYTES", "OLDEST-ms"
        );
        for q in &fleet.queues {
            let tenant = if q.tenant.is_empty() { "-" } else { q.tenant.as_str() };
            let _ = writeln!(
                out,
                "{:<30} {:<12} {:<20} {:>8} {:>10} {:>10}",
                q.model,
                q.priority.as_str(),
                tenant,
                q.waiting,
                q.bytes,
                q.oldest_ms
            );
        }
    }
    out
}
