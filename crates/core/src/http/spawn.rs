//! How hyper's HTTP/2 starts its tasks: a task for each connection, and one for each
//! stream (a server's stream, a client's request body on its way). hyper hands every
//! one of them over as one type per side, an enum as large as its largest variant, the
//! connection's future: about 2.5 KB for a client, moved whole into the task and copied
//! whole again each time the task's stage changes (finished, then its output taken).
//! Boxed first, the task holds a pointer: one allocation instead of kilobytes copied
//! several times for every request.

use std::future::Future;

/// hyper's executor: spawns each future on the current tokio runtime, boxed.
#[derive(Clone, Copy, Debug, Default)]
pub struct BoxedSpawn;

impl<F> hyper::rt::Executor<F> for BoxedSpawn
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        tokio::spawn(Box::pin(fut));
    }
}
