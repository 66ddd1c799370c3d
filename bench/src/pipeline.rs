//! `switchyard bench pipeline`: one GGUF split into pipeline stages (one worker
//! process per stage, `--threads` each, over NATS on this machine) against one
//! worker process holding the whole model with all the stages' threads, and —
//! given `--rpc-server` and an RPC-enabled `--rpc-llama-server` from the same
//! llama.cpp build — llama.cpp's RPC split of the same GGUF with the same layers
//! per process and threads. Rounds alternate between the systems; prints decode
//! tok/s at each stream count, prefill tok/s, time per token of one stream and
//! peak RSS per process, with ratios.

use super::llama_cpp::{direct, fabric, Run};
use super::{median, BENCH_PROMPT};
use anyhow::{bail, Context};
use clap::Args;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use switchyard_client::Client;
use switchyard_config::Config;
use switchyard_procs::llama_server::LlamaServer;
use switchyard_procs::nats_server::{find_nats_server, NatsServer};

/// `switchyard bench pipeline`.
#[derive(Args, Debug)]
pub struct BenchPipelineArgs {
    /// The GGUF to split (default: the demo model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Stages: the layers are cut into this many even ranges, one worker process each.
    #[arg(long, default_value_t = 2)]
    pub stages: usize,
    /// Compute threads per stage; the whole-model worker (and llama.cpp's processes,
    /// per process) get the same in all.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Concurrent stream counts, comma-separated; the largest is every side's slots.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 8])]
    pub streams: Vec<usize>,
    /// Rounds per stream count and system.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Tokens generated per stream.
    #[arg(long, default_value_t = 32)]
    pub max_tokens: u32,
    /// llama.cpp's `ggml-rpc-server` (built with -DGGML_RPC=ON): one per later stage.
    #[arg(long)]
    pub rpc_server: Option<PathBuf>,
    /// The `llama-server` of that same RPC-enabled build (it runs the first
    /// stage's layers and reaches the others through `--rpc`).
    #[arg(long)]
    pub rpc_llama_server: Option<PathBuf>,
    /// Put the later stages (and llama.cpp's rpc-servers) behind a network
    /// namespace link of RTT,RATE, e.g. `1ms,1gbit` (as `bench kv-transfer --link`;
    /// needs root).
    #[arg(long)]
    pub link: Option<crate::link::LinkSpec>,
}

/// A child process killed when dropped.
struct Kid(Child);

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Kid {
    fn spawn(cmd: &mut Command) -> anyhow::Result<Self> {
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        switchyard_fabric::process::kill_with_parent(cmd);
        Ok(Self(cmd.spawn().with_context(|| format!("starting {cmd:?}"))?))
    }

    /// Peak resident set, MB.
    fn peak_mb(&self) -> f64 {
        switchyard_fabric::host::process_memory(Some(self.0.id())).0 as f64 / 1e6
    }
}

/// `bin`, in network namespace `ns` when given.
fn command(bin: &Path, ns: Option<&str>) -> Command {
    match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(bin);
            c
        }
        None => Command::new(bin),
    }
}

/// A switchyard worker process of the fleet at `url` (in namespace `ns`).
fn worker(
    url: &str,
    ns: Option<&str>,
    id: &str,
    model: &Path,
    threads: usize,
    slots: usize,
    extra: &[String],
) -> anyhow::Result<Kid> {
    let mut cmd = command(&std::env::current_exe()?, ns);
    cmd.args(["--nats", url, "worker", "--worker-id", id, "--model"])
        .arg(model)
        .args([
            "--threads",
            &threads.to_string(),
            "--parallel-slots",
            &slots.to_string(),
        ])
        .args(["--context-len", "1024"])
        .args(extra);
    Kid::spawn(&mut cmd)
}

/// Decode of one round: the sum of the streams' decode rates (each stream's tokens
/// after its first over the time from its first token to its last; prompts are
/// measured apart, as prefill), and the first stream's time per token (ms).
#[derive(Debug, Clone, Copy)]
struct Round {
    tps: f64,
    tpot_ms: f64,
}

fn decode_tps(r: &Run) -> f64 {
    f64::from(r.tokens.saturating_sub(1)) / r.total.saturating_sub(r.ttft).as_secs_f64().max(1e-9)
}

fn round(runs: &[Run], _wall: f64) -> Round {
    Round {
        tps: runs.iter().map(decode_tps).sum(),
        tpot_ms: 1e3 / decode_tps(&runs[0]),
    }
}

fn prompts(r: usize, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{} {BENCH_PROMPT}", 1000 * r + i)).collect()
}

/// A system under test: how to send one stream.
#[derive(Clone)]
enum Side {
    Fleet(Box<Client>, String),
    Llama(reqwest::Client, String),
}

impl Side {
    async fn one(&self, prompt: &str, max_tokens: u32) -> anyhow::Result<Run> {
        match self {
            Side::Fleet(c, model) => fabric(c, model, prompt, max_tokens).await,
            Side::Llama(http, url) => direct(http, url, prompt, max_tokens).await,
        }
    }

    async fn round(&self, ps: Vec<String>, max_tokens: u32) -> anyhow::Result<Round> {
        let start = Instant::now();
        let runs = futures::future::try_join_all(ps.iter().map(|p| self.one(p, max_tokens))).await?;
        Ok(round(&runs, start.elapsed().as_secs_f64()))
    }

    /// Prefill tok/s of a ~400-token prompt no one has seen.
    async fn prefill(&self, salt: usize) -> anyhow::Result<f64> {
        let prompt = format!("{salt} {}", BENCH_PROMPT.repeat(4));
        match self {
            Side::Fleet(c, model) => {
                let mut req = switchyard_messages::GenerateRequest::generate(Client::new_request_id(), model, &prompt);
                req.config.max_tokens = 1;
                let done = c.generate(req).await?.collect().await?;
                Ok(done.metrics.prefill_tokens_per_sec)
            }
            Side::Llama(http, url) => {
                let body = serde_json::json!({"prompt": prompt, "n_predict": 1, "cache_prompt": false});
                let v: serde_json::Value = http
                    .post(format!("{url}/completion"))
                    .json(&body)
                    .send()
                    .await?
                    .json()
                    .await?;
                Ok(v["timings"]["prompt_per_second"].as_f64().unwrap_or(0.0))
            }
        }
    }
}

/// Runs the comparison and prints the table.
pub async fn run(config: Config, args: BenchPipelineArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.stages >= 2, "--stages is at least 2");
    let model = match &args.model {
        Some(m) => m.clone(),
        None => switchyard_config::demo_model_path(),
    };
    let layers = {
        let mut f = std::fs::File::open(&model).with_context(|| model.display().to_string())?;
        let ct = candle_core::quantized::gguf_file::Content::read(&mut f)?;
        switchyard_workers::engine::model::params::LlamaParams::from_gguf(&ct)?.n_layer
    };
    anyhow::ensure!(
        layers >= args.stages,
        "{layers} layers cannot make {} stages",
        args.stages
    );
    let cuts: Vec<usize> = (0..=args.stages).map(|i| i * layers / args.stages).collect();
    let slots = args.streams.iter().copied().max().unwrap_or(1);
    let nats = NatsServer::start(&find_nats_server(&config.nats.server_bin)?)?;
    let url = nats.url();
    let mut fleet = config.clone();
    fleet.nats.url = url.clone();
    let coordinator = switchyard_node::start_coordinator(&fleet).await?;
    let link = match args.link {
        Some(spec) => {
            eprintln!("later stages behind a link of {spec}");
            Some(crate::link::Link::up(spec, nats.port())?)
        }
        None => None,
    };
    let (far_url, ns) = match &link {
        Some(l) => (l.url(), Some(l.netns())),
        None => (url.clone(), None),
    };
    let mut kids: Vec<(String, Kid)> = Vec::new();
    for i in (1..args.stages).rev() {
        let range = format!("{}-{}", cuts[i], cuts[i + 1] - 1);
        let extra = [
            "--pipeline".to_string(),
            "bench".into(),
            "--layers".into(),
            range.clone(),
        ];
        kids.push((
            format!("stage {range}"),
            worker(&far_url, ns, &format!("stage-{i}"), &model, args.threads, slots, &extra)?,
        ));
    }
    let first = format!("0-{}", cuts[1] - 1);
    let extra = [
        "--pipeline".to_string(),
        "bench".into(),
        "--layers".into(),
        first.clone(),
        "--model-name".into(),
        "split".into(),
    ];
    kids.push((
        format!("stage {first}"),
        worker(&url, None, "stage-0", &model, args.threads, slots, &extra)?,
    ));
    let whole_threads = args.threads * args.stages;
    let extra = ["--model-name".to_string(), "whole".into()];
    let whole = worker(&url, None, "whole", &model, whole_threads, slots, &extra)?;
    let client = Client::connect(&url).await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s = client.status().await?;
        if s.workers.len() == 2 {
            break;
        }
        if Instant::now() > deadline {
            bail!("the workers did not come up within 120 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut sides = vec![
        (
            "switchyard pipeline",
            Side::Fleet(Box::new(client.clone()), "split".into()),
        ),
        (
            "one worker, whole",
            Side::Fleet(Box::new(client.clone()), "whole".into()),
        ),
    ];
    let mut rpc_kids = Vec::new();
    let _llama = match (&args.rpc_server, &args.rpc_llama_server) {
        (Some(rpc), Some(server)) => {
            let mut endpoints = Vec::new();
            let mut split = Vec::new();
            for i in 1..args.stages {
                let port = switchyard_fabric::process::free_port()?;
                let mut cmd = command(rpc, ns);
                let host = match &link {
                    Some(l) => l.far_addr().to_string(),
                    None => "127.0.0.1".into(),
                };
                cmd.args(["-H", &host, "-p", &port.to_string(), "-t", &args.threads.to_string()]);
                rpc_kids.push((
                    format!("rpc-server {}-{}", cuts[i], cuts[i + 1] - 1),
                    Kid::spawn(&mut cmd)?,
                ));
                endpoints.push(match &link {
                    Some(l) => l.relay_to(port)?.to_string(),
                    None => format!("127.0.0.1:{port}"),
                });
                split.push((cuts[i + 1] - cuts[i]).to_string());
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            let ngl = (layers - cuts[1]).to_string();
            let rpc_list = endpoints.join(",");
            let ts = split.join(",");
            let mut extra = vec!["--rpc", &rpc_list, "-ngl", &ngl];
            if split.len() > 1 {
                extra.extend(["--tensor-split", &ts]);
            }
            eprintln!("starting llama-server --rpc {rpc_list} -ngl {ngl} …");
            let s = LlamaServer::start_with(server, &model, args.threads, slots, &extra).await?;
            sides.push((
                "llama.cpp RPC",
                Side::Llama(switchyard_procs::llama_server::http_client(), s.url.clone()),
            ));
            Some(s)
        }
        (None, None) => {
            eprintln!("no --rpc-server / --rpc-llama-server: llama.cpp's RPC split is not measured");
            None
        }
        _ => bail!("--rpc-server and --rpc-llama-server go together"),
    };
    eprintln!("warming up …");
    let warm = Instant::now() + Duration::from_secs(60);
    for (name, side) in &sides {
        loop {
            match side.round(prompts(0, 1), 4).await {
                Ok(_) => break,
                Err(e) if Instant::now() < warm => {
                    eprintln!("{name}: not ready ({e}); again …");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => return Err(e.context(format!("{name} never answered"))),
            }
        }
    }
    // Exactness on this model: the pipeline's greedy tokens against the whole worker's.
    let mut same = 0;
    for (i, p) in prompts(77, 3).iter().enumerate() {
        let ids = |model: &str| {
            let mut req = switchyard_messages::GenerateRequest::generate(Client::new_request_id(), model, p);
            req.config.max_tokens = args.max_tokens;
            let c = client.clone();
            async move {
                let done = c.generate(req).await?.collect().await?;
                anyhow::Ok(done.tokens.iter().map(|t| t.id).collect::<Vec<u32>>())
            }
        };
        let (a, b) = (ids("split").await?, ids("whole").await?);
        match a == b {
            true => same += 1,
            false => {
                eprintln!("prompt {i}: the pipeline's greedy tokens differ from the whole worker's: {a:?} vs {b:?}")
            }
        }
    }
    println!(
        "pipeline: {} ({layers} layers) in {} stages of {} thread(s) each ({}); the whole model on one worker \
         with {whole_threads} threads; {}; ~100-token prompts, {} tokens per stream, greedy, {} rounds (medians)",
        model.display(),
        args.stages,
        args.threads,
        cuts.windows(2)
            .map(|w| format!("{}-{}", w[0], w[1] - 1))
            .collect::<Vec<_>>()
            .join(", "),
        match args.link {
            Some(spec) => format!("later stages behind a link of {spec}"),
            None => "loopback".into(),
        },
        args.max_tokens,
        args.runs
    );
    let mut r = 1;
    let mut table: Vec<(usize, Vec<Round>)> = Vec::new();
    for &n in &args.streams {
        let mut per: Vec<Vec<Round>> = vec![Vec::new(); sides.len()];
        for i in 0..args.runs {
            eprintln!("{n} streams, round {}/{}", i + 1, args.runs);
            // Each round starts with a different side, so drift hits them all.
            for k in 0..sides.len() {
                let j = (k + i) % sides.len();
                per[j].push(sides[j].1.round(prompts(r, n), args.max_tokens).await?);
                r += 1;
            }
        }
        let med = |xs: &[Round], g: fn(&Round) -> f64| median(&xs.iter().map(g).collect::<Vec<_>>());
        table.push((
            n,
            per.iter()
                .map(|xs| Round {
                    tps: med(xs, |r| r.tps),
                    tpot_ms: med(xs, |r| r.tpot_ms),
                })
                .collect(),
        ));
    }
    let mut prefill = vec![Vec::new(); sides.len()];
    for i in 0..args.runs {
        for (j, (_, side)) in sides.iter().enumerate() {
            prefill[j].push(side.prefill(90_000 + i * 10 + j).await?);
        }
    }
    print!("{:<8}", "streams");
    for (name, _) in &sides {
        print!(" {:>32}", format!("{name} decode t/s"));
    }
    println!(" {:>14} {:>14}", "pipe/whole", "pipe/rpc");
    for (n, rounds) in &table {
        print!("{n:<8}");
        for r in rounds {
            print!(" {:>32.1}", r.tps);
        }
        let rpc = rounds
            .get(2)
            .map_or("-".to_string(), |r| format!("{:.3}", rounds[0].tps / r.tps));
        println!(" {:>14.3} {:>14}", rounds[0].tps / rounds[1].tps, rpc);
    }
    if let Some((_, rounds)) = table.iter().find(|(n, _)| *n == 1) {
        print!("{:<8}", "TPOT ms");
        for r in rounds {
            print!(" {:>32.2}", r.tpot_ms);
        }
        println!();
    }
    println!("greedy tokens identical to the whole worker's: {same}/3 prompts");
    print!("{:<8}", "prefill");
    for p in &prefill {
        print!(" {:>32.1}", median(p));
    }
    println!("  (tok/s, ~400-token prompt)");
    if let Some(p) = client
        .status()
        .await?
        .workers
        .iter()
        .find(|w| w.status.worker_id == "stage-0")
        .and_then(|w| w.status.models[0].info.pipeline.clone())
    {
        println!("{}", p.describe("stage-0"));
    }
    println!("peak RSS (MB):");
    for (name, kid) in kids.iter().chain(&rpc_kids) {
        println!("  {name:<24} {:>8.0}", kid.peak_mb());
    }
    println!("  {:<24} {:>8.0}", "whole-model worker", whole.peak_mb());
    if let Some(s) = &_llama {
        println!(
            "  {:<24} {:>8.0}",
            "llama-server (first)",
            switchyard_fabric::host::process_memory(Some(s.pid())).0 as f64 / 1e6
        );
    }
    drop(kids);
    coordinator.shutdown().await;
    Ok(())
}
