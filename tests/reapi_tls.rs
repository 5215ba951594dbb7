//! The REAPI client over TLS and mutual TLS, and what every call carries in its headers.
//!
//! `dtlto-reapi serve` speaks plain gRPC only, so this test runs a small in-process tonic server
//! with TLS (certificates made on the spot by rcgen) that answers GetCapabilities and records the
//! request headers it received.

use std::sync::{Arc, Mutex};

use bazel_remote_apis::build::bazel::remote::execution::v2::{
    self as re, RequestMetadata,
    capabilities_server::{Capabilities, CapabilitiesServer},
};
use dtlto_reapi::reapi::{Client, ConnectionOptions, TlsFiles};
use prost::Message;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

/// Answers GetCapabilities like a SHA-256 CAS and keeps the metadata of every request.
#[derive(Clone, Default)]
struct RecordingCapabilities {
    seen: Arc<Mutex<Vec<tonic::metadata::MetadataMap>>>,
}

#[tonic::async_trait]
impl Capabilities for RecordingCapabilities {
    async fn get_capabilities(
        &self,
        request: tonic::Request<re::GetCapabilitiesRequest>,
    ) -> Result<tonic::Response<re::ServerCapabilities>, tonic::Status> {
        self.seen.lock().unwrap().push(request.metadata().clone());
        Ok(tonic::Response::new(re::ServerCapabilities {
            cache_capabilities: Some(re::CacheCapabilities {
                digest_functions: vec![re::digest_function::Value::Sha256 as i32],
                ..Default::default()
            }),
            ..Default::default()
        }))
    }
}

/// PEM files of a CA, a server certificate for `localhost` and a client certificate it signed.
struct Pki {
    dir: tempfile::TempDir,
    ca_pem: String,
    server: (String, String),
}

impl Pki {
    fn new() -> Pki {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        let leaf = |name: &str| {
            let key = KeyPair::generate().unwrap();
            let cert = CertificateParams::new(vec![name.to_string()])
                .unwrap()
                .signed_by(&key, &ca)
                .unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let server = leaf("localhost");
        let client = leaf("client");
        let dir = tempfile::tempdir().unwrap();
        let other_ca = rcgen::generate_simple_self_signed(vec!["other".to_string()]).unwrap();
        for (name, pem) in [
            ("ca.pem", ca.pem()),
            ("other-ca.pem", other_ca.cert.pem()),
            ("client.pem", client.0),
            ("client.key", client.1),
        ] {
            std::fs::write(dir.path().join(name), pem).unwrap();
        }
        Pki {
            dir,
            ca_pem: ca.pem(),
            server,
        }
    }

    fn path(&self, name: &str) -> Option<std::path::PathBuf> {
        Some(self.dir.path().join(name))
    }
}

/// Serves `service` with TLS on a free loopback port (requiring client certificates when
/// `mutual`); returns the port.
async fn serve_tls(pki: &Pki, service: RecordingCapabilities, mutual: bool) -> u16 {
    let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(&pki.server.0, &pki.server.1));
    if mutual {
        tls = tls.client_ca_root(Certificate::from_pem(&pki.ca_pem));
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let router = Server::builder()
        .tls_config(tls)
        .unwrap()
        .add_service(CapabilitiesServer::new(service));
    // The server task ends with the test's runtime.
    tokio::spawn(
        router.serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    port
}

fn options(port: u16, tls: TlsFiles) -> ConnectionOptions {
    let mut opts = ConnectionOptions::new(format!("grpcs://localhost:{port}"));
    opts.tls = tls;
    opts.max_retries = 0;
    opts
}

#[tokio::test]
async fn tls_with_a_private_ca_and_request_metadata() {
    let pki = Pki::new();
    let service = RecordingCapabilities::default();
    let port = serve_tls(&pki, service.clone(), false).await;

    let mut opts = options(
        port,
        TlsFiles {
            ca_cert: pki.path("ca.pem"),
            ..Default::default()
        },
    );
    // Cargo sets CARGO_PKG_NAME for the tests it runs: an `env:` value set without touching the
    // environment of this (multi-threaded) process.
    opts.headers = vec![("X-Api-Key".into(), "env:CARGO_PKG_NAME".into())];
    opts.invocation_id = "invocation-1".into();
    opts.correlated_invocations_id = Some("build-7".into());
    let client = Client::connect(&opts).await.expect("connect over TLS");
    assert_eq!(
        client.capabilities().max_batch_bytes,
        dtlto_reapi::reapi::DEFAULT_MAX_BATCH_BYTES
    );
    assert!(!client.capabilities().exec_enabled);

    let seen = service.seen.lock().unwrap().clone();
    let metadata = seen.last().expect("a request");
    assert_eq!(metadata.get("x-api-key").unwrap(), env!("CARGO_PKG_NAME"));
    let raw = metadata
        .get_bin("build.bazel.remote.execution.v2.requestmetadata-bin")
        .unwrap()
        .to_bytes()
        .unwrap();
    let request_metadata = RequestMetadata::decode(raw).unwrap();
    let tool = request_metadata.tool_details.unwrap();
    assert_eq!(
        (tool.tool_name.as_str(), tool.tool_version.as_str()),
        ("dtlto-reapi", env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(request_metadata.tool_invocation_id, "invocation-1");
    assert_eq!(request_metadata.correlated_invocations_id, "build-7");

    // A server certificate from an unknown CA is refused.
    let wrong = options(
        port,
        TlsFiles {
            ca_cert: pki.path("other-ca.pem"),
            ..Default::default()
        },
    );
    let err = Client::connect(&wrong)
        .await
        .expect_err("an untrusted server");
    assert!(
        err.is_infrastructure() && err.to_string().contains("certificate"),
        "{err}"
    );
}

#[tokio::test]
async fn mutual_tls() {
    let pki = Pki::new();
    let port = serve_tls(&pki, RecordingCapabilities::default(), true).await;
    let with_cert = TlsFiles {
        ca_cert: pki.path("ca.pem"),
        client_cert: pki.path("client.pem"),
        client_key: pki.path("client.key"),
    };
    Client::connect(&options(port, with_cert))
        .await
        .expect("connect with a client certificate");
    let without = TlsFiles {
        ca_cert: pki.path("ca.pem"),
        ..Default::default()
    };
    assert!(
        Client::connect(&options(port, without)).await.is_err(),
        "no client certificate, no service"
    );
}
