//! The server's limits on connections and on chat-template rendering, with their defaults
//! (the `runit serve` flags of the same names set them).

use std::time::Duration;

use runit_tokenizer::RenderLimits;

/// How long clients may take and how many may be connected; see
/// [`ConnectionLimits::DEFAULT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// From the first byte of a request to the end of its headers (`--header-timeout`).
    pub header_timeout: Duration,
    /// From the end of a request's headers to the end of its body (`--body-timeout`).
    pub body_timeout: Duration,
    /// How long a connection may wait for its next request, or for its first one, before it
    /// is closed (`--idle-timeout`).
    pub idle_timeout: Duration,
    /// How long one write of a response may wait for a client that does not read before the
    /// connection is dropped (`--write-timeout`); streams end this way when their reader
    /// stalls.
    pub write_timeout: Duration,
    /// Most connections open at once; a connection beyond them is answered 503 and closed
    /// (`--max-connections`). Keep it well below the process's descriptor limit.
    pub max_connections: usize,
    /// At shutdown, how long the requests in flight may take to finish before the server
    /// exits anyway (`--shutdown-timeout`).
    pub shutdown_timeout: Duration,
}

impl ConnectionLimits {
    /// 10 s for headers, 30 s for a body, 60 s idle, 30 s per stalled write, 512 connections,
    /// 30 s to drain at shutdown.
    pub const DEFAULT: ConnectionLimits = ConnectionLimits {
        header_timeout: Duration::from_secs(10),
        body_timeout: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(60),
        write_timeout: Duration::from_secs(30),
        max_connections: 512,
        shutdown_timeout: Duration::from_secs(30),
    };
}

impl Default for ConnectionLimits {
    fn default() -> ConnectionLimits {
        ConnectionLimits::DEFAULT
    }
}

/// How chat templates are rendered: off the async runtime, a few at a time, each under the
/// template's [`RenderLimits`] and a deadline; see [`TemplateLimits::DEFAULT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TemplateLimits {
    /// Fuel and output size of one rendering (`--template-fuel`, `--template-max-bytes`).
    pub render: RenderLimits,
    /// How long a request may wait for its prompt to be rendered and tokenized
    /// (`--template-timeout`): a request that cannot start within it is answered 503, a
    /// rendering that runs past it 400.
    pub timeout: Duration,
    /// Renderings run at once, each on a thread of the blocking pool.
    pub workers: usize,
}

impl TemplateLimits {
    /// [`RenderLimits::DEFAULT`], 10 s, two at a time.
    pub const DEFAULT: TemplateLimits = TemplateLimits {
        render: RenderLimits::DEFAULT,
        timeout: Duration::from_secs(10),
        workers: 2,
    };
}

impl Default for TemplateLimits {
    fn default() -> TemplateLimits {
        TemplateLimits::DEFAULT
    }
}
