//! A second "host" for the KV benches: a network namespace joined to this one by a
//! veth pair whose two ends are rate-limited by `tc` (a token bucket, `tbf`, each
//! direction), with a relay on this side that holds every byte for half the round
//! trip in each direction before passing it to the local nats-server. Workers started
//! in the namespace reach NATS only through that link, as a worker on another machine
//! would reach a server next to the others: a KV chunk from them crosses it once.
//!
//! The delay is the relay's and not the kernel's because the kernels these benches run
//! on (Firecracker VMs) are built without `netem`; `tbf` is there. Needs root, `ip`
//! and `tc`; everything made is removed on drop.

use anyhow::{bail, Context};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::process::Command;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// `--link RTT,RATE`, e.g. `1ms,1gbit`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkSpec {
    /// Round trip added by the link.
    pub rtt: Duration,
    /// Rate limit of each direction, in Mbit/s.
    pub mbit: u64,
}

impl FromStr for LinkSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (rtt, rate) = s
            .split_once(',')
            .ok_or_else(|| format!("--link {s:?}: expected RTT,RATE such as 1ms,1gbit"))?;
        let rtt = match rtt.trim() {
            r if r.ends_with("us") => r[..r.len() - 2].parse::<f64>().map(|v| v / 1e6),
            r if r.ends_with("ms") => r[..r.len() - 2].parse::<f64>().map(|v| v / 1e3),
            r => r.parse::<f64>().map(|v| v / 1e3),
        }
        .map_err(|_| format!("--link {s:?}: the round trip is a number of ms (or us), such as 1ms"))?;
        let rate = rate.trim().to_ascii_lowercase();
        let mbit = match rate.as_str() {
            r if r.ends_with("gbit") => r[..r.len() - 4].parse::<f64>().map(|v| v * 1000.0),
            r if r.ends_with("mbit") => r[..r.len() - 4].parse::<f64>(),
            _ => return Err(format!("--link {s:?}: the rate is in mbit or gbit, such as 1gbit")),
        }
        .map_err(|_| format!("--link {s:?}: the rate is a number of mbit or gbit"))?;
        if !(0.0..=1.0).contains(&rtt) || !(1.0..=100_000.0).contains(&mbit) {
            return Err(format!("--link {s:?}: round trip 0–1000 ms, rate 1 mbit–100 gbit"));
        }
        Ok(Self {
            rtt: Duration::from_secs_f64(rtt),
            mbit: mbit as u64,
        })
    }
}

impl std::fmt::Display for LinkSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.1} ms RTT, {} Mbit/s", self.rtt.as_secs_f64() * 1e3, self.mbit)
    }
}

/// The namespace, its veth link and the delaying relay; removed on drop.
pub struct Link {
    ns: String,
    host_if: String,
    relay_port: u16,
    addr: Ipv4Addr,
    stop: Arc<AtomicBool>,
    /// Half the round trip: what each relay holds a byte back.
    half: Duration,
}

fn run(cmd: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .with_context(|| format!("running {cmd} (the link needs iproute2)"))?;
    if !out.status.success() {
        bail!(
            "{cmd} {}: {} (the link needs root)",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl Link {
    /// Makes the namespace and the link, and relays its side's connections to the
    /// nats-server listening on loopback `nats_port`.
    pub fn up(spec: LinkSpec, nats_port: u16) -> anyhow::Result<Self> {
        let pid = std::process::id();
        let net = (pid % 250) as u8 + 1;
        let mut link = Self {
            ns: format!("sykv{pid}"),
            host_if: format!("sykva{pid}"),
            relay_port: 0,
            addr: Ipv4Addr::new(10, 201, net, 1),
            stop: Arc::default(),
            half: spec.rtt / 2,
        };
        let (ns, host_if) = (link.ns.clone(), link.host_if.clone());
        let far_if = format!("sykvb{pid}");
        run("ip", &["netns", "add", &ns])?;
        run(
            "ip",
            &[
                "link", "add", &host_if, "type", "veth", "peer", "name", &far_if, "netns", &ns,
            ],
        )?;
        run("ip", &["addr", "add", &format!("10.201.{net}.1/30"), "dev", &host_if])?;
        run("ip", &["link", "set", &host_if, "up"])?;
        run(
            "ip",
            &["-n", &ns, "addr", "add", &format!("10.201.{net}.2/30"), "dev", &far_if],
        )?;
        run("ip", &["-n", &ns, "link", "set", &far_if, "up"])?;
        run("ip", &["-n", &ns, "link", "set", "lo", "up"])?;
        // A bucket of 256 KB: a few GSO segments pass at once, anything longer at the
        // rate.
        let rate = format!("{}mbit", spec.mbit);
        let tbf = ["root", "tbf", "rate", &rate, "burst", "256kb", "latency", "200ms"];
        run("tc", &[&["qdisc", "add", "dev", &host_if][..], &tbf].concat())?;
        run("tc", &[&["-n", &ns, "qdisc", "add", "dev", &far_if][..], &tbf].concat())?;
        let listener = TcpListener::bind((link.addr, 0)).context("binding the link's relay")?;
        link.relay_port = listener.local_addr()?.port();
        let (stop, half) = (link.stop.clone(), spec.rtt / 2);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::Acquire) {
                    return;
                }
                let Ok(near) = conn else { continue };
                match TcpStream::connect(("127.0.0.1", nats_port)) {
                    Ok(far) => relay(near, far, half),
                    Err(e) => eprintln!("link relay: nats-server on port {nats_port}: {e}"),
                }
            }
        });
        Ok(link)
    }

    /// The namespace's name (`ip netns exec NAME …` starts a process behind the link).
    pub fn netns(&self) -> &str {
        &self.ns
    }

    /// The namespace side's address.
    pub fn far_addr(&self) -> Ipv4Addr {
        let o = self.addr.octets();
        Ipv4Addr::new(o[0], o[1], o[2], 2)
    }

    /// A relay from this side to `port` on the namespace side, holding each byte
    /// back half the round trip each way as the NATS relay does (for a peer's own
    /// protocol, such as llama.cpp's RPC); the address to connect to.
    pub fn relay_to(&self, port: u16) -> anyhow::Result<std::net::SocketAddr> {
        let listener = TcpListener::bind((self.addr, 0)).context("binding a relay")?;
        let at = listener.local_addr()?;
        let (stop, half, far) = (self.stop.clone(), self.half, self.far_addr());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::Acquire) {
                    return;
                }
                let Ok(near) = conn else { continue };
                match TcpStream::connect((far, port)) {
                    Ok(f) => relay(near, f, half),
                    Err(e) => eprintln!("link relay: {far}:{port}: {e}"),
                }
            }
        });
        Ok(at)
    }

    /// The NATS URL a worker inside the namespace connects to.
    pub fn url(&self) -> String {
        format!("nats://{}:{}", self.addr, self.relay_port)
    }

    /// Runs `fut` to its end on a Tokio runtime whose threads live in the namespace
    /// (so every socket it opens goes through the link).
    pub fn spawn<R: Send + 'static>(
        &self,
        fut: impl std::future::Future<Output = R> + Send + 'static,
    ) -> std::thread::JoinHandle<anyhow::Result<R>> {
        let path = format!("/var/run/netns/{}", self.ns);
        std::thread::spawn(move || {
            let file = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
            // SAFETY: setns with a valid namespace descriptor moves only this thread
            // (and the threads it starts from now on) into that network namespace.
            let rc = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET) };
            if rc != 0 {
                bail!("setns {path}: {}", std::io::Error::last_os_error());
            }
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            Ok(rt.block_on(fut))
        })
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the accept loop so it sees the stop.
        let _ = TcpStream::connect((self.addr, self.relay_port));
        let _ = run("ip", &["link", "del", &self.host_if]);
        let _ = run("ip", &["netns", "del", &self.ns]);
    }
}

/// Relays both directions of one connection, each byte held back `delay`.
fn relay(a: TcpStream, b: TcpStream, delay: Duration) {
    let _ = a.set_nodelay(true);
    let _ = b.set_nodelay(true);
    for (from, to) in [(&a, &b), (&b, &a)] {
        let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) else {
            return;
        };
        pipe(from, to, delay);
    }
}

/// Reads `from` as it comes; a second thread writes each read to `to` once it is
/// `delay` old. Bounded: at most 256 reads (16 MiB) wait.
fn pipe(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (tx, rx) = mpsc::sync_channel::<(Instant, Vec<u8>)>(256);
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = from.shutdown(Shutdown::Read);
    });
    std::thread::spawn(move || {
        for (due, bytes) in rx {
            let wait = due.saturating_duration_since(Instant::now());
            if !wait.is_zero() {
                std::thread::sleep(wait);
            }
            if to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_specs_parse() {
        let s: LinkSpec = "1ms,1gbit".parse().unwrap();
        assert_eq!(s.rtt, Duration::from_millis(1));
        assert_eq!(s.mbit, 1000);
        let s: LinkSpec = "500us,100mbit".parse().unwrap();
        assert_eq!(s.rtt, Duration::from_micros(500));
        assert_eq!(s.mbit, 100);
        for bad in ["1ms", "fast,1gbit", "1ms,1gbps", "2000ms,1gbit", "1ms,0mbit"] {
            assert!(bad.parse::<LinkSpec>().is_err(), "{bad} accepted");
        }
    }
}
