//! The end-to-end tests of the whole fleet, one binary with a module per area: a real
//! nats-server, real `switchyard` processes and in-process fleets, real models, real
//! llama-server, MLX, the OpenAI SDKs and a headless browser. (Telemetry, which sets
//! process-global tracing and OpenTelemetry state, is its own binary: tests/telemetry.rs.)

mod common;

mod chaos;
mod cli;
mod cluster;
mod coalescing;
mod cuda_native;
mod cuda_workers;
mod dashboard;
mod e2e;
mod embedding_models;
mod failover;
mod gateway;
mod gateway_page;
mod input_limits;
mod kv_routing;
mod llama_cpp_backend;
mod llama_cpp_workers;
mod memory_abuse;
mod mlx_bridge;
mod mlx_conformance;
mod mlx_supervision;
mod mlx_worker;
mod multihost;
mod nats_outage;
mod nats_permissions;
mod nats_security;
mod payload_limits;
mod prometheus;
mod python;
mod queue;
mod resume;
mod sessions;
mod store;
mod structured;
mod supervision;
