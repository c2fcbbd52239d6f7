#!/usr/bin/env python3
"""What TLS on the listener costs a check: instructions per `/v1/check` of `slidegate serve`
(memory backend) over HTTP and over HTTPS (`--tls-cert`/`--tls-key`, an ECDSA P-256 certificate
made here), each under callgrind and loaded by wrk with 64 kept-alive connections, as in
bench/http_cost.py (whose measurement this reuses): the handshakes happen before the counters
are zeroed, so the figure is the steady state of a proxy's pooled connections.

    cargo build --release -p slidegate-server --features bench --bin slidegate
    python3 bench/tls_cost.py [--seconds 5]   # needs valgrind, wrk, openssl

Loopback only; every process started here is ended here.
"""
import argparse, os, shutil, ssl, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import http_cost  # noqa: E402
from http_cost import SHAPES, free_port, server_cost  # noqa: E402


def certificate(d):
    """A self-signed certificate for 127.0.0.1 in `d`: (cert, key)."""
    cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


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
                                      a.seconds, None, f"http-{shape}")
            port = free_port()
            tls, _, tls_errors = server_cost([slidegate, "serve", "--http", f"127.0.0.1:{port}", "--tls-cert", cert,
                                     "--tls-key", key], port, keys, window, a.seconds, None, f"https-{shape}",
                                    scheme="https", context=trusting_it)
            if plain_errors or tls_errors:
                raise SystemExit(f"answers that were not 2xx: {plain_errors} over HTTP, {tls_errors} over HTTPS")
            print(f"| {shape} | {plain:,.0f} | {tls:,.0f} | **{tls / plain:.2f}** |", flush=True)
    finally:
        shutil.rmtree(d)


if __name__ == "__main__":
    main()
