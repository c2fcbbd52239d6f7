//! The `Service`: decides, then answers 429 (or a rejection; to a gRPC call, their gRPC
//! statuses) or calls the inner service.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use http_body::{Body, Frame, SizeHint};
use slidegate::Backend;

use crate::decide::Outcome;
use crate::layer::Shared;
use crate::{Rejection, grpc};

/// The rate-limited service that [`crate::RateLimitLayer`] builds.
pub struct RateLimit<S, B> {
    inner: S,
    shared: Arc<Shared<B>>,
}

impl<S: Clone, B> Clone for RateLimit<S, B> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone(), shared: Arc::clone(&self.shared) }
    }
}

impl<S: std::fmt::Debug, B> std::fmt::Debug for RateLimit<S, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit").field("inner", &self.inner).finish_non_exhaustive()
    }
}

impl<S, B> RateLimit<S, B> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<B>>) -> Self {
        Self { inner, shared }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, ReqBody, ResBody> tower_service::Service<Request<ReqBody>> for RateLimit<S, B>
where
    S: tower_service::Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    B: Backend + 'static,
    ReqBody: Send + 'static,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The clone that `poll_ready` made ready is the one to call; leave a fresh one behind.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let headers = match (shared.decide(&parts).await, grpc::is_grpc(&parts.headers)) {
                (Outcome::Pass(headers), _) => headers,
                (Outcome::Deny { headers, .. }, false) => return Ok(shared.denied(headers)),
                (Outcome::Deny { mut headers, retry_after }, true) => {
                    headers.extend(grpc::exhausted(retry_after));
                    return Ok(grpc_answer(headers));
                }
                (Outcome::Reject(rejection), false) => return Ok(rejected(rejection)),
                (Outcome::Reject(rejection), true) => return Ok(grpc_answer(grpc::rejected(rejection))),
            };
            let response = inner.call(Request::from_parts(parts, body)).await?;
            let (mut head, body) = response.into_parts();
            if let Some(headers) = headers {
                head.headers.extend(headers);
            }
            Ok(Response::from_parts(head, RateLimitBody::inner(body)))
        })
    }
}

impl<B> Shared<B> {
    /// The 429 answer.
    fn denied<T>(&self, headers: HeaderMap) -> Response<RateLimitBody<T>> {
        let mut response = Response::new(RateLimitBody::limited(self.deny_body.clone()));
        *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        response.headers_mut().insert(header::CONTENT_TYPE, self.deny_type.clone());
        response.headers_mut().extend(headers);
        response
    }
}

/// The answer to a request that cannot be counted: its status, with the JSON error body.
fn rejected<T>(rejection: Rejection) -> Response<RateLimitBody<T>> {
    let mut response = Response::new(RateLimitBody::limited(Bytes::from(rejection.body())));
    *response.status_mut() = rejection.status();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A trailers-only gRPC answer: `200 OK`, `headers` (the status among them), no body.
fn grpc_answer<T>(headers: HeaderMap) -> Response<RateLimitBody<T>> {
    let mut response = Response::new(RateLimitBody::empty());
    *response.headers_mut() = headers;
    response
}

pin_project_lite::pin_project! {
    /// The response body: the inner service's, or the layer's own answer's (429, rejection).
    pub struct RateLimitBody<B> {
        #[pin]
        inner: Option<B>,
        limited: Option<Bytes>,
    }
}

impl<B> RateLimitBody<B> {
    fn inner(body: B) -> Self {
        Self { inner: Some(body), limited: None }
    }

    fn limited(body: Bytes) -> Self {
        Self { inner: None, limited: Some(body) }
    }

    /// No body at all: the stream ends with the headers.
    fn empty() -> Self {
        Self { inner: None, limited: None }
    }
}

impl<B: Body<Data = Bytes>> Body for RateLimitBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        match this.inner.as_pin_mut() {
            Some(body) => body.poll_frame(cx),
            None => Poll::Ready(this.limited.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Some(body) => body.is_end_stream(),
            None => self.limited.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Some(body) => body.size_hint(),
            None => SizeHint::with_exact(self.limited.as_ref().map_or(0, |b| b.len() as u64)),
        }
    }
}
