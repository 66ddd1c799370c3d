//! Running a local `nats-server` on a free loopback port (used by `switchyard up`
//! and by the tests). The child is killed when the guard drops, and by the kernel
//! if this process dies first.

use anyhow::{bail, Context};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use switchyard_actors::process::{free_port, kill_with_parent};

/// A running `nats-server` child process.
pub struct NatsServer {
    child: Child,
    port: u16,
}

/// The cache directory: `$SWITCHYARD_CACHE`, else `~/.cache/switchyard`.
pub use switchyard_config::cache_dir;

/// Finds `nats-server`: `configured` if non-empty, `$SWITCHYARD_NATS_SERVER`, the
/// cache's `bin/`, then `PATH`.
pub fn find_nats_server(configured: &str) -> anyhow::Result<PathBuf> {
    if !configured.is_empty() {
        let p = PathBuf::from(configured);
        if !p.is_file() {
            bail!("nats.server_bin = {configured:?} does not exist");
        }
        return Ok(p);
    }
    let mut candidates = Vec::new();
    if let Some(p) = std::env::var_os("SWITCHYARD_NATS_SERVER") {
        candidates.push(PathBuf::from(p));
    }
    candidates.push(cache_dir().join("bin/nats-server"));
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("nats-server")));
    }
    candidates
        .into_iter()
        .find(|p| p.is_file())
        .context("nats-server not found (looked at $SWITCHYARD_NATS_SERVER, ~/.cache/switchyard/bin, PATH); run scripts/setup.sh")
}

impl NatsServer {
    /// Starts `bin` on a free loopback port and waits until it accepts connections.
    pub fn start(bin: &Path) -> anyhow::Result<Self> {
        let port = free_port().context("finding a free port")?;
        let mut cmd = Command::new(bin);
        cmd.args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        kill_with_parent(&mut cmd);
        let child = cmd.spawn().with_context(|| format!("starting {}", bin.display()))?;
        let mut server = Self { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(server);
            }
            if let Some(status) = server.child.try_wait()? {
                bail!("nats-server exited at start-up with {status}");
            }
            if Instant::now() > deadline {
                bail!("nats-server did not listen on port {port} within 10 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `nats://127.0.0.1:{port}`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
