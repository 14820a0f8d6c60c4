//! Connections to Redis: one server (`redis://`, `rediss://`, password in the URL) or, for HA installs, the master that
//! Redis Sentinel names (the redis crate's `sentinel` support through `deadpool-redis`). A connection that failed at
//! the transport level or reached a server that is no longer the master (`READONLY`, after a Sentinel failover) is
//! dropped instead of going back to the pool, so the next command connects afresh — through Sentinel, to the new
//! master.

use deadpool_redis::Runtime;
use redis::aio::ConnectionLike;
use redis::{Cmd, IntoConnectionInfo, Pipeline, RedisError, RedisFuture, Value};

/// Where the queue's Redis is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One server: a `redis://` or `rediss://` URL.
    Server(String),
    /// The master named `master` as Sentinels at `sentinels` (`redis://host:26379` URLs) report it; the first URL's
    /// username, password and database, and its scheme's TLS (`rediss`), are used for the master too.
    Sentinel {
        /// Sentinel URLs.
        sentinels: Vec<String>,
        /// The monitored master's name (`sentinel monitor <name> …`).
        master: String,
    },
}

impl Target {
    /// `url` (one URL, or with `sentinel_master`, comma-separated Sentinel URLs). Errors: a URL the redis crate cannot
    /// parse, or several URLs without a master name, naming the flag.
    pub fn parse(url: &str, sentinel_master: Option<&str>) -> Result<Self, String> {
        let mut urls: Vec<String> =
            url.split(',').map(str::trim).filter(|u| !u.is_empty()).map(str::to_string).collect();
        if urls.is_empty() {
            return Err("--redis-url is empty".into());
        }
        for u in &urls {
            u.as_str().into_connection_info().map_err(|e| format!("--redis-url {:?}: {e}", redact(u)))?;
        }
        match sentinel_master.filter(|m| !m.is_empty()) {
            Some(master) => Ok(Target::Sentinel { sentinels: urls, master: master.to_string() }),
            None if urls.len() == 1 => Ok(Target::Server(urls.remove(0))),
            None => Err(
                "--redis-url lists several servers: that is a list of Sentinels, which needs --redis-sentinel-master"
                    .into(),
            ),
        }
    }
}

/// `url` with any password replaced by `[secret]` (for messages).
pub fn redact(url: &str) -> String {
    match url.split_once("://").and_then(|(scheme, rest)| rest.rsplit_once('@').map(|(_, host)| (scheme, host))) {
        Some((scheme, host)) => format!("{scheme}://[secret]@{host}"),
        None => url.to_string(),
    }
}

/// A pool of connections to the queue's Redis (cheap to clone: the pools are shared).
#[derive(Clone)]
pub(crate) enum Pools {
    Server(deadpool_redis::Pool),
    Sentinel(deadpool_redis::sentinel::Pool),
}

impl Pools {
    /// Pools for `target` (connecting lazily). Errors: the pool's configuration.
    pub(crate) fn new(target: &Target) -> Result<Self, String> {
        match target {
            Target::Server(url) => deadpool_redis::Config::from_url(url.as_str())
                .create_pool(Some(Runtime::Tokio1))
                .map(Pools::Server)
                .map_err(|e| e.to_string()),
            Target::Sentinel { sentinels, master } => {
                let first = sentinels[0].as_str().into_connection_info().map_err(|e| e.to_string())?;
                let settings = first.redis_settings();
                let node = deadpool_redis::sentinel::SentinelNodeConnectionInfo {
                    tls_mode: sentinels[0].starts_with("rediss").then_some(deadpool_redis::sentinel::TlsMode::Secure),
                    redis_connection_info: Some(deadpool_redis::RedisConnectionInfo {
                        db: settings.db(),
                        username: settings.username().map(str::to_string),
                        password: settings.password().map(str::to_string),
                        protocol: Default::default(),
                    }),
                };
                deadpool_redis::sentinel::Config::from_urls(
                    sentinels.clone(),
                    master.clone(),
                    deadpool_redis::sentinel::SentinelServerType::Master,
                )
                .with_node_connection_info(Some(node))
                .create_pool(Some(Runtime::Tokio1))
                .map(Pools::Sentinel)
                .map_err(|e| e.to_string())
            }
        }
    }

    /// A connection. Errors: none could be made (Redis or every Sentinel unreachable, no master).
    pub(crate) async fn get(&self) -> Result<Conn, deadpool_redis::PoolError> {
        let inner = match self {
            Pools::Server(p) => Inner::Server(p.get().await?),
            Pools::Sentinel(p) => Inner::Sentinel(p.get().await?),
        };
        Ok(Conn { inner: Some(inner), broken: false })
    }
}

enum Inner {
    Server(deadpool_redis::Connection),
    Sentinel(deadpool_redis::sentinel::Connection),
}

/// A pooled connection; dropped from the pool (not recycled) once it failed in a way that a fresh connection may not.
pub(crate) struct Conn {
    inner: Option<Inner>,
    broken: bool,
}

/// Whether `e` says this connection should not be used again: the transport failed, or the server is a replica now
/// (`READONLY`, a Sentinel failover happened).
fn breaks(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() || e.code() == Some("READONLY")
}

fn gone() -> RedisError {
    RedisError::from(std::io::Error::other("connection already dropped"))
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let r = match &mut self.inner {
                Some(Inner::Server(c)) => c.req_packed_command(cmd).await,
                Some(Inner::Sentinel(c)) => c.req_packed_command(cmd).await,
                None => Err(gone()),
            };
            if r.as_ref().err().is_some_and(breaks) {
                self.broken = true;
            }
            r
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let r = match &mut self.inner {
                Some(Inner::Server(c)) => c.req_packed_commands(cmd, offset, count).await,
                Some(Inner::Sentinel(c)) => c.req_packed_commands(cmd, offset, count).await,
                None => Err(gone()),
            };
            if r.as_ref().err().is_some_and(breaks) {
                self.broken = true;
            }
            r
        })
    }

    fn get_db(&self) -> i64 {
        match &self.inner {
            Some(Inner::Server(c)) => c.get_db(),
            Some(Inner::Sentinel(c)) => c.get_db(),
            None => 0,
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if self.broken {
            // detached from the pool: closed here, never recycled
            match self.inner.take() {
                Some(Inner::Server(c)) => drop(deadpool_redis::Connection::take(c)),
                Some(Inner::Sentinel(c)) => drop(deadpool_redis::sentinel::Connection::take(c)),
                None => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_make_a_server_or_a_sentinel_target_and_errors_name_the_flag() {
        assert_eq!(Target::parse("redis://127.0.0.1:6379", None), Ok(Target::Server("redis://127.0.0.1:6379".into())));
        assert_eq!(
            Target::parse("redis://a:26379, redis://b:26379", Some("mymaster")),
            Ok(Target::Sentinel {
                sentinels: vec!["redis://a:26379".into(), "redis://b:26379".into()],
                master: "mymaster".into()
            })
        );
        assert!(
            Target::parse("redis://a:26379,redis://b:26379", None).unwrap_err().contains("--redis-sentinel-master")
        );
        let err = Target::parse("nope://:hunter2@x", None).unwrap_err();
        assert!(err.contains("--redis-url") && !err.contains("hunter2"), "{err}");
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("redis://:hunter2@host:6379/0"), "redis://[secret]@host:6379/0");
        assert_eq!(redact("rediss://user:pw@host"), "rediss://[secret]@host");
        assert_eq!(redact("redis://host"), "redis://host");
    }
}
