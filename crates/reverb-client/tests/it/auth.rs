//! Token authentication: a server with a token serves only clients that send it; any other
//! call gets UNAUTHENTICATED and reads or changes nothing, over gRPC and in-process alike.

use reverb_client::{Client, Tensor};

use crate::common::{block, insert_step, table, T};
use reverb_core::SelectorKind;
use reverb_proto::tensorflow::DataType;
use reverb_server::{Server, ServerOptions};
use tonic::Code;

fn one() -> Tensor {
    Tensor::new(
        DataType::DtInt32 as i32,
        vec![],
        5i32.to_le_bytes().to_vec(),
    )
    .unwrap()
}

#[test]
fn only_clients_with_the_token_are_served() {
    let t = table("t", SelectorKind::Fifo, 100);
    let options = ServerOptions {
        auth_token: Some("s3cret".into()),
        ..ServerOptions::default()
    };
    let server = Server::start(vec![t.clone()], options).unwrap();
    let address = format!("localhost:{}", server.port());
    let good = Client::new(&address)
        .unwrap()
        .with_auth_token(Some("s3cret"))
        .unwrap();
    insert_step(&good, vec![one()], vec![("t".into(), 1.0)], T).unwrap();
    for inproc in [false, true] {
        for token in [None, Some("wrong")] {
            let bad = Client::new(&address)
                .unwrap()
                .with_auth_token(token)
                .unwrap()
                .with_inproc(inproc);
            assert!(
                bad.inproc().is_none(),
                "no in-process shortcut past the token"
            );
            let refused = |e: reverb_client::ClientError| {
                assert_eq!(e.code, Code::Unauthenticated, "{token:?}: {e:?}");
                assert!(!e.message.contains("s3cret"));
            };
            refused(block(bad.server_info(T)).unwrap_err());
            refused(block(bad.sample("t", 1, None, T)).unwrap_err());
            refused(block(bad.reset("t", T)).unwrap_err());
            refused(block(bad.checkpoint(T)).unwrap_err());
            refused(insert_step(&bad, vec![one()], vec![("t".into(), 1.0)], T).unwrap_err());
        }
    }
    // Nothing changed: the one item is there and served to the right token, in-process too.
    assert_eq!(t.size(), 1);
    let inproc = Client::new(&address)
        .unwrap()
        .with_auth_token(Some("s3cret"))
        .unwrap();
    assert!(inproc.inproc().is_some());
    let samples = block(inproc.sample("t", 1, None, T)).unwrap();
    assert_eq!(samples[0].columns[0].data, 5i32.to_le_bytes().to_vec());
}

#[test]
fn a_server_listens_on_the_host_it_is_given() {
    let options = ServerOptions {
        host: Some("127.0.0.1".into()),
        ..ServerOptions::default()
    };
    let server = Server::start(vec![table("t", SelectorKind::Fifo, 10)], options).unwrap();
    let client = Client::new(&format!("127.0.0.1:{}", server.port()))
        .unwrap()
        .with_inproc(false);
    assert_eq!(block(client.server_info(T)).unwrap().len(), 1);
    // Not on the IPv6 loopback: only the given address was bound.
    assert!(std::net::TcpStream::connect(("::1", server.port())).is_err());
    let bad = ServerOptions {
        host: Some("no-such-host.invalid".into()),
        ..ServerOptions::default()
    };
    let err = Server::start(vec![table("t", SelectorKind::Fifo, 10)], bad)
        .err()
        .unwrap();
    assert!(err.to_string().contains("no-such-host.invalid"), "{err}");
}

#[test]
fn a_writer_with_the_wrong_token_fails_for_good() {
    use reverb_client::writer::{ItemColumn, TrajectoryWriter, WriterOptions};
    let options = ServerOptions {
        auth_token: Some("s3cret".into()),
        ..ServerOptions::default()
    };
    let t = table("t", SelectorKind::Fifo, 100);
    let server = Server::start(vec![t.clone()], options).unwrap();
    let client = Client::new(&format!("localhost:{}", server.port()))
        .unwrap()
        .with_auth_token(Some("wrong"))
        .unwrap();
    let mut w = {
        let _guard = reverb_client::runtime().enter();
        TrajectoryWriter::new(client, WriterOptions::default()).unwrap()
    };
    let column = [ItemColumn {
        refs: vec![(0, 0)],
        squeeze: false,
    }];
    w.append(vec![(0, one())], false).unwrap();
    w.create_item("t", 1.0, &column, None).unwrap();
    let deadline = Some(std::time::Instant::now() + std::time::Duration::from_secs(10));
    let err = w.flush(0, deadline).unwrap_err();
    assert_eq!(err.code, Code::Unauthenticated, "{err:?}");
    assert!(w.failed());
    assert_eq!(
        w.flush(0, deadline).unwrap_err().code,
        Code::Unauthenticated
    );
    assert_eq!(t.size(), 0);
}
