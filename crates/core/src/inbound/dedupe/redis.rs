//! The Redis store: one store for every replica of the service (Redis 6.0 or later, or
//! Valkey), so a retry that lands on another replica is still a duplicate.
//!
//! Each key is one string, `tollgate:dedupe:<scope digest in hex>`, whose value starts
//! with a fixed 63-byte header: the state (`R` running, `D` done, `N` not replayable),
//! the claim's token (16 bytes), the lease's end in Redis's own milliseconds (13
//! digits), whether a fingerprint follows (`0`/`1`) and the fingerprint (32 bytes); a
//! done key's kept response follows ([`Kept::encode`]). Every step is one small Lua
//! script, so each is atomic on the server and one round trip; a script's clock is
//! Redis's `TIME`, so the replicas' own clocks never have to agree.
//!
//! **The lease.** A replica can die in the middle of a request, and its claim must not
//! hold the key forever. A running key carries a lease (30 s), renewed by the claim
//! while it runs (every 10 s); a claim found with its lease run out belonged to a
//! replica that is gone, and it may have done the work: the key turns into *not
//! replayable* (a duplicate gets `500 not-replayable`), never into free, since freeing
//! it could run the request twice. So the key itself always outlives its lease: it
//! expires `lease + ttl` after its claim, and each renewal moves that expiry forward
//! with the lease (a request that runs longer than `ttl` never finds its key gone
//! under it); once it ends, it lives `ttl`. An abandoned one goes away with the rest.
//!
//! **Failures.** Every operation is bounded by `store_timeout`. The connection is one
//! multiplexed connection (`redis::aio::ConnectionManager`, pipelined, shared by every
//! request and worker), made on first use, and made again in the background after it
//! breaks (a Redis restart), with a backoff capped at one second; the scripts are sent
//! again when a restarted Redis no longer knows them (`EVALSHA`, then `EVAL`).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo, Script, Value};

use super::kept::Kept;
use super::scope::{DIGEST_LEN, Fingerprint, Scope};
use super::store::{Ending, Found, Store, StoreError, Token};
use crate::config::RedisAddr;

/// How long a claim holds its key without renewal.
pub const LEASE: Duration = Duration::from_secs(30);
/// How often a running claim renews its lease.
pub const RENEW_EVERY: Duration = Duration::from_secs(10);

const PREFIX: &str = "tollgate:dedupe:";
/// State, token, lease, fingerprint flag, fingerprint.
const HEADER: usize = 1 + 16 + 13 + 1 + DIGEST_LEN;

/// `KEYS[1]`; `ARGV`: `claim` or `look`, the token, the lease and the ttl in ms. A lapsed
/// lease turns the key into not replayable, kept as long as it was to live.
const CLAIM: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local v = redis.call('GET', KEYS[1])
if not v then
  if ARGV[1] == 'look' then return false end
  local lease = string.format('%013d', now + tonumber(ARGV[3]))
  redis.call('SET', KEYS[1], 'R' .. ARGV[2] .. lease .. string.rep('0', 33), 'PX', ARGV[4])
  return 1
end
if string.sub(v, 1, 1) == 'R' and tonumber(string.sub(v, 18, 30)) < now then
  v = 'N' .. string.sub(v, 2)
  redis.call('SET', KEYS[1], v, 'KEEPTTL')
end
return v
";

/// `ARGV`: the token, the new value, the ttl in ms. Written when the claim still holds
/// the key, or when the key vanished (a restarted Redis): an answer nobody else claims
/// is still worth keeping.
const FINISH: &str = r"
local v = redis.call('GET', KEYS[1])
if v and not (string.sub(v, 1, 1) == 'R' and string.sub(v, 2, 17) == ARGV[1]) then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
";

/// `ARGV`: the value, the ttl in ms. Written only where nothing is (a key another
/// replica ran meanwhile is its own).
const PUT: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
";

/// `ARGV`: the token.
const RELEASE: &str = r"
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 1) == 'R' and string.sub(v, 2, 17) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
";

/// `ARGV`: the token, the lease in ms, the key's new expiry (lease and ttl) in ms.
const RENEW: &str = r"
local v = redis.call('GET', KEYS[1])
if not (v and string.sub(v, 1, 1) == 'R' and string.sub(v, 2, 17) == ARGV[1]) then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = string.format('%013d', now + tonumber(ARGV[2]))
redis.call('SET', KEYS[1], string.sub(v, 1, 17) .. lease .. string.sub(v, 31), 'PX', ARGV[3])
return 1
";

/// The Redis store.
pub struct RedisStore {
    addr: RedisAddr,
    timeout: Duration,
    conn: OnceLock<ConnectionManager>,
    scripts: Arc<Scripts>,
}

struct Scripts {
    claim: Script,
    finish: Script,
    put: Script,
    release: Script,
    renew: Script,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The address's own `Display` leaves out the password.
        write!(f, "RedisStore({})", self.addr)
    }
}

impl RedisStore {
    /// A store at `addr`; nothing is connected until the first operation.
    pub fn new(addr: RedisAddr, timeout: Duration) -> Self {
        RedisStore {
            addr,
            timeout,
            conn: OnceLock::new(),
            scripts: Arc::new(Scripts {
                claim: Script::new(CLAIM),
                finish: Script::new(FINISH),
                put: Script::new(PUT),
                release: Script::new(RELEASE),
                renew: Script::new(RENEW),
            }),
        }
    }

    pub fn addr(&self) -> &RedisAddr {
        &self.addr
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Writes a key that ended elsewhere (in this replica's memory, while the store
    /// failed), unless the store holds it already; whether it was written.
    pub async fn put(
        &self,
        scope: &Scope,
        ending: &Ending,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let args: [&[u8]; 2] = [&ended(Token::new(), ending), &ms(ttl)];
        one(self.run(&self.scripts.put, scope, &args).await?)
    }

    fn conn(&self) -> Result<ConnectionManager, StoreError> {
        if let Some(c) = self.conn.get() {
            return Ok(c.clone());
        }
        let mut redis = RedisConnectionInfo::default()
            .set_db(self.addr.db)
            .set_skip_set_lib_name();
        if let Some(u) = &self.addr.username {
            redis = redis.set_username(u);
        }
        if let Some(p) = &self.addr.password {
            redis = redis.set_password(p);
        }
        let info = ConnectionAddr::Tcp(self.addr.host.clone(), self.addr.port)
            .into_connection_info()
            .map_err(failed)?
            .set_redis_settings(redis);
        let client = redis::Client::open(info).map_err(failed)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.timeout.max(Duration::from_millis(250))))
            .set_response_timeout(None)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_secs(1))
            .set_number_of_retries(8);
        let made = ConnectionManager::new_lazy_with_config(client, config).map_err(failed)?;
        Ok(self.conn.get_or_init(|| made).clone())
    }

    /// Runs one script within `store_timeout`.
    async fn run(
        &self,
        script: &Script,
        scope: &Scope,
        args: &[&[u8]],
    ) -> Result<Value, StoreError> {
        let mut conn = self.conn()?;
        let mut call = script.key(key(scope));
        for a in args {
            call.arg(*a);
        }
        match tokio::time::timeout(self.timeout, call.invoke_async::<Value>(&mut conn)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(failed(e)),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }
}

fn failed(e: redis::RedisError) -> StoreError {
    // A Redis error names the command or the connection's failure, never the address
    // it was given (which may carry a password).
    StoreError::Failed(format!("redis: {e}"))
}

fn key(scope: &Scope) -> String {
    format!("{PREFIX}{}", scope.hex())
}

fn ms(d: Duration) -> Vec<u8> {
    d.as_millis().max(1).to_string().into_bytes()
}

/// A finished key's value.
fn ended(token: Token, ending: &Ending) -> Vec<u8> {
    let (state, fingerprint, kept) = match ending {
        Ending::Kept { fingerprint, kept } => (b'D', Some(fingerprint), Some(kept.encode())),
        Ending::NotReplayable { fingerprint } => (b'N', fingerprint.as_ref(), None),
    };
    let mut v = Vec::with_capacity(HEADER + kept.as_ref().map_or(0, Vec::len));
    v.push(state);
    v.extend_from_slice(&token.0);
    v.extend_from_slice(b"0000000000000");
    match fingerprint {
        Some(f) => {
            v.push(b'1');
            v.extend_from_slice(&f.0);
        }
        None => v.extend_from_slice(&[b'0'; 1 + DIGEST_LEN]),
    }
    if let Some(k) = kept {
        v.extend_from_slice(&k);
    }
    v
}

/// A key's value as the claim script returns it.
fn found(v: Value) -> Result<Found, StoreError> {
    let bytes = match v {
        Value::Int(1) => return Ok(Found::Claimed),
        Value::Nil => return Ok(Found::Free),
        Value::BulkString(b) => b,
        _ => return Err(StoreError::Damaged),
    };
    if bytes.len() < HEADER {
        return Err(StoreError::Damaged);
    }
    let fingerprint = match bytes[30] {
        b'1' => {
            let mut f = [0u8; DIGEST_LEN];
            f.copy_from_slice(&bytes[31..HEADER]);
            Some(Fingerprint(f))
        }
        _ => None,
    };
    match (bytes[0], fingerprint) {
        (b'R', _) => Ok(Found::Running),
        (b'N', fingerprint) => Ok(Found::Gone { fingerprint }),
        (b'D', Some(fingerprint)) => {
            let kept = Kept::decode(&bytes[HEADER..]).map_err(|_| StoreError::Damaged)?;
            Ok(Found::Done {
                fingerprint,
                kept: Arc::new(kept),
            })
        }
        _ => Err(StoreError::Damaged),
    }
}

fn one(v: Value) -> Result<bool, StoreError> {
    match v {
        Value::Int(n) => Ok(n == 1),
        _ => Err(StoreError::Damaged),
    }
}

impl Store for RedisStore {
    async fn claim(
        &self,
        scope: &Scope,
        token: Token,
        lease: Duration,
        ttl: Duration,
    ) -> Result<Found, StoreError> {
        // The key outlives its lease by `ttl`: a lapsed lease is seen, never a free key.
        let args: [&[u8]; 4] = [b"claim", &token.0, &ms(lease), &ms(lease + ttl)];
        found(self.run(&self.scripts.claim, scope, &args).await?)
    }

    async fn look(&self, scope: &Scope) -> Result<Found, StoreError> {
        let args: [&[u8]; 4] = [b"look", &[0; 16], b"1", b"1"];
        found(self.run(&self.scripts.claim, scope, &args).await?)
    }

    async fn finish(
        &self,
        scope: &Scope,
        token: Token,
        ending: &Ending,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let args: [&[u8]; 3] = [&token.0, &ended(token, ending), &ms(ttl)];
        one(self.run(&self.scripts.finish, scope, &args).await?)
    }

    async fn release(&self, scope: &Scope, token: Token) -> Result<(), StoreError> {
        one(self.run(&self.scripts.release, scope, &[&token.0]).await?).map(|_| ())
    }

    async fn renew(
        &self,
        scope: &Scope,
        token: Token,
        lease: Duration,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let args: [&[u8]; 3] = [&token.0, &ms(lease), &ms(lease + ttl)];
        one(self.run(&self.scripts.renew, scope, &args).await?)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use bytes::Bytes;
    use http::{HeaderMap, StatusCode};

    #[test]
    fn a_finished_value_reads_back_as_what_it_was() {
        let fingerprint = Fingerprint::of(b"body");
        let kept = Kept {
            status: StatusCode::CREATED,
            headers: HeaderMap::new(),
            body: Bytes::from_static(b"{}"),
            trailers: None,
        };
        let v = ended(
            Token::new(),
            &Ending::Kept {
                fingerprint,
                kept: Arc::new(kept.clone()),
            },
        );
        assert_eq!(&v[17..30], b"0000000000000");
        assert_eq!(
            found(Value::BulkString(v)).unwrap(),
            Found::Done {
                fingerprint,
                kept: Arc::new(kept)
            }
        );
        let gone = ended(Token::new(), &Ending::NotReplayable { fingerprint: None });
        assert_eq!(gone.len(), HEADER);
        assert_eq!(
            found(Value::BulkString(gone)).unwrap(),
            Found::Gone { fingerprint: None }
        );
        assert_eq!(found(Value::Int(1)).unwrap(), Found::Claimed);
        assert_eq!(found(Value::Nil).unwrap(), Found::Free);
        assert_eq!(
            found(Value::BulkString(b"D short".to_vec())),
            Err(StoreError::Damaged)
        );
    }
}
