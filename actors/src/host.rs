//! What this host says about itself, read from `/proc` in one place: its name, the
//! memory still available, and a process's resident set. Every reader answers 0 (or
//! `localhost`) where `/proc` is missing (macOS), never an error.

/// The host name (`/proc/sys/kernel/hostname`), else `localhost`.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
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
    fn this_process_has_memory_and_tokens_are_subject_safe() {
        let (peak, now) = process_memory(None);
        if cfg!(target_os = "linux") {
            assert!(peak >= now && now > 0, "{peak} {now}");
            assert!(available_memory() > 0);
        }
        assert_eq!(subject_token("cpu-my.host 1"), "cpu-my_host_1");
        assert!(!hostname().is_empty());
    }
}
