//! A progress bar on stderr for long scans.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// A progress bar on stderr, shown only if the scan takes over a second and
/// stderr is a terminal.
pub(crate) struct Progress {
    pub(crate) start: Instant,
    pub(crate) bar: Option<indicatif::ProgressBar>,
    pub(crate) enabled: bool,
    pub(crate) what: String,
}

impl Progress {
    pub(crate) fn new(what: &str, quiet: bool) -> Progress {
        Progress {
            start: Instant::now(),
            bar: None,
            enabled: !quiet && std::io::stderr().is_terminal(),
            what: what.to_string(),
        }
    }

    pub(crate) fn tick(&mut self, done: u64) {
        if !self.enabled || self.start.elapsed() < Duration::from_secs(1) {
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
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
