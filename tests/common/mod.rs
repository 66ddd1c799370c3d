//! Shared test fixtures: a real nats-server, real `switchyard` processes, the real
//! demo model. Every child process is killed when its guard drops.

#![allow(dead_code)] // each test binary uses a different subset

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use switchyard::{Client, ClientOptions};
use switchyard_procs::nats_server::{find_nats_server, kill_with_parent, NatsServer};

/// Why a test does not run here: something this machine could have (a tool
/// scripts/setup.sh installs, root for namespaces or mounts) — a CI machine must —
/// or something it is not meant to have (a GPU, a CPU feature, a variable the user set).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Skip {
    /// Fixable on this machine: CI fails on it (`SWITCHYARD_STRICT_SKIPS`).
    Fixable,
    /// What this machine is, or what the user asked for.
    Expected,
}

/// Says a test (or a case of it) is skipped, and why: on stderr, and as a line
/// `kind<TAB>test<TAB>reason` appended to `$SWITCHYARD_SKIP_LOG`, the file
/// scripts/test.sh lists in its summary (failing the run on fixable skips when
/// `SWITCHYARD_STRICT_SKIPS` is set, as `.ci/run` does).
pub fn skip(kind: Skip, reason: &str) {
    eprintln!("SKIPPED: {reason}");
    let Some(log) = std::env::var_os("SWITCHYARD_SKIP_LOG") else {
        return;
    };
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|s| s.rsplit_once('-').map(|(name, _hash)| name.to_string()).unwrap_or(s))
        .unwrap_or_default();
    let test = std::thread::current().name().unwrap_or("?").to_string();
    let line = format!("{kind:?}\t{binary}::{test}\t{}\n", reason.replace(['\n', '\t'], " "));
    use std::io::Write;
    // One short O_APPEND write per line: test threads and binaries do not interleave.
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(log) {
        let _ = f.write_all(line.as_bytes());
    }
}

/// Starts a fresh nats-server on a free port.
pub fn nats() -> NatsServer {
    let bin = find_nats_server("").expect("nats-server (run scripts/setup.sh)");
    NatsServer::start(&bin).expect("start nats-server")
}

/// The demo model, which must be installed (scripts/setup.sh).
pub fn demo_model() -> PathBuf {
    let p = switchyard::node::demo_model_path();
    assert!(
        p.is_file(),
        "demo model missing at {} — run scripts/setup.sh",
        p.display()
    );
    p
}

/// Gemma 3 270M Q4_K_M, installed by scripts/setup.sh; `None` (with a printed reason)
/// when `SWITCHYARD_SKIP_GEMMA` is set.
#[allow(dead_code)] // only the reference tests use it
pub fn gemma_model() -> Option<PathBuf> {
    if std::env::var_os("SWITCHYARD_SKIP_GEMMA").is_some() {
        skip(
            Skip::Expected,
            "SWITCHYARD_SKIP_GEMMA is set, so the Gemma 3 checks do not run",
        );
        return None;
    }
    let p = switchyard::node::demo_model_path().with_file_name("gemma-3-270m-q4_k_m.gguf");
    assert!(
        p.is_file(),
        "Gemma 3 model missing at {} — run scripts/setup.sh",
        p.display()
    );
    Some(p)
}

/// The model name workers announce for the demo model.
pub const DEMO_NAME: &str = "SmolLM2-135M-Instruct.Q4_1";

/// A child process killed (SIGKILL) on drop.
pub struct Proc {
    pub child: Child,
    pub name: String,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    /// Waits until a stdout/stderr line contains `needle`; panics after `limit`.
    pub fn wait_for(&self, needle: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("{}: exited before printing {needle:?}", self.name)
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("{}: no line containing {needle:?} within {limit:?}", self.name)
                }
            }
        }
    }

    /// Sends SIGKILL now.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM and waits for the exit status (up to `limit`).
    pub fn terminate(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `switchyard ARGS…` as a child, collecting its output lines.
pub fn switchyard(name: &str, args: &[&str]) -> Proc {
    switchyard_with_env(name, args, &[])
}

/// [`switchyard`] with extra environment variables.
pub fn switchyard_with_env(name: &str, args: &[&str], env: &[(&str, &str)]) -> Proc {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_switchyard"));
    cmd.args(args)
        .envs(env.iter().copied())
        .env("RUST_LOG", "switchyard=info,warn");
    spawn_logged(name, cmd)
}

/// A worker process serving the demo model, with fast heartbeats.
pub fn worker_proc(url: &str, id: &str) -> Proc {
    let model = demo_model();
    let p = switchyard(
        id,
        &[
            "--nats",
            url,
            "worker",
            "--worker-id",
            id,
            "--heartbeat-ms",
            "200",
            "--model",
            model.to_str().unwrap(),
        ],
    );
    p.wait_for("up on", Duration::from_secs(60));
    p
}

/// A coordinator process with a short worker expiry.
pub fn coordinator_proc(url: &str, name: &str) -> Proc {
    let mut cmd_args = vec!["--nats", url, "coordinator", "--worker-expiry-ms", "1500"];
    cmd_args.push("--admission-timeout-ms");
    cmd_args.push("2000");
    let p = switchyard(name, &cmd_args);
    p.wait_for("coordinator up", Duration::from_secs(30));
    p
}

/// A client with the given stall limit.
pub async fn client(url: &str, stall: Duration) -> Client {
    let opts = ClientOptions {
        stall_timeout: stall,
        ..ClientOptions::default()
    };
    Client::connect_with(url, opts).await.expect("client connects")
}

/// Waits until the fleet lists exactly the workers in `ids`.
pub async fn wait_for_workers(client: &Client, ids: &[&str], limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(s) = client.status().await {
            let mut live: Vec<String> = s.workers.iter().map(|w| w.status.worker_id.clone()).collect();
            live.sort();
            let mut want: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
            want.sort();
            if live == want {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "fleet did not become {ids:?} within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The Python interpreter with nats-py and msgpack (scripts/setup.sh makes it).
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("SWITCHYARD_PYTHON") {
        return PathBuf::from(p);
    }
    let p = switchyard_procs::nats_server::cache_dir().join("venv/bin/python");
    assert!(
        p.is_file(),
        "python venv missing at {} — run scripts/setup.sh",
        p.display()
    );
    p
}

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A whole fleet in this process: nats-server, a coordinator and a CPU worker
/// (actors, not child processes).
pub struct Fleet {
    pub url: String,
    pub worker: switchyard_workers::WorkerHandle,
    pub coordinator: switchyard_coordinator::CoordinatorHandle,
    pub config: switchyard::Config,
    pub nats: NatsServer,
}

/// Config for an in-process fleet on `url`, with fast heartbeats.
pub fn fleet_config(url: &str) -> switchyard::Config {
    let mut c = switchyard::Config::default();
    c.nats.url = url.to_string();
    c.worker.model = demo_model().display().to_string();
    c.worker.id = "w1".into();
    c.worker.heartbeat_ms = 200;
    c.worker.keepalive_ms = 200;
    c.coordinator.worker_expiry_ms = 1000;
    c.client.stall_timeout_ms = 5000;
    c
}

/// Starts a fleet; `tweak` adjusts the config first.
pub async fn fleet(tweak: impl FnOnce(&mut switchyard::Config)) -> Fleet {
    let nats = nats();
    let mut config = fleet_config(&nats.url());
    tweak(&mut config);
    config.validate().expect("valid test config");
    let coordinator = switchyard::node::start_coordinator(&config).await.expect("coordinator");
    let loaded = switchyard::node::load(&config).await.expect("model loads");
    let worker = switchyard::node::start_worker(&config, &loaded).await.expect("worker");
    let deadline = Instant::now() + Duration::from_secs(10);
    while coordinator.status().await.unwrap().workers.is_empty() {
        assert!(Instant::now() < deadline, "coordinator never saw the worker");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Fleet {
        url: nats.url(),
        worker,
        coordinator,
        config,
        nats,
    }
}

impl Fleet {
    /// A client of this fleet.
    pub async fn client(&self) -> Client {
        client(&self.url, Duration::from_millis(self.config.client.stall_timeout_ms)).await
    }
}

/// A greedy generate request.
pub fn greedy(prompt: &str, max_tokens: u32) -> switchyard::GenerateRequest {
    let mut r = switchyard::GenerateRequest::generate(Client::new_request_id(), "", prompt);
    r.config.max_tokens = max_tokens;
    r
}

/// The exact reference llama-server: `$SWITCHYARD_LLAMA_SERVER`, else the AVX2 build of
/// scripts/build-llama-server.sh (on x86-64; the native build elsewhere). The CPU
/// engine computes ggml's AVX2 arithmetic with every kernel variant, so this build is
/// the one it matches exactly, on any host. `None` (with the reason printed) when the
/// reference is disabled with `SWITCHYARD_SKIP_LLAMA=1`.
pub fn llama_server_bin() -> Option<PathBuf> {
    if std::env::var_os("SWITCHYARD_SKIP_LLAMA").is_some() {
        skip(
            Skip::Expected,
            "SWITCHYARD_SKIP_LLAMA is set, so the llama.cpp reference is not used",
        );
        return None;
    }
    if let Some(p) = std::env::var_os("SWITCHYARD_LLAMA_SERVER") {
        return Some(PathBuf::from(p));
    }
    let variant = if cfg!(target_arch = "x86_64") { "avx2" } else { "native" };
    Some(build_llama_server(variant))
}

/// The llama-server built for this CPU (`-march=native`), where it differs from the
/// AVX2 reference: `$SWITCHYARD_LLAMA_SERVER_NATIVE`, else the native build when this
/// CPU has AVX-512 VNNI or AVX-VNNI. `None` (with the reason printed) otherwise.
#[allow(dead_code)] // only the reference tests use it
pub fn native_llama_server_bin() -> Option<PathBuf> {
    if std::env::var_os("SWITCHYARD_SKIP_LLAMA").is_some() {
        skip(
            Skip::Expected,
            "SWITCHYARD_SKIP_LLAMA is set, so the llama.cpp reference is not used",
        );
        return None;
    }
    if let Some(p) = std::env::var_os("SWITCHYARD_LLAMA_SERVER_NATIVE") {
        return Some(PathBuf::from(p));
    }
    use switchyard_workers::engine::kernels::isa::Isa;
    if !cfg!(target_arch = "x86_64") || matches!(Isa::best(), Isa::Avx2 | Isa::Portable) {
        skip(
            Skip::Expected,
            &format!(
                "this CPU's best kernels are {}; a native llama.cpp build would be the AVX2 reference again",
                Isa::best()
            ),
        );
        return None;
    }
    Some(build_llama_server("native"))
}

fn build_llama_server(variant: &str) -> PathBuf {
    let out = Command::new("bash")
        .arg(repo().join("scripts/build-llama-server.sh"))
        .arg(variant)
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/build-llama-server.sh");
    assert!(out.status.success(), "scripts/build-llama-server.sh {variant} failed");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

#[allow(unused_imports)] // only the reference tests use it
pub use switchyard_procs::llama_server::LlamaServer;

/// Waits until every worker's heartbeat, sent after this call, shows nothing in
/// flight or queued: routing then sees every worker free (the coordinator counts
/// requests routed since a worker's last heartbeat as load), and the workers' KV
/// events have landed.
pub async fn settle(client: &Client) {
    let before: Vec<(String, u64)> = client
        .status()
        .await
        .unwrap()
        .workers
        .iter()
        .map(|w| (w.status.worker_id.clone(), w.status.seq))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = client.status().await.unwrap();
        let fresh = s.workers.iter().all(|w| {
            w.status.in_flight + w.status.queued == 0
                && before
                    .iter()
                    .any(|(id, seq)| *id == w.status.worker_id && w.status.seq > *seq)
        });
        if fresh {
            return;
        }
        assert!(Instant::now() < deadline, "workers did not settle: {:?}", s.workers);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The demo GGUF as a Hugging Face directory with F32 weights
/// (`scripts/gguf-to-hf.py`), made on first use and kept in the cache.
#[allow(dead_code)] // only the HF-directory and MLX tests use it
pub fn converted_demo_model() -> PathBuf {
    let dir = switchyard_procs::nats_server::cache_dir().join("models/SmolLM2-135M-Instruct-f32-hf");
    if !dir.join("model.safetensors").is_file() {
        let out = std::process::Command::new(python())
            .arg(repo().join("scripts/gguf-to-hf.py"))
            .arg(demo_model())
            .arg(&dir)
            .arg("f32")
            .output()
            .expect("run scripts/gguf-to-hf.py");
        assert!(
            out.status.success(),
            "gguf-to-hf.py failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    dir
}

/// Pids of the processes whose parent is `parent` and whose command line has `needle`.
#[allow(dead_code)] // the MLX supervision tests use it
pub fn children_running(parent: u32, needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // pid (comm) state ppid …; comm may hold spaces, so split after the last ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if ppid == Some(parent) && String::from_utf8_lossy(&cmdline).contains(needle) {
            out.push(pid);
        }
    }
    out
}

#[allow(dead_code)] // the MLX supervision tests use it
pub fn alive(pid: u32) -> bool {
    // A zombie has no command line left; count only live processes.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

/// Runs `cmd` as a child like [`switchyard`] does: output lines collected (and echoed
/// with `name`), killed on drop and with this process.
pub fn spawn_logged(name: &str, mut cmd: Command) -> Proc {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    kill_with_parent(&mut cmd);
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {name}: {e}"));
    let (tx, rx) = mpsc::channel();
    for stream in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let tx = tx.clone();
        let name = name.to_string();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                eprintln!("[{name}] {line}");
                let _ = tx.send(line);
            }
        });
    }
    Proc {
        child,
        name: name.to_string(),
        lines: rx,
    }
}

/// The `host:port` a switchyard process serves its metrics on for Prometheus
/// (`telemetry.prometheus_listen`), from the line it prints at start.
pub fn scrape_address(p: &Proc) -> String {
    let line = p.wait_for("Prometheus scrape endpoint on http://", Duration::from_secs(30));
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split("/metrics").next())
        .unwrap_or_else(|| panic!("{}: no address in {line:?}", p.name));
    addr.to_string()
}

/// Debian's `prometheus` (scripts/setup.sh installs it; tests install nothing):
/// `$SWITCHYARD_PROMETHEUS`, else `/usr/bin/prometheus`, else `PATH`. `None`, with the
/// reason printed, when it is missing.
pub fn prometheus_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SWITCHYARD_PROMETHEUS") {
        return Some(PathBuf::from(p));
    }
    let deb = PathBuf::from("/usr/bin/prometheus");
    if deb.is_file() {
        return Some(deb);
    }
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("prometheus"))
            .find(|p| p.is_file())
    });
    if on_path.is_none() {
        skip(
            Skip::Fixable,
            "no prometheus binary (looked at $SWITCHYARD_PROMETHEUS, /usr/bin/prometheus, PATH) — run \
             scripts/setup.sh (as root it installs Debian's package) or set SWITCHYARD_PROMETHEUS",
        );
    }
    on_path
}

/// Asserts the fleet still answers a short greedy request with all its tokens.
pub async fn assert_serves(client: &Client, what: &str) {
    let done = client
        .generate(greedy("The capital of France is", 3))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(done.tokens.len(), 3, "{what}");
}

/// Waits until the coordinator reports `worker` as `available` (or not).
pub async fn wait_available(client: &Client, worker: &str, available: bool, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let status = client.status().await.unwrap();
        if status
            .workers
            .iter()
            .any(|w| w.status.worker_id == worker && w.status.available == available)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{worker} not available={available} within {limit:?}: {:?}",
            status.workers
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads the stream to its end and returns the error it ended with.
pub async fn ends_with_error(mut stream: switchyard::client::ResponseStream) -> switchyard::ClientError {
    loop {
        match stream.next().await {
            Some(Ok(switchyard::StreamEvent::Tokens(_))) => {}
            Some(Ok(done)) => panic!("expected an error, the stream ended with {done:?}"),
            Some(Err(e)) => return e,
            None => panic!("the stream ended without an error"),
        }
    }
}

/// Whether `pid` is gone (or a zombie awaiting its reaper) within `limit`.
pub fn gone(pid: u32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// The greedy token ids and final metrics of `n` tokens of `prompt`, generated
/// in process by `model`.
pub async fn greedy_ids(
    model: &switchyard_workers::EngineModel,
    prompt: switchyard_messages::Prompt,
    n: u32,
) -> (Vec<u32>, switchyard_messages::GenerateMetrics) {
    use futures::StreamExt;
    use switchyard_messages::{CancelFlag, GenerateConfig, GenerateEvent, TextModel};
    let cfg = GenerateConfig {
        max_tokens: n,
        ..GenerateConfig::default()
    };
    let mut events = model.generate(prompt, cfg, CancelFlag::new());
    let (mut ids, mut metrics) = (Vec::new(), None);
    while let Some(ev) = events.next().await {
        match ev.unwrap() {
            GenerateEvent::Token(t) => ids.push(t.id),
            GenerateEvent::Done { metrics: m, .. } => metrics = Some(m),
        }
    }
    (ids, metrics.expect("a final event"))
}

/// The cosine of two vectors, in f64.
#[allow(dead_code)] // only the embedding tests use it
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let n = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}
