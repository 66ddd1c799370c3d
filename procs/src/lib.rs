//! # switchyard-procs — the processes switchyard runs beside itself
//!
//! - [`nats_server`]: a local `nats-server` on a free loopback port — what
//!   `switchyard up` starts when no `--nats` is given, and what every test and
//!   benchmark runs its fleet on.
//! - [`llama_server`]: a `llama-server` child on a free port — the llama.cpp peer
//!   the benchmarks and the reference tests compare against. (The `rocm` and `cuda`
//!   workers' supervised llama-server is a backend:
//!   `switchyard_workers::backends::llama_server`.)
//!
//! Both children are killed when their guard drops, and by the kernel if this
//! process dies first.

pub mod llama_server;
pub mod nats_server;
