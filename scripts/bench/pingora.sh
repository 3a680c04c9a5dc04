# shellcheck shell=bash disable=SC2034,SC2153  # variables shared with bench.sh
# Sourced by scripts/bench.sh: Pingora as a peer. A minimal reverse proxy on the
# `pingora` crate (the `proxy` feature, OpenSSL for TLS to the upstream, linked to the
# system's OpenSSL as nginx and HAProxy are): one listener, one upstream, one worker
# thread. Its sources are written into a scratch directory and built there with cargo,
# once: the binary is kept under a hash of the sources and reused by later runs. It is
# no part of tollgate's own build. When the build fails the Pingora peer is skipped,
# loudly, and the rest of the matrix runs.

PINGORA_DIR="${TMPDIR:-/tmp}/tollgate-bench-pingora"
PINGORA_BIN=""

pingora_cargo_toml() {
  cat <<'EOF'
[package]
name = "tollgate-bench-pingora"
version = "0.1.0"
edition = "2021"
publish = false

[dependencies]
pingora = { version = "=0.9.1", features = ["proxy", "openssl"] }
async-trait = "0.1"

# The same release profile as tollgate's own.
[profile.release]
lto = "thin"
codegen-units = 1
debug = "line-tables-only"
EOF
}

pingora_main_rs() {
  cat <<'EOF'
//! A minimal Pingora reverse proxy for tollgate's load benchmark: one listener, one
//! upstream, one worker thread, plain HTTP/1.1 or TLS (verified against CA_FILE, with
//! SNI) to the upstream; upstream connections are pooled and reused.
//!
//!   tollgate-bench-pingora LISTEN UPSTREAM RUNDIR [SNI CA_FILE]
use std::sync::Arc;

use async_trait::async_trait;
use pingora::prelude::*;
use pingora::proxy::{http_proxy_service, ProxyHttp, Session};
use pingora::server::configuration::ServerConf;
use pingora::tls::x509::X509;

struct Bench {
    upstream: String,
    tls: Option<(String, Arc<Box<[X509]>>)>,
}

#[async_trait]
impl ProxyHttp for Bench {
    type CTX = ();
    fn new_ctx(&self) {}

    async fn upstream_peer(&self, _: &mut Session, _: &mut ()) -> Result<Box<HttpPeer>> {
        let peer = match &self.tls {
            None => HttpPeer::new(self.upstream.as_str(), false, String::new()),
            Some((sni, ca)) => {
                let mut peer = HttpPeer::new(self.upstream.as_str(), true, sni.clone());
                peer.options.ca = Some(ca.clone());
                peer
            }
        };
        Ok(Box::new(peer))
    }
}

fn fail(what: &str) -> ! {
    eprintln!("tollgate-bench-pingora: {what}");
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 && args.len() != 6 {
        fail("usage: tollgate-bench-pingora LISTEN UPSTREAM RUNDIR [SNI CA_FILE]");
    }
    let tls = if args.len() == 6 {
        let pem = std::fs::read(&args[5]).unwrap_or_else(|e| fail(&format!("{}: {e}", args[5])));
        let certs = X509::stack_from_pem(&pem).unwrap_or_else(|e| fail(&format!("{}: {e}", args[5])));
        Some((args[4].clone(), Arc::new(certs.into_boxed_slice())))
    } else {
        None
    };
    let mut conf = ServerConf::default();
    conf.threads = 1;
    conf.pid_file = format!("{}/pingora.pid", args[3]);
    conf.upgrade_sock = format!("{}/pingora-upgrade.sock", args[3]);
    conf.grace_period_seconds = Some(0);
    conf.graceful_shutdown_timeout_seconds = Some(1);
    conf.upstream_keepalive_pool_size = 16384;
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let bench = Bench { upstream: args[2].clone(), tls };
    let mut proxy = http_proxy_service(&server.configuration, bench);
    proxy.add_tcp(&args[1]);
    server.add_service(proxy);
    server.run_forever();
}
EOF
}

# Sets PINGORA_BIN to a built binary, or leaves it empty and says SKIP.
ensure_pingora() {
  local stage="$WORK/pingora-src" hash bin blog rc=0
  mkdir -p "$stage/src"
  pingora_cargo_toml > "$stage/Cargo.toml"
  pingora_main_rs > "$stage/src/main.rs"
  # The build recipe is part of what is hashed: the same sources built another way are
  # another binary.
  hash="$( { cat "$stage/Cargo.toml" "$stage/src/main.rs"; echo "OPENSSL_NO_VENDOR=1 cargo build --release"; } |
    sha256sum | cut -c1-16)"
  bin="$PINGORA_DIR/bin/tollgate-bench-pingora-$hash"
  if [ -x "$bin" ]; then
    PINGORA_BIN="$bin"
    log "pingora: cached build $bin"
    return 0
  fi
  pingora_skip() { log "SKIP pingora: $1"; SKIPS+=("pingora: $1"); }
  [ "${PINGORA_BUILD:-1}" = 1 ] || { pingora_skip "not built yet (the load comparison builds it)"; return 0; }
  command -v cargo >/dev/null 2>&1 || { pingora_skip "no cargo on PATH to build it"; return 0; }
  local -a pkgs=()
  command -v cc >/dev/null 2>&1 || pkgs+=(gcc)
  command -v make >/dev/null 2>&1 || pkgs+=(make)
  command -v cmake >/dev/null 2>&1 || pkgs+=(cmake)
  command -v pkg-config >/dev/null 2>&1 || pkgs+=(pkg-config)
  pkg-config --exists openssl 2>/dev/null || pkgs+=(libssl-dev)
  if [ "${#pkgs[@]}" -gt 0 ]; then
    install_pkgs "${pkgs[@]}" || { pingora_skip "could not install ${pkgs[*]} (needed to build it)"; return 0; }
  fi
  mkdir -p "$PINGORA_DIR/src" "$PINGORA_DIR/bin"
  # Only changed files are replaced, so cargo's own cache stays valid.
  cmp -s "$stage/Cargo.toml" "$PINGORA_DIR/Cargo.toml" || cp "$stage/Cargo.toml" "$PINGORA_DIR/Cargo.toml"
  cmp -s "$stage/src/main.rs" "$PINGORA_DIR/src/main.rs" || cp "$stage/src/main.rs" "$PINGORA_DIR/src/main.rs"
  blog="$PINGORA_DIR/build.log"
  log "pingora: building $PINGORA_DIR (cargo build --release; the first build takes many minutes on 2 cores; log: $blog) ..."
  (cd "$PINGORA_DIR" && OPENSSL_NO_VENDOR=1 CARGO_TARGET_DIR="$PINGORA_DIR/target" \
    timeout 3600 nice -n 10 cargo build --release) > "$blog" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ] || [ ! -x "$PINGORA_DIR/target/release/tollgate-bench-pingora" ]; then
    tail -n 15 "$blog" >&2 || true
    pingora_skip "the build failed (exit status $rc; log: $blog)"
    return 0
  fi
  cp "$PINGORA_DIR/target/release/tollgate-bench-pingora" "$bin.tmp" && mv "$bin.tmp" "$bin"
  PINGORA_BIN="$bin"
  log "pingora: built $bin"
}
