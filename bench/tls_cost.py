#!/usr/bin/env python3
"""What TLS on the listeners costs a decision: instructions of `slidegate serve` (memory backend)
per `/v1/check` over HTTP and over HTTPS, and per `ShouldRateLimit` over gRPC with and without
TLS (`--tls-cert`/`--tls-key`, an ECDSA P-256 certificate made here), each under callgrind.
HTTP: wrk with 64 kept-alive connections, as in bench/http_cost.py (whose measurement this
reuses). gRPC: h2load's W1 as in bench/grpc_floor.py (one connection, 64 streams, one hot
descriptor; bench/envoy/bench.yaml). Each load opens its connections anew, so each figure is
the difference between a load of `--seconds` and one of twice that: the handshakes left out,
the steady state of a proxy's pooled connections.

    cargo build --release -p slidegate-server --features bench --bin slidegate
    python3 bench/tls_cost.py [--seconds 5]   # needs valgrind, wrk, h2load (nghttp2-client), openssl

Loopback only; every process started here is ended here.
"""
import argparse, glob, os, shutil, ssl, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grpc_floor  # noqa: E402
import http_cost  # noqa: E402
from http_cost import SHAPES, free_port, server_cost, total  # noqa: E402


def certificate(d):
    """A self-signed certificate for 127.0.0.1 in `d`: (cert, key)."""
    cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


def grpc_cost(cmd, grpc, scheme, seconds, workdir):
    """Instructions per `ShouldRateLimit` of `cmd` (a server on port `grpc`) under h2load's W1,
    the connection's set-up left out as for HTTP."""
    out = os.path.join(workdir, f"callgrind.grpc.{scheme}")
    server = grpc_floor.start(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *cmd], grpc, 120)

    def measured(s):
        subprocess.run(["callgrind_control", "-z", str(server.pid)], check=True, capture_output=True)
        run = subprocess.run(grpc_floor.h2load_cmd(grpc, s, workdir, scheme=scheme), capture_output=True, text=True,
                             timeout=s + 120)
        subprocess.run(["callgrind_control", "-d", str(server.pid)], check=True, capture_output=True)
        dump = max(glob.glob(out + ".*"), key=lambda d: int(d.rsplit(".", 1)[1]))
        return total(dump), grpc_floor.h2load_report(run.stdout)[0]

    try:
        measured(1)
        (short, short_calls), (long, long_calls) = measured(seconds), measured(2 * seconds)
    finally:
        server.terminate()
        server.wait(120)
    return (long - short) / (long_calls - short_calls)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--bin-dir", default=http_cost.REL, help="where slidegate is (default: target/release)")
    a = ap.parse_args()
    slidegate = os.path.join(a.bin_dir, "slidegate")
    d = tempfile.mkdtemp(prefix="tls-cost-")
    cert, key = certificate(d)
    trusting_it = ssl.create_default_context(cafile=cert)
    print("| shape | HTTP (instr./req) | HTTPS (instr./req) | ratio |")
    print("|---|---|---|---|")
    try:
        for shape, (keys, window) in SHAPES.items():
            port = free_port()
            plain, _, plain_errors = server_cost([slidegate, "serve", "--http", f"127.0.0.1:{port}"], port, keys, window,
                                      a.seconds, None, f"http-{shape}", marginal=True)
            port = free_port()
            tls, _, tls_errors = server_cost([slidegate, "serve", "--http", f"127.0.0.1:{port}", "--tls-cert", cert,
                                     "--tls-key", key], port, keys, window, a.seconds, None, f"https-{shape}",
                                    scheme="https", context=trusting_it, marginal=True)
            if plain_errors or tls_errors:
                raise SystemExit(f"answers that were not 2xx: {plain_errors} over HTTP, {tls_errors} over HTTPS")
            print(f"| {shape} | {plain:,.0f} | {tls:,.0f} | **{tls / plain:.2f}** |", flush=True)
        print("\n| shape | gRPC (instr./call) | gRPC over TLS (instr./call) | ratio |")
        print("|---|---|---|---|")
        envoy = os.path.join(http_cost.ROOT, "bench", "envoy")
        serve = lambda grpc: [slidegate, "serve", "--http", f"127.0.0.1:{free_port()}", "--grpc", f"127.0.0.1:{grpc}",
                              "--envoy-config", envoy]
        grpc = free_port()
        plain = grpc_cost(serve(grpc), grpc, "http", a.seconds, d)
        grpc = free_port()
        tls = grpc_cost(serve(grpc) + ["--tls-cert", cert, "--tls-key", key], grpc, "https", a.seconds, d)
        print(f"| W1 (h2load) | {plain:,.0f} | {tls:,.0f} | **{tls / plain:.2f}** |", flush=True)
    finally:
        shutil.rmtree(d)


if __name__ == "__main__":
    main()
