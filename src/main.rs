//! The `switchyard` command line. See `switchyard --help`.

mod cli;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let args = cli::Cli::parse();
    // The config file's [telemetry] section stands in for OTEL_* variables that are
    // not set (before any other thread exists, so setting them is safe). A config error
    // is reported by the command itself.
    let config = cli::load_config(&args).ok();
    if let Some(config) = &config {
        for (key, value) in config.telemetry.as_env(|k| std::env::var_os(k).is_some()) {
            std::env::set_var(key, value);
        }
    }
    // CUDA numbers GPUs fastest first unless told otherwise; the `cuda` backend's
    // native engine counts them as nvidia-smi does, as its llama-server children do.
    if std::env::var_os("CUDA_DEVICE_ORDER").is_none() {
        std::env::set_var("CUDA_DEVICE_ORDER", "PCI_BUS_ID");
    }
    // A process running a CPU worker gets one async thread (`worker.async_threads`):
    // the compute threads take every core.
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = config.as_ref().and_then(|c| cli::async_threads(&args.command, c)) {
        builder.worker_threads(n);
    }
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let telemetry = {
        let _in_runtime = runtime.enter();
        match switchyard::telemetry::init(&args.log, args.command.service_name()) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("error: {e:#}");
                return std::process::ExitCode::FAILURE;
            }
        }
    };
    let code = match runtime.block_on(cli::run(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    };
    if let Some(t) = telemetry {
        // Blocking (it waits for the last export), on a blocking thread of the live runtime.
        let _ = runtime.block_on(async { tokio::task::spawn_blocking(move || t.shutdown()).await });
    }
    // A blocking task still running (a model load a stop cut short) does not hold the
    // exit up.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    code
}
