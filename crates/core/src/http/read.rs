//! Reading into a connection's buffer without holding memory while it waits.
//!
//! A keep-alive connection spends most of its life between messages, and a read
//! buffer kept at full size all that time is most of what a connection costs: 8 KiB
//! each way, for 2,000 connections 31 MiB that is touched in turn. So a connection
//! gives its read buffer back while it waits (as nginx frees a keep-alive connection's
//! buffers), and the read that ends the wait does not allocate a buffer ahead of it:
//! it goes into a scratch array on the stack, and only the bytes that came are copied
//! into a buffer of their own size (a small request or response head: some tens to
//! hundreds of bytes, where the header values then live).
//!
//! The scratch holds [`FIRST_READ`]: nearly every head arrives whole in it, and what
//! follows a larger one is read straight into a grown buffer, as bodies are. Bodies
//! are never read through it: their reads make room ahead (up to 64 KiB at a time), so
//! a large body costs no copy and no extra system call.

use std::io;
use std::mem::MaybeUninit;
use std::ops::Deref;
use std::pin::{Pin, pin};
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};

/// The most one read into a released buffer takes.
pub const FIRST_READ: usize = 4 * 1024;

/// With less free room than this, a head's read goes through the scratch rather than
/// grow the buffer ahead of it.
const SMALL_ROOM: usize = 1024;

/// Whether the next read of a head into `rbuf` should go through the scratch: the
/// buffer has (next to) no room, as after [`release`] or when it holds only the bytes
/// of an earlier read.
fn wants_scratch(rbuf: &BytesMut) -> bool {
    rbuf.capacity() - rbuf.len() < SMALL_ROOM
}

/// Reads what `io` holds into `rbuf`, for a head: into the buffer's free room when it
/// has some, else through the scratch, so that a buffer given back while its connection
/// waited grows only by what came. Not for bodies, whose reads make room ahead.
/// `Ready(Ok(0))` is the end of the stream.
pub fn poll_read_head<R: AsyncRead + Unpin + ?Sized>(
    io: &mut R,
    cx: &mut Context<'_>,
    rbuf: &mut BytesMut,
) -> Poll<io::Result<usize>> {
    if wants_scratch(rbuf) {
        return poll_read_scratch(Pin::new(io), cx, rbuf);
    }
    let read = pin!(io.read_buf(rbuf));
    read.poll(cx)
}

/// Reads what `io` holds, up to [`FIRST_READ`] bytes, and appends it to `rbuf`, which
/// grows only by what came.
fn poll_read_scratch<R: AsyncRead + ?Sized>(
    io: Pin<&mut R>,
    cx: &mut Context<'_>,
    rbuf: &mut BytesMut,
) -> Poll<io::Result<usize>> {
    let mut scratch = [MaybeUninit::<u8>::uninit(); FIRST_READ];
    let mut buf = ReadBuf::uninit(&mut scratch);
    ready!(io.poll_read(cx, &mut buf))?;
    let got = buf.filled();
    rbuf.extend_from_slice(got);
    Poll::Ready(Ok(got.len()))
}

/// Gives back the memory of a read buffer that holds nothing (bytes read ahead are
/// kept). The memory is freed once nothing else refers to it: header values and body
/// chunks taken from it hold it until they are dropped.
///
/// Also a buffer with no room left: once a head has been split off, the empty rest
/// still shares its allocation, and kept, it would hold that memory while the
/// connection waits, and make the next read look up whether it is the last owner (a
/// cache line of that allocation, long since gone cold) before it can grow.
pub fn release(rbuf: &mut BytesMut) {
    if rbuf.is_empty() {
        *rbuf = BytesMut::new();
    }
}

/// Hands on what was read ahead of a reader (the bytes that came with a head, or
/// with a look at the first ones), as much as `buf` takes, before anything the
/// connection still holds; whether there was any.
#[inline]
pub fn hand_on_ahead<B>(ahead: &mut B, buf: &mut ReadBuf<'_>) -> bool
where
    B: Buf + Deref<Target = [u8]>,
{
    if ahead.is_empty() {
        return false;
    }
    let n = ahead.len().min(buf.remaining());
    buf.put_slice(&ahead[..n]);
    ahead.advance(n);
    true
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn read_all(input: &[u8], rbuf: &mut BytesMut) -> usize {
        let mut reader = input;
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match poll_read_scratch(Pin::new(&mut reader), &mut cx, rbuf) {
            Poll::Ready(r) => r.unwrap(),
            Poll::Pending => unreachable!("a slice is always ready"),
        }
    }

    #[test]
    fn a_small_read_takes_only_its_own_size() {
        let mut rbuf = BytesMut::new();
        assert!(wants_scratch(&rbuf));
        let head = b"GET / HTTP/1.1\r\nhost: a\r\n\r\n";
        assert_eq!(read_all(head, &mut rbuf), head.len());
        assert_eq!(&rbuf[..], head);
        assert!(rbuf.capacity() < 64, "capacity {}", rbuf.capacity());
    }

    #[test]
    fn one_read_takes_at_most_the_scratch() {
        let input = vec![b'x'; FIRST_READ * 2];
        let mut rbuf = BytesMut::new();
        assert_eq!(read_all(&input, &mut rbuf), FIRST_READ);
        assert_eq!(rbuf.len(), FIRST_READ);
        // No room left: the rest of a head that long goes through the scratch too.
        assert!(wants_scratch(&rbuf));
    }

    #[test]
    fn release_keeps_bytes_read_ahead() {
        let mut rbuf = BytesMut::with_capacity(8192);
        rbuf.extend_from_slice(b"GET");
        release(&mut rbuf);
        assert_eq!(rbuf.capacity(), 8192);
        rbuf.clear();
        release(&mut rbuf);
        assert_eq!(rbuf.capacity(), 0);
        assert!(wants_scratch(&rbuf));
    }

    #[test]
    fn release_lets_go_of_the_memory_a_head_was_split_from() {
        let mut rbuf = BytesMut::new();
        let head = b"GET / HTTP/1.1\r\nhost: a\r\n\r\n";
        assert_eq!(read_all(head, &mut rbuf), head.len());
        // The head is taken whole (its header values are slices of it), then dropped
        // once answered: the empty rest is the allocation's last owner.
        drop(rbuf.split_to(head.len()).freeze());
        assert_eq!((rbuf.len(), rbuf.capacity()), (0, 0));
        release(&mut rbuf);
        assert!(!rbuf.try_reclaim(1), "a released buffer holds no memory");
        assert!(wants_scratch(&rbuf));
    }
}
