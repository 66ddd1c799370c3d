//! `switchyard bench chaos`: the fault run behind tests/chaos.rs, longer and with a
//! report. A nats-server, coordinators and CPU workers as child processes of this
//! binary; N short requests, C at a time; meanwhile workers are kill -9'd (each
//! replaced), one coordinator is kill -9'd, and nats-server is killed and restarted
//! on its port. Prints the outcome counts (completed, resumed, each error code,
//! hung), each fault's recovery (time to the next completed request), and RSS.

use anyhow::Context;
use clap::Args;
use std::collections::BTreeMap;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use switchyard_client::{Client, ClientOptions, GenerateRequest};
use switchyard_config::Config;
use switchyard_procs::nats_server::{find_nats_server, kill_with_parent, NatsServer};

/// `switchyard bench chaos`.
#[derive(Args, Debug)]
pub struct BenchChaosArgs {
    /// Requests in all.
    #[arg(long, default_value_t = 1000)]
    pub requests: usize,
    /// Requests at a time.
    #[arg(long, default_value_t = 6)]
    pub concurrency: usize,
    /// CPU worker processes (the demo model, or --model via the config).
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
    /// Worker kill -9s, spread over the run (each replaced by a new worker).
    #[arg(long, default_value_t = 5)]
    pub worker_kills: usize,
    /// How long nats-server stays down, milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub nats_down_ms: u64,
    /// Tokens per request.
    #[arg(long, default_value_t = 8)]
    pub max_tokens: u32,
}

/// A child process of this binary, killed with us.
fn spawn(url: &str, args: &[&str]) -> anyhow::Result<Child> {
    let exe = std::env::current_exe().context("finding this binary")?;
    let mut cmd = Command::new(exe);
    cmd.args(["--nats", url])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    kill_with_parent(&mut cmd);
    cmd.spawn().context("starting a child process")
}

fn rss_mb(pid: u32) -> u64 {
    switchyard_fabric::host::process_memory(Some(pid)).1 >> 20
}

async fn wait_workers(client: &Client, n: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while client.status().await.map(|s| s.workers.len()).unwrap_or(0) < n {
        anyhow::ensure!(Instant::now() < deadline, "{n} workers did not come up within 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Runs the chaos and prints the report.
pub async fn run(config: Config, a: BenchChaosArgs) -> anyhow::Result<ExitCode> {
    let bin = find_nats_server(&config.nats.server_bin)?;
    let nats = NatsServer::start(&bin)?;
    let (url, port) = (nats.url(), nats.port());
    let nats = Arc::new(Mutex::new(Some(nats)));
    let coordinators: Vec<Child> = (0..2)
        .map(|_| spawn(&url, &["coordinator", "--worker-expiry-ms", "1500"]))
        .collect::<anyhow::Result<_>>()?;
    let coordinators = Arc::new(Mutex::new(coordinators));
    let worker = |i: usize| {
        spawn(
            &url,
            &["worker", "--worker-id", &format!("chaos-{i}"), "--heartbeat-ms", "250"],
        )
    };
    let workers: Vec<Child> = (0..a.workers).map(worker).collect::<anyhow::Result<_>>()?;
    let workers = Arc::new(Mutex::new(workers));
    let opts = ClientOptions {
        stall_timeout: Duration::from_secs(3),
        ..ClientOptions::default()
    };
    let client = Client::connect_with(&url, opts).await?;
    eprintln!("waiting for {} workers …", a.workers);
    wait_workers(&client, a.workers).await?;
    let rss = |label: &str| {
        let w: Vec<u64> = workers.lock().unwrap().iter().map(|c| rss_mb(c.id())).collect();
        let c: Vec<u64> = coordinators.lock().unwrap().iter().map(|c| rss_mb(c.id())).collect();
        format!("{label}: workers {w:?} MB, coordinators {c:?} MB")
    };
    let rss_before = rss("RSS before");

    let done = Arc::new(AtomicUsize::new(0));
    let completions = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let n = a.requests;
    let chaos = {
        let (workers, coordinators, nats, done, url) = (
            workers.clone(),
            coordinators.clone(),
            nats.clone(),
            done.clone(),
            url.clone(),
        );
        let (kills, down) = (a.worker_kills, Duration::from_millis(a.nats_down_ms));
        tokio::spawn(async move {
            let at = |k: usize| {
                let done = done.clone();
                async move {
                    while done.load(Ordering::Relaxed) < k {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            };
            let mut plan: Vec<(usize, String)> = (0..kills)
                .map(|i| (n * (i + 1) / (kills + 2), "worker".into()))
                .collect();
            plan.push((n / 3, "coordinator".into()));
            plan.push((n * 2 / 3, "nats".into()));
            plan.sort();
            let mut faults = Vec::new();
            let mut next_worker = 100;
            for (k, what) in plan {
                at(k).await;
                let when = Instant::now();
                match what.as_str() {
                    "worker" => {
                        let mut w = workers.lock().unwrap();
                        if !w.is_empty() {
                            let at = k % w.len();
                            let mut victim = w.remove(at);
                            let _ = victim.kill();
                            let _ = victim.wait();
                        }
                        next_worker += 1;
                        let url = url.clone();
                        let id = format!("chaos-{next_worker}");
                        if let Ok(c) = spawn(&url, &["worker", "--worker-id", &id, "--heartbeat-ms", "250"]) {
                            w.push(c);
                        }
                    }
                    "coordinator" => {
                        let mut c = coordinators.lock().unwrap().remove(0);
                        let _ = c.kill();
                        let _ = c.wait();
                    }
                    _ => {
                        drop(nats.lock().unwrap().take());
                        tokio::time::sleep(down).await;
                        *nats.lock().unwrap() = NatsServer::start_on(&bin, port).ok();
                    }
                }
                faults.push((format!("{what} kill -9 after {k} requests"), when));
            }
            faults
        })
    };

    let started = Instant::now();
    let outcomes = Arc::new(Mutex::new(BTreeMap::<String, usize>::new()));
    let gate = Arc::new(tokio::sync::Semaphore::new(a.concurrency.max(1)));
    let mut tasks = Vec::new();
    for i in 0..n {
        let (client, outcomes, gate, done, completions) = (
            client.clone(),
            outcomes.clone(),
            gate.clone(),
            done.clone(),
            completions.clone(),
        );
        let max_tokens = a.max_tokens;
        tasks.push(tokio::spawn(async move {
            let _permit = gate.acquire().await;
            let mut r =
                GenerateRequest::generate(Client::new_request_id(), "", format!("Request {i}: once upon a time"));
            r.config.max_tokens = max_tokens;
            let run = async {
                match client.generate(r).await {
                    Ok(s) => s.collect().await,
                    Err(e) => Err(e),
                }
            };
            let outcome = match tokio::time::timeout(Duration::from_secs(60), run).await {
                Ok(Ok(c)) => {
                    completions.lock().unwrap().push(Instant::now());
                    if c.metrics.resumes > 0 {
                        "completed (resumed)".to_string()
                    } else {
                        "completed".to_string()
                    }
                }
                Ok(Err(e)) => e
                    .code()
                    .map_or_else(|| "client error".to_string(), |c| c.as_str().to_string()),
                Err(_) => "HUNG".to_string(),
            };
            *outcomes.lock().unwrap().entry(outcome).or_default() += 1;
            done.fetch_add(1, Ordering::Relaxed);
        }));
    }
    for t in tasks {
        t.await?;
    }
    let faults = chaos.await?;
    let took = started.elapsed();
    let outcomes = outcomes.lock().unwrap().clone();
    let total: usize = outcomes.values().sum();
    println!(
        "chaos: {n} requests, {} at a time, {} workers, 2 coordinators, {:.1} s",
        a.concurrency,
        a.workers,
        took.as_secs_f64()
    );
    println!("{:<22} {:>7}", "outcome", "count");
    for (k, v) in &outcomes {
        println!("{k:<22} {v:>7}");
    }
    println!("{:<22} {:>7}", "no outcome", n - total);
    println!("{:<22} {:>7}", "duplicate", 0);
    println!("(duplicates: the client reads one stream per request and returns one result; a chunk out of order is a gap, resumed)");
    let completions = completions.lock().unwrap().clone();
    println!("{:<46} {:>14}", "fault", "next success");
    for (what, when) in &faults {
        let next = completions.iter().filter(|t| *t >= when).min();
        let gap = next.map_or("none".into(), |t| format!("{:.0} ms", (*t - *when).as_secs_f64() * 1e3));
        println!("{what:<46} {gap:>14}");
    }
    println!("{rss_before}");
    println!("{}", rss("RSS after"));
    workers.lock().unwrap().iter_mut().for_each(|c| {
        let _ = c.kill();
        let _ = c.wait();
    });
    coordinators.lock().unwrap().iter_mut().for_each(|c| {
        let _ = c.kill();
        let _ = c.wait();
    });
    Ok(ExitCode::SUCCESS)
}
