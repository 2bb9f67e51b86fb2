//! A peer that accepts connections and never answers (a hung process, a port taken by
//! something else): every call fails within its timeout, or within the silence bound.

use reverb_client::transport::connect::SILENCE;
use reverb_client::Client;

use crate::common::block;
use std::net::TcpListener;
use std::time::{Duration, Instant};
use tonic::Code;

/// A listener that accepts and holds connections, reading nothing and sending nothing.
fn silent_listener() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming() {
            held.push(conn);
        }
    });
    port
}

#[test]
fn calls_without_a_timeout_fail_once_the_server_stayed_silent() {
    let port = silent_listener();
    let client = Client::new(&format!("127.0.0.1:{port}")).unwrap();
    let started = Instant::now();
    let err = block(client.server_info(None)).unwrap_err();
    let took = started.elapsed();
    assert_eq!(err.code, Code::Unavailable, "{err:?}");
    assert!(err.message.contains("sent nothing"), "{err:?}");
    assert!(
        took >= SILENCE && took < SILENCE + Duration::from_secs(3),
        "{took:?}"
    );
}

#[test]
fn calls_with_a_timeout_fail_at_it() {
    let port = silent_listener();
    let client = Client::new(&format!("127.0.0.1:{port}")).unwrap();
    let started = Instant::now();
    let err = block(client.server_info(Some(Duration::from_secs(1)))).unwrap_err();
    assert_eq!(err.code, Code::DeadlineExceeded, "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
}
