//! What a callee's `x-tollgate-dedupe` says, and the store a retry names in
//! `x-tollgate-dedupe-store`: whether keyed requests run there once, which header
//! carries the key, and where the keys are remembered. The callee's inbound side writes
//! it, the caller reads it.

use http::{HeaderName, HeaderValue};

/// Where a callee remembers its keys, as its `x-tollgate-dedupe` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DedupeScope {
    /// A store every replica shares (Redis): a retry may go to any of them.
    Shared,
    /// This replica's memory, named by an ID that changes at every process start: a
    /// retry of a request that may have run must go back to it, carrying the ID.
    Replica(StoreId),
}

/// A memory store's name: random, never 0, written as 16 hex digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StoreId(u64);

impl StoreId {
    /// A new random ID.
    pub fn random() -> StoreId {
        StoreId(fastrand::u64(1..))
    }

    /// The ID of `text` (16 hex digits, as [`StoreId::value`] writes it).
    pub fn parse(text: &[u8]) -> Option<StoreId> {
        if text.len() != 16 {
            return None;
        }
        let s = std::str::from_utf8(text).ok()?;
        u64::from_str_radix(s, 16)
            .ok()
            .filter(|n| *n != 0)
            .map(StoreId)
    }

    /// The store `text` names: its ID, or, when it is no ID, one that names no store
    /// (0, never any store's).
    pub fn named(text: &[u8]) -> StoreId {
        StoreId::parse(text).unwrap_or(StoreId(0))
    }

    /// As `x-tollgate-dedupe-store` carries it.
    pub fn value(self) -> HeaderValue {
        let text = format!("{:016x}", self.0);
        // Hex digits are always a valid value.
        HeaderValue::from_str(&text).unwrap_or(HeaderValue::from_static("0"))
    }
}

/// What a callee's `x-tollgate-dedupe` says: `on; header=NAME; scope=shared`, or `on;
/// header=NAME; scope=replica; store=ID`. Both sides speak it from here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DedupeAdvert {
    /// The header the callee reads a key from.
    pub header: HeaderName,
    pub scope: DedupeScope,
}

impl DedupeAdvert {
    /// The field's value, as the callee writes it.
    pub fn to_value(&self) -> String {
        match self.scope {
            DedupeScope::Shared => format!("on; header={}; scope=shared", self.header),
            DedupeScope::Replica(id) => format!(
                "on; header={}; scope=replica; store={:016x}",
                self.header, id.0
            ),
        }
    }

    /// Where keys sent in `own` are deduplicated, by what `value` says: `None` unless
    /// it is on, names `own` as its header (a callee reading another header sees no
    /// key at all), and says where it keeps them.
    pub fn scope_for(value: &[u8], own: &HeaderName) -> Option<DedupeScope> {
        let mut parts = value.split(|b| *b == b';').map(<[u8]>::trim_ascii);
        if parts.next()? != b"on" {
            return None;
        }
        let (mut header, mut scope, mut store) = (None, None, None);
        for part in parts {
            let Some(eq) = part.iter().position(|b| *b == b'=') else {
                continue;
            };
            let (name, v) = (part[..eq].trim_ascii(), part[eq + 1..].trim_ascii());
            match name {
                b"header" => header = Some(v),
                b"scope" => scope = Some(v),
                b"store" => store = Some(v),
                _ => {}
            }
        }
        if !header?.eq_ignore_ascii_case(own.as_str().as_bytes()) {
            return None;
        }
        match scope? {
            b"shared" => Some(DedupeScope::Shared),
            b"replica" => Some(DedupeScope::Replica(StoreId::parse(store?)?)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dedupe_advert_counts_only_for_the_header_it_names() {
        let own = HeaderName::from_static("idempotency-key");
        let id = StoreId::random();
        for scope in [DedupeScope::Shared, DedupeScope::Replica(id)] {
            let advert = DedupeAdvert {
                header: own.clone(),
                scope,
            };
            let value = advert.to_value();
            assert_eq!(DedupeAdvert::scope_for(value.as_bytes(), &own), Some(scope));
            let other = HeaderName::from_static("x-idempotency-key");
            assert_eq!(DedupeAdvert::scope_for(value.as_bytes(), &other), None);
        }
        let read = |v: &str| DedupeAdvert::scope_for(v.as_bytes(), &own);
        assert_eq!(read("on"), None, "no header named: nothing to trust");
        assert_eq!(read("on; header=idempotency-key"), None, "no scope");
        assert_eq!(
            read("on;header=Idempotency-Key ;scope=shared"),
            Some(DedupeScope::Shared)
        );
        assert_eq!(read("on; header=idempotency-key; scope=replica"), None);
        assert_eq!(
            read("on; header=idempotency-key; scope=replica; store=xyz"),
            None
        );
        assert_eq!(
            read("on; header=idempotency-key; scope=replica; store=0000000000000000"),
            None
        );
        assert_eq!(read("off; header=idempotency-key; scope=shared"), None);
        assert_eq!(
            StoreId::parse(id.value().as_bytes()),
            Some(id),
            "the ID reads back"
        );
    }
}
