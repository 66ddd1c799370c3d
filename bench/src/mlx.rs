//! `bench mlx`: the same greedy prompts through switchyard (NATS + coordinator + a
//! `metal` worker and its MLX bridge) and through mlx-lm called directly in Python
//! (`mlx_peer.py`), alternating run by run, each run a cold prompt (a different first
//! word, so neither side reuses a prefix). Prints decode tok/s, prefill tok/s and time
//! to first token for both with ratios, and the CPU engine on the same weights for
//! context. The goal it checks: the bridge and fabric cost ≤ 3% of decode throughput.

use super::{median, LocalNode, RunClock, RunTiming, BENCH_PROMPT};
use clap::Args;
use futures::StreamExt;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::path::PathBuf;
use std::process::ExitCode;
use std::process::{Command, Stdio};
use std::time::Duration;
use switchyard_backend::{CancelFlag, GenerateEvent, Prompt};
use switchyard_client::{Client, StreamEvent};
use switchyard_config::Config;
use switchyard_messages::{GenerateConfig, GenerateRequest, LoadConfig};

/// `switchyard bench mlx`.
#[derive(Args, Debug)]
pub struct BenchMlxArgs {
    /// Hugging Face model directory (default: the demo model as F32 safetensors,
    /// ~/.cache/switchyard/models/SmolLM2-135M-Instruct-f32-hf, which
    /// scripts/gguf-to-hf.py makes and the test suite caches).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The Python with mlx-lm, for the bridge and the direct peer (default: the
    /// cache's venv, which scripts/setup.sh makes).
    #[arg(long)]
    pub mlx_python: Option<PathBuf>,
    /// Threads for the CPU engine's context figures.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Measured runs of each side (after one warm-up each).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Tokens generated per run (greedy; fewer if the model ends its answer).
    #[arg(long, default_value_t = 128)]
    pub max_tokens: u32,
}

const PEER_PY: &str = include_str!("mlx_peer.py");

/// First words that make every run's prompt cold (they differ in the first token).
const OPENERS: &[&str] = &[
    "Yesterday",
    "Meanwhile",
    "Honestly",
    "Notably",
    "Remember",
    "Suddenly",
    "Curiously",
    "Frankly",
    "Naturally",
    "Eventually",
    "Apparently",
    "Luckily",
    "Sadly",
    "Ironically",
    "Briefly",
    "Clearly",
];

fn prompt(i: usize) -> String {
    format!("{} {BENCH_PROMPT}", OPENERS[i % OPENERS.len()])
}

/// mlx-lm in its own Python process, driven one prompt per line.
struct Peer {
    child: std::process::Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Peer {
    fn start(python: &Path, model: &Path) -> anyhow::Result<Self> {
        let script = switchyard_workers::local::cache_dir().join("mlx-bench-peer.py");
        std::fs::create_dir_all(script.parent().unwrap_or(Path::new(".")))?;
        std::fs::write(&script, PEER_PY)?;
        let mut child = Command::new(python)
            .arg(&script)
            .arg(model)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting {} for the mlx-lm peer: {e}", python.display()))?;
        let out = BufReader::new(child.stdout.take().expect("piped"));
        let mut peer = Self { child, out };
        let ready = peer.line()?;
        anyhow::ensure!(ready["ready"] == true, "the mlx-lm peer did not start: {ready}");
        Ok(peer)
    }

    fn line(&mut self) -> anyhow::Result<Value> {
        let mut line = String::new();
        anyhow::ensure!(self.out.read_line(&mut line)? > 0, "the mlx-lm peer exited");
        Ok(serde_json::from_str(&line)?)
    }

    fn run(&mut self, prompt: &str, max_tokens: u32) -> anyhow::Result<RunTiming> {
        let stdin = self.child.stdin.as_mut().expect("piped");
        writeln!(stdin, "{}", json!({"prompt": prompt, "max_tokens": max_tokens}))?;
        stdin.flush()?;
        let v = self.line()?;
        let secs = |k: &str| Duration::from_secs_f64(v[k].as_f64().unwrap_or(0.0));
        Ok(RunTiming {
            ttft: secs("ttft_s"),
            decode: secs("decode_s"),
            tokens: v["tokens"].as_u64().unwrap_or(0) as u32,
            prompt_tokens: v["prompt_tokens"].as_u64().unwrap_or(0) as u32,
            prefill: secs("ttft_s"),
        })
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Prefill tok/s as the caller sees it: prompt tokens over time to first token.
fn seen_prefill_tps(t: &RunTiming) -> f64 {
    if t.ttft.is_zero() {
        0.0
    } else {
        f64::from(t.prompt_tokens) / t.ttft.as_secs_f64()
    }
}

/// Runs the benchmark and prints the report.
/// `switchyard bench mlx`: checks the model directory and the worker settings, then
/// runs [`mlx`].
pub async fn run(mut config: Config, args: &BenchMlxArgs) -> anyhow::Result<ExitCode> {
    let cache = switchyard_workers::local::cache_dir();
    let model = args
        .model
        .clone()
        .unwrap_or_else(|| cache.join("models/SmolLM2-135M-Instruct-f32-hf"));
    anyhow::ensure!(
        model.join("config.json").is_file(),
        "{} is not a Hugging Face model directory; make the demo one with: \
         ~/.cache/switchyard/venv/bin/python scripts/gguf-to-hf.py {} {} f32",
        model.display(),
        switchyard_node::demo_model_path().display(),
        model.display()
    );
    let python = args.mlx_python.clone().unwrap_or_else(|| cache.join("venv/bin/python"));
    config.worker.backend = "metal".into();
    config.worker.model = model.display().to_string();
    config.worker.mlx_python = python.display().to_string();
    config.worker.mlx_allow_cpu = true; // a benchmark runs MLX wherever it can
    config.validate()?;
    mlx(config, &python, args.runs, args.max_tokens, args.threads).await?;
    Ok(ExitCode::SUCCESS)
}

pub async fn mlx(config: Config, python: &Path, runs: usize, max_tokens: u32, threads: usize) -> anyhow::Result<()> {
    let model_dir = std::path::PathBuf::from(&config.worker.model);
    eprintln!("starting a fleet with a metal worker on {} …", model_dir.display());
    let local = LocalNode::start(config).await?;
    let (client, name) = (local.client.clone(), local.loaded.name.clone());
    eprintln!("starting the mlx-lm peer …");
    let mut peer = Peer::start(python, &model_dir)?;
    let gen_config = GenerateConfig {
        max_tokens,
        ..GenerateConfig::default()
    };
    let via = |p: String| {
        let (client, name, cfg) = (client.clone(), name.clone(), gen_config.clone());
        async move {
            let mut req = GenerateRequest::generate(Client::new_request_id(), name, p);
            req.config = cfg;
            let mut clock = RunClock::start();
            let mut stream = client.generate(req).await?;
            while let Some(ev) = stream.next().await {
                match ev? {
                    StreamEvent::Tokens(t) => clock.tokens(t.len() as u32),
                    StreamEvent::Done { metrics, .. } => clock.done(&metrics),
                }
            }
            let mut t = clock.finish();
            t.prefill = t.ttft;
            anyhow::Ok(t)
        }
    };
    eprintln!("warming up …");
    via(prompt(runs)).await?;
    peer.run(&prompt(runs + 1), max_tokens)?;
    let (mut s, mut m) = (Vec::new(), Vec::new());
    for i in 0..runs {
        eprintln!("run {}/{runs}", i + 1);
        if i % 2 == 0 {
            s.push(via(prompt(i)).await?);
            m.push(peer.run(&prompt(i), max_tokens)?);
        } else {
            m.push(peer.run(&prompt(i), max_tokens)?);
            s.push(via(prompt(i)).await?);
        }
    }
    drop(peer);
    local.stop().await;

    // The CPU engine on the same weights, in this process, for context.
    eprintln!("the CPU engine on the same weights …");
    let load = LoadConfig {
        threads: threads as u32,
        context_len: 2048,
        ..LoadConfig::default()
    };
    let cpu = super::engine_model(&model_dir, &load)?;
    let mut c = Vec::new();
    for i in 0..=runs {
        let mut clock = RunClock::start();
        let mut events = cpu.generate(Prompt::Text(prompt(i)), gen_config.clone(), CancelFlag::new());
        while let Some(ev) = events.next().await {
            match ev? {
                GenerateEvent::Token(_) => clock.tokens(1),
                GenerateEvent::Done { metrics, .. } => clock.done(&metrics),
            }
        }
        if i > 0 {
            c.push(clock.finish()); // the first run warms up
        }
    }

    let col = |xs: &[RunTiming], g: fn(&RunTiming) -> f64| median(&xs.iter().map(g).collect::<Vec<_>>());
    let ttft = |t: &RunTiming| t.ttft.as_secs_f64() * 1e3;
    println!(
        "mlx benchmark: {}, prompt ~{} tokens, {} generated, greedy, {runs} cold runs each (medians)",
        model_dir.display(),
        s[0].prompt_tokens,
        s[0].tokens
    );
    println!(
        "{:<30} {:>14} {:>14} {:>10} {:>16}",
        "", "mlx-lm direct", "switchyard", "ratio", "cpu engine (f32)"
    );
    for (label, g) in [
        (
            "decode tok/s (client-seen)",
            RunTiming::decode_tps as fn(&RunTiming) -> f64,
        ),
        ("prefill tok/s (prompt/TTFT)", seen_prefill_tps),
        ("time to first token ms", ttft),
    ] {
        let (direct, ours, engine) = (col(&m, g), col(&s, g), col(&c, g));
        println!(
            "{label:<30} {direct:>14.1} {ours:>14.1} {:>10.3} {engine:>16.1}",
            ours / direct
        );
    }
    let (direct, ours) = (col(&m, RunTiming::decode_tps), col(&s, RunTiming::decode_tps));
    let cost = (1.0 - ours / direct) * 100.0;
    println!(
        "bridge + fabric cost: {cost:.2}% of decode throughput ({}; goal ≤ 3%)",
        if cost <= 3.0 { "met" } else { "not met" }
    );
    Ok(())
}
