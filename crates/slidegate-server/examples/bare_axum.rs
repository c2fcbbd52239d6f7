//! The HTTP baseline for benchmarks: an axum server whose `POST /v1/check` reads the body and
//! answers a fixed decision of the same size as slidegate's, deciding nothing. The service's
//! own overhead is measured against this (bench/http_overhead.py).
//!
//! ```text
//! cargo run --release -p slidegate-server --example bare_axum -- 127.0.0.1:8090
//! ```

use axum::Router;
use axum::body::Bytes;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::post;

const DECISION: &str = r#"{"rule":"inline","allowed":true,"limit":100,"remaining":99,"reset_after_ms":60000,"retry_after_ms":null,"degraded":false,"engine":"memory"}"#;

async fn check(body: Bytes) -> impl IntoResponse {
    std::hint::black_box(body);
    ([(header::CONTENT_TYPE, "application/json")], DECISION)
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:8090".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    axum::serve(listener, Router::new().route("/v1/check", post(check))).await
}
