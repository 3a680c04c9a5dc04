//! A real `redis-server` for the Redis store's tests: started on a free loopback port,
//! persisting nothing, and stopped when the test ends, passing or failing (`Drop`).
//!
//! Without `redis-server` installed (Debian's `redis-server` package) the Redis tests
//! are skipped, saying so on stderr in capitals; CI installs it.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::config::RedisAddr;

pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
}

impl RedisServer {
    /// A server on a free port, or `None` (said loudly) when none is installed.
    pub fn start(test: &str) -> Option<RedisServer> {
        if Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_err()
        {
            eprintln!(
                "\n*** SKIPPED {test}: redis-server is not installed \
                 (apt-get install redis-server); the Redis store was NOT tested ***\n"
            );
            return None;
        }
        let port = free_port();
        let mut server = RedisServer { child: None, port };
        server.restart();
        Some(server)
    }

    /// Starts it again on its port, empty (after [`RedisServer::kill`]).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "already running");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--loglevel", "warning"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.child = Some(child);
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let until = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_err() {
            assert!(
                Instant::now() < until,
                "redis-server did not listen within 10 s"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Kills it at once (no shutdown, no save): a crash.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-CONT", &c.id().to_string()])
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops it answering (`SIGSTOP`), connections open: a store slower than any
    /// timeout. [`RedisServer::resume`] undoes it; a paused server is resumed before
    /// it is killed.
    pub fn pause(&mut self) {
        self.signal("-STOP");
    }

    pub fn resume(&mut self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let ok = Command::new("kill")
                .args([sig, &c.id().to_string()])
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "kill {sig} redis-server");
        }
    }

    pub fn addr(&self) -> RedisAddr {
        RedisAddr {
            host: "127.0.0.1".into(),
            port: self.port,
            db: 0,
            username: None,
            password: None,
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    l.local_addr().expect("its address").port()
}
