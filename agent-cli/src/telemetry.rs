//! What a run says about itself beyond its log: logs on standard error when `RUST_LOG`
//! asks for them (quiet otherwise), and spans sent over OTLP/HTTP (protobuf) when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) names a
//! collector, with the standard `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`. With
//! neither, no subscriber is installed and the spans of the runtime cost next to nothing.

use std::io::IsTerminal as _;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::filter::{FilterExt as _, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{Layer as _, Registry};

/// The service name spans carry when `OTEL_SERVICE_NAME` does not say.
const SERVICE_NAME: &str = "agent";

/// The installed telemetry; dropping it sends the spans still buffered.
#[derive(Default)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            // Whatever is still buffered goes out now; a collector that is gone does not
            // change how the command ends.
            let _ = provider.shutdown();
        }
    }
}

fn set(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| !v.is_empty())
}

/// Installs what the environment asks for. A value that cannot be used is an error that
/// names it.
pub fn init() -> Result<Telemetry, String> {
    // Only the layers asked for: a layer that is not there must not be one that takes
    // every span (as an absent optional layer does), or spans would cost with nobody
    // reading them.
    let mut layers: Vec<Box<dyn tracing_subscriber::Layer<Registry> + Send + Sync>> = Vec::new();
    if set("RUST_LOG") {
        let directives = std::env::var("RUST_LOG").unwrap_or_default();
        let targets: Targets = directives.parse().map_err(|e| {
            format!(
                "RUST_LOG={directives:?}: {e}; give levels by target, for example \
                 RUST_LOG=agent_runtime=info,warn"
            )
        })?;
        let logs = tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal() && !set("NO_COLOR"))
            // Events only: formatting every span's fields for the context of a log line
            // cost a sixth of a turn; the events carry the fields that matter.
            .with_filter(targets.and(tracing_subscriber::filter::filter_fn(|meta| {
                meta.is_event()
            })));
        layers.push(Box::new(logs));
    }
    let export = set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    let provider = if export { Some(provider()?) } else { None };
    if let Some(provider) = &provider {
        let spans = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("agent-loop"))
            // Only the runtime's own spans (the GenAI ones, commits, compactions): no
            // dependency's.
            .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
                meta.target().starts_with("agent_")
            }));
        layers.push(Box::new(spans));
    }
    if layers.is_empty() {
        return Ok(Telemetry::default());
    }
    tracing_subscriber::registry()
        .with(layers)
        .try_init()
        .map_err(|e| format!("cannot install tracing: {e}"))?;
    Ok(Telemetry { provider })
}

fn provider() -> Result<SdkTracerProvider, String> {
    let tls = agent_providers::tls().map_err(|e| e.to_string())?;
    let client = reqwest::blocking::Client::builder()
        .tls_backend_preconfigured(tls)
        .timeout(std::time::Duration::from_secs(10))
        .build()
        .map_err(|e| format!("cannot build the span exporter's HTTP client: {e}"))?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_http_client(Blocking(client))
        .build()
        .map_err(|e| format!("{e}; give a collector's URL, for example http://localhost:4318"))?;
    let mut resource = Resource::builder();
    if !set("OTEL_SERVICE_NAME") {
        resource = resource.with_service_name(SERVICE_NAME);
    }
    Ok(SdkTracerProvider::builder()
        // Its own thread sends the spans in batches: a slow collector never slows a turn.
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build())
}

/// The exporter's HTTP client: blocking reqwest, called on the batch exporter's own thread
/// (never on the runtime's).
#[derive(Debug)]
struct Blocking(reqwest::blocking::Client);

#[async_trait::async_trait]
impl HttpClient for Blocking {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let response = self
            .0
            .request(parts.method, parts.uri.to_string())
            .headers(parts.headers)
            .body(body.to_vec())
            .send()?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes()?;
        let mut out = Response::builder().status(status).body(body)?;
        *out.headers_mut() = headers;
        Ok(out)
    }
}
