//! A client whose watches of one resource lag: the events of a watch opened while the lag is on reach
//! the watcher `delay` late, as a replica's cache of newly gained shards does when its watch replays
//! what it missed, or when a loaded API server's watch cache trails etcd. Lists, reads and writes are
//! not delayed, nor are watches opened before the lag was switched on.

use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use kube::client::ClientBuilder;

type Inner = Box<dyn Body<Data = Bytes, Error = tower::BoxError> + Send + Unpin>;

/// The switch of a [`lagging_client`]: watches of its resource opened while on lag.
#[derive(Clone, Default)]
pub struct Lag(Arc<AtomicBool>);

impl Lag {
    /// Watches opened from now on lag.
    pub fn on(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A client of the bed whose watches of `resource` (the plural, e.g. `workspaces`) opened while `lag`
/// is on deliver each chunk `delay` after it arrived.
pub async fn lagging_client(resource: &'static str, delay: Duration, lag: Lag) -> kube::Client {
    let config = pko_testbed::testbed().config().await.unwrap();
    let builder = ClientBuilder::try_from(config).unwrap();
    let layer = tower::layer::layer_fn(move |inner| LagService { inner, resource, delay, lag: lag.clone() });
    builder.with_layer(&layer).build()
}

#[derive(Clone)]
struct LagService<S> {
    inner: S,
    resource: &'static str,
    delay: Duration,
    lag: Lag,
}

impl<S, B> tower::Service<Request<kube::client::Body>> for LagService<S>
where
    S: tower::Service<Request<kube::client::Body>, Response = Response<B>>,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<tower::BoxError>,
{
    type Response = Response<LaggingBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<kube::client::Body>) -> Self::Future {
        let watch = req.uri().query().is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
        let ours = req.uri().path().ends_with(&format!("/{}", self.resource));
        let delay = (watch && ours && self.lag.0.load(Ordering::SeqCst)).then_some(self.delay);
        let fut = self.inner.call(req);
        Box::pin(async move {
            let res = fut.await?;
            Ok(res.map(|b| LaggingBody { inner: Box::new(ErrInto(b)), delay, held: None }))
        })
    }
}

/// A body whose data frames are each held `delay` (none: passed on at once).
pub struct LaggingBody {
    inner: Inner,
    delay: Option<Duration>,
    held: Option<(Pin<Box<tokio::time::Sleep>>, Frame<Bytes>)>,
}

impl Body for LaggingBody {
    type Data = Bytes;
    type Error = tower::BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some((sleep, _)) = self.held.as_mut() {
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let (_, frame) = self.held.take().unwrap();
            return Poll::Ready(Some(Ok(frame)));
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match (polled, self.delay) {
            (Poll::Ready(Some(Ok(frame))), Some(delay)) => {
                self.held = Some((Box::pin(tokio::time::sleep(delay)), frame));
                self.poll_frame(cx)
            }
            (polled, _) => polled,
        }
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

struct ErrInto<B>(B);

impl<B> Body for ErrInto<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<tower::BoxError>,
{
    type Data = Bytes;
    type Error = tower::BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.0).poll_frame(cx).map_err(Into::into)
    }

    fn size_hint(&self) -> SizeHint {
        self.0.size_hint()
    }
}
