//! `switchyard bench pull`: fetching a model over NATS (JetStream's object store,
//! `models pull`) against the same bytes over plain HTTP, same host, same file,
//! alternating runs. Both sides do the same work on arrival — write to a fresh
//! file, SHA-256 every byte, sync to disk — so the ratio is the transport's. One
//! uncounted warm-up round each first.

use super::median;
use anyhow::Context as _;
use clap::Args;
use futures::StreamExt;
use sha2::{Digest as _, Sha256};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use switchyard_config::Config;
use switchyard_procs::nats_server::{find_nats_server, NatsServer};
use switchyard_store::sink::FileSink;
use switchyard_store::{Progress, Store, Upload};
use tokio::io::AsyncReadExt;

/// `switchyard bench pull`.
#[derive(Args, Debug)]
pub struct BenchPullArgs {
    /// The file to move (default: a file of --size-mb random bytes).
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Size of the generated file, MB.
    #[arg(long, default_value_t = 512)]
    pub size_mb: usize,
    /// Runs of each (alternating).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
}

/// Runs the benchmark; with `config.nats.url` empty, on its own JetStream server.
pub async fn run(mut config: Config, args: &BenchPullArgs) -> anyhow::Result<ExitCode> {
    let dir = TempDir(std::env::temp_dir().join(format!("switchyard-bench-pull-{}", std::process::id())));
    std::fs::create_dir_all(dir.path())?;
    let file = match &args.file {
        Some(f) => f.clone(),
        None => {
            let f = dir.path().join("model.bin");
            write_random(&f, args.size_mb << 20)?;
            f
        }
    };
    let size = std::fs::metadata(&file)?.len();
    let server = match config.nats.url.is_empty() {
        true => {
            let s = NatsServer::start_jetstream(&find_nats_server(&config.nats.server_bin)?, &dir.path().join("js"))?;
            config.nats.url = s.url();
            Some(s)
        }
        false => None,
    };
    config.store.bucket = "switchyard-bench-pull".into();
    let nats = switchyard_fabric::nats::connect(
        &config.nats.url,
        &config.nats.security(),
        "switchyard-bench",
        Duration::from_secs(10),
    )
    .await?;
    let store = Store::new(nats.clone(), &config.store);
    let upload = Upload {
        name: "bench-pull".into(),
        format: "hf".into(),
        entry: String::new(),
        files: vec![("model.bin".into(), file.clone())],
    };
    let pushed = Instant::now();
    store.push(upload, &mut Progress::new("pushing", size).quiet()).await?;
    let push_s = pushed.elapsed().as_secs_f64();
    let (url, http) = serve(file.clone()).await?;
    println!(
        "bench pull: {:.1} MB, {} runs each, alternating; pushed in {:.2} s ({:.0} MB/s); chunk {} KiB",
        size as f64 / 1e6,
        args.runs,
        push_s,
        size as f64 / 1e6 / push_s,
        config.store.chunk_bytes / 1024
    );
    let (mut nats_rates, mut http_rates) = (Vec::new(), Vec::new());
    // CPU seconds per GB moved, each side: this process (receiver, writer and for
    // HTTP the sender too) plus our nats-server when the bench started it.
    let (mut nats_cpu, mut http_cpu) = (Vec::new(), Vec::new());
    let server_pid = server.as_ref().map(|s| s.pid());
    let cpu = || cpu_seconds(std::process::id()) + server_pid.map_or(0.0, cpu_seconds);
    let gb = size as f64 / 1e9;
    // Round 0 warms both sides (the server's block cache, the page cache) and is not
    // counted.
    for run in 0..=args.runs {
        let cache = dir.path().join(format!("cache-{run}"));
        config.store.cache_dir = cache.display().to_string();
        let store = Store::new(nats.clone(), &config.store);
        let (t, c) = (Instant::now(), cpu());
        let fetched = store.fetch("bench-pull", true).await?;
        let nats_s = t.elapsed().as_secs_f64();
        let nats_c = (cpu() - c) / gb;
        anyhow::ensure!(
            fetched.fetched_bytes == size,
            "fetched {} of {size} bytes",
            fetched.fetched_bytes
        );
        std::fs::remove_dir_all(&cache)?;

        let target = dir.path().join(format!("http-{run}.bin"));
        let (t, c) = (Instant::now(), cpu());
        let got = http_fetch(&url, &target).await?;
        let http_s = t.elapsed().as_secs_f64();
        let http_c = (cpu() - c) / gb;
        anyhow::ensure!(got == fetched.manifest.files[0].sha256, "HTTP copy differs");
        std::fs::remove_file(&target)?;
        let (n, h) = (size as f64 / 1e6 / nats_s, size as f64 / 1e6 / http_s);
        if run == 0 {
            println!("  warm-up: NATS {n:7.0} MB/s   HTTP {h:7.0} MB/s (not counted)");
            continue;
        }
        println!(
            "  run {run}: NATS {n:7.0} MB/s {nats_c:4.2} CPU s/GB   HTTP {h:7.0} MB/s {http_c:4.2} CPU s/GB   ratio {:.2}",
            n / h
        );
        nats_rates.push(n);
        http_rates.push(h);
        nats_cpu.push(nats_c);
        http_cpu.push(http_c);
    }
    http.abort();
    drop(store);
    let _ = nats.drain().await;
    let (n, h) = (median(&nats_rates), median(&http_rates));
    let lo = |xs: &[f64]| xs.iter().copied().fold(f64::MAX, f64::min);
    let hi = |xs: &[f64]| xs.iter().copied().fold(0.0, f64::max);
    println!(
        "median: NATS object store {n:.0} MB/s (runs {:.0}–{:.0}), plain HTTP {h:.0} MB/s (runs {:.0}–{:.0}), ratio {:.2} (goal ≥ 0.8)",
        lo(&nats_rates),
        hi(&nats_rates),
        lo(&http_rates),
        hi(&http_rates),
        n / h
    );
    // A shared disk only ever slows a run down: the fastest run of each side is the
    // least disturbed one.
    println!(
        "best:   NATS {:.0} MB/s, HTTP {:.0} MB/s, ratio {:.2}",
        hi(&nats_rates),
        hi(&http_rates),
        hi(&nats_rates) / hi(&http_rates)
    );
    if !nats_cpu.is_empty() {
        println!(
            "CPU per GB moved (median; receiver + writer + {}): NATS {:.2} s, HTTP {:.2} s",
            match server_pid {
                Some(_) => "our nats-server; HTTP's sender is in this process",
                None => "HTTP's sender; the given nats-server is not counted",
            },
            median(&nats_cpu),
            median(&http_cpu)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// User + system CPU seconds `pid` has used so far (0 where /proc cannot say).
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces) in parentheses; utime
    // and stime are the 14th and 15th of the line.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    ticks as f64 / hz
}

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Pseudo-random bytes (xorshift), so no compression anywhere helps either side.
fn write_random(path: &Path, len: usize) -> anyhow::Result<()> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut bytes = vec![0u8; len];
    for chunk in bytes.chunks_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
    }
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

/// A plain HTTP server for `file` on a free loopback port: GET / streams it in 1 MiB
/// reads.
async fn serve(file: PathBuf) -> anyhow::Result<(String, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/", listener.local_addr()?);
    let app = axum::Router::new().route(
        "/",
        axum::routing::get(move || {
            let file = file.clone();
            async move {
                let f = tokio::fs::File::open(&file).await.expect("bench file");
                let body = futures::stream::unfold(f, |mut f| async move {
                    let mut buf = vec![0u8; 1 << 20];
                    match f.read(&mut buf).await {
                        Ok(0) | Err(_) => None,
                        Ok(n) => {
                            buf.truncate(n);
                            Some((Ok::<_, std::io::Error>(bytes::Bytes::from(buf)), f))
                        }
                    }
                });
                axum::body::Body::from_stream(body)
            }
        }),
    );
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((url, task))
}

/// GET `url` into `target` as the store's fetch does (the same [`FileSink`]:
/// buffered writes and SHA-256 on a thread of its own, sync at the end). Returns the digest (hex).
async fn http_fetch(url: &str, target: &Path) -> anyhow::Result<String> {
    let response = reqwest::get(url).await?.error_for_status()?;
    let mut out = FileSink::new(std::fs::File::create(target)?, Sha256::new());
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        out.write(chunk?).await?;
    }
    Ok(switchyard_store::manifest::hex(&out.finish().await?))
}
