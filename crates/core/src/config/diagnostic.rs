//! A problem found in a config file, placed at `FILE:LINE:COLUMN` and named by its key,
//! with what is wrong and how to fix it. Errors and lint warnings share the shape so a
//! user reads every complaint the same way.

use std::fmt;
use std::ops::Range;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Error,
    Warning,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    pub severity: Severity,
    pub file: String,
    /// 1-based.
    pub line: usize,
    /// 1-based, in characters.
    pub column: usize,
    /// The dotted key, e.g. `upstreams.payments.retry.max_attempts`.
    pub key: String,
    pub message: String,
    pub fix: String,
}

impl Diagnostic {
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tag = match self.severity {
            Severity::Error => "",
            Severity::Warning => "warning: ",
        };
        write!(
            f,
            "{}:{}:{}: {tag}{}: {}",
            self.file, self.line, self.column, self.key, self.message
        )?;
        if !self.fix.is_empty() {
            write!(f, " ({})", self.fix)?;
        }
        Ok(())
    }
}

/// Every problem in one file, errors first in file order; the error type of loading.
#[derive(Clone, Debug, thiserror::Error)]
pub struct ConfigErrors(pub Vec<Diagnostic>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

/// Turns byte offsets of one source text into 1-based line and column numbers.
#[derive(Clone, Debug)]
pub struct Source<'a> {
    pub file: &'a str,
    pub text: &'a str,
    line_starts: Vec<usize>,
}

impl<'a> Source<'a> {
    pub fn new(file: &'a str, text: &'a str) -> Self {
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Source {
            file,
            text,
            line_starts,
        }
    }

    pub fn position(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let line = match self.line_starts.binary_search(&offset) {
            Ok(i) => i,
            Err(i) => i - 1,
        };
        let start = self.line_starts[line];
        let column = self
            .text
            .get(start..offset)
            .map_or(offset - start, |s| s.chars().count())
            + 1;
        (line + 1, column)
    }

    pub fn diagnostic(
        &self,
        severity: Severity,
        span: Range<usize>,
        key: &str,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) -> Diagnostic {
        let (line, column) = self.position(span.start);
        Diagnostic {
            severity,
            file: self.file.to_string(),
            line,
            column,
            key: key.to_string(),
            message: message.into(),
            fix: fix.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_one_based_lines_and_character_columns() {
        let src = Source::new("f.toml", "a = 1\nbé = 2\n\nc = 3");
        assert_eq!(src.position(0), (1, 1));
        assert_eq!(src.position(4), (1, 5));
        assert_eq!(src.position(6), (2, 1));
        // "bé = " is 6 bytes but 5 characters
        assert_eq!(src.position(6 + 6), (2, 6));
        assert_eq!(src.position(src.text.len()), (4, 6));
    }

    #[test]
    fn display_names_file_line_column_key_problem_and_fix() {
        let src = Source::new("svc.toml", "x\ny = 2");
        let d = src.diagnostic(Severity::Error, 2..3, "y", "is wrong", "set it right");
        assert_eq!(d.to_string(), "svc.toml:2:1: y: is wrong (set it right)");
    }
}
