//! gRPC's own words, as far as a hop needs them: which requests are gRPC calls, the
//! status codes, the mapping of an HTTP status to a gRPC one (as gRPC clients apply it
//! to a response that is not a gRPC answer), and a trailers-only answer's head
//! (`grpc-status` and `grpc-message` with the headers, no body, HTTP 200), whichever
//! HTTP version carries it.

use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

pub const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
pub const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// How long the client should wait before a retry; negative: do not retry.
pub const GRPC_PUSHBACK: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// The gRPC status codes a hop speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Code {
    Unknown = 2,
    DeadlineExceeded = 4,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

impl Code {
    pub fn header_value(self) -> HeaderValue {
        HeaderValue::from(u16::from(self as u8))
    }

    /// The code gRPC clients give a response that is not a gRPC answer, by its HTTP
    /// status (gRPC's "HTTP to gRPC status code mapping"), with 431 as
    /// RESOURCE_EXHAUSTED (the request's metadata was too large).
    pub fn of_http(status: StatusCode) -> Code {
        match status.as_u16() {
            400 => Code::Internal,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::Unimplemented,
            431 => Code::ResourceExhausted,
            429 | 502 | 503 | 504 => Code::Unavailable,
            _ => Code::Unknown,
        }
    }
}

/// Whether a request is a gRPC call: `content-type: application/grpc` or
/// `application/grpc+...`/`;...`.
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// Whether a response head is a gRPC answer: HTTP 200 with a `content-type` of gRPC,
/// or trailers-only (its `grpc-status` already in the head).
pub fn is_grpc_answer(status: StatusCode, content_type: Option<&[u8]>, grpc_status: bool) -> bool {
    status == StatusCode::OK
        && (grpc_status || content_type.is_some_and(|v| v.starts_with(b"application/grpc")))
}

/// The head of a trailers-only answer: `content-type`, `grpc-status` and
/// `grpc-message` (percent-encoded as gRPC asks).
pub fn trailers_only(code: Code, message: &str) -> HeaderMap {
    let mut h = HeaderMap::with_capacity(6);
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert(GRPC_STATUS, code.header_value());
    if let Ok(v) = HeaderValue::from_bytes(&percent_encode(message.trim_end())) {
        h.insert(GRPC_MESSAGE, v);
    }
    h
}

/// `grpc-message` encoding: printable ASCII but `%` as it is, every other byte as
/// `%XX`.
fn percent_encode(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for &b in text.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b);
        } else {
            out.push(b'%');
            out.push(b"0123456789ABCDEF"[usize::from(b >> 4)]);
            out.push(b"0123456789ABCDEF"[usize::from(b & 15)]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(percent_encode("50% é\n"), b"50%25 %C3%A9%0A");
        let h = trailers_only(Code::Unavailable, "the upstream could not be reached\n");
        assert_eq!(h[GRPC_STATUS], "14");
        assert_eq!(h[GRPC_MESSAGE], "the upstream could not be reached");
        assert_eq!(h[CONTENT_TYPE], "application/grpc");
    }

    #[test]
    fn http_statuses_map_as_grpc_clients_map_them() {
        assert_eq!(Code::of_http(StatusCode::BAD_REQUEST), Code::Internal);
        assert_eq!(
            Code::of_http(StatusCode::SERVICE_UNAVAILABLE),
            Code::Unavailable
        );
        assert_eq!(
            Code::of_http(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE),
            Code::ResourceExhausted
        );
        assert_eq!(Code::of_http(StatusCode::IM_A_TEAPOT), Code::Unknown);
    }
}
