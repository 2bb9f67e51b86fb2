//! TLS: a server with a certificate serves clients that trust its authority; clients that do
//! not, plain-TCP clients and (with a client CA) clients without a certificate are refused
//! promptly with an error that says why, and nothing is stored.

use reverb_client::transport::tls::Tls;
use reverb_client::{Client, ClientError, Tensor};

use crate::common::{block, insert_step, table, T};
use reverb_core::SelectorKind;
use reverb_proto::tensorflow::DataType;
use reverb_server::{Server, ServerOptions, ServerTls};
use std::time::{Duration, Instant};

fn fixture(name: &str) -> String {
    format!("{}/../../tests/data/tls/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn server_tls(client_ca: bool) -> ServerTls {
    let ca = client_ca.then(|| fixture("ca.pem"));
    ServerTls::from_files(
        &fixture("server.pem"),
        &fixture("server.key"),
        ca.as_deref(),
    )
    .unwrap()
}

fn one(v: i32) -> Tensor {
    Tensor::new(DataType::DtInt32 as i32, vec![], v.to_le_bytes().to_vec()).unwrap()
}

fn start(tls: Option<ServerTls>) -> (Server, std::sync::Arc<reverb_core::Table>) {
    let t = table("t", SelectorKind::Fifo, 100);
    let options = ServerOptions {
        tls,
        ..ServerOptions::default()
    };
    (Server::start(vec![t.clone()], options).unwrap(), t)
}

/// A gRPC client (no in-process shortcut) of `server` with `tls`.
fn client(server: &Server, host: &str, tls: Option<Tls>) -> Client {
    Client::new(&format!("{host}:{}", server.port()))
        .unwrap()
        .with_tls(tls)
        .unwrap()
        .with_inproc(false)
}

fn trusting(ca: &str, cert: bool) -> Tls {
    let (c, k) = (fixture("client.pem"), fixture("client.key"));
    let (c, k) = if cert {
        (Some(c.as_str()), Some(k.as_str()))
    } else {
        (None, None)
    };
    Tls::from_files(&fixture(ca), c, k, None).unwrap()
}

/// `call` fails within a few seconds (not after retrying for a minute).
fn refused_quickly<R: std::fmt::Debug>(
    call: impl FnOnce() -> reverb_client::Result<R>,
) -> ClientError {
    let start = Instant::now();
    let error = call().unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "took {:?}: {error:?}",
        start.elapsed()
    );
    error
}

#[test]
fn clients_that_trust_the_servers_authority_are_served_over_tls() {
    let (server, t) = start(Some(server_tls(false)));
    for host in ["localhost", "127.0.0.1", "[::1]"] {
        let c = client(&server, host, Some(trusting("ca.pem", false)));
        insert_step(&c, vec![one(7)], vec![("t".into(), 1.0)], T).unwrap();
        let samples = block(c.sample("t", 1, None, T)).unwrap();
        assert_eq!(samples[0].columns[0].data, 7i32.to_le_bytes().to_vec());
        // A clone made for another connection keeps TLS.
        assert_eq!(
            block(c.reconnected().unwrap().server_info(T))
                .unwrap()
                .len(),
            1
        );
    }
    assert_eq!(t.size(), 3);
}

#[test]
fn clients_that_do_not_trust_the_server_or_speak_plain_tcp_are_refused() {
    let (server, t) = start(Some(server_tls(false)));
    let stranger = client(&server, "localhost", Some(trusting("other-ca.pem", false)));
    let e = refused_quickly(|| insert_step(&stranger, vec![one(1)], vec![("t".into(), 1.0)], T));
    assert!(e.message.to_lowercase().contains("certificate"), "{e:?}");
    let plain = client(&server, "localhost", None);
    let e = refused_quickly(|| insert_step(&plain, vec![one(1)], vec![("t".into(), 1.0)], T));
    assert!(e.message.contains("tls_ca"), "{e:?}");
    assert_eq!(t.size(), 0, "nothing stored from refused clients");
    // And a TLS client of a plain server is refused too.
    let (plain_server, _) = start(None);
    let c = client(&plain_server, "localhost", Some(trusting("ca.pem", false)));
    let e = refused_quickly(|| block(c.server_info(T)));
    assert!(e.message.contains("does it serve TLS"), "{e:?}");
}

#[test]
fn with_a_client_ca_only_clients_with_a_certificate_are_served() {
    let (server, t) = start(Some(server_tls(true)));
    let anonymous = client(&server, "localhost", Some(trusting("ca.pem", false)));
    let e = refused_quickly(|| insert_step(&anonymous, vec![one(1)], vec![("t".into(), 1.0)], T));
    assert!(e.message.contains("tls_cert"), "{e:?}");
    assert_eq!(t.size(), 0);
    let known = client(&server, "localhost", Some(trusting("ca.pem", true)));
    insert_step(&known, vec![one(2)], vec![("t".into(), 1.0)], T).unwrap();
    assert_eq!(t.size(), 1);
}

#[test]
fn wrong_tls_files_are_errors_that_name_the_file() {
    let missing = fixture("missing.pem");
    let e = ServerTls::from_files(&missing, &fixture("server.key"), None).unwrap_err();
    assert!(
        e.contains("missing.pem") && e.contains("certificate"),
        "{e}"
    );
    // A key where a certificate belongs, and the other way round.
    let e =
        ServerTls::from_files(&fixture("server.key"), &fixture("server.key"), None).unwrap_err();
    assert!(
        e.contains("server.key") && e.contains("no certificate"),
        "{e}"
    );
    let e = Tls::from_files(
        &fixture("ca.pem"),
        Some(&fixture("client.pem")),
        Some(&fixture("client.pem")),
        None,
    )
    .unwrap_err();
    assert!(e.contains("client.pem") && e.contains("private key"), "{e}");
    assert!(ServerTls::from_paths(Some(&fixture("server.pem")), None, None).is_err());
    assert!(ServerTls::from_paths(None, None, Some(&fixture("ca.pem"))).is_err());
    assert!(Tls::from_paths(None, Some(&fixture("client.pem")), None, None).is_err());
    assert!(Tls::from_paths(None, None, None, None).unwrap().is_none());
    // An https:// address needs an authority.
    let e = Client::new("https://localhost:1").err().unwrap();
    assert!(e.message.contains("tls_ca"), "{e:?}");
}
