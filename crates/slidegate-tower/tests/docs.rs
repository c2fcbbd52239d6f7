//! docs/middleware.md's shell session, run as written against the example app it starts
//! (`examples/login_and_search.rs`, its rules and routes served here on a free port instead of
//! 3000), with real `curl` through `bash`: the statuses and headers it shows are what comes back.

use std::net::SocketAddr;
use std::process::Command;

use slidegate::Limiter;

// The example's `main` binds port 3000 and is not called: the test serves the same app on a
// free port.
#[allow(dead_code)]
#[path = "../examples/login_and_search.rs"]
mod example;

/// The body of the first `sh` block of docs/middleware.md.
fn session() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/middleware.md");
    let text = std::fs::read_to_string(path).expect("docs/middleware.md");
    let body = &text[text.find("```sh\n").expect("an sh block") + "```sh\n".len()..];
    body[..body.find("```").expect("closed block")].to_owned()
}

/// Runs one line of the session with bash, the example's address in place of `localhost:3000`.
fn run(line: &str, addr: SocketAddr) -> String {
    let line = line.replace("localhost:3000", &addr.to_string());
    let out = Command::new("bash").args(["-c", &format!("set -o pipefail; {line}")]).output().expect("bash");
    assert!(out.status.success(), "{line}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("UTF-8").replace('\r', "")
}

#[tokio::test]
async fn the_middleware_session_answers_what_the_docs_show() {
    let text = session();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("cargo run -p slidegate-tower --example login_and_search"), "{text}");
    let (logins, login_answer) =
        (lines[1].to_owned(), lines[2].strip_prefix("# ").expect("the statuses, as a comment"));
    let search = lines[3].to_owned();
    let search_answer: Vec<String> =
        lines[4..].iter().filter_map(|l| l.strip_prefix("# ")).map(str::to_owned).collect();

    let app = example::app(example::rules(Limiter::in_memory()).expect("the example's rules"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await.expect("serve");
    });

    // The six logins: the statuses shown, then the 429's body.
    let (statuses, said) = login_answer.split_once(" — and the 429 says: ").expect("statuses and body");
    let got = tokio::task::spawn_blocking(move || run(&logins, addr)).await.expect("curl");
    assert_eq!(got.split_whitespace().collect::<Vec<_>>(), statuses.split_whitespace().collect::<Vec<_>>());
    let denied = reqwest::Client::new().post(format!("http://{addr}/login")).send().await.expect("login");
    assert_eq!(denied.status(), 429);
    assert_eq!(denied.text().await.expect("body").trim(), said);

    // The search of a vip user: the RateLimit headers shown.
    let got = tokio::task::spawn_blocking(move || run(&search, addr)).await.expect("curl");
    assert_eq!(got.lines().collect::<Vec<_>>(), search_answer);
}
