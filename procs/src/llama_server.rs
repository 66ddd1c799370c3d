//! A `llama-server` child on a free loopback port — the llama.cpp peer that
//! `switchyard bench llama` and the reference tests compare against. Killed on drop
//! (and by the kernel if this process dies first).

use crate::nats_server::{free_port, kill_with_parent};
use anyhow::{bail, Context};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The context (`-c`) llama-server gets; the benchmark gives switchyard the same.
pub const CONTEXT: u32 = 4096;

/// A running llama-server.
pub struct LlamaServer {
    child: Child,
    /// `http://127.0.0.1:{port}`.
    pub url: String,
    http: reqwest::Client,
}

impl LlamaServer {
    /// Starts `bin` serving `model` with `threads` threads (prompt and generation)
    /// and `slots` parallel slots, and waits until `/health` answers 200.
    pub async fn start(bin: &Path, model: &Path, threads: usize, slots: usize) -> anyhow::Result<Self> {
        Self::start_with(bin, model, threads, slots, &[]).await
    }

    /// [`Self::start`] with extra command-line arguments (e.g. `["-fa", "off"]`).
    pub async fn start_with(
        bin: &Path,
        model: &Path,
        threads: usize,
        slots: usize,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        Self::start_at(bin, model, free_port()?, threads, slots, extra).await
    }

    /// [`Self::start_with`] on a given port (to bring a server back where it was).
    pub async fn start_at(
        bin: &Path,
        model: &Path,
        port: u16,
        threads: usize,
        slots: usize,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let threads = threads.to_string();
        let mut cmd = Command::new(bin);
        cmd.arg("-m")
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["-t", &threads, "-tb", &threads, "-c", &CONTEXT.to_string()])
            .args(["--parallel", &slots.to_string(), "--no-webui"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        kill_with_parent(&mut cmd);
        let child = cmd.spawn().with_context(|| format!("starting {}", bin.display()))?;
        let server = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            http: http_client(),
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(r) = server.http.get(format!("{}/health", server.url)).send().await {
                if r.status().is_success() {
                    return Ok(server);
                }
            }
            if Instant::now() > deadline {
                bail!("llama-server did not become healthy within 120 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// POSTs JSON to `path` and returns the JSON answer.
    pub async fn post(&self, path: &str, body: serde_json::Value) -> anyhow::Result<serde_json::Value> {
        let r = self.http.post(format!("{}{path}", self.url)).json(&body).send().await?;
        if !r.status().is_success() {
            bail!("llama-server {path}: {}", r.status());
        }
        Ok(r.json().await?)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.url.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or(0)
    }

    /// The process id (for reading its memory use).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// The CPU features a llama-server binary was built to use, as ggml reports them
/// (`"AVX AVX2 F16C FMA BMI2 AVX512 AVX512_VNNI …"`), or `None` if it would not say.
/// Asks the binary itself: with a model path that does not exist and verbose logging
/// it prints its `system_info` line and exits.
pub fn cpu_features(bin: &Path) -> Option<String> {
    let missing = std::env::temp_dir().join(format!("switchyard-no-model-{}.gguf", std::process::id()));
    let out = Command::new(bin)
        .arg("-m")
        .arg(&missing)
        .args(["--port", "1", "-lv", "4"])
        .stdin(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    let cpu = text.split("CPU : ").nth(1)?.lines().next()?;
    let skip = ["SSE3", "SSSE3", "LLAMAFILE", "OPENMP", "REPACK", "KLEIDIAI"];
    let on: Vec<&str> = cpu
        .split('|')
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, v)| v.trim() == "1" && !skip.contains(&k.trim()))
        .map(|(k, _)| k.trim())
        .collect();
    Some(on.join(" "))
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP client for talking to llama-server in benchmarks and tests: a new
/// connection per request (loopback connects cost microseconds), so no request ever
/// goes out on a kept-alive connection the server is closing ("connection closed
/// before message completed", seen from `bench batch` after streamed answers).
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap_or_default()
}
