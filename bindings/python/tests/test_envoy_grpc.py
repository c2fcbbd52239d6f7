"""Envoy's rate limit gRPC API from a real client of another stack, Python's grpcio, against the
spawned `slidegate serve`: concurrent calls admitted exactly `limit` times over plaintext and
over TLS; under mutual TLS a client without a certificate, or with one from another CA, refused
at the handshake. Certificates made here (trustme); the request and the answer encoded here, in
the few protobuf fields they use."""

import ssl

import grpc
import pytest
import trustme

from servers import Slidegate, free_port

METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
OK, OVER_LIMIT = 1, 2
LIMIT = 5
ENVOY_CONFIG = f"""
domain: py
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: {LIMIT}
"""


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def request(domain: str, user: str) -> bytes:
    """RateLimitRequest{domain, descriptors: [{entries: [{key: "user", value: user}]}]}."""
    entry = field(1, b"user") + field(2, user.encode())
    return field(1, domain.encode()) + field(2, field(1, entry))


def overall_code(answer: bytes) -> int:
    """RateLimitResponse.overall_code (field 1, a varint); 0 when absent, as protobuf reads it."""
    at = 0

    def read_varint():
        nonlocal at
        shift = value = 0
        while True:
            byte = answer[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    while at < len(answer):
        tag = read_varint()
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value = read_varint()
            if number == 1:
                return value
        elif wire == 2:
            at += read_varint()
        else:
            raise ValueError(f"wire type {wire} in a RateLimitResponse")
    return 0


class Pki:
    """A CA, the server's certificate from it for localhost and 127.0.0.1, and clients' ones."""

    def __init__(self, directory):
        self.dir = directory
        self.ca = trustme.CA()
        self.ca_file = self.write("ca.pem", self.ca.cert_pem)
        server = self.ca.issue_cert("localhost", "127.0.0.1")
        self.cert = self.write("server.pem", server.cert_chain_pems[0])
        self.key = self.write("server.key", server.private_key_pem)

    def write(self, name, blob) -> str:
        path = self.dir / name
        blob.write_to_path(str(path))
        return str(path)

    def client(self, ca=None):
        """(certificate chain, key) PEM bytes of a client certificate from `ca` (this one's)."""
        issued = (ca or self.ca).issue_cert("client.example")
        return b"".join(p.bytes() for p in issued.cert_chain_pems), issued.private_key_pem.bytes()

    def context(self, client=None) -> ssl.SSLContext:
        """An HTTPS client's side: the CA trusted, `client`'s certificate presented."""
        context = ssl.create_default_context(cafile=self.ca_file)
        if client:
            cert, key = self.dir / "health.pem", self.dir / "health.key"
            cert.write_bytes(client[0])
            key.write_bytes(client[1])
            context.load_cert_chain(str(cert), str(key))
        return context


@pytest.fixture
def pki(tmp_path):
    return Pki(tmp_path)


def serve(tmp_path, *flags, tls=None):
    """`slidegate serve --grpc … --envoy-config …` and its gRPC address."""
    config = tmp_path / "envoy"
    config.mkdir(exist_ok=True)
    (config / "py.yaml").write_text(ENVOY_CONFIG)
    address = f"127.0.0.1:{free_port()}"
    return Slidegate("--grpc", address, "--envoy-config", str(config), *flags, tls=tls), address


def channel(address, pki=None, client=None):
    """A plaintext channel, or one over TLS trusting `pki`'s CA and presenting `client`."""
    if pki is None:
        return grpc.insecure_channel(address)
    cert, key = client or (None, None)
    credentials = grpc.ssl_channel_credentials(root_certificates=pki.ca.cert_pem.bytes(), private_key=key,
                                               certificate_chain=cert)
    return grpc.secure_channel(address, credentials, options=[("grpc.ssl_target_name_override", "localhost")])


def call(chan, user: str, domain: str = "py") -> int:
    return overall_code(chan.unary_unary(METHOD)(request(domain, user), timeout=10))


def refused(chan, user: str) -> grpc.StatusCode:
    """The status of a call that must not be answered (on `chan`, closed after)."""
    with chan, pytest.raises(grpc.RpcError) as error:
        call(chan, user)
    return error.value.code()


@pytest.mark.parametrize("over_tls", [False, True], ids=["plaintext", "tls"])
def test_concurrent_calls_are_admitted_exactly_the_limit(tmp_path, pki, over_tls):
    flags = ("--tls-cert", pki.cert, "--tls-key", pki.key) if over_tls else ()
    service, address = serve(tmp_path, *flags, tls=pki.context() if over_tls else None)
    try:
        with channel(address, pki if over_tls else None) as chan:
            stub = chan.unary_unary(METHOD)
            calls = [stub.future(request("py", "alice"), timeout=10) for _ in range(4 * LIMIT)]
            codes = [overall_code(c.result()) for c in calls]
            assert codes.count(OK) == LIMIT and codes.count(OVER_LIMIT) == 3 * LIMIT, codes
            assert call(chan, "bob") == OK, "another user has a limit of its own"
        if over_tls:
            assert refused(channel(address), "carol") == grpc.StatusCode.UNAVAILABLE, "plaintext to a TLS listener"
    finally:
        service.stop()


def test_mutual_tls_refuses_clients_without_a_certificate_of_its_ca(tmp_path, pki):
    mine = pki.client()
    service, address = serve(tmp_path, "--tls-cert", pki.cert, "--tls-key", pki.key, "--tls-client-ca", pki.ca_file,
                             tls=pki.context(mine))
    try:
        assert refused(channel(address, pki), "dave") == grpc.StatusCode.UNAVAILABLE, "no client certificate"
        other = pki.client(trustme.CA())
        assert refused(channel(address, pki, other), "dave") == grpc.StatusCode.UNAVAILABLE, "another CA's"
        with channel(address, pki, mine) as chan:
            assert [call(chan, "dave") for _ in range(LIMIT + 1)] == [OK] * LIMIT + [OVER_LIMIT]
    finally:
        service.stop()

