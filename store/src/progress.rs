//! Progress of a long transfer on stderr: a bar redrawn in place on a terminal,
//! a line every few seconds (and at each tenth) otherwise, so logs stay readable.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// A byte counter that reports itself.
pub struct Progress {
    label: String,
    total: u64,
    done: u64,
    /// Bytes that were already there (resumed), not counted in the rate.
    skipped: u64,
    started: Instant,
    last: Instant,
    last_tenth: u64,
    tty: bool,
    quiet: bool,
}

impl Progress {
    /// A counter towards `total` bytes, labelled e.g. `fetching qwen`.
    pub fn new(label: impl Into<String>, total: u64) -> Self {
        let now = Instant::now();
        Self {
            label: label.into(),
            total,
            done: 0,
            skipped: 0,
            started: now,
            last: now,
            last_tenth: 0,
            tty: std::io::stderr().is_terminal(),
            quiet: false,
        }
    }

    /// A counter that prints nothing (benchmarks).
    pub fn quiet(mut self) -> Self {
        self.quiet = true;
        self
    }

    /// Counts bytes found already in place (a resumed transfer).
    pub fn skip(&mut self, n: u64) {
        self.done += n;
        self.skipped += n;
    }

    /// Counts `n` more bytes and reports if it is time.
    pub fn advance(&mut self, n: u64) {
        self.done += n;
        let tenth = (self.done * 10).checked_div(self.total).unwrap_or(10);
        let every = if self.tty {
            Duration::from_millis(100)
        } else {
            Duration::from_secs(5)
        };
        if self.last.elapsed() >= every || (!self.tty && tenth > self.last_tenth) {
            self.last_tenth = tenth;
            self.last = Instant::now();
            self.print(false);
        }
    }

    /// Forgets what was counted after `done` bytes (a transfer that starts again).
    pub fn reset_to(&mut self, done: u64) {
        self.done = done.min(self.done);
        self.skipped = self.skipped.min(self.done);
    }

    /// Bytes counted so far.
    pub fn done(&self) -> u64 {
        self.done
    }

    /// Bytes per second moved by this process (resumed bytes not counted).
    pub fn rate(&self) -> f64 {
        (self.done - self.skipped) as f64 / self.started.elapsed().as_secs_f64().max(1e-6)
    }

    /// The last report, ending the bar's line (unless a line already said 100%).
    pub fn finish(&mut self) {
        if self.tty || self.last_tenth < 10 {
            self.print(true);
        }
    }

    fn print(&self, last: bool) {
        if self.quiet {
            return;
        }
        let pct = match self.total {
            0 => 100.0,
            t => self.done as f64 * 100.0 / t as f64,
        };
        let text = format!(
            "{:.1}/{:.1} MB, {:.0} MB/s",
            self.done as f64 / 1e6,
            self.total as f64 / 1e6,
            self.rate() / 1e6
        );
        let mut err = std::io::stderr().lock();
        if self.tty {
            let filled = (pct / 5.0) as usize;
            let bar = format!("{}{}", "#".repeat(filled.min(20)), "-".repeat(20 - filled.min(20)));
            let _ = write!(err, "\r{} [{bar}] {pct:5.1}% {text}   ", self.label);
            if last {
                let _ = writeln!(err);
            }
        } else {
            let _ = writeln!(err, "{}: {pct:.0}% ({text})", self.label);
        }
        let _ = err.flush();
    }
}
