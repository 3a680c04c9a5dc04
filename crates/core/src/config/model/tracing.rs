//! What the `[tracing]` section says: where spans go (OTLP over HTTP), which requests
//! are traced, and the bounds of the export. Plain data: the tracer is built from it.

use std::time::Duration;

/// `[tracing]`.
#[derive(Clone, Debug, PartialEq)]
pub struct TracingConfig {
    /// The collector's OTLP/HTTP address; spans are POSTed to its `/v1/traces`.
    pub otlp: OtlpAddr,
    /// The share of requests arriving without `traceparent` that start a trace.
    pub sample: f64,
    /// Spans per export.
    pub batch: usize,
    /// Spans waiting at most; more are dropped and counted.
    pub queue: usize,
    /// One export's time.
    pub timeout: Duration,
}

impl Default for TracingConfig {
    fn default() -> Self {
        TracingConfig {
            otlp: OtlpAddr {
                written: "http://127.0.0.1:4318".into(),
                authority: "127.0.0.1:4318".into(),
                base_path: String::new(),
            },
            sample: 0.0,
            batch: 512,
            queue: 8192,
            timeout: Duration::from_secs(2),
        }
    }
}

/// A collector's OTLP/HTTP base address: `http://host:port`, with or without a path.
/// One that exists is valid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtlpAddr {
    written: String,
    /// `host:port` (port 80 when none is written).
    authority: String,
    /// The address's own path, without a trailing `/` (usually empty).
    base_path: String,
}

impl OtlpAddr {
    /// Reads `http://host[:port][/path]`; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<Self, &'static str> {
        let uri: http::Uri = text.parse().map_err(|_| "is not a URL")?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(
                    "uses https, which the trace export does not speak (plain HTTP to a collector or agent beside tollgate)",
                );
            }
            _ => return Err("is not an http:// URL"),
        }
        let authority = uri.authority().ok_or("names no host")?;
        if authority.as_str().contains('@') {
            return Err("carries credentials, which the trace export does not send");
        }
        if uri.query().is_some() {
            return Err("has a query, which the trace export does not send");
        }
        let base_path = uri.path().trim_end_matches('/');
        if base_path.ends_with("/v1/traces") {
            return Err("ends with /v1/traces, which the export adds itself");
        }
        let authority = match authority.port_u16() {
            Some(_) => authority.as_str().to_string(),
            None => format!("{}:80", authority.host()),
        };
        Ok(OtlpAddr {
            written: text.to_string(),
            authority,
            base_path: base_path.to_string(),
        })
    }

    /// `text` as it may be shown (a message, `check`, a log): a password or token in
    /// it replaced by `***`, the user info's password (all of it when it has no `:`: a
    /// bare token) and every value of the query. Read as text, not parsed, so that an
    /// address too broken to parse is masked all the same.
    pub fn masked(text: &str) -> String {
        let (scheme, rest) = match text.split_once("://") {
            Some((scheme, rest)) => (Some(scheme), rest),
            None => (None, text),
        };
        let mut out = String::with_capacity(text.len());
        if let Some(scheme) = scheme {
            out.push_str(scheme);
            out.push_str("://");
        }
        let (before_fragment, fragment) = match rest.split_once('#') {
            Some((b, _)) => (b, true),
            None => (rest, false),
        };
        let (before_query, query) = match before_fragment.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (before_fragment, None),
        };
        let authority_end = before_query.find('/').unwrap_or(before_query.len());
        let (authority, path) = before_query.split_at(authority_end);
        match authority.rsplit_once('@') {
            Some((userinfo, host)) => {
                match userinfo.split_once(':') {
                    Some((user, _)) => {
                        out.push_str(user);
                        out.push_str(":***@");
                    }
                    None => out.push_str("***@"),
                }
                out.push_str(host);
            }
            None => out.push_str(authority),
        }
        out.push_str(path);
        if let Some(q) = query {
            out.push('?');
            let pairs: Vec<String> = q
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((k, _)) => format!("{k}=***"),
                    None => "***".to_string(),
                })
                .collect();
            out.push_str(&pairs.join("&"));
        }
        if fragment {
            out.push_str("#***");
        }
        out
    }

    /// As the file wrote it.
    pub fn as_str(&self) -> &str {
        &self.written
    }

    /// `host:port`, to connect to and send as `Host`.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// The path spans are POSTed to.
    pub fn traces_path(&self) -> String {
        format!("{}/v1/traces", self.base_path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_collector_address_is_read_strictly() {
        let a = OtlpAddr::parse("http://127.0.0.1:4318").unwrap();
        assert_eq!(a.authority(), "127.0.0.1:4318");
        assert_eq!(a.traces_path(), "/v1/traces");
        let a = OtlpAddr::parse("http://otel-collector/otlp/").unwrap();
        assert_eq!(a.authority(), "otel-collector:80");
        assert_eq!(a.traces_path(), "/otlp/v1/traces");
        assert_eq!(a.as_str(), "http://otel-collector/otlp/");
        for bad in [
            "https://collector:4318",
            "collector:4318",
            "http://collector:4318/v1/traces",
            "http://u:p@collector:4318",
            "http://collector:4318/?x=1",
            "",
        ] {
            assert!(OtlpAddr::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(TracingConfig::default().otlp.authority(), "127.0.0.1:4318");
    }

    #[test]
    fn a_password_or_token_is_never_shown() {
        for (text, shown) in [
            (
                "http://user:hunter2@collector:4318/otlp",
                "http://user:***@collector:4318/otlp",
            ),
            ("http://hunter2@collector:4318", "http://***@collector:4318"),
            (
                "http://collector:4318/?token=hunter2&x=1",
                "http://collector:4318/?token=***&x=***",
            ),
            ("http://collector?hunter2", "http://collector?***"),
            ("http:/hunter2@broken", "http:/hunter2@broken"),
            ("http://collector:4318", "http://collector:4318"),
        ] {
            assert_eq!(OtlpAddr::masked(text), shown, "{text}");
        }
    }
}
