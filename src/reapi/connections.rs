//! The client's HTTP/2 connections, opened on demand.
//!
//! Servers cap the concurrent streams of one connection (hyper's default is 200, and a client that
//! overruns it loses the whole connection's calls), so a link with many jobs in flight needs more
//! than one connection, as Bazel opens. Each call goes to the first connection that carries fewer
//! than [`CALLS_PER_CONNECTION`] calls; the channels connect lazily, so a later connection is opened
//! only when the earlier ones are full — a small link uses one connection (one TLS handshake),
//! a large one as many as its concurrency needs. A call holds its place until its client and its
//! response body (a stream of messages, for ByteStream reads and executions) are dropped.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service, http};
use tonic::transport::Channel;

/// Calls carried by one HTTP/2 connection at most, well below common servers' stream limits.
pub const CALLS_PER_CONNECTION: usize = 64;

/// The connections of one client.
#[derive(Debug)]
pub(crate) struct Connections {
    /// Never empty.
    pool: Vec<Connection>,
    /// How many of them have been used (and so connected): the first `opened` of `pool`.
    opened: AtomicUsize,
}

#[derive(Debug)]
struct Connection {
    channel: Channel,
    /// The calls it carries now.
    calls: Arc<AtomicUsize>,
}

impl Connections {
    /// The pool of `channels` (lazily connecting); `None` when there is none.
    pub fn new(channels: Vec<Channel>) -> Option<Connections> {
        let pool: Vec<Connection> = channels
            .into_iter()
            .map(|channel| Connection {
                channel,
                calls: Arc::default(),
            })
            .collect();
        (!pool.is_empty()).then(|| Connections {
            pool,
            opened: AtomicUsize::new(0),
        })
    }

    /// The channel for one more call: the first connection with room, else the least busy.
    pub fn pick(&self) -> CountedChannel {
        let calls = |i: &usize| self.pool[*i].calls.load(Ordering::Relaxed);
        let index = (0..self.pool.len())
            .find(|i| calls(i) < CALLS_PER_CONNECTION)
            .or_else(|| (0..self.pool.len()).min_by_key(calls))
            .unwrap_or(0);
        self.opened.fetch_max(index + 1, Ordering::Relaxed);
        let connection = &self.pool[index];
        connection.calls.fetch_add(1, Ordering::Relaxed);
        CountedChannel {
            channel: connection.channel.clone(),
            place: Arc::new(Place(connection.calls.clone())),
        }
    }

    /// How many connections calls have used so far.
    pub fn opened(&self) -> usize {
        self.opened.load(Ordering::Relaxed)
    }
}

/// A call's place on a connection, given back when the last holder drops it.
#[derive(Debug)]
struct Place(Arc<AtomicUsize>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A channel that holds one place on its connection while it, or a response it returned, lives.
#[derive(Debug, Clone)]
pub(crate) struct CountedChannel {
    channel: Channel,
    place: Arc<Place>,
}

impl Service<http::Request<Body>> for CountedChannel {
    type Response = http::Response<Body>;
    type Error = tonic::transport::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.channel.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let response = self.channel.call(request);
        let place = self.place.clone();
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| {
                Body::new(HoldingBody {
                    body,
                    _place: place,
                })
            }))
        })
    }
}

/// A response body that keeps its call's place on the connection until it is dropped.
struct HoldingBody {
    body: Body,
    _place: Arc<Place>,
}

impl http_body::Body for HoldingBody {
    type Data = <Body as http_body::Body>::Data;
    type Error = <Body as http_body::Body>::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(connections: usize) -> Connections {
        let channels = (0..connections)
            .map(|_| tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy())
            .collect();
        Connections::new(channels).unwrap()
    }

    fn calls(pool: &Connections) -> Vec<usize> {
        pool.pool
            .iter()
            .map(|c| c.calls.load(Ordering::Relaxed))
            .collect()
    }

    #[tokio::test]
    async fn later_connections_are_used_only_when_the_earlier_are_full() {
        let pool = pool(3);
        let first: Vec<CountedChannel> = (0..CALLS_PER_CONNECTION).map(|_| pool.pick()).collect();
        assert_eq!(pool.opened(), 1);
        let second = pool.pick();
        assert_eq!(calls(&pool), [CALLS_PER_CONNECTION, 1, 0]);
        assert_eq!(pool.opened(), 2);
        // A clone (what a tonic client holds) shares its place.
        let clone = second.clone();
        drop(second);
        assert_eq!(calls(&pool), [CALLS_PER_CONNECTION, 1, 0]);
        drop(clone);
        assert_eq!(calls(&pool), [CALLS_PER_CONNECTION, 0, 0]);
        // A place freed on the first connection is taken before the second is used again.
        drop(first);
        let _again = pool.pick();
        assert_eq!(calls(&pool), [1, 0, 0]);
        assert_eq!(pool.opened(), 2);
    }

    #[tokio::test]
    async fn when_all_are_full_the_least_busy_one_takes_more() {
        let pool = pool(2);
        let _held: Vec<CountedChannel> = (0..2 * CALLS_PER_CONNECTION + 1)
            .map(|_| pool.pick())
            .collect();
        assert_eq!(
            calls(&pool),
            [CALLS_PER_CONNECTION + 1, CALLS_PER_CONNECTION]
        );
    }
}
