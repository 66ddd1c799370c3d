//! # switchyard-testkit — what the test suites share about this host
//!
//! A real nats-server on a free port, child processes killed with their guard, the
//! models and tools `scripts/setup.sh` installs (the demo model, Gemma 3, the Python
//! venv, llama-server builds, prometheus), and [`skip`], which every skipped test goes
//! through so `scripts/test.sh` can list it. Nothing here knows about switchyard's
//! services: the root crate's `tests/common/mod.rs` adds fleets and clients on top.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
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
    let p = switchyard_config::demo_model_path();
    assert!(
        p.is_file(),
        "demo model missing at {} — run scripts/setup.sh",
        p.display()
    );
    p
}

/// Gemma 3 270M Q4_K_M, installed by scripts/setup.sh; `None` (with a printed reason)
/// when `SWITCHYARD_SKIP_GEMMA` is set.
pub fn gemma_model() -> Option<PathBuf> {
    if std::env::var_os("SWITCHYARD_SKIP_GEMMA").is_some() {
        skip(
            Skip::Expected,
            "SWITCHYARD_SKIP_GEMMA is set, so the Gemma 3 checks do not run",
        );
        return None;
    }
    let p = switchyard_config::demo_model_path().with_file_name("gemma-3-270m-q4_k_m.gguf");
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

/// Writes the test LoRA adapter with `seed` for the demo model into `dir` (as
/// `scripts/make-lora.py` does: `dir/lora-{seed}` is the PEFT directory, and its
/// `adapter.gguf` the same adapter as a llama.cpp GGUF LoRA).
pub fn make_lora(dir: &std::path::Path, seed: u32) -> PathBuf {
    let out = dir.join(format!("lora-{seed}"));
    let run = std::process::Command::new(python())
        .arg(repo().join("scripts/make-lora.py"))
        .arg(demo_model())
        .arg(&out)
        .args(["--seed", &seed.to_string()])
        .output()
        .expect("run scripts/make-lora.py");
    assert!(
        run.status.success(),
        "make-lora.py: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    out
}

/// The repository root.
pub fn repo() -> PathBuf {
    let kit = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    kit.parent().expect("testkit/ lies in the repository").to_path_buf()
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
    // The engine's kernels past AVX2 need VNNI (AVX-512 VNNI or AVX-VNNI), as
    // scripts/test.sh decides which llama.cpp builds to make.
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let vnni = cpuinfo
        .split_whitespace()
        .any(|f| f == "avx512_vnni" || f == "avx_vnni");
    if !cfg!(target_arch = "x86_64") || !vnni {
        skip(
            Skip::Expected,
            "this CPU has no AVX-512 VNNI or AVX-VNNI; a native llama.cpp build would be the AVX2 reference again",
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

pub use switchyard_procs::llama_server::LlamaServer;

/// The demo GGUF as a Hugging Face directory with F32 weights
/// (`scripts/gguf-to-hf.py`), made on first use and kept in the cache.
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

pub fn alive(pid: u32) -> bool {
    // A zombie has no command line left; count only live processes.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

/// Runs `cmd` as a child: output lines collected (and echoed
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
    model: &dyn switchyard_backend::TextModel,
    prompt: switchyard_backend::Prompt,
    n: u32,
) -> (Vec<u32>, switchyard_messages::GenerateMetrics) {
    use futures::StreamExt;
    use switchyard_backend::{CancelFlag, GenerateEvent};
    use switchyard_messages::GenerateConfig;
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
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let n = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}
