//! Printing a command's output to stdout the way Unix tools do: when the reader goes
//! away early (`tollgate calc --json | head -c 10`), the output stops quietly instead of
//! ending in a panic about a broken pipe. The reader has what it wanted; there is no
//! one left to tell.
//!
//! Rust ignores SIGPIPE, so a write to a closed pipe returns `BrokenPipe`, and
//! `print!` panics on it. The tools print through here instead.

use std::io::{ErrorKind, Write};

/// Writes `text` to stdout and flushes it. A reader that has gone away is not an error;
/// any other failure is reported on stderr.
pub fn stdout(text: &str) {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::BrokenPipe => {}
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "tollgate: cannot write the output: {e}");
        }
    }
}

/// Writes a line to stderr, ignoring a stderr that is gone (progress and notes only).
pub fn stderr_line(text: &str) {
    let _ = writeln!(std::io::stderr(), "{text}");
}
