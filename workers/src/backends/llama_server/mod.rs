//! The `rocm` and `cuda` backends (the seeds' go-rocm, and its NVIDIA twin): a
//! `llama-server` child this worker owns, pinned to one GPU, served through
//! [`crate::backends::llama_cpp::LlamaCppModel`] exactly like an external llama.cpp
//! server. One supervisor serves both; a [`GpuVendor`] says what differs.
//!
//! ## Layout
//! - [`vendor`]: [`GpuVendor`]: the pinning variable (`HIP_VISIBLE_DEVICES` /
//!   `CUDA_VISIBLE_DEVICES`), the announced device (`rocm:N` / `cuda:N`), finding
//!   the GPU (`/dev/kfd` + the KFD topology / `/dev/nvidiactl` + `/dev/nvidiaN`), the
//!   refusal when it is missing, and whether the binary can use it.
//! - [`supervisor`]: the child: started, watched, restarted, stopped.
//! - `backend`: the registry entries ([`LlamaServerBackend::ROCM`],
//!   [`LlamaServerBackend::CUDA`]).
//!
//! What the supervisor does, for either vendor:
//! - Start: the binary must exist and be executable; unless `allow_cpu`, the
//!   vendor's GPU `device` must be present and `llama-server --list-devices` must
//!   list one of its devices (else `unavailable`, naming the backend and what is
//!   missing). The child gets the vendor's pinning variable, `-ngl` from
//!   `gpu_layers`, `-c` from `context_len`, `--parallel` from `parallel_slots`, a
//!   free loopback port, and the extra arguments; start-up waits for `/health`, and
//!   a child that exits first fails the start with its last log lines.
//! - Logs: every line the child prints goes into our tracing with the worker id
//!   (target `switchyard_workers::backends::llama_server::child`; lines mentioning
//!   errors at `warn`, the rest at `debug`).
//! - Crashes: the supervisor thread sees the exit, marks the model down at once (so
//!   in-flight requests end with a retryable `unavailable` and the heartbeat says
//!   so), logs why, and restarts the child on the same port with backoff (0.5 s
//!   doubling to 30 s; back to 0.5 s after a minute of good health).
//! - No orphans: [`Supervisor::stop`] (and drop) sends SIGTERM, then SIGKILL after
//!   5 s; the child is also spawned with `PR_SET_PDEATHSIG` from the supervisor's
//!   own thread, so even `kill -9` of the worker takes it down.
//! - Capacity and sessions are the llama.cpp server's: its slots, and sessions on
//!   pinned slots ([`crate::backends::llama_cpp`]).

mod backend;
pub mod supervisor;
pub mod vendor;

pub use backend::LlamaServerBackend;
pub use supervisor::{ServerOptions, Supervisor};
pub use vendor::GpuVendor;
