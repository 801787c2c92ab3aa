//! The `terdut-standin` program (what `deploy/run-local.sh` starts): prints
//! a loopback base URL on its first line and serves the stand-in there.
//! Being an integration test of this package also makes `cargo test
//! --workspace` build the program, which the demo then reuses.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};

#[test]
fn prints_a_loopback_url_and_answers_the_version_endpoint() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_terdut-standin"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn terdut-standin");
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("read the first line");
    let url = first.trim().to_owned();
    let result = std::panic::catch_unwind(|| {
        let addr = url
            .strip_prefix("http://127.0.0.1:")
            .map(|port| format!("127.0.0.1:{port}"))
            .unwrap_or_else(|| panic!("not a loopback http URL: {url:?}"));
        let mut s = std::net::TcpStream::connect(&addr).expect("connect");
        s.write_all(format!("GET /api/version HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .expect("write");
        let mut answer = String::new();
        s.read_to_string(&mut answer).expect("read");
        assert!(
            answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200"),
            "{answer}"
        );
        assert!(answer.contains("\"bootstrapped\":false"), "{answer}");
    });
    let _ = child.kill();
    let _ = child.wait();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}
