//! The `rocm` backend (the seeds' go-rocm): a `llama-server` child this worker owns,
//! pinned to one AMD GPU, served through [`crate::backends::llama_cpp::LlamaCppModel`] exactly like an external
//! llama.cpp server.
//!
//! - Start: the binary must exist and be executable, and (unless `allow_cpu`) a ROCm
//!   GPU must be present ([`rocm_devices`]). The child gets `HIP_VISIBLE_DEVICES=N`,
//!   `-ngl` from `gpu_layers`, `-c` from `context_len`, `--parallel` from
//!   `parallel_slots`, a free loopback port, and the extra arguments; start-up waits
//!   for `/health`, and a child that exits first fails the start with its last log
//!   lines.
//! - Logs: every line the child prints goes into our tracing with the worker id
//!   (target `switchyard_workers::backends::rocm::child`; lines mentioning errors at `warn`,
//!   the rest at `debug`).
//! - Crashes: the supervisor thread sees the exit, marks the model down at once (so
//!   in-flight requests end with a retryable `unavailable` and the heartbeat says
//!   so), logs why, and restarts the child on the same port with backoff (0.5 s
//!   doubling to 30 s; back to 0.5 s after a minute of good health).
//! - No orphans: [`Supervisor::stop`] (and drop) sends SIGTERM, then SIGKILL after
//!   5 s; the child is also spawned with `PR_SET_PDEATHSIG` from the supervisor's
//!   own thread, so even `kill -9` of the worker takes it down.

mod backend;
pub mod supervisor;

pub use backend::RocmBackend;
pub use supervisor::{rocm_devices, RocmOptions, Supervisor};
