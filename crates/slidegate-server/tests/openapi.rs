//! The OpenAPI document the real binary serves at `/openapi.json`, held to the real answers of
//! every endpoint, successes and errors: each answer's status is documented for its operation,
//! its content type is one the document names, its JSON body validates against the documented
//! schema (a JSON Schema 2020-12 validator, as OpenAPI 3.1 specifies), its documented headers
//! are there and well-formed; the request bodies that succeed validate against the documented
//! request schema; and every answer the document lists is exercised here. The routes the
//! router serves (`routes::all`, the list it is built from) are the document's paths.

mod support;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{Value, json};
use slidegate_testkit::RedisServer;
use support::{RulesFile, Slidegate};

/// An answer as it came over the wire.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    async fn from(response: reqwest::Response) -> Self {
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.to_str().expect("ASCII header").to_owned()))
            .collect();
        Self { status, headers, body: response.bytes().await.expect("body").to_vec() }
    }

    /// An HTTP/1.1 answer read whole from a raw socket.
    fn parse(raw: &[u8]) -> Self {
        let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a complete head");
        let head = std::str::from_utf8(&raw[..split]).expect("ASCII head");
        let mut lines = head.split("\r\n");
        let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok()).expect("status");
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        Self { status, headers, body: raw[split + 4..].to_vec() }
    }
}

/// Where the document describes an answer: an operation's response, or a response of
/// `components.responses` that any route can give.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum At {
    Operation(&'static str, &'static str),
    Component(&'static str),
}

/// The document, and the answers held to it so far.
struct Spec {
    doc: Value,
    seen: BTreeSet<String>,
}

impl Spec {
    /// A `$ref` resolved within the document.
    fn resolve<'a>(&'a self, value: &'a Value) -> &'a Value {
        match value["$ref"].as_str() {
            Some(pointer) => self.doc.pointer(pointer.trim_start_matches('#')).expect("a $ref within the document"),
            None => value,
        }
    }

    /// Validates `instance` against `schema`, whose `$ref`s point into the document.
    fn validate(&self, schema: &Value, instance: &Value, what: &str) {
        let mut rooted = schema.clone();
        rooted["$schema"] = json!("https://json-schema.org/draft/2020-12/schema");
        rooted["components"] = self.doc["components"].clone();
        let validator = jsonschema::validator_for(&rooted).unwrap_or_else(|e| panic!("{what}: bad schema: {e}"));
        let errors: Vec<String> =
            validator.iter_errors(instance).map(|e| format!("{} at {}", e, e.instance_path())).collect();
        assert!(errors.is_empty(), "{what}: {instance} does not match the document: {errors:#?}");
    }

    /// The documented response for `status` at `at`.
    fn response(&self, at: At, status: u16) -> &Value {
        let response = match at {
            At::Operation(path, method) => &self.doc["paths"][path][method]["responses"][status.to_string()],
            At::Component(name) => {
                let response = &self.doc["components"]["responses"][name];
                assert_eq!(response["x-status"], status, "{at:?}: the status this answer of any route has");
                response
            }
        };
        assert!(!response.is_null(), "{at:?} {status} is not in the document");
        self.resolve(response)
    }

    /// Holds `answer` to the document; `request`, when the call succeeded, to its request schema.
    fn hold(&mut self, at: At, request: Option<&Value>, answer: &Answer) {
        let what = format!("{at:?} {}", answer.status);
        let response = self.response(at, answer.status);
        for (name, header) in response["headers"].as_object().into_iter().flatten() {
            let header = self.resolve(header);
            match answer.header(name) {
                Some(value) => {
                    let value = match header["schema"]["type"].as_str() {
                        Some("integer") => {
                            json!(value.parse::<u64>().unwrap_or_else(|_| panic!("{what}: {name}: {value}")))
                        }
                        _ => json!(value),
                    };
                    self.validate(&header["schema"], &value, &format!("{what} header {name}"));
                }
                None => assert!(header["required"] != true, "{what}: no {name} header"),
            }
        }
        match response["content"].as_object() {
            None => assert!(answer.body.is_empty(), "{what}: a body where the document says none"),
            Some(content) => {
                let given = answer.header("content-type").unwrap_or_else(|| panic!("{what}: no content type"));
                let media = given.split(';').next().unwrap_or_default().trim();
                let schema =
                    &content.get(media).unwrap_or_else(|| panic!("{what}: {given} is not documented"))["schema"];
                let body = if media == "application/json" {
                    serde_json::from_slice(&answer.body).unwrap_or_else(|e| panic!("{what}: not JSON: {e}"))
                } else {
                    json!(String::from_utf8(answer.body.clone()).expect("text"))
                };
                self.validate(schema, &body, &what);
            }
        }
        if let (Some(request), At::Operation(path, method), true) = (request, at, answer.status < 300) {
            let body = &self.doc["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"];
            self.validate(body, request, &format!("{what} request"));
        }
        self.seen.insert(match at {
            At::Operation(..) => format!("{at:?} {}", answer.status),
            At::Component(_) => format!("{at:?} "),
        });
    }

    /// Every response the document lists, as [`Spec::hold`] names them: the operations', and
    /// the components' that no operation refers to (those of any route).
    fn documented(&self) -> BTreeSet<String> {
        let mut all = BTreeSet::new();
        let paths = self.doc["paths"].to_string();
        for name in self.doc["components"]["responses"].as_object().expect("responses").keys() {
            if !paths.contains(&format!("#/components/responses/{name}\"")) {
                all.insert(format!("{:?} ", At::Component(leak(name))));
            }
        }
        for (path, item) in self.doc["paths"].as_object().expect("paths") {
            for (method, operation) in item.as_object().expect("path item").iter().filter(|(m, _)| *m != "parameters") {
                for status in operation["responses"].as_object().expect("responses").keys() {
                    all.insert(format!("{:?} {status}", At::Operation(leak(path), leak(method))));
                }
            }
        }
        all
    }
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_owned().into_boxed_str())
}

/// Sends `method path` with an optional JSON `body` and admin token.
async fn call(server: &Slidegate, method: &str, path: &str, body: Option<&str>, token: Option<&str>) -> Answer {
    let client = reqwest::Client::new();
    let mut request = client.request(method.parse().expect("method"), server.url(path));
    if let Some(body) = body {
        request = request.header("content-type", "application/json").body(body.to_owned());
    }
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    Answer::from(request.send().await.expect("request")).await
}

/// Writes `bytes` on a fresh connection to the server at `base` and reads the answer to its end.
fn raw(base: &str, bytes: &[u8]) -> Answer {
    let mut socket = TcpStream::connect(base.trim_start_matches("http://")).expect("connect");
    socket.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    // The server may answer and close before taking all of it (a head too large).
    let _ = socket.write_all(bytes);
    let mut answer = Vec::new();
    let _ = socket.read_to_end(&mut answer);
    Answer::parse(&answer)
}

/// The methods the forward-auth routes are documented for.
const FORWARD_METHODS: [&str; 7] = ["get", "post", "put", "patch", "delete", "options", "trace"];

/// The forward-auth routes' paths, with the status each denies with.
const FORWARD_ROUTES: [(&str, u16); 2] = [("/v1/forward-auth/{rule}", 429), ("/v1/auth-request/{rule}", 403)];

/// Sends `method` to the forward-auth route `path` of `rule`, with `headers`.
async fn forward(server: &Slidegate, method: &str, path: &str, rule: &str, headers: &[(&str, &str)]) -> Answer {
    let url = server.url(&path.replace("{rule}", rule));
    let mut request = reqwest::Client::new().request(method.to_uppercase().parse().expect("method"), url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    Answer::from(request.send().await.expect("request")).await
}

#[test]
fn every_route_served_is_in_the_document_and_every_documented_one_is_served() {
    let served: BTreeSet<(String, String)> = slidegate_server::routes::all()
        .into_iter()
        .map(|(method, path, _)| (method.as_str().to_ascii_lowercase(), path.to_owned()))
        .collect();
    let doc: Value = serde_json::from_str(slidegate_server::openapi::DOCUMENT).expect("JSON");
    const METHODS: [&str; 8] = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];
    let documented: BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .expect("paths")
        .iter()
        .flat_map(|(path, item)| {
            let methods = item.as_object().expect("path item").keys().filter(|k| METHODS.contains(&k.as_str()));
            methods.map(move |method| (method.clone(), path.clone()))
        })
        .collect();
    assert!(served.len() >= 16, "{served:?}");
    let undocumented: Vec<_> = served.difference(&documented).collect();
    assert!(undocumented.is_empty(), "served but not in openapi.json: {undocumented:?}");
    let unserved: Vec<_> = documented.difference(&served).collect();
    assert!(unserved.is_empty(), "in openapi.json but not served: {unserved:?}");
}

const RULES: &str = r#"admin_token = "t"

[forward_auth]
trusted_proxies = ["127.0.0.1/32"]

[[rules]]
name = "posts"
limit = 1
window = "60s"
methods = ["POST"]

[[rules]]
name = "sms"
limit = 1
window = "60s"

[[rules]]
name = "api"
limit = 10
window = "60s"
algorithm = "sliding_window"
buckets = 6
warm_up = "30s"
tiers = { vip = { limit = 100 } }
"#;

#[tokio::test]
async fn every_endpoint_answers_as_the_openapi_document_says() {
    let rules = RulesFile::new(RULES);
    let server = Slidegate::serve(&["--config", rules.arg(), "--request-timeout", "300ms"]);
    let served = call(&server, "GET", "/openapi.json", None, None).await;
    let doc: Value = serde_json::from_slice(&served.body).expect("the document is JSON");
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc, serde_json::from_str::<Value>(slidegate_server::openapi::DOCUMENT).expect("JSON"));
    let mut spec = Spec { doc, seen: BTreeSet::new() };
    spec.hold(At::Operation("/openapi.json", "get"), None, &served);

    let check = At::Operation("/v1/check", "post");
    for body in [
        r#"{"rule":"sms","key":"a"}"#,
        r#"{"rule":"sms","key":"a"}"#,
        r#"{"rule":"api","key":"a","tier":"vip","cost":2}"#,
        r#"{"key":"b","limit":5,"window":"10s","algorithm":"gcra","burst":2}"#,
        r#"{"checks":[{"rule":"api","key":"c"},{"key":"c","limit":5,"window":"10s"}]}"#,
        r#"{"checks":[{"rule":"sms","key":"a"},{"key":"c","limit":5,"window":"10s"}]}"#,
        r#"{"rule":"sms""#,
        r#"{"rule":"sms","key":"a","limit":5}"#,
        r#"{"rule":"nope","key":"a"}"#,
    ] {
        let answer = call(&server, "POST", "/v1/check", Some(body), None).await;
        spec.hold(check, Some(&serde_json::from_str(body).unwrap_or(Value::Null)), &answer);
    }
    // Charges and refunds: one, a group, past the limit, and the mistakes a check has.
    let settle = [At::Operation("/v1/charge", "post"), At::Operation("/v1/refund", "post")];
    for (at, path) in settle.iter().zip(["/v1/charge", "/v1/refund"]) {
        for body in [
            r#"{"rule":"api","key":"s","cost":3}"#,
            r#"{"rule":"sms","key":"s"}"#,
            r#"{"rule":"sms","key":"s"}"#,
            r#"{"checks":[{"rule":"api","key":"s","tier":"vip"},{"key":"s","limit":5,"window":"10s","cost":2}]}"#,
            r#"{"rule":"sms","key":"s","cost":2}"#,
            r#"{"rule":"nope","key":"s"}"#,
        ] {
            let answer = call(&server, "POST", path, Some(body), None).await;
            spec.hold(*at, Some(&serde_json::from_str(body).expect("JSON")), &answer);
        }
        spec.hold(
            *at,
            None,
            &call(&server, "POST", path, Some(&format!(r#"{{"rule":"sms","key":"{}"}}"#, "x".repeat(70_000))), None)
                .await,
        );
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 40\r\n\r\n{{\"rule\""
        );
        let base = server.base.clone();
        let slow = tokio::task::spawn_blocking(move || raw(&base, head.as_bytes()));
        spec.hold(*at, None, &slow.await.expect("raw"));
    }
    let denied = call(&server, "POST", "/v1/check", Some(r#"{"rule":"sms","key":"a"}"#), None).await;
    assert_eq!((denied.status, denied.header("retry-after").is_some()), (200, true), "{denied:?}");
    let large = format!(r#"{{"rule":"sms","key":"{}"}}"#, "x".repeat(70_000));
    spec.hold(check, None, &call(&server, "POST", "/v1/check", Some(&large), None).await);
    // A body that never comes whole meets the request deadline.
    let head =
        b"POST /v1/check HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 40\r\n\r\n{\"rule\"";
    let base = server.base.clone();
    let slow = tokio::task::spawn_blocking(move || raw(&base, head));
    spec.hold(check, None, &slow.await.expect("raw"));

    // The forward-auth routes, each method: allowed, denied, outside the rule, a bad cost, an
    // unknown rule, a forwarding header too long.
    let long = "203.0.113.1,".repeat(400);
    for (i, (path, method)) in FORWARD_ROUTES.iter().flat_map(|r| FORWARD_METHODS.map(|m| (r, m))).enumerate() {
        let ((path, denial), at) = (*path, At::Operation(path.0, method));
        let client = format!("203.0.113.{}", i + 10);
        let xff = [("x-forwarded-for", client.as_str())];
        let allowed = forward(&server, method, path, "sms", &xff).await;
        assert_eq!(allowed.status, 200, "{allowed:?}");
        spec.hold(at, None, &allowed);
        let denied = forward(&server, method, path, "sms", &xff).await;
        assert_eq!((denied.status, denied.header("retry-after").is_some()), (denial, true), "{denied:?}");
        spec.hold(at, None, &denied);
        let outside = forward(&server, method, path, "posts", &[("x-forwarded-method", "GET")]).await;
        // Outside the rule: a 200 without the RateLimit headers.
        assert!(outside.status == 200 && outside.header("ratelimit").is_none(), "{outside:?}");
        spec.hold(at, None, &outside);
        spec.hold(at, None, &forward(&server, method, path, "sms", &[("x-ratelimit-cost", "many")]).await);
        spec.hold(at, None, &forward(&server, method, path, "nope", &[]).await);
        spec.hold(at, None, &forward(&server, method, path, "sms", &[("x-forwarded-for", &long)]).await);
    }

    for path in ["/v1/rules", "/metrics", "/healthz", "/readyz"] {
        spec.hold(At::Operation(path, "get"), None, &call(&server, "GET", path, None, None).await);
    }

    let key = "/v1/keys/{rule}/{key}";
    let key_get = At::Operation(key, "get");
    let long = format!("/v1/keys/sms/{}", "k".repeat(600));
    for (method, path, token) in [
        ("get", "/v1/keys/sms/a", Some("t")),
        ("get", "/v1/keys/api/a?tier=vip", Some("t")),
        ("get", "/v1/keys/sms/a?tier=x&tier=y", Some("t")),
        ("get", "/v1/keys/sms/a", None),
        ("get", "/v1/keys/sms/a", Some("wrong")),
        ("get", "/v1/keys/nope/a", Some("t")),
        ("delete", "/v1/keys/sms/a", Some("t")),
        ("delete", long.as_str(), Some("t")),
        ("delete", "/v1/keys/sms/a", None),
        ("delete", "/v1/keys/nope/a", Some("t")),
    ] {
        let answer = call(&server, &method.to_uppercase(), path, None, token).await;
        spec.hold(At::Operation(key, leak(method)), None, &answer);
    }

    // Overrides: set (and set again), inspected, listed a page at a time, deleted.
    let one = At::Operation("/v1/overrides/{rule}/{key}", "put");
    let gone = At::Operation("/v1/overrides/{rule}/{key}", "delete");
    let list = At::Operation("/v1/overrides/{rule}", "get");
    let long_key = format!("/v1/overrides/api/{}", "k".repeat(600));
    let big = format!(r#"{{"limit":1,"ttl":"{}"}}"#, "9".repeat(70_000));
    for (path, body, token) in [
        ("/v1/overrides/api/c1", r#"{"limit":1000,"ttl":"7d"}"#, Some("t")),
        ("/v1/overrides/api/c1", r#"{"limit":50,"window":"10s","algorithm":"gcra","burst":5}"#, Some("t")),
        (
            "/v1/overrides/api/c2",
            r#"{"limit":20,"algorithm":"sliding_window","buckets":4,"warm_up":"5s","cold_fraction":0.5}"#,
            Some("t"),
        ),
        ("/v1/overrides/api/c3", "{}", Some("t")),
        ("/v1/overrides/api/c3", r#"{"limit":1}"#, None),
        ("/v1/overrides/nope/c3", r#"{"limit":1}"#, Some("t")),
        (long_key.as_str(), r#"{"limit":1}"#, Some("t")),
        ("/v1/overrides/api/c3", big.as_str(), Some("t")),
    ] {
        let answer = call(&server, "PUT", path, Some(body), token).await;
        spec.hold(one, serde_json::from_str(body).ok().as_ref(), &answer);
    }
    spec.hold(key_get, None, &call(&server, "GET", "/v1/keys/api/c1", None, Some("t")).await);
    for (path, token) in [
        ("/v1/overrides/api?limit=1", Some("t")),
        ("/v1/overrides/api?limit=0", Some("t")),
        ("/v1/overrides/api", None),
    ] {
        spec.hold(list, None, &call(&server, "GET", path, None, token).await);
    }
    for (path, token) in [
        ("/v1/overrides/api/c1", Some("t")),
        ("/v1/overrides/api/c1", Some("t")),
        ("/v1/overrides/api/c2", None),
        (long_key.as_str(), Some("t")),
    ] {
        spec.hold(gone, None, &call(&server, "DELETE", path, None, token).await);
    }

    // Answers of any route.
    spec.hold(At::Component("NotFound"), None, &call(&server, "GET", "/nope", None, None).await);
    spec.hold(At::Component("MethodNotAllowed"), None, &call(&server, "GET", "/v1/check", None, None).await);
    let big_head = format!("GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n", "a".repeat(20_000));
    let base = server.base.clone();
    let answer = tokio::task::spawn_blocking(move || raw(&base, big_head.as_bytes()));
    spec.hold(At::Component("HeadTooLarge"), None, &answer.await.expect("raw"));

    // Without an admin token: the admin routes are disabled.
    let bare = Slidegate::serve(&[]);
    for method in ["get", "delete"] {
        let answer = call(&bare, &method.to_uppercase(), "/v1/keys/sms/a", None, Some("t")).await;
        spec.hold(At::Operation(key, leak(method)), None, &answer);
    }
    spec.hold(one, None, &call(&bare, "PUT", "/v1/overrides/sms/a", Some(r#"{"limit":1}"#), Some("t")).await);
    spec.hold(gone, None, &call(&bare, "DELETE", "/v1/overrides/sms/a", None, Some("t")).await);
    spec.hold(list, None, &call(&bare, "GET", "/v1/overrides/sms", None, Some("t")).await);

    // The dashboard's data: open by default, behind the admin token with `[ui] require_token`,
    // refused with `[ui] enabled = false`.
    let stats = At::Operation("/v1/stats", "get");
    spec.hold(stats, None, &call(&server, "GET", "/v1/stats", None, None).await);
    let guarded_rules = RulesFile::new("admin_token = \"t\"\n\n[ui]\nrequire_token = true\n");
    let guarded = Slidegate::serve(&["--config", guarded_rules.arg()]);
    for token in [None, Some("wrong"), Some("t")] {
        spec.hold(stats, None, &call(&guarded, "GET", "/v1/stats", None, token).await);
    }
    let off_rules = RulesFile::new("[ui]\nenabled = false\n");
    let off = Slidegate::serve(&["--config", off_rules.arg()]);
    spec.hold(stats, None, &call(&off, "GET", "/v1/stats", None, None).await);
    // The dashboard's page and its files, served and refused; `/` redirects to it.
    for path in ["/ui", "/ui/app.js", "/ui/app.css"] {
        spec.hold(At::Operation(path, "get"), None, &call(&server, "GET", path, None, None).await);
        spec.hold(At::Operation(path, "get"), None, &call(&off, "GET", path, None, None).await);
    }
    let base = server.base.clone();
    let root =
        tokio::task::spawn_blocking(move || raw(&base, b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"));
    spec.hold(At::Operation("/", "get"), None, &root.await.expect("raw"));
    // Over max_connections: one connection held open, the next refused.
    let capped = Slidegate::serve(&["--max-connections", "1"]);
    let base = capped.base.clone();
    let refused = tokio::task::spawn_blocking(move || {
        // Until one is held: the slot of the start's readiness probe may not be free yet.
        let mut held = Vec::new();
        loop {
            assert!(held.len() < 5, "no connection was ever refused");
            held.push(TcpStream::connect(base.trim_start_matches("http://")).expect("connect"));
            std::thread::sleep(Duration::from_millis(200));
            let answer = raw(&base, b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
            if answer.status != 200 {
                return answer;
            }
        }
    });
    spec.hold(At::Component("TooManyConnections"), None, &refused.await.expect("raw"));

    // On Redis: inline checks disabled, a charge the Lua scripts cannot settle, a backend that
    // answers wrongly, a backend gone.
    let mut redis = RedisServer::start();
    let warm = "[[rules]]\nname = \"warm\"\nlimit = 5\nwindow = \"1m\"\nwarm_up = \"30s\"\n";
    let on_redis = RulesFile::new(&format!(
        "{RULES}\n{warm}\n[inline]\nenabled = false\n\n[backend]\nredis = {:?}\n",
        redis.url()
    ));
    let server = Slidegate::serve(&["--config", on_redis.arg(), "--max-overrides", "1"]);
    spec.hold(At::Operation("/readyz", "get"), None, &call(&server, "GET", "/readyz", None, None).await);
    let answer = call(&server, "PUT", "/v1/overrides/api/r1", Some(r#"{"limit":5}"#), Some("t")).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    spec.hold(one, None, &call(&server, "PUT", "/v1/overrides/api/r2", Some(r#"{"limit":5}"#), Some("t")).await);
    let inline = r#"{"key":"b","limit":5,"window":"10s"}"#;
    spec.hold(check, None, &call(&server, "POST", "/v1/check", Some(inline), None).await);
    for at in settle {
        let At::Operation(path, _) = at else { unreachable!("operations") };
        spec.hold(at, None, &call(&server, "POST", path, Some(inline), None).await);
    }
    for at in settle {
        let At::Operation(path, _) = at else { unreachable!("operations") };
        spec.hold(at, None, &call(&server, "POST", path, Some(r#"{"rule":"warm","key":"a"}"#), None).await);
    }
    let _: String = redis.query(&["SET", "slidegate:sms:{wrong}", "a string"]);
    spec.hold(check, None, &call(&server, "POST", "/v1/check", Some(r#"{"rule":"sms","key":"wrong"}"#), None).await);
    for at in settle {
        let At::Operation(path, _) = at else { unreachable!("operations") };
        spec.hold(at, None, &call(&server, "POST", path, Some(r#"{"rule":"sms","key":"wrong"}"#), None).await);
    }
    // The forward-auth routes count this client's address, which holds a string now.
    let _: String = redis.query(&["SET", "slidegate:sms:{127.0.0.1}", "a string"]);
    for ((path, _), method) in FORWARD_ROUTES.iter().flat_map(|r| FORWARD_METHODS.map(|m| (r, m))) {
        spec.hold(At::Operation(path, method), None, &forward(&server, method, path, "sms", &[]).await);
    }
    redis.kill();
    for at in settle {
        let At::Operation(path, _) = at else { unreachable!("operations") };
        spec.hold(at, None, &call(&server, "POST", path, Some(r#"{"rule":"sms","key":"gone"}"#), None).await);
    }
    spec.hold(At::Operation("/readyz", "get"), None, &call(&server, "GET", "/readyz", None, None).await);
    for method in ["get", "delete"] {
        let answer = call(&server, &method.to_uppercase(), "/v1/keys/sms/a", None, Some("t")).await;
        spec.hold(At::Operation(key, leak(method)), None, &answer);
    }
    spec.hold(one, None, &call(&server, "PUT", "/v1/overrides/api/r1", Some(r#"{"limit":6}"#), Some("t")).await);
    spec.hold(gone, None, &call(&server, "DELETE", "/v1/overrides/api/r1", None, Some("t")).await);
    // A degraded decision has its own shape.
    let degraded = call(&server, "POST", "/v1/check", Some(r#"{"rule":"sms","key":"d"}"#), None).await;
    spec.hold(check, None, &degraded);
    assert!(String::from_utf8_lossy(&degraded.body).contains(r#""policy":"fail_open""#));

    let missing: Vec<String> = spec.documented().difference(&spec.seen).cloned().collect();
    assert!(missing.is_empty(), "documented but never answered here: {missing:#?}");
}
