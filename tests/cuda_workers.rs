//! The `cuda` worker: the supervised llama-server the `rocm` worker uses, for an
//! NVIDIA GPU. No NVIDIA GPU is here, so the shared supervisor runs a CPU
//! llama-server (`gpu_allow_cpu`), as tests/llama_cpp_workers.rs does for `rocm`;
//! what is checked is everything the vendor decides and everything shared:
//!
//! - In-process fleet: the worker announces backend `cuda`, device `cuda:1(cpu)` and
//!   the server's slots as capacity; the child runs with `CUDA_VISIBLE_DEVICES=1`
//!   and `CUDA_DEVICE_ORDER=PCI_BUS_ID` (read from `/proc/<pid>/environ`); a session
//!   lives on a pinned slot; `kill -9` of the child mid-stream gives a retryable
//!   `unavailable`, the heartbeat says unavailable, the supervisor restarts it
//!   (pinned again) and the worker serves; stop leaves no child.
//! - The `switchyard worker --backend cuda` process: `kill -9` takes its child down.
//! - Without a GPU and without `gpu_allow_cpu`: a clear `unavailable` naming `cuda`
//!   and `/dev/nvidiactl`, the process exits, and the fleet routes elsewhere; a CPU
//!   llama-server binary is told apart from a CUDA one by `--list-devices`.

mod common;

use common::*;
use std::path::Path;
use std::time::Duration;
use switchyard::node::{self, Loaded};
use switchyard::{Client, ClientError, Config, GenerateRequest, StreamEvent};
use switchyard_backend::BackendError;
use switchyard_messages::session::{ContextManifest, OpenSessionRequest};
use switchyard_messages::ErrorCode;
use switchyard_workers::backends::llama_server::{vendor, GpuVendor};

const NAME: &str = "smol";

/// A prompt the model continues for hundreds of tokens.
const COUNTING: &str = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,";

fn cuda_config(url: &str, id: &str, bin: &Path, allow_cpu: bool) -> Config {
    let mut c = fleet_config(url);
    c.worker.id = id.into();
    c.worker.model_name = NAME.into();
    c.worker.threads = 1;
    c.worker.queue_depth = 0;
    c.worker.backend = "cuda".into();
    // The supervised llama-server (a `cuda` build's default is the native engine:
    // tests/cuda_native.rs).
    c.worker.cuda_engine = "llama-server".into();
    c.worker.gpu_allow_cpu = allow_cpu;
    c.worker.gpu_device = 1;
    c.worker.llama_server_bin = bin.display().to_string();
    c.worker.llama_server_args = "-fa off".into();
    c.worker.parallel_slots = 2;
    c.worker.context_len = 2048;
    c.validate().expect("valid config");
    c
}

/// The child's environment variable `name`, from `/proc/<pid>/environ`.
fn child_env(pid: u32, name: &str) -> Option<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("the child's environ");
    environ.split(|b| *b == 0).find_map(|kv| {
        let kv = String::from_utf8_lossy(kv);
        kv.strip_prefix(&format!("{name}=")).map(str::to_string)
    })
}

fn assert_pinned_to_gpu_1(pid: u32) {
    assert_eq!(
        child_env(pid, "CUDA_VISIBLE_DEVICES").as_deref(),
        Some("1"),
        "pid {pid}"
    );
    assert_eq!(
        child_env(pid, "CUDA_DEVICE_ORDER").as_deref(),
        Some("PCI_BUS_ID"),
        "pid {pid}"
    );
}

fn request(prompt: &str, max_tokens: u32, backend: Option<&str>) -> GenerateRequest {
    let mut r = GenerateRequest::generate(Client::new_request_id(), NAME, prompt);
    r.config.max_tokens = max_tokens;
    r.head.backend = backend.map(str::to_string);
    r
}

/// Generates and returns (worker, token count).
async fn run(client: &Client, req: GenerateRequest) -> (String, usize) {
    let done = client.generate(req).await.unwrap().collect().await.unwrap();
    (done.worker_id, done.tokens.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cuda_worker_pins_its_child_announces_cuda_1_and_survives_its_crash() {
    let Some(bin) = llama_server_bin() else { return };
    let nats = nats();
    let url = nats.url();
    let coordinator = node::start_coordinator(&fleet_config(&url)).await.unwrap();
    let config = cuda_config(&url, "w-cuda", &bin, true);
    let mut loaded: Loaded = node::load(&config).await.expect("model loads");
    let worker = node::start_worker(&config, &loaded).await.expect("worker starts");
    let client = client(&url, Duration::from_secs(20)).await;
    wait_available(&client, "w-cuda", true, Duration::from_secs(15)).await;

    // Announced: backend, device (on the CPU: no NVIDIA GPU here), slots as capacity.
    let status = client.status().await.unwrap();
    let s = &status.workers[0].status;
    assert_eq!((s.backend.as_str(), s.capacity), ("cuda", 2));
    if GpuVendor::Cuda.gpus().is_err() {
        assert_eq!(s.device, "cuda:1(cpu)");
    } else {
        assert!(s.device.starts_with("cuda:1"), "{}", s.device);
    }
    assert_eq!(s.models[0].info.context_len, 1024, "-c 2048 over two slots");

    // The child is pinned to GPU 1.
    let supervisor = loaded.supervisor.as_ref().unwrap();
    let first_pid = supervisor.pid().unwrap();
    assert_pinned_to_gpu_1(first_pid);
    assert_eq!(
        run(&client, request("The capital of France is", 8, Some("cuda")))
            .await
            .1,
        8
    );

    // A session on a pinned slot: the second slot stays for requests.
    let session = client
        .open_session(OpenSessionRequest::new("owner-a", ""))
        .await
        .unwrap();
    let m = ContextManifest {
        profile: "p".into(),
        model: NAME.into(),
        ..ContextManifest::default()
    };
    let prefix = "You are a careful assistant. Answer in one short sentence.";
    assert_eq!(session.ensure_prefix(prefix, &m).await.unwrap().reused_tokens, 0);
    let warm = session.ensure_prefix(prefix, &m).await.unwrap();
    assert_eq!(warm.reused_tokens, warm.prefix_tokens - 1, "{warm:?}");
    session.close().await.unwrap();

    // The child dies mid-stream: a retryable `unavailable`, then unavailable in the
    // heartbeat, then restarted (backoff 0.5 s), pinned again, and serving.
    let mut stream = client.generate(request(COUNTING, 900, None)).await.unwrap();
    loop {
        match stream.next().await {
            Some(Ok(StreamEvent::Tokens(t))) if !t.is_empty() => break,
            Some(Ok(StreamEvent::Tokens(_))) => {}
            other => panic!("expected tokens, got {other:?}"),
        }
    }
    // SAFETY: kill(2) on the llama-server child's pid.
    unsafe {
        libc::kill(first_pid as i32, libc::SIGKILL);
    }
    let err = ends_with_error(stream).await;
    assert_eq!(err.code(), Some(ErrorCode::Unavailable), "{err}");
    assert!(
        matches!(&err, ClientError::Remote { error, .. } if error.retryable),
        "{err}"
    );
    wait_available(&client, "w-cuda", false, Duration::from_secs(3)).await;
    wait_available(&client, "w-cuda", true, Duration::from_secs(60)).await;
    let second_pid = supervisor.pid().expect("a new child runs");
    assert_ne!(first_pid, second_pid);
    assert_eq!(supervisor.crashes(), 1);
    assert_pinned_to_gpu_1(second_pid);
    assert_eq!(
        run(&client, request("The capital of France is", 8, None)).await,
        ("w-cuda".to_string(), 8)
    );

    worker.shutdown(Duration::from_secs(5)).await;
    loaded.stop();
    assert!(gone(second_pid, Duration::from_secs(10)), "the child outlived stop()");
    coordinator.shutdown().await;
}

#[test]
fn the_cuda_worker_process_takes_its_child_down_when_killed() {
    let Some(bin) = llama_server_bin() else { return };
    let nats = nats();
    let url = nats.url();
    let bin = bin.display().to_string();
    let mut worker = switchyard(
        "worker",
        &[
            "--nats",
            &url,
            "worker",
            "--backend",
            "cuda",
            "--cuda-engine",
            "llama-server",
            "--gpu-allow-cpu",
            "--gpu-device",
            "1",
            "--llama-server",
            &bin,
            "--threads",
            "1",
            "--parallel-slots",
            "1",
            "--context-len",
            "1024",
        ],
    );
    if GpuVendor::Cuda.gpus().is_err() {
        worker.wait_for("on the CPU (gpu_allow_cpu, no CUDA GPU 1)", Duration::from_secs(20));
    }
    let line = worker.wait_for("llama-server up at", Duration::from_secs(60));
    let pid: u32 = line
        .split("(pid ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {line:?}"));
    assert_pinned_to_gpu_1(pid);
    worker.kill9();
    assert!(
        gone(pid, Duration::from_secs(5)),
        "llama-server {pid} outlived kill -9 of the worker"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_gpu_a_cuda_worker_refuses_clearly_and_the_fleet_routes_elsewhere() {
    if GpuVendor::Cuda.gpus().is_ok() {
        skip(
            Skip::Expected,
            "this machine has an NVIDIA GPU, so a cuda worker does not refuse",
        );
        return;
    }
    let fleet = fleet(|c| c.worker.id = "w-cpu".into()).await;
    let client = fleet.client().await;

    // In-process: loading refuses with `unavailable`, naming the backend and what is
    // missing, before anything is started.
    let config = cuda_config(&fleet.url, "w-cuda", Path::new("/bin/true"), false);
    let err = node::load(&config).await.err().expect("no GPU: refused");
    let backend_err = err.downcast_ref::<BackendError>().expect("a BackendError");
    assert!(matches!(backend_err, BackendError::Unavailable(_)), "{backend_err:?}");
    assert_eq!(backend_err.to_wire().code, ErrorCode::Unavailable);
    let msg = backend_err.to_string();
    assert!(
        msg.starts_with("backend unavailable: cuda: no /dev/nvidiactl") && msg.contains("gpu_allow_cpu"),
        "{msg}"
    );

    // The process: says so and exits non-zero, so it never joins the fleet.
    let mut worker = switchyard(
        "worker",
        &[
            "--nats",
            &fleet.url,
            "worker",
            "--backend",
            "cuda",
            "--cuda-engine",
            "llama-server",
            "--llama-server",
            "/bin/true",
        ],
    );
    worker.wait_for("backend unavailable: cuda: no /dev/nvidiactl", Duration::from_secs(20));
    assert!(!worker.child.wait().unwrap().success());

    // The fleet routes elsewhere; a request pinned to cuda finds no worker.
    let status = client.status().await.unwrap();
    assert_eq!(status.workers.len(), 1);
    let mut req = request("The capital of France is", 4, None);
    req.head.model = String::new();
    assert_eq!(run(&client, req).await, ("w-cpu".to_string(), 4));
    let mut req = request("The capital of France is", 4, Some("cuda"));
    req.head.model = String::new();
    let err = ends_with_error(client.generate(req).await.unwrap()).await;
    assert_eq!(err.code(), Some(ErrorCode::NoWorker), "{err}");

    // A GPU present but a llama-server built without CUDA is refused too: the CPU
    // build lists no CUDA device.
    if let Some(bin) = llama_server_bin() {
        let env = GpuVendor::Cuda.pin_env(0, None).unwrap();
        let e = vendor::check_binary_sees_gpu(&bin, GpuVendor::Cuda, &env)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("lists no CUDA device") && e.contains("-DGGML_CUDA=ON"),
            "{e}"
        );
    }
}
