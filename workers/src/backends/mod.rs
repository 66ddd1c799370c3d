//! The backends a worker can serve a model with, one folder or file each.
//!
//! ## Layout
//! - [`cpu`]: switchyard's own CPU engine ([`crate::engine`]).
//! - [`llama_cpp`]: an existing llama.cpp server over HTTP, and its sessions.
//! - [`rocm`]: a llama-server this worker starts and supervises on an AMD GPU.
//! - [`probe`]: `fabric-probe`, a compute-free fake model named as such, for
//!   measuring the fabric's own overhead.

pub mod cpu;
pub mod llama_cpp;
pub mod probe;
pub mod rocm;
