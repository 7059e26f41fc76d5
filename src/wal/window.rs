//! A reader that keeps a window of a segment file in memory, so that a
//! scan streams a huge segment: it reads forward in large chunks, skips
//! without reading, and can track where the bytes that are not zero end
//! (the room a preallocated segment had left).

use std::io::Read;

use crate::fs::read_full;

/// A reader that keeps a window of the file in memory, so a huge segment is
/// streamed: memory stays at about two maximum-size records.
pub(super) struct Window<R> {
    r: R,
    buf: Vec<u8>,
    /// File offset of `buf[0]`.
    base: u64,
    eof: bool,
    /// Once [`Window::track_from`] is called: one past the last byte not
    /// zero read from there on (where tracking started, if none).
    pub(super) written_end: Option<u64>,
    /// Moves the reader forward without reading (see [`Window::skip_to`]).
    skip: fn(&mut R, u64) -> std::io::Result<()>,
}

/// Skips by reading: for a reader that cannot seek.
pub(super) fn read_past<R: Read>(r: &mut R, n: u64) -> std::io::Result<()> {
    std::io::copy(&mut r.by_ref().take(n), &mut std::io::sink()).map(|_| ())
}

/// The least a refill of the window reads.
pub(super) const CHUNK: usize = 1 << 20;

impl<R: Read> Window<R> {
    /// A window at the start of `r`, which `skip` moves forward.
    pub(super) fn new(r: R, skip: fn(&mut R, u64) -> std::io::Result<()>) -> Window<R> {
        Window {
            r,
            buf: Vec::new(),
            base: 0,
            eof: false,
            written_end: None,
            skip,
        }
    }

    /// The bytes from file offset `at` on, with at least `want` of them
    /// unless the file ends first.
    pub(super) fn at(&mut self, at: u64, want: usize) -> std::io::Result<&[u8]> {
        // The window only moves forward; a read behind it is a bug of the
        // scan, reported as an error rather than a panic.
        let Some(rel) = at.checked_sub(self.base) else {
            return Err(std::io::Error::other(
                "internal error: a segment scan read behind its window",
            ));
        };
        let rel = rel as usize;
        if self.buf.len() - rel < want && !self.eof {
            self.buf.drain(..rel);
            self.base = at;
            while self.buf.len() < want.max(CHUNK) && !self.eof {
                let old = self.buf.len();
                self.buf.resize(old + CHUNK, 0);
                let n = read_full(&mut self.r, self.buf.get_mut(old..).unwrap_or_default())?;
                self.buf.truncate(old + n);
                self.eof = n == 0;
                let new = self.buf.get(old..).unwrap_or_default();
                note_written(&mut self.written_end, self.base + old as u64, new);
            }
        }
        let rel = (at - self.base) as usize;
        Ok(self.buf.get(rel..).unwrap_or_default())
    }

    /// Moves the window to file offset `at` (not behind it), skipping the
    /// bytes between without reading them.
    pub(super) fn skip_to(&mut self, at: u64) -> std::io::Result<()> {
        let held_end = self.base + self.buf.len() as u64;
        if at > held_end {
            (self.skip)(&mut self.r, at - held_end)?;
            self.buf.clear();
            self.base = at;
        }
        Ok(())
    }

    /// From file offset `at` on, keeps where the bytes that are not zero
    /// end (what is already in the window, and everything read later).
    pub(super) fn track_from(&mut self, at: u64) {
        self.written_end = Some(at);
        let rel = at.saturating_sub(self.base) as usize;
        let held = self.buf.get(rel..).unwrap_or_default();
        note_written(&mut self.written_end, at, held);
    }
}

/// `bytes`, read at file offset `at`: moves the tracked end (if tracking)
/// past their last byte that is not zero.
fn note_written(written_end: &mut Option<u64>, at: u64, bytes: &[u8]) {
    if let Some(end) = written_end
        && let Some(i) = last_nonzero(bytes)
    {
        *end = (*end).max(at + i as u64 + 1);
    }
}

/// The index of the last byte that is not zero.
pub(super) fn last_nonzero(bytes: &[u8]) -> Option<usize> {
    // Eight at a time from the end, then the byte.
    let words = bytes.rchunks_exact(8);
    let zeros = words.take_while(|w| w.iter().all(|&b| b == 0)).count() * 8;
    bytes
        .get(..bytes.len() - zeros)?
        .iter()
        .rposition(|&b| b != 0)
}
