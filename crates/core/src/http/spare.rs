//! Allocations each thread keeps for the next request once a request is done with them:
//! the header map a request head is read into, and the list of a response head's field
//! lines. A request takes a spare where it would allocate and gives it back where it
//! would free, as HAProxy keeps per-thread pools of its per-request objects: the
//! allocator's own round trip costs more than the request's other work on these.
//!
//! Each kind keeps at most [`KEPT`] spares per thread, and none that a large head has
//! grown past [`LARGEST`] entries, so what is kept stays small whatever came before.

use std::cell::RefCell;

use http::HeaderMap;

/// Spares of each kind one thread keeps.
pub const KEPT: usize = 64;
/// A map or list with room for more entries than this is freed, not kept.
pub const LARGEST: usize = 32;

/// Spares of one kind, as a thread keeps them.
struct Spares<T> {
    kept: RefCell<Vec<T>>,
}

impl<T> Spares<T> {
    const fn new() -> Self {
        Spares {
            kept: RefCell::new(Vec::new()),
        }
    }

    /// A spare, if one is kept.
    fn take(&self) -> Option<T> {
        self.kept.try_borrow_mut().ok()?.pop()
    }

    /// Keeps `spare` unless [`KEPT`] are kept already.
    fn give(&self, spare: T) {
        if let Ok(mut kept) = self.kept.try_borrow_mut()
            && kept.len() < KEPT
        {
            kept.push(spare);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.kept.try_borrow().map_or(0, |k| k.len())
    }
}

thread_local! {
    static MAPS: Spares<HeaderMap> = const { Spares::new() };
    static LINES: Spares<Vec<[u32; 4]>> = const { Spares::new() };
}

/// An empty header map with room for `n` fields.
pub fn header_map(n: usize) -> HeaderMap {
    match MAPS.with(Spares::take) {
        Some(mut map) => {
            map.reserve(n);
            map
        }
        None => HeaderMap::with_capacity(n),
    }
}

/// Gives back a header map a request is done with.
pub fn give_header_map(mut map: HeaderMap) {
    if map.capacity() <= LARGEST {
        map.clear();
        MAPS.with(|m| m.give(map));
    }
}

/// An empty list of field lines with room for `n`.
pub fn lines(n: usize) -> Vec<[u32; 4]> {
    match LINES.with(Spares::take) {
        Some(mut lines) => {
            lines.reserve(n);
            lines
        }
        None => Vec::with_capacity(n),
    }
}

/// Gives back a list of field lines a response is done with.
pub fn give_lines(mut lines: Vec<[u32; 4]>) {
    if lines.capacity() <= LARGEST {
        lines.clear();
        LINES.with(|l| l.give(lines));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn a_given_back_map_comes_back_empty_with_its_room() {
        let mut map = header_map(8);
        map.insert("x-a", HeaderValue::from_static("1"));
        let room = map.capacity();
        give_header_map(map);
        let again = header_map(2);
        assert!(again.is_empty());
        assert_eq!(again.capacity(), room);
    }

    #[test]
    fn a_large_map_is_not_kept() {
        // A fresh thread, so no spare of another test is in the way.
        std::thread::spawn(|| {
            let mut map = header_map(LARGEST * 2);
            map.insert("x-a", HeaderValue::from_static("1"));
            give_header_map(map);
            assert_eq!(MAPS.with(Spares::len), 0);
            let lines = Vec::with_capacity(LARGEST + 1);
            give_lines(lines);
            assert_eq!(LINES.with(Spares::len), 0);
        })
        .join()
        .expect("the thread runs to its end");
    }

    #[test]
    fn a_thread_keeps_a_bounded_number() {
        std::thread::spawn(|| {
            for _ in 0..KEPT * 2 {
                give_header_map(HeaderMap::with_capacity(4));
                give_lines(Vec::with_capacity(4));
            }
            assert_eq!(MAPS.with(Spares::len), KEPT);
            assert_eq!(LINES.with(Spares::len), KEPT);
        })
        .join()
        .expect("the thread runs to its end");
    }
}
