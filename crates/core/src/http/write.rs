//! What a connection has to write next: the small pieces of a message (its head, a
//! chunk-size line, a small body chunk) copied into one buffer, and the large body
//! chunks kept as the `Bytes` they came in, placed between those pieces and written
//! with them in one vectored write.
//!
//! Copying a body into the write buffer cost a full copy of every byte (256 KiB for a
//! 256 KiB upload) and, as a large chunk grew the buffer past what a connection keeps,
//! a reallocation each time it grew again. A chunk of [`BIG_CHUNK`] or more is worth
//! its slot in the vectored write instead; a smaller one is cheaper to copy than to
//! carry, and batching small ones keeps the writes few. A chunk kept here is shared
//! (its `Bytes` is reference-counted) with whatever else holds it, such as the replay
//! of a body a retry may send again.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use tokio::io::AsyncWrite;

/// A body chunk this large or larger is written from its own buffer, not copied.
pub const BIG_CHUNK: usize = 4 * 1024;

/// At most this many slices go into one vectored write. A batch ends at
/// [`WRITE_BATCH`](super::WRITE_BATCH) bytes, so it holds at most four large chunks and
/// nine slices; a longer queue is written over several calls.
const MAX_SLICES: usize = 16;

/// The bytes waiting to be written on a connection, in order.
#[derive(Default)]
pub struct WriteBuf {
    /// The copied pieces.
    bytes: Vec<u8>,
    /// The large chunks, each with the offset in `bytes` it goes before, in order;
    /// what of them is written is advanced past.
    chunks: Vec<(usize, Bytes)>,
    /// What of `bytes` has been written.
    pos: usize,
    /// What the chunks hold, not yet written.
    chunked: usize,
}

impl WriteBuf {
    /// The buffer the small pieces are copied into, after everything queued so far.
    pub fn bytes_mut(&mut self) -> &mut Vec<u8> {
        &mut self.bytes
    }

    /// Queues `data`: a large chunk as it is, a small one copied.
    pub fn put(&mut self, data: Bytes) {
        if data.len() >= BIG_CHUNK {
            self.chunked += data.len();
            self.chunks.push((self.bytes.len(), data));
        } else {
            self.bytes.extend_from_slice(&data);
        }
    }

    /// Bytes queued and not yet written.
    pub fn len(&self) -> usize {
        self.bytes.len() - self.pos + self.chunked
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The buffer's capacity.
    pub fn capacity(&self) -> usize {
        self.bytes.capacity()
    }

    /// Empties the queue, keeping the buffer.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.chunks.clear();
        self.pos = 0;
        self.chunked = 0;
    }

    /// Empties the queue and frees a buffer grown past `keep` bytes (by a large head,
    /// or many small chunks): a connection keeps its buffer between messages only
    /// while it is small.
    pub fn clear_and_bound(&mut self, keep: usize) {
        self.clear();
        if self.bytes.capacity() > keep {
            self.bytes = Vec::new();
        }
    }

    /// Writes everything queued to `io`, in as few writes as it takes. Once it is all
    /// out, the queue is empty (its buffer kept).
    pub fn poll_write_all<W: AsyncWrite + Unpin + ?Sized>(
        &mut self,
        io: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        while !self.is_empty() {
            let n = if self.chunks.is_empty() {
                ready!(Pin::new(&mut *io).poll_write(cx, &self.bytes[self.pos..]))?
            } else {
                let mut slices = [IoSlice::new(&[]); MAX_SLICES];
                let count = self.slices(&mut slices);
                ready!(Pin::new(&mut *io).poll_write_vectored(cx, &slices[..count]))?
            };
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.advance(n);
        }
        self.bytes.clear();
        self.pos = 0;
        Poll::Ready(Ok(()))
    }

    /// Fills `slices` with what is queued, in order; returns how many it used.
    fn slices<'a>(&'a self, slices: &mut [IoSlice<'a>; MAX_SLICES]) -> usize {
        let mut n = 0;
        let mut at = self.pos;
        for (before, chunk) in &self.chunks {
            if *before > at {
                slices[n] = IoSlice::new(&self.bytes[at..*before]);
                n += 1;
                at = *before;
                if n == MAX_SLICES {
                    return n;
                }
            }
            slices[n] = IoSlice::new(chunk);
            n += 1;
            if n == MAX_SLICES {
                return n;
            }
        }
        if at < self.bytes.len() {
            slices[n] = IoSlice::new(&self.bytes[at..]);
            n += 1;
        }
        n
    }

    /// Marks `n` more bytes as written.
    fn advance(&mut self, mut n: usize) {
        let mut done = 0;
        while n > 0 {
            let before = self.chunks.get(done).map_or(self.bytes.len(), |c| c.0);
            if self.pos < before {
                let k = n.min(before - self.pos);
                self.pos += k;
                n -= k;
                continue;
            }
            let Some((_, chunk)) = self.chunks.get_mut(done) else {
                break;
            };
            let k = n.min(chunk.len());
            chunk.advance(k);
            self.chunked -= k;
            n -= k;
            if chunk.is_empty() {
                done += 1;
            }
        }
        self.chunks.drain(..done);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that takes at most `max` bytes a call, and honours vectored writes.
    struct Trickle {
        out: Vec<u8>,
        max: usize,
        calls: usize,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let n = buf.len().min(self.max);
            self.out.extend_from_slice(&buf[..n]);
            self.calls += 1;
            Poll::Ready(Ok(n))
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let mut left = self.max;
            for b in bufs {
                let n = b.len().min(left);
                self.out.extend_from_slice(&b[..n]);
                left -= n;
            }
            self.calls += 1;
            Poll::Ready(Ok(self.max - left))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn pattern(len: usize, seed: u8) -> Bytes {
        (0..len).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect()
    }

    /// Queues a head, big and small chunks between small pieces, and checks that
    /// every byte arrives in order, however little each write takes.
    #[test]
    fn large_and_small_pieces_arrive_in_order_over_partial_writes() {
        for max in [1, 3, 100, 4095, 4096, 5000, 1 << 20] {
            let mut w = WriteBuf::default();
            let mut expected = Vec::new();
            w.bytes_mut().extend_from_slice(b"POST / HTTP/1.1\r\n\r\n");
            expected.extend_from_slice(b"POST / HTTP/1.1\r\n\r\n");
            for (i, len) in [5000usize, 10, 4096, 4096, 20_000, 3, 70_000]
                .into_iter()
                .enumerate()
            {
                let chunk = pattern(len, i as u8);
                expected.extend_from_slice(&chunk);
                w.put(chunk);
                w.bytes_mut().extend_from_slice(b"\r\n");
                expected.extend_from_slice(b"\r\n");
            }
            assert_eq!(w.len(), expected.len());
            let mut io = Trickle {
                out: Vec::new(),
                max,
                calls: 0,
            };
            let mut cx = Context::from_waker(std::task::Waker::noop());
            assert!(matches!(
                w.poll_write_all(&mut io, &mut cx),
                Poll::Ready(Ok(()))
            ));
            assert_eq!(io.out, expected, "max {max}");
            assert!(w.is_empty());
            if max == 1 << 20 {
                assert_eq!(io.calls, 1, "one vectored write for the whole queue");
            }
        }
    }

    #[test]
    fn small_chunks_are_copied_and_large_ones_kept() {
        let mut w = WriteBuf::default();
        w.put(pattern(BIG_CHUNK - 1, 1));
        assert_eq!(w.bytes_mut().len(), BIG_CHUNK - 1);
        w.put(pattern(BIG_CHUNK, 2));
        assert_eq!(w.bytes_mut().len(), BIG_CHUNK - 1);
        assert_eq!(w.len(), 2 * BIG_CHUNK - 1);
        w.clear_and_bound(0);
        assert!(w.is_empty());
        assert_eq!(w.capacity(), 0);
    }
}
