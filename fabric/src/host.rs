//! What this host says about itself, read from `/proc` in one place: its name, the
//! memory still available, a process's resident set, and its threads' scheduling.
//! Every reader answers 0 (or `localhost`, or nothing) where `/proc` is missing
//! (macOS), never an error.

/// The host name (`/proc/sys/kernel/hostname`; where there is no `/proc`, as on
/// macOS, `gethostname(3)`), else `localhost`.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(system_hostname)
        .unwrap_or_else(|| "localhost".into())
}

/// `gethostname(3)`.
fn system_hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most that
    // many bytes (NUL-terminated when it fits, which the search below does not need).
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).trim().to_string();
    (!name.is_empty()).then_some(name)
}

/// A kB field (`Name:   123 kB`) of a `/proc` file, in bytes (0 when absent).
fn kb_field(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// `MemAvailable` from /proc/meminfo, in bytes (0 when unknown).
pub fn available_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo").map_or(0, |m| kb_field(&m, "MemAvailable:"))
}

/// (peak, current) resident set size in bytes of process `pid` (`None`: this one).
pub fn process_memory(pid: Option<u32>) -> (u64, u64) {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/status"),
        None => "/proc/self/status".into(),
    };
    std::fs::read_to_string(path).map_or((0, 0), |s| (kb_field(&s, "VmHWM:"), kb_field(&s, "VmRSS:")))
}

/// What the scheduler says of one thread so far (`/proc/{pid}/task/{tid}`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThreadSched {
    /// Its name (`comm`).
    pub name: String,
    /// Nanoseconds it ran on a CPU (`schedstat`, first field).
    pub ran_ns: u64,
    /// Times it was put on a CPU (`schedstat`, third field): each one a wake-up or
    /// a return after preemption.
    pub slices: u64,
    /// Times it was taken off a CPU while still runnable (`nonvoluntary_ctxt_switches`).
    pub preempted: u64,
}

/// The threads of process `pid` (`None`: this one); empty where unknown.
pub fn threads(pid: Option<u32>) -> Vec<ThreadSched> {
    let dir = match pid {
        Some(pid) => format!("/proc/{pid}/task"),
        None => "/proc/self/task".into(),
    };
    let Ok(tasks) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .map(|task| {
            let read = |file| std::fs::read_to_string(task.path().join(file)).unwrap_or_default();
            let sched: Vec<u64> = read("schedstat")
                .split_whitespace()
                .map(|f| f.parse().unwrap_or(0))
                .collect();
            let preempted = read("status")
                .lines()
                .find_map(|l| l.strip_prefix("nonvoluntary_ctxt_switches:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            ThreadSched {
                name: read("comm").trim().to_string(),
                ran_ns: sched.first().copied().unwrap_or(0),
                slices: sched.get(2).copied().unwrap_or(0),
                preempted,
            }
        })
        .collect()
}

/// `raw` reduced to one NATS subject token: letters, digits, `-` and `_` kept,
/// anything else `_` (default worker and coordinator ids).
pub fn subject_token(raw: &str) -> String {
    raw.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_name_without_proc_is_the_systems() {
        // What macOS (no /proc) gets: the same name Linux keeps in /proc.
        let name = system_hostname().expect("gethostname answers");
        assert!(!name.is_empty() && !name.contains('\0'));
        if cfg!(target_os = "linux") {
            assert_eq!(name, hostname());
        }
    }

    #[test]
    fn this_process_has_memory_and_tokens_are_subject_safe() {
        let (peak, now) = process_memory(None);
        if cfg!(target_os = "linux") {
            assert!(peak >= now && now > 0, "{peak} {now}");
            assert!(available_memory() > 0);
        }
        if cfg!(target_os = "linux") {
            let me = threads(None);
            assert!(
                !me.is_empty() && me.iter().any(|t| t.ran_ns > 0 && t.slices > 0),
                "{me:?}"
            );
        }
        assert_eq!(subject_token("cpu-my.host 1"), "cpu-my_host_1");
        assert!(!hostname().is_empty());
    }
}
