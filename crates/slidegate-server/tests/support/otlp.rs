//! An OTLP trace receiver on a free loopback port, speaking gRPC or HTTP/protobuf, that keeps
//! the spans it is sent and counts the connections it accepts.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;
use tokio::net::TcpListener;

/// One span as received: ids in hex, attributes as text.
#[derive(Debug, Clone)]
pub struct Received {
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    pub attributes: BTreeMap<String, String>,
}

impl Received {
    pub fn attribute(&self, name: &str) -> Option<&str> {
        self.attributes.get(name).map(String::as_str)
    }
}

#[derive(Clone, Default)]
struct Store(Arc<Mutex<Vec<Received>>>);

impl Store {
    fn keep(&self, request: ExportTraceServiceRequest) {
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let mut spans = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        for span in request.resource_spans.into_iter().flat_map(|r| r.scope_spans).flat_map(|s| s.spans) {
            let attributes = span
                .attributes
                .into_iter()
                .map(|kv| {
                    let text = match kv.value.and_then(|v| v.value) {
                        Some(Value::StringValue(s)) => s,
                        Some(Value::BoolValue(b)) => b.to_string(),
                        Some(Value::IntValue(i)) => i.to_string(),
                        other => format!("{other:?}"),
                    };
                    (kv.key, text)
                })
                .collect();
            spans.push(Received {
                name: span.name,
                trace_id: hex(&span.trace_id),
                span_id: hex(&span.span_id),
                parent_span_id: hex(&span.parent_span_id),
                attributes,
            });
        }
    }
}

#[tonic::async_trait]
impl TraceService for Store {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.keep(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// A running receiver; it stops with the test's runtime.
pub struct Receiver {
    pub addr: SocketAddr,
    spans: Store,
    connections: Arc<AtomicUsize>,
}

impl Receiver {
    /// OTLP over gRPC (`TraceService/Export`).
    pub async fn grpc() -> Self {
        Self::start(|stream, store| async move {
            let service = TowerToHyperService::new(TraceServiceServer::new(store));
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        })
        .await
    }

    /// OTLP over HTTP: protobuf `POST /v1/traces`.
    pub async fn http() -> Self {
        Self::start(|stream, store| async move {
            let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
                let store = store.clone();
                async move {
                    let ok = request.uri().path() == "/v1/traces";
                    let body = request.into_body().collect().await?.to_bytes();
                    let status = match ExportTraceServiceRequest::decode(body) {
                        Ok(export) if ok => {
                            store.keep(export);
                            200
                        }
                        _ => 400,
                    };
                    let answer = Full::new(Bytes::from(ExportTraceServiceResponse::default().encode_to_vec()));
                    let mut response = hyper::Response::new(answer);
                    *response.status_mut() = hyper::StatusCode::from_u16(status).expect("a status");
                    response.headers_mut().insert("content-type", "application/x-protobuf".parse().expect("a value"));
                    Ok::<_, hyper::Error>(response)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        })
        .await
    }

    async fn start<F, C>(serve: F) -> Self
    where
        F: Fn(tokio::net::TcpStream, Store) -> C + Send + 'static,
        C: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the receiver");
        let (addr, spans) = (listener.local_addr().expect("addr"), Store::default());
        let connections = Arc::new(AtomicUsize::new(0));
        let (store, count) = (spans.clone(), Arc::clone(&connections));
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(stream, store.clone()));
            }
        });
        Self { addr, spans, connections }
    }

    /// The gRPC endpoint's URL (`http://127.0.0.1:<port>`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn spans(&self) -> Vec<Received> {
        self.spans.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// The spans of trace `trace_id` once `count` of them have arrived (within 20 s).
    pub async fn trace(&self, trace_id: &str, count: usize) -> Vec<Received> {
        let started = Instant::now();
        loop {
            let spans: Vec<_> = self.spans().into_iter().filter(|s| s.trace_id == trace_id).collect();
            if spans.len() >= count {
                return spans;
            }
            assert!(started.elapsed() < Duration::from_secs(20), "{count} spans of {trace_id} not received: {spans:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
