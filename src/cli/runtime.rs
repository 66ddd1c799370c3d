//! How many threads a command's async runtime gets (`worker.async_threads`).
//!
//! A process that runs a `cpu` worker gets one: the engine's compute threads take
//! every core, and a second async thread only adds wake-ups between the two (tokio
//! wakes a parked sibling to look for work whenever a task is woken), each one a
//! time slice taken from the compute threads (issue 17, `bench fabric`).

use super::Command;
use switchyard::Config;
use switchyard_bench::BenchCommand;

/// The backend of the worker `command` runs in its own process, if it runs one.
fn worker_backend<'a>(command: &'a Command, config: &'a Config) -> Option<&'a str> {
    let flags = match command {
        Command::Up(a) => &a.worker,
        Command::Worker(a) => &a.worker,
        Command::Bench(BenchCommand::Fabric(a)) => &a.worker,
        Command::Bench(BenchCommand::Batch(a)) => &a.worker,
        Command::Bench(BenchCommand::Gateway(a)) => &a.worker,
        Command::Bench(BenchCommand::KvRouting(a)) => &a.worker,
        Command::Bench(BenchCommand::Prefix(a)) => &a.worker,
        Command::Bench(
            BenchCommand::Llama(_)
            | BenchCommand::Kv(_)
            | BenchCommand::Stall(_)
            | BenchCommand::Structured(_)
            | BenchCommand::Embed(_)
            | BenchCommand::Spec(_),
        ) => return Some("cpu"),
        _ => return None,
    };
    Some(flags.backend.as_deref().unwrap_or(&config.worker.backend))
}

/// The async runtime threads for `command`; `None`: tokio's default
/// (`TOKIO_WORKER_THREADS`, else one per core).
pub fn async_threads(command: &Command, config: &Config) -> Option<usize> {
    if std::env::var_os("TOKIO_WORKER_THREADS").is_some() {
        return None;
    }
    let backend = worker_backend(command, config)?;
    match config.worker.async_threads {
        0 if backend == "cpu" => Some(1),
        0 => None,
        n => Some(n as usize),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn threads(args: &[&str], tweak: impl FnOnce(&mut Config)) -> Option<usize> {
        let cli = super::super::Cli::try_parse_from(std::iter::once("switchyard").chain(args.iter().copied()))
            .expect("valid arguments");
        let mut config = Config::default();
        tweak(&mut config);
        async_threads(&cli.command, &config)
    }

    #[test]
    fn a_cpu_worker_runs_its_async_side_on_one_thread_and_others_keep_the_default() {
        if std::env::var_os("TOKIO_WORKER_THREADS").is_some() {
            return; // it wins over everything here
        }
        assert_eq!(threads(&["up"], |_| ()), Some(1));
        assert_eq!(threads(&["worker", "--nats", "nats://127.0.0.1:1"], |_| ()), Some(1));
        assert_eq!(threads(&["bench", "fabric"], |_| ()), Some(1));
        assert_eq!(threads(&["up", "--backend", "cuda"], |_| ()), None);
        assert_eq!(threads(&["up"], |c| c.worker.backend = "rocm".into()), None);
        assert_eq!(threads(&["up"], |c| c.worker.async_threads = 3), Some(3));
        assert_eq!(threads(&["coordinator"], |_| ()), None);
        assert_eq!(threads(&["bench", "routing"], |_| ()), None);
    }
}
