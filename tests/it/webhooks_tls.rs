//! Webhooks over `https://`: a receiver the test starts behind TLS, its
//! certificate signed by a CA the test makes with `openssl`.
//!
//! - With the CA in `[outbox] webhook_ca_file`, the receiver ends with every
//!   change of the sale, each signed (checked by `domain::webhook::verify`).
//! - Without it (the system's roots only), every handshake is refused by the
//!   client: nothing reaches the receiver, and the subscription is paused
//!   with the certificate named in its reason.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;
use shardstock::domain::webhook::verify;

use crate::harness::{Backend, TestApp, eid, eventually};
use crate::outbox::{all_changes, sale_with_holds};
use crate::webhooks::{Receiver, SECRET_NEW, hooks_on, subscribe, webhook};

/// A CA and a server certificate for 127.0.0.1 signed by it, in a fresh
/// directory.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn make() -> Self {
        let dir = std::env::temp_dir().join(format!("ss-tls-{:08x}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("leaf.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ];
        let steps: [Vec<&str>; 3] = [
            [
                &["req", "-x509"][..],
                &ec,
                &[
                    "-keyout",
                    "ca.key",
                    "-out",
                    "ca.pem",
                    "-days",
                    "2",
                    "-subj",
                    "/CN=shardstock test CA",
                ],
            ]
            .concat(),
            [
                &["req"][..],
                &ec,
                &[
                    "-keyout",
                    "leaf.key",
                    "-out",
                    "leaf.csr",
                    "-subj",
                    "/CN=localhost",
                ],
            ]
            .concat(),
            vec![
                "x509",
                "-req",
                "-in",
                "leaf.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "leaf.pem",
                "-days",
                "2",
                "-extfile",
                "leaf.ext",
            ],
        ];
        for args in steps {
            let out = Command::new("openssl")
                .args(&args)
                .current_dir(&dir)
                .output()
                .expect("openssl runs (apt-get install openssl)");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Serves `receiver` over TLS on 127.0.0.1:0 with the leaf certificate; its
/// URL, and a count of handshakes that failed (the client refusing it).
#[allow(deprecated)] // ring's provider, as the service's client uses
async fn serve_tls(receiver: &Arc<Receiver>, pki: &Pki) -> (String, Arc<AtomicUsize>) {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(pki.path("leaf.pem"))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(pki.path("leaf.key")).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let refused = Arc::new(AtomicUsize::new(0));
    let router = receiver.router();
    let count = refused.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, router, count) = (acceptor.clone(), router.clone(), count.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    count.fetch_add(1, Ordering::SeqCst);
                    return;
                };
                let service = hyper_util::service::TowerToHyperService::new(router);
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (format!("https://127.0.0.1:{port}/hook"), refused)
}

fn tag() -> String {
    format!("{:08x}", rand::random::<u32>())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_https_receiver_gets_every_change_with_its_ca_and_nothing_without() {
    let pki = Pki::make();
    let ca = pki.path("ca.pem");
    assert!(Path::new(&ca).exists());

    // Trusted through webhook_ca_file: every change delivered, signed.
    let trusted = Receiver::new(200);
    let (url, refused) = serve_tls(&trusted, &pki).await;
    let mut settings = hooks_on(Backend::Memory, 3);
    settings.outbox.webhook_ca_file = Some(ca.display().to_string());
    let app = TestApp::spawn_with(settings).await;
    let id = format!("tls-{}", tag());
    subscribe(&app, json!({"id": id, "url": url, "secrets": [SECRET_NEW]})).await;
    let event = eid("tls");
    sale_with_holds(&app, &event, 12).await;
    let changes = all_changes(&app, &event, 1000).await;
    assert!(!changes.is_empty());
    eventually(
        "every change at the https receiver",
        Duration::from_secs(30),
        async || (trusted.deduplicated(&event).len() == changes.len()).then_some(()),
    )
    .await;
    for d in trusted.all() {
        let t: i64 = d
            .signature
            .split(',')
            .find_map(|p| p.strip_prefix("t="))
            .unwrap()
            .parse()
            .unwrap();
        verify(SECRET_NEW, &d.signature, &d.body, t, 300).unwrap();
    }
    assert_eq!(refused.load(Ordering::SeqCst), 0, "no handshake refused");
    assert_eq!(webhook(&app, &id).await["status"], "active");

    // The system's roots only: the client refuses the certificate, nothing
    // is delivered, the subscription pauses naming why.
    let stranger = Receiver::new(200);
    let (url, refused) = serve_tls(&stranger, &pki).await;
    let app = TestApp::spawn_with(hooks_on(Backend::Memory, 3)).await;
    let id = format!("tls-{}", tag());
    subscribe(&app, json!({"id": id, "url": url, "secrets": [SECRET_NEW]})).await;
    let event = eid("tlsno");
    sale_with_holds(&app, &event, 4).await;
    let paused = eventually(
        "the subscription to an untrusted receiver paused",
        Duration::from_secs(30),
        async || {
            let view = webhook(&app, &id).await;
            (view["status"] == "paused").then_some(view)
        },
    )
    .await;
    let reason = paused["paused_reason"].as_str().unwrap();
    assert!(
        reason.contains("3 deliveries failed") && reason.contains("certificate"),
        "{reason}"
    );
    assert!(stranger.all().is_empty(), "nothing delivered");
    assert!(
        refused.load(Ordering::SeqCst) >= 3,
        "each attempt's handshake refused"
    );
}
