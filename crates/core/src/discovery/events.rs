//! The watch stream: newline-delimited JSON events, arriving in chunks that cut lines
//! anywhere, and what each event asks of the watch.
//!
//! Pure, so the splitting (a line over several chunks, several lines in one) and every
//! event's meaning are tested without a server. The one decision with a consequence is
//! `ERROR` with code 410 (Gone): the version watched from is older than the API keeps,
//! so the watch must list again; any other `ERROR` is a failure to back off from.

use serde::Deserialize;

use super::objects::Slice;

/// The longest line taken: an EndpointSlice holds at most 1,000 endpoints, well under.
pub const MAX_LINE: usize = 4 << 20;

/// Bytes in, whole lines out; the rest waits for the next chunk.
#[derive(Default)]
pub struct Lines {
    buf: Vec<u8>,
}

impl Lines {
    /// Adds `chunk` and returns the lines it completed (without their `\n`; empty
    /// lines skipped). An error when a line grows past [`MAX_LINE`].
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<Vec<u8>>, String> {
        let mut out = Vec::new();
        let mut rest = chunk;
        while let Some(i) = rest.iter().position(|b| *b == b'\n') {
            let line = if self.buf.is_empty() {
                rest[..i].to_vec()
            } else {
                let mut line = std::mem::take(&mut self.buf);
                line.extend_from_slice(&rest[..i]);
                line
            };
            if line.iter().any(|b| !b.is_ascii_whitespace()) {
                out.push(line);
            }
            rest = &rest[i + 1..];
        }
        self.buf.extend_from_slice(rest);
        if self.buf.len() > MAX_LINE {
            return Err(format!("a watch event longer than {MAX_LINE} bytes"));
        }
        Ok(out)
    }
}

/// One event of the watch, as the watch acts on it.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// ADDED or MODIFIED: the slice as it is now.
    Put(Slice),
    /// DELETED: the slice is gone; its version is the one to go on from.
    Deleted {
        name: String,
        resource_version: Option<String>,
    },
    /// BOOKMARK: nothing changed up to this version.
    Bookmark(Option<String>),
    /// ERROR: a Status object.
    Error { code: u16, message: String },
}

#[derive(Deserialize)]
struct RawEvent {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    object: serde_json::Value,
}

impl Event {
    pub fn parse(line: &[u8]) -> Result<Event, String> {
        let raw: RawEvent =
            serde_json::from_slice(line).map_err(|e| format!("a watch event: {e}"))?;
        let version = |o: &serde_json::Value| {
            o["metadata"]["resourceVersion"]
                .as_str()
                .map(str::to_string)
        };
        match raw.kind.as_str() {
            "ADDED" | "MODIFIED" => Slice::from_json(raw.object).map(Event::Put),
            "DELETED" => Ok(Event::Deleted {
                name: raw.object["metadata"]["name"]
                    .as_str()
                    .ok_or("a DELETED event without metadata.name")?
                    .to_string(),
                resource_version: version(&raw.object),
            }),
            "BOOKMARK" => Ok(Event::Bookmark(version(&raw.object))),
            "ERROR" => Ok(Event::Error {
                code: raw.object["code"]
                    .as_u64()
                    .and_then(|c| u16::try_from(c).ok())
                    .unwrap_or(0),
                message: raw.object["message"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            }),
            other => Err(format!("a watch event of type `{other}`")),
        }
    }
}

/// What an `ERROR` event (or a status answering the watch request) asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum AfterError {
    /// 410 Gone: the version is too old; list again, at once.
    Relist,
    /// Anything else: a failure; back off, then watch again from the same version.
    Retry,
}

pub fn after_error(code: u16) -> AfterError {
    if code == 410 {
        AfterError::Relist
    } else {
        AfterError::Retry
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_whole_whatever_the_chunks() {
        let text = b"{\"a\":1}\n{\"b\":2}\n\n{\"c\":3}\n";
        let want: Vec<Vec<u8>> = vec![
            b"{\"a\":1}".to_vec(),
            b"{\"b\":2}".to_vec(),
            b"{\"c\":3}".to_vec(),
        ];
        for size in 1..=text.len() {
            let mut lines = Lines::default();
            let mut got = Vec::new();
            for chunk in text.chunks(size) {
                got.extend(lines.push(chunk).unwrap());
            }
            assert_eq!(got, want, "chunks of {size}");
        }
        let mut lines = Lines::default();
        assert!(lines.push(b"{\"partial\":").unwrap().is_empty());
        assert_eq!(lines.push(b"1}\n{").unwrap(), [b"{\"partial\":1}".to_vec()]);
    }

    #[test]
    fn a_line_without_end_is_refused_past_the_limit() {
        let mut lines = Lines::default();
        let big = vec![b'x'; MAX_LINE / 2 + 1];
        assert!(lines.push(&big).is_ok());
        assert!(lines.push(&big).is_err());
    }

    #[test]
    fn events_say_what_changed() {
        let put = br#"{"type":"MODIFIED","object":{"metadata":{"name":"s1","resourceVersion":"9"},
            "addressType":"IPv4","endpoints":[{"addresses":["10.0.0.1"]}],"ports":[{"name":"http","port":80}]}}"#;
        let Event::Put(s) = Event::parse(put).unwrap() else {
            panic!("a put")
        };
        assert_eq!((s.name.as_str(), s.ready.len()), ("s1", 1));
        assert_eq!(
            Event::parse(
                br#"{"type":"DELETED","object":{"metadata":{"name":"s1","resourceVersion":"10"}}}"#
            )
            .unwrap(),
            Event::Deleted {
                name: "s1".into(),
                resource_version: Some("10".into())
            }
        );
        assert_eq!(
            Event::parse(br#"{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"11"}}}"#)
                .unwrap(),
            Event::Bookmark(Some("11".into()))
        );
        let gone = br#"{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired","message":"too old resource version: 1 (5)"}}"#;
        let Event::Error { code, message } = Event::parse(gone).unwrap() else {
            panic!("an error")
        };
        assert_eq!(code, 410);
        assert!(message.contains("too old"));
        assert!(Event::parse(b"not json").is_err());
        assert!(Event::parse(br#"{"type":"WHAT","object":{}}"#).is_err());
    }

    #[test]
    fn gone_relists_and_other_errors_retry() {
        assert_eq!(after_error(410), AfterError::Relist);
        for code in [0, 401, 403, 500, 503] {
            assert_eq!(after_error(code), AfterError::Retry, "{code}");
        }
    }
}
