"""Real processes for the tests: redis-server (alone, with slidegate's module, or as a Cluster)
and the `slidegate` binary, each on a free loopback port, each stopped by its own pid."""

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Optional

import redis

ROOT = Path(__file__).resolve().parents[3]
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "debug"
MODULE = TARGET / "libslidegate_module.so"
SLIDEGATE = TARGET / "slidegate"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition, what: str, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {within} s")
        time.sleep(0.02)


class RedisServer:
    """A redis-server child process with no persistence, in a directory of its own."""

    def __init__(self, *args: str, module: bool = False, port: Optional[int] = None):
        self.dir = tempfile.mkdtemp(prefix="slidegate-py-redis-")
        self.port = port or free_port()
        command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                   "--appendonly", "no", "--enable-debug-command", "yes", "--dir", self.dir, *args]
        if module:
            if not MODULE.exists():
                raise FileNotFoundError(f"{MODULE}: build the workspace first (cargo build --workspace)")
            command += ["--loadmodule", str(MODULE)]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"redis://127.0.0.1:{self.port}"
        wait_for(self.answers, f"redis-server on port {self.port} answering")

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=5)

    def answers(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"redis-server on port {self.port} exited with {self.process.returncode}")
        try:
            return self.client().ping()
        except redis.ConnectionError:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisCluster:
    """Three masters created with `redis-cli --cluster create`."""

    def __init__(self, masters: int = 3):
        self.nodes = []
        try:
            for _ in range(masters):
                bus = str(free_port())
                self.nodes.append(RedisServer("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                                              "--cluster-port", bus))
            subprocess.run(["redis-cli", "--cluster", "create", *[f"127.0.0.1:{n.port}" for n in self.nodes],
                            "--cluster-replicas", "0", "--cluster-yes"], check=True, capture_output=True)
            wait_for(self.is_ok, "cluster_state:ok", within=30)
        except BaseException:
            self.stop()
            raise
        self.urls = [n.url for n in self.nodes]

    def is_ok(self) -> bool:
        return all(b"cluster_state:ok" in n.client().execute_command("CLUSTER", "INFO") for n in self.nodes)

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


class Slidegate:
    """`slidegate serve` from target/debug, on a free port, until stopped; over HTTPS when given
    `tls`, the client's side of it (the CA trusted, and a certificate when the server asks)."""

    def __init__(self, *args: str, tls: Optional[ssl.SSLContext] = None):
        if not SLIDEGATE.exists():
            raise FileNotFoundError(f"{SLIDEGATE}: build the workspace first (cargo build --workspace)")
        self.port = free_port()
        self.tls = tls
        self.base = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="slidegate-py-serve-", suffix=".log", delete=False)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLIDEGATE_") and k != "RUST_LOG"}
        self.process = subprocess.Popen([str(SLIDEGATE), "serve", "--http", f"127.0.0.1:{self.port}", *args],
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log, env=env)
        wait_for(self.healthy, "slidegate /healthz")

    def healthy(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"slidegate exited: {Path(self.log.name).read_text()}")
        try:
            with urllib.request.urlopen(f"{self.base}/healthz", timeout=1, context=self.tls) as r:
                return r.status == 200
        except OSError:
            return False

    def post(self, path: str, body: dict) -> dict:
        request = urllib.request.Request(f"{self.base}{path}", data=json.dumps(body).encode(),
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=5, context=self.tls) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=10)
        os.unlink(self.log.name)
