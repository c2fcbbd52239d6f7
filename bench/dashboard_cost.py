#!/usr/bin/env python3
"""What recording the dashboard's traffic (issue 21) costs a decision: `slidegate serve` on the
memory backend under callgrind, N and then 3N checks of a named rule sent one at a time over one
kept-alive connection, and the difference divided by 2N: instructions per check, the start and
stop cancelled out. Counted twice: the whole server, and only inside the timed route future of /v1/check (where
recording happens; the rest of the server does not change, and its count varies by a few
hundred instructions from run to run with its threads' polling).

Shapes: W1, one hot key (100 per 10 s: nearly every check a denial, so every one counts a key
in the sketch) and W2, 10,000 keys drawn in turn (100 per 60 s: nearly every check admitted).
Each binary is measured with the dashboard on and, as the nearest thing to a build without it,
with `[ui] enabled = false`.

    cargo build --release -p slidegate-server --bin slidegate
    python3 bench/dashboard_cost.py [--before path/to/main's/slidegate] [--n 4000]

Loopback only; every process started here is ended here.
"""
import argparse, http.client, json, os, re, signal, socket, subprocess, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = {"W1": (1, "10s"), "W2": (10_000, "60s")}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def instructions(binary, rules, n, keys, handler):
    """Callgrind's total for a server that answered `n` checks, then stopped: the whole
    process's, or (`handler`) only the instructions inside the check handler."""
    port = free_port()
    out = tempfile.mktemp(prefix="callgrind.", dir=tempfile.gettempdir())
    only = ["--toggle-collect=<slidegate_server::api::TimedFuture*"] if handler else []
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *only, binary, "serve",
         "--http", f"127.0.0.1:{port}", "--config", rules],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                conn.request("GET", "/healthz")
                conn.getresponse().read()
                break
            except OSError:
                if time.time() > deadline:
                    raise SystemExit("the server did not come up under valgrind")
                time.sleep(0.2)
        for i in range(n):
            body = json.dumps({"rule": "bench", "key": f"k{i % keys}"})
            conn.request("POST", "/v1/check", body, {"Content-Type": "application/json"})
            conn.getresponse().read()
        conn.close()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)
    with open(out) as f:
        total = next(int(m.group(1)) for line in f if (m := re.match(r"summary: (\d+)", line)))
    os.unlink(out)
    return total


def per_check(binary, shape, ui_enabled, n, handler):
    keys, window = SHAPES[shape]
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        if ui_enabled is not None:
            f.write(f"[ui]\nenabled = {'true' if ui_enabled else 'false'}\n\n")
        f.write(f'[[rules]]\nname = "bench"\nlimit = 100\nwindow = "{window}"\n')
    try:
        low, high = (instructions(binary, f.name, m, keys, handler) for m in (n, 3 * n))
    finally:
        os.unlink(f.name)
    return (high - low) / (2 * n)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--after", default=os.path.join(ROOT, "target", "release", "slidegate"))
    p.add_argument("--before", help="a build without the dashboard (main before it)")
    p.add_argument("--n", type=int, default=4000)
    a = p.parse_args()
    for shape in SHAPES:
        # The whole server's work per check, and the part the dashboard can change: the check
        # handler's (decoding, deciding, counting, the answer), which repeats to a few
        # instructions where the whole process varies by a few hundred (its threads' polling).
        whole = per_check(a.before or a.after, shape, None if a.before else True, a.n, False)
        row = {}
        if a.before:
            row["before"] = per_check(a.before, shape, None, a.n, True)
        row["ui off"] = per_check(a.after, shape, False, a.n, True)
        row["ui on"] = per_check(a.after, shape, True, a.n, True)
        base = row.get("before", row["ui off"])
        cells = ", ".join(f"{k} {v:,.0f}" for k, v in row.items())
        added = row["ui on"] - base
        print(f"{shape}: server {whole:,.0f} per check; handler: {cells}; "
              f"recording adds {added:,.0f} = {100 * added / whole:.1f}% of the server's")


if __name__ == "__main__":
    main()
