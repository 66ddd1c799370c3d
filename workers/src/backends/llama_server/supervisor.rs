//! The llama-server child of a `rocm` or `cuda` worker: started, watched, restarted
//! with backoff, never orphaned. The [`GpuVendor`] only decides how the child is
//! pinned and how a missing GPU is found; the rest is the same for both.

use super::vendor::{check_binary_sees_gpu, GpuVendor};
use crate::backends::backoff::Backoff;
use crate::backends::llama_cpp::client::LlamaCppModel;
use std::collections::VecDeque;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use switchyard_backend::BackendError;
use switchyard_fabric::process::{free_port, kill_with_parent};

/// Log lines of the child kept for error messages.
const LOG_TAIL: usize = 20;
/// SIGTERM → SIGKILL grace on stop.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// How to run the supervised llama-server.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Whose GPU it runs on: decides the pinning variable and the GPU check.
    pub vendor: GpuVendor,
    /// The `llama-server` binary.
    pub bin: PathBuf,
    /// The GGUF it serves.
    pub model: PathBuf,
    /// GPU index as the vendor numbers them (the child's `HIP_VISIBLE_DEVICES` or
    /// `CUDA_VISIBLE_DEVICES`, see [`GpuVendor::pin_env`]).
    pub device: u32,
    /// Layers to offload (`-ngl`); `-1` = all.
    pub gpu_layers: i32,
    /// Context window (`-c`) shared by all slots; `0` = llama-server's default.
    pub context_len: u32,
    /// Parallel slots (`--parallel`); `0` = llama-server's default.
    pub parallel_slots: u32,
    /// CPU threads (`-t`); `0` = llama-server's default.
    pub threads: u32,
    /// LoRA adapter files loaded at start (`--lora`, each at scale 0 until a request
    /// names it: `--lora-init-without-apply`).
    pub lora: Vec<PathBuf>,
    /// More arguments, passed last.
    pub extra_args: Vec<String>,
    /// Where the server saves and restores slots (`--slot-save-path`), for the KV
    /// exchange with peers.
    pub slot_dir: Option<PathBuf>,
    /// Run without the vendor's GPU (a CPU llama-server under the same supervisor),
    /// for tests and for machines without one.
    pub allow_cpu: bool,
    /// The worker id, for log lines.
    pub worker_id: String,
    /// How long the first start may take (model load).
    pub startup_timeout: Duration,
}

/// Checks that `bin` is an executable file.
pub fn check_binary(bin: &Path) -> Result<(), BackendError> {
    use std::os::unix::fs::PermissionsExt;
    let fail = |reason: String| BackendError::Load {
        path: bin.display().to_string(),
        reason,
    };
    let meta = std::fs::metadata(bin).map_err(|e| fail(format!("the llama-server binary: {e}")))?;
    if !meta.is_file() {
        return Err(fail("the llama-server binary is not a file".into()));
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err(fail("the llama-server binary is not executable".into()));
    }
    Ok(())
}

/// State shared by the supervisor thread and its handle.
struct State {
    stop: Mutex<bool>,
    wake: Condvar,
    /// The running child's pid; 0 when none.
    pid: AtomicU32,
    /// Times the child has exited (any cause) while we did not ask it to.
    exits: AtomicU32,
    tail: Arc<Mutex<VecDeque<String>>>,
    /// Set once the model is connected: marks it down when the child exits.
    on_exit: Mutex<Option<LlamaCppModel>>,
}

impl State {
    fn stopped(&self) -> bool {
        *self.stop.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sleeps up to `d`; returns early (true) when stop is asked.
    fn sleep(&self, d: Duration) -> bool {
        let guard = self.stop.lock().unwrap_or_else(|p| p.into_inner());
        let (guard, _) = self
            .wake
            .wait_timeout_while(guard, d, |stop| !*stop)
            .unwrap_or_else(|p| p.into_inner());
        *guard
    }

    fn tail(&self) -> String {
        let tail = self.tail.lock().unwrap_or_else(|p| p.into_inner());
        tail.iter().cloned().collect::<Vec<_>>().join("\n")
    }
}

/// A supervised llama-server: its thread, port and state.
pub struct Supervisor {
    state: Arc<State>,
    thread: Option<std::thread::JoinHandle<()>>,
    url: String,
}

impl Supervisor {
    /// Starts the child and waits until it serves; returns the supervisor and the
    /// model behind it. Fails with a clear error when the binary is missing, the
    /// vendor's GPU is not present or the binary cannot use it (without
    /// `allow_cpu`: `unavailable`, naming the backend), or the child exits or stays
    /// unhealthy during start-up.
    pub async fn start(opts: ServerOptions) -> Result<(Self, LlamaCppModel), BackendError> {
        check_binary(&opts.bin)?;
        let env = pin_env(&opts)?;
        if !opts.allow_cpu {
            opts.vendor.check(opts.device)?;
            check_binary_sees_gpu(&opts.bin, opts.vendor, &env).await?;
        }
        let port = free_port().map_err(|e| BackendError::Unavailable(format!("finding a free port: {e}")))?;
        let url = format!("http://127.0.0.1:{port}");
        let state = Arc::new(State {
            stop: Mutex::new(false),
            wake: Condvar::new(),
            pid: AtomicU32::new(0),
            exits: AtomicU32::new(0),
            tail: Arc::new(Mutex::new(VecDeque::new())),
            on_exit: Mutex::new(None),
        });
        let thread = std::thread::Builder::new()
            .name(format!("llama-server-{}", opts.worker_id))
            .spawn({
                let state = state.clone();
                let opts = opts.clone();
                move || supervise(&opts, port, &state)
            })
            .map_err(|e| BackendError::Unavailable(format!("starting the supervisor thread: {e}")))?;
        let mut sup = Self {
            state,
            thread: Some(thread),
            url,
        };
        tracing::info!(worker = %opts.worker_id, url = %sup.url, model = %opts.model.display(), vendor = opts.vendor.label(), "starting llama-server");

        // Wait for the first good /health, failing fast if the child exits.
        let http = reqwest::Client::new();
        let deadline = Instant::now() + opts.startup_timeout;
        loop {
            if sup.state.exits.load(Ordering::Acquire) > 0 {
                let tail = sup.state.tail();
                sup.stop();
                return Err(BackendError::Load {
                    path: opts.model.display().to_string(),
                    reason: format!("llama-server exited during start-up; its last lines:\n{tail}"),
                });
            }
            let health = http
                .get(format!("{}/health", sup.url))
                .timeout(Duration::from_secs(2))
                .send()
                .await;
            if health.is_ok_and(|r| r.status().is_success()) {
                break;
            }
            if Instant::now() > deadline {
                let tail = sup.state.tail();
                sup.stop();
                return Err(BackendError::Load {
                    path: opts.model.display().to_string(),
                    reason: format!(
                        "llama-server was not healthy within {:.0?}; its last lines:\n{tail}",
                        opts.startup_timeout
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let model = match LlamaCppModel::connect(&sup.url, Duration::from_secs(10)).await {
            Ok(m) => m,
            Err(e) => {
                sup.stop();
                return Err(e);
            }
        };
        *sup.state.on_exit.lock().unwrap_or_else(|p| p.into_inner()) = Some(model.clone());
        Ok((sup, model))
    }

    /// The child's URL (`http://127.0.0.1:{port}`; the port survives restarts).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The running child's pid, if one runs now.
    pub fn pid(&self) -> Option<u32> {
        Some(self.state.pid.load(Ordering::Acquire)).filter(|p| *p != 0)
    }

    /// How many times the child exited without being asked to.
    pub fn crashes(&self) -> u32 {
        self.state.exits.load(Ordering::Acquire)
    }

    /// Stops the child (SIGTERM, then SIGKILL after 5 s) and the supervisor thread.
    /// Blocks until both are gone; safe to call twice.
    pub fn stop(&mut self) {
        *self.state.stop.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.state.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The supervisor thread: run the child, restart it when it exits, until stopped.
fn supervise(opts: &ServerOptions, port: u16, state: &State) {
    let mut backoff = Backoff::default();
    while !state.stopped() {
        let started = Instant::now();
        let why = match spawn(opts, port, state) {
            Ok(mut child) => {
                state.pid.store(child.id(), Ordering::Release);
                let status = loop {
                    if state.stopped() {
                        terminate(&mut child, &opts.worker_id);
                        state.pid.store(0, Ordering::Release);
                        return;
                    }
                    match child.try_wait() {
                        Ok(Some(status)) => break describe(status),
                        Ok(None) => {
                            state.sleep(Duration::from_millis(100));
                        }
                        Err(e) => {
                            let _ = child.kill();
                            let _ = child.wait();
                            break format!("could not be waited on ({e}) and was killed");
                        }
                    }
                };
                state.pid.store(0, Ordering::Release);
                status
            }
            Err(e) => format!("could not be started: {e}"),
        };
        state.exits.fetch_add(1, Ordering::AcqRel);
        crate::worker::telemetry::record_restart(&opts.worker_id, "llama-server");
        if let Some(model) = state.on_exit.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            model.mark_down(&format!("llama-server {why}"));
        }
        let wait = backoff.after_exit(started.elapsed());
        let last = state.tail.lock().unwrap_or_else(|p| p.into_inner()).back().cloned();
        tracing::warn!(
            worker = %opts.worker_id,
            "llama-server {why}; restarting in {wait:.1?} (its last line: {})",
            last.as_deref().unwrap_or("-")
        );
        if state.sleep(wait) {
            return;
        }
    }
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(sig)) => format!("was killed by signal {sig}"),
        _ => format!("ended ({status})"),
    }
}

/// The pinning environment for `opts`' child: [`GpuVendor::pin_env`] against this
/// process's own pinning variable.
fn pin_env(opts: &ServerOptions) -> Result<Vec<(&'static str, String)>, BackendError> {
    let inherited = std::env::var(opts.vendor.pin_var()).ok();
    opts.vendor
        .pin_env(opts.device, inherited.as_deref())
        .map_err(|e| BackendError::Unavailable(format!("{}: {e}", opts.vendor.kind())))
}

/// The child's command line, pinned to the GPU ([`GpuVendor::pin_env`]).
pub fn command(opts: &ServerOptions, port: u16) -> Result<Command, BackendError> {
    let mut cmd = Command::new(&opts.bin);
    cmd.arg("-m")
        .arg(&opts.model)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--no-webui", "--metrics", "--slots"]);
    let ngl = if opts.gpu_layers < 0 {
        "999".to_string()
    } else {
        opts.gpu_layers.to_string()
    };
    cmd.args(["-ngl", &ngl]);
    if opts.context_len > 0 {
        cmd.args(["-c", &opts.context_len.to_string()]);
    }
    if opts.parallel_slots > 0 {
        cmd.args(["--parallel", &opts.parallel_slots.to_string()]);
    }
    if opts.threads > 0 {
        let t = opts.threads.to_string();
        cmd.args(["-t", &t, "-tb", &t]);
    }
    for path in &opts.lora {
        cmd.arg("--lora").arg(path);
    }
    if !opts.lora.is_empty() {
        cmd.arg("--lora-init-without-apply");
    }
    if let Some(dir) = &opts.slot_dir {
        cmd.arg("--slot-save-path").arg(dir);
    }
    cmd.args(&opts.extra_args);
    cmd.envs(pin_env(opts)?);
    Ok(cmd)
}

fn spawn(opts: &ServerOptions, port: u16, state: &State) -> std::io::Result<Child> {
    let mut cmd = command(opts, port).map_err(std::io::Error::other)?;
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    // Called on the supervisor thread, which lives as long as the child should.
    kill_with_parent(&mut cmd);
    let mut child = cmd.spawn()?;
    let out: [Option<Box<dyn std::io::Read + Send>>; 2] = [
        child.stdout.take().map(|s| Box::new(s) as _),
        child.stderr.take().map(|s| Box::new(s) as _),
    ];
    for stream in out.into_iter().flatten() {
        let worker = opts.worker_id.clone();
        let tail = state.tail.clone();
        std::thread::spawn(move || forward_logs(stream, &worker, &tail));
    }
    Ok(child)
}

/// Sends each line the child prints into tracing (with the worker id) and keeps the
/// last [`LOG_TAIL`] for error messages. Ends when the child closes the pipe.
fn forward_logs(stream: Box<dyn std::io::Read + Send>, worker: &str, tail: &Mutex<VecDeque<String>>) {
    for line in std::io::BufReader::new(stream).lines() {
        let Ok(line) = line else { break };
        let line = line.trim_end().to_string();
        if line.is_empty() {
            continue;
        }
        let lower = line.to_ascii_lowercase();
        if lower.contains("error") || lower.contains("failed") {
            tracing::warn!(target: "switchyard_workers::backends::llama_server::child", worker, "{line}");
        } else {
            tracing::debug!(target: "switchyard_workers::backends::llama_server::child", worker, "{line}");
        }
        let mut tail = tail.lock().unwrap_or_else(|p| p.into_inner());
        if tail.len() == LOG_TAIL {
            tail.pop_front();
        }
        tail.push_back(line);
    }
}

/// SIGTERM, up to [`STOP_GRACE`] to exit, then SIGKILL; always reaps.
fn terminate(child: &mut Child, worker: &str) {
    let pid = child.id() as libc::pid_t;
    // SAFETY: plain kill(2) on our own child's pid, which is not reaped yet.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    let deadline = Instant::now() + STOP_GRACE;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            tracing::info!(worker, "llama-server stopped");
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    tracing::warn!(worker, "llama-server ignored SIGTERM for {STOP_GRACE:?}; killing it");
    let _ = child.kill();
    let _ = child.wait();
}
