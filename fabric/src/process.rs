//! Child processes that never outlive us, and loopback ports for them.

use std::net::TcpListener;
use std::process::Command;

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Asks the kernel to SIGKILL the child when its parent dies, so no child outlives
/// us even after `kill -9`.
///
/// Linux ties this to the *thread* that spawned the child, not the process: spawn
/// from a thread that lives as long as the child should (the main thread, a tokio
/// worker, or a supervisor's own thread), never from a `spawn_blocking` thread,
/// which exits when idle and would take the child with it.
pub fn kill_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: prctl and getppid are async-signal-safe and touch only the calling
    // (child) process.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

/// An exclusive `flock` on `path` (created if missing), held until the file is
/// dropped. With `wait`, blocks until another holder lets go; without, `None` when
/// someone else holds it.
pub fn lock_file(path: &std::path::Path, wait: bool) -> std::io::Result<Option<std::fs::File>> {
    use std::os::fd::AsRawFd;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    let how = if wait {
        libc::LOCK_EX
    } else {
        libc::LOCK_EX | libc::LOCK_NB
    };
    // SAFETY: a valid open descriptor; flock has no memory effects.
    if unsafe { libc::flock(file.as_raw_fd(), how) } == 0 {
        return Ok(Some(file));
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() == Some(libc::EWOULDBLOCK) && !wait {
        true => Ok(None),
        false => Err(e),
    }
}
