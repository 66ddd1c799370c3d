//! `switchyard bench disagg` and `switchyard bench handover`: what moving KV between
//! workers does for a request, through NATS + coordinator + CPU workers in this
//! process (they share the host's cores: one compute at a time where it matters).
//!
//! `disagg`: a `prefill`, a `decode` and a `both` worker. Each run's new document goes
//! first to the decode worker (prefilled on the prefill worker, then pulled) and then
//! to the `both` worker (pulls off: computed whole): time to first token of each. Then
//! the cost to others: a stream already running on the target, and the longest gap
//! between its chunks while the long prompt is admitted there — whole (the prompt's
//! prefill shares the worker's steps) or disaggregated (only the pulled KV's import).
//!
//! `handover`: streams on long documents (up to 512 tokens each) run on worker `a`,
//! which is drained (what SIGTERM does) once each has 16 tokens; `b` takes them. Per stream: the longest gap
//! the client saw, the tokens `b` computed again, and, for comparison, the time to
//! first token of a document as long computed from nothing on a third worker (what a
//! resume by recompute costs before its first token).

use super::kv_transfer::{ask, settle, BenchFleet};
use super::link::LinkSpec;
use super::median;
use super::prefix::document;
use clap::Args;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use switchyard_client::{Client, StreamEvent};
use switchyard_config::Config;
use switchyard_messages::{GenerateMetrics, GenerateRequest, WorkerRole};
use switchyard_node::WorkerFlags;

/// `switchyard bench disagg` and `switchyard bench handover`.
#[derive(Args, Debug)]
pub struct BenchKvMovesArgs {
    #[command(flatten)]
    pub worker: WorkerFlags,
    /// Prompt lengths to measure, in tokens (about; a document of ~100-token parts).
    #[arg(long, value_delimiter = ',', default_value = "1500")]
    pub tokens: Vec<usize>,
    /// Measured runs per length (each a new document).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// handover: streams running on the drained worker.
    #[arg(long, default_value_t = 2)]
    pub streams: usize,
    /// Puts the prefill worker (disagg) or the taker (handover) on a second "host": a
    /// network namespace whose link to this one has this round trip and rate, e.g.
    /// `1ms,1gbit` (needs root, `ip` and `tc`; see docs/benchmarks.md).
    #[arg(long, value_name = "RTT,RATE")]
    pub link: Option<LinkSpec>,
}

/// How the workers reach each other, for the report's first line.
fn path(link: Option<LinkSpec>, far: &str) -> String {
    match link {
        Some(spec) => format!("{far} behind a link of {spec}"),
        None => "loopback NATS".into(),
    }
}

fn prompt(run: usize, tokens: usize) -> String {
    format!("{}\nQuestion: what came first?\nAnswer:", document(run, tokens / 100))
}

/// A stream pinned to `worker`, read until it has `tokens` tokens.
async fn started(
    client: &Client,
    name: &str,
    worker: &str,
    prompt: String,
    max_tokens: u32,
    tokens: usize,
) -> anyhow::Result<switchyard_client::ResponseStream> {
    let mut req = GenerateRequest::generate(Client::new_request_id(), name, prompt);
    req.head.worker = Some(worker.into());
    req.config.max_tokens = max_tokens;
    let mut stream = client.generate(req).await?.without_resume();
    let mut got = 0;
    while got < tokens {
        match stream.next().await {
            Some(Ok(StreamEvent::Tokens(t))) => got += t.len(),
            Some(Ok(StreamEvent::Done { .. })) | None => anyhow::bail!("the stream ended after {got} tokens"),
            Some(Err(e)) => return Err(e.into()),
        }
    }
    Ok(stream)
}

/// Reads a stream to its end: the longest gap between two chunks that came after
/// `from`, and the final metrics.
async fn finish(
    mut stream: switchyard_client::ResponseStream,
    from: Instant,
) -> anyhow::Result<(Duration, GenerateMetrics)> {
    let (mut gap, mut last) = (Duration::ZERO, from);
    while let Some(ev) = stream.next().await {
        let now = Instant::now();
        gap = gap.max(now.saturating_duration_since(last));
        last = now;
        match ev? {
            StreamEvent::Tokens(_) => {}
            StreamEvent::Done { metrics, .. } => return Ok((gap, metrics)),
        }
    }
    anyhow::bail!("the stream ended without a final event")
}

/// The longest gap between chunks of a stream running on `worker` while `prompt`
/// (a new document) is admitted there and computed up to its first token.
async fn stall_during(fleet: &BenchFleet, worker: &str, prompt: String) -> anyhow::Result<Duration> {
    let (client, name) = (&fleet.client, fleet.name.as_str());
    let count = "Count from 1 to 10000: 1, 2, 3, 4,".to_string();
    let mut running = started(client, name, worker, count, 4_000, 8).await?;
    let long = ask(client, name, worker, prompt);
    tokio::pin!(long);
    let (mut gap, mut last) = (Duration::ZERO, Instant::now());
    loop {
        tokio::select! {
            done = &mut long => {
                done?;
                break;
            }
            ev = running.next() => {
                let now = Instant::now();
                gap = gap.max(now - last);
                last = now;
                match ev {
                    Some(Ok(StreamEvent::Tokens(_))) => {}
                    _ => anyhow::bail!("the running stream ended before the long prompt's first token"),
                }
            }
        }
    }
    running.cancel().await?;
    drop(running);
    settle(client).await?;
    Ok(gap)
}

/// `bench disagg`.
pub async fn disagg(mut config: Config, args: &BenchKvMovesArgs) -> anyhow::Result<ExitCode> {
    args.worker.apply(&mut config);
    let workers = [("dec", WorkerRole::Decode, true), ("whole", WorkerRole::Both, false)];
    let mut fleet = BenchFleet::start_linked(config, &workers, args.link).await?;
    match args.link {
        Some(_) => fleet.add_far("pre", WorkerRole::Prefill, true).await?,
        None => fleet.add("pre", WorkerRole::Prefill, true).await?,
    }
    let (client, name) = (&fleet.client, fleet.name.clone());
    println!(
        "disagg: {name}, {}, a prefill and a decode worker vs one worker, {} runs per length (medians)",
        path(args.link, "the prefill worker"),
        args.runs
    );
    println!(
        "{:>7} {:>11} {:>11} {:>8} {:>12} {:>8} {:>14} {:>14}",
        "tokens", "whole TTFT", "disagg TTFT", "ratio", "prefill@pre", "pull", "stall whole", "stall disagg"
    );
    let mut run = 0;
    for &tokens in &args.tokens {
        let (mut whole, mut split, mut remote, mut pull, mut stalls) =
            (vec![], vec![], vec![], vec![], (vec![], vec![]));
        let mut prompt_tokens = 0;
        for i in 0..args.runs + 1 {
            run += 1;
            eprintln!(
                "{tokens} tokens: run {i}/{}{}",
                args.runs,
                if i == 0 { " (warm-up)" } else { "" }
            );
            // The decode worker first: the whole worker computes with pulls off, so
            // the document it holds after is no help to it.
            let (d_ttft, d) = ask(client, &name, "dec", prompt(run, tokens)).await?;
            settle(client).await?;
            let (w_ttft, w) = ask(client, &name, "whole", prompt(run, tokens)).await?;
            settle(client).await?;
            if d.remote_prefill_us == 0 {
                eprintln!("note: the decode worker computed it itself ({d:?})");
            }
            run += 1;
            let stall_whole = stall_during(&fleet, "whole", prompt(run, tokens)).await?;
            run += 1;
            let stall_split = stall_during(&fleet, "dec", prompt(run, tokens)).await?;
            if i == 0 {
                continue;
            }
            prompt_tokens = w.prompt_tokens;
            whole.push(w_ttft.as_secs_f64() * 1e3);
            split.push(d_ttft.as_secs_f64() * 1e3);
            remote.push(d.remote_prefill_us as f64 / 1e3);
            pull.push(d.pull_us as f64 / 1e3);
            stalls.0.push(stall_whole.as_secs_f64() * 1e3);
            stalls.1.push(stall_split.as_secs_f64() * 1e3);
        }
        let (w, s) = (median(&whole), median(&split));
        println!(
            "{:>7} {:>9.0}ms {:>9.0}ms {:>7.2}× {:>10.0}ms {:>6.0}ms {:>12.0}ms {:>12.0}ms",
            prompt_tokens,
            w,
            s,
            w / s,
            median(&remote),
            median(&pull),
            median(&stalls.0),
            median(&stalls.1)
        );
    }
    fleet.stop().await;
    Ok(ExitCode::SUCCESS)
}

/// `bench handover`.
pub async fn handover(mut config: Config, args: &BenchKvMovesArgs) -> anyhow::Result<ExitCode> {
    args.worker.apply(&mut config);
    let both = WorkerRole::Both;
    // `cmp` measures recomputing: pulls off, and a `prefill` worker so that no
    // routed request (a stream handed over) lands there.
    let workers = [("cmp", WorkerRole::Prefill, false)];
    let mut fleet = BenchFleet::start_linked(config, &workers, args.link).await?;
    match args.link {
        Some(_) => fleet.add_far("b", both, true).await?,
        None => fleet.add("b", both, true).await?,
    }
    let name = fleet.name.clone();
    println!(
        "handover: {name}, {}, {} streams drained per run, {} runs per length (medians over streams)",
        path(args.link, "the taker"),
        args.streams,
        args.runs
    );
    println!(
        "{:>7} {:>10} {:>12} {:>12} {:>10} {:>16}",
        "tokens", "moved", "gap", "recomputed", "pulled", "recompute TTFT"
    );
    let mut run = 0;
    for &tokens in &args.tokens {
        let (mut gaps, mut recomputed, mut pulled, mut cold, mut moved, mut total) =
            (vec![], vec![], vec![], vec![], 0, 0);
        let mut prompt_tokens = 0;
        for i in 0..args.runs + 1 {
            let a = format!("a{run}");
            fleet.add(&a, both, true).await?;
            eprintln!(
                "{tokens} tokens: run {i}/{}{}",
                args.runs,
                if i == 0 { " (warm-up)" } else { "" }
            );
            // All at once, long enough to be running still when the last has its
            // tokens: each then moves mid-stream.
            let starts =
                (0..args.streams).map(|k| started(&fleet.client, &name, &a, prompt(run + 1 + k, tokens), 512, 16));
            let streams = futures::future::try_join_all(starts).await?;
            run += args.streams;
            let drained = fleet.workers.last().expect("just added").0.clone();
            let from = Instant::now();
            let drain = tokio::spawn(async move { drained.shutdown(Duration::from_secs(60)).await });
            // Read side by side, so each gap is when its chunks really came.
            let done = futures::future::try_join_all(streams.into_iter().map(|s| finish(s, from))).await?;
            drain.await?;
            if let Some((_, mut loaded)) = fleet.workers.pop() {
                loaded.stop();
            }
            // What recomputing instead costs before its first token: a document as
            // long, from nothing, on a worker that does not pull.
            run += 1;
            let (ttft, m) = ask(&fleet.client, &name, "cmp", prompt(run, tokens)).await?;
            settle(&fleet.client).await?;
            if i == 0 {
                continue;
            }
            prompt_tokens = m.prompt_tokens;
            cold.push(ttft.as_secs_f64() * 1e3);
            for (gap, m) in done {
                total += 1;
                if m.handovers == 0 {
                    continue;
                }
                moved += 1;
                gaps.push(gap.as_secs_f64() * 1e3);
                // The taker's prompt is the prompt and the tokens so far; the last of
                // them was sampled but never run (an undisturbed run computes it too).
                recomputed.push(f64::from((m.prompt_tokens - m.cached_tokens).saturating_sub(1)));
                pulled.push(f64::from(m.pulled_tokens));
            }
        }
        println!(
            "{:>7} {:>6}/{:<3} {:>10.0}ms {:>12.0} {:>10.0} {:>14.0}ms",
            prompt_tokens,
            moved,
            total,
            median(&gaps),
            median(&recomputed),
            median(&pulled),
            median(&cold)
        );
    }
    fleet.stop().await;
    Ok(ExitCode::SUCCESS)
}
