//! The standard gRPC health service (`grpc.health.v1.Health`) beside the Envoy service: it says
//! `SERVING` while the backend is ready, as `/readyz` does, and `NOT_SERVING` while it is not
//! (or while the rules come from Redis and none are in force, the stored ones unreadable), so
//! that a load balancer or Kubernetes' gRPC probe stops sending work to an instance whose
//! Redis is gone.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;
use tracing::{info, warn};

use crate::app::App;
use crate::redact::redact;
use crate::shared_store::Shared;

/// The largest health request decoded: a service name is tens of bytes; tonic's default would
/// let one request make the server decode 4 MiB.
pub const MAX_HEALTH_REQUEST_BYTES: usize = 1024;

/// How often the backend's readiness is asked for: a change shows in the health service within
/// this, plus the backend's deadline.
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(1);

/// Asks the backend whether it is ready every [`HEALTH_INTERVAL`], forever, and reports each
/// change for the whole server (service `""`) and the Envoy rate limit service.
pub async fn follow_readiness(reporter: HealthReporter, app: Arc<App>) {
    let mut reported = None;
    loop {
        let unready = match app.limiter.backend().ready().await {
            Ok(()) => app.shared().and_then(Shared::unready),
            Err(e) => Some(format!("backend not ready: {}", redact(&e.to_string()))),
        };
        let status = match unready {
            None => ServingStatus::Serving,
            Some(why) => {
                if reported != Some(ServingStatus::NotServing) {
                    warn!("{why}: gRPC health NOT_SERVING");
                }
                ServingStatus::NotServing
            }
        };
        if reported != Some(status) {
            if reported.is_some() && status == ServingStatus::Serving {
                info!("ready: gRPC health SERVING");
            }
            // A watcher is woken by every report, so only changes are reported.
            for service in ["", rate_limit_service_server::SERVICE_NAME] {
                reporter.set_service_status(service, status).await;
            }
            reported = Some(status);
        }
        tokio::time::sleep(HEALTH_INTERVAL).await;
    }
}
