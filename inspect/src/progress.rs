//! A progress bar on stderr for the long parts of a run: scanning,
//! rendering the tables and writing the output.
//!
//! The time is not where one would guess: scanning a 64 MiB segment takes
//! a fraction of a second, rendering its two and a half million records
//! as a table or JSON (hundreds of MB) several seconds. So every phase
//! ticks one of these, and a bar shows once the *run* (not the phase) has
//! taken over a second, in whichever phase it is then.

use std::io::{IsTerminal, Write};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// When the run started.
static START: OnceLock<Instant> = OnceLock::new();

/// Marks the start of the run (the first call wins).
pub(crate) fn start() {
    START.get_or_init(Instant::now);
}

fn elapsed() -> Duration {
    START.get_or_init(Instant::now).elapsed()
}

/// A spinner on stderr for one phase, shown only once the run has taken
/// over a second and only if stderr is a terminal; cleared when dropped.
pub(crate) struct Progress {
    bar: Option<indicatif::ProgressBar>,
    enabled: bool,
    delay: Duration,
    what: String,
    /// Ticks so far (the tests count them).
    pub(crate) ticks: u64,
}

impl Progress {
    pub(crate) fn new(what: &str) -> Progress {
        Progress {
            bar: None,
            enabled: std::io::stderr().is_terminal(),
            delay: Duration::from_secs(1),
            what: what.to_string(),
            ticks: 0,
        }
    }

    /// A bar for a phase that writes the output (rendering it, writing
    /// it): shown only if stdout goes to a file (or `/dev/null`), not to
    /// a terminal or a pipe, whose reader (a pager) may share stderr's
    /// terminal: a spinner drawn between the lines would garble them.
    pub(crate) fn for_output(what: &str) -> Progress {
        let mut p = Progress::new(what);
        p.enabled &= stdout_is_file();
        p
    }

    /// `done` of the phase so far (bytes, entries, rows).
    pub(crate) fn tick(&mut self, done: u64) {
        self.ticks += 1;
        if !self.enabled || elapsed() < self.delay {
            return;
        }
        let bar = self.bar.get_or_insert_with(|| {
            let b = indicatif::ProgressBar::new_spinner();
            b.set_style(
                indicatif::ProgressStyle::with_template("{spinner} {msg} {pos} [{elapsed}]")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
            );
            b.set_message(self.what.clone());
            b
        });
        bar.set_position(done);
    }

    /// Whether the bar is showing (or would, on a terminal).
    #[cfg(test)]
    pub(crate) fn shown(&self) -> bool {
        self.bar.is_some()
    }
}

/// Whether stdout is a regular file or a device that is not a terminal.
#[cfg(unix)]
fn stdout_is_file() -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::fs::FileTypeExt;
    let out = std::io::stdout();
    if out.is_terminal() {
        return false;
    }
    out.as_fd()
        .try_clone_to_owned()
        .map(std::fs::File::from)
        .and_then(|f| f.metadata())
        .is_ok_and(|m| m.file_type().is_file() || m.file_type().is_char_device())
}

#[cfg(not(unix))]
fn stdout_is_file() -> bool {
    false
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// A writer that ticks a progress bar with the bytes written through it:
/// the output phase (a segment's JSON can be hundreds of MB).
pub(crate) struct Ticking<W> {
    pub(crate) inner: W,
    pub(crate) written: u64,
    pub(crate) progress: Progress,
}

impl<W: Write> Write for Ticking<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        self.progress.tick(self.written);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bar_shows_in_whichever_phase_the_run_passes_its_delay() {
        start();
        // Not a terminal: never.
        let mut p = Progress::new("scanning");
        p.enabled = false;
        p.delay = Duration::ZERO;
        p.tick(1);
        assert!(!p.shown());
        // A phase that starts after the delay shows at its first tick,
        // however short the phase itself is.
        let mut p = Progress::new("rendering");
        p.enabled = true;
        p.delay = Duration::ZERO;
        p.tick(1);
        assert!(p.shown());
        // Before the delay: not yet.
        let mut p = Progress::new("writing");
        p.enabled = true;
        p.delay = Duration::from_secs(3600);
        p.tick(1);
        assert!(!p.shown());
    }

    #[test]
    fn writing_ticks_with_the_bytes_written() {
        let mut w = Ticking {
            inner: Vec::new(),
            written: 0,
            progress: Progress::new("writing"),
        };
        w.write_all(&[1; 100]).unwrap();
        w.write_all(&[2; 50]).unwrap();
        assert_eq!((w.written, w.inner.len()), (150, 150));
        assert!(w.progress.ticks >= 2);
    }
}
