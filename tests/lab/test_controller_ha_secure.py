"""etcd is not a back door, on real etcd and real ``modelcast-controller`` processes (issue
46, finding 2): etcd over TLS with client certificates and with etcd users, as the
controller's ``--etcd-*`` options configure it; the first review's attack re-run (a
leader key planted in etcd, pointing at a listening server, got the admin's token from a
follower): now it gets no request at all, the instances elect a leader once it is gone,
and etcd holds no session key."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import secrets
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from controller.store import EtcdSecurity, EtcdStore, StoreError, parse_store_url
from lab import etcd as lab_etcd
from lab.controller import Controller
from lab.sh import free_port
from tests.support.controller_lab import health, wait_for
from tests.support.lab import skip_or_fail

pytestmark = pytest.mark.lab  # real etcd and controller processes

TOKEN = "admin-token-for-the-lab"


# -- certificates and an etcd of our own ---------------------------------------------------
def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _cert(subject: str, key: Any, issuer: x509.Certificate | None, issuer_key: Any,
          ca: bool = False, ip: str | None = None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    b = (x509.CertificateBuilder().subject_name(name)
         .issuer_name(issuer.subject if issuer is not None else name)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5))
         .not_valid_after(now + datetime.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ip is not None:
        b = b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]),
                            critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def make_pki(where: Path) -> dict[str, str]:
    """A CA, etcd's server certificate for 127.0.0.1 and a controller's client certificate."""
    ca_key = _key()
    ca = _cert("modelcast test CA", ca_key, None, ca_key, ca=True)
    files: dict[str, str] = {}

    def write(name: str, cert: x509.Certificate, key: Any) -> None:
        (where / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (where / f"{name}-key.pem").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        files[name], files[f"{name}-key"] = str(where / f"{name}.pem"), str(where / f"{name}-key.pem")

    write("ca", ca, ca_key)
    server_key, client_key = _key(), _key()
    write("server", _cert("etcd", server_key, ca, ca_key, ip="127.0.0.1"), server_key)
    write("client", _cert("modelcast-controller", client_key, ca, ca_key), client_key)
    return files


class OwnEtcd:
    """A single-node etcd with the flags a test needs (TLS), stopped by PID."""

    def __init__(self, workdir: Path, pki: dict[str, str] | None = None) -> None:
        self.workdir, self.pki = workdir, pki
        self.port, self.peer = free_port(), free_port()
        self.proc: subprocess.Popen | None = None
        scheme = "https" if pki else "http"
        self.client_url = f"{scheme}://127.0.0.1:{self.port}"

    @property
    def store_url(self) -> str:
        return f"etcd://127.0.0.1:{self.port}"

    def start(self) -> None:
        tls = ["--cert-file", self.pki["server"], "--key-file", self.pki["server-key"],
               "--trusted-ca-file", self.pki["ca"], "--client-cert-auth"] if self.pki else []
        peer = f"http://127.0.0.1:{self.peer}"
        log = self.workdir / f"etcd-{self.port}.log"
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                [lab_etcd.ETCD, "--name", "lab", "--data-dir", str(self.workdir / f"etcd-{self.port}"),
                 "--listen-client-urls", self.client_url, "--advertise-client-urls", self.client_url,
                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"lab={peer}", *tls],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        kw: dict[str, Any] = {"verify": self.pki["ca"], "cert": (self.pki["client"], self.pki["client-key"])} \
            if self.pki else {}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, log.read_text()[-3000:]
            try:
                if requests.get(f"{self.client_url}/health", timeout=1, **kw).ok:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise AssertionError(f"etcd did not start:\n{log.read_text()[-3000:]}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


@pytest.fixture
def etcd_factory(tmp_path: Path) -> Iterator[Any]:
    why = lab_etcd.available()
    if why:
        skip_or_fail(why)
    made: list[OwnEtcd] = []

    def make(pki: dict[str, str] | None = None) -> OwnEtcd:
        e = OwnEtcd(tmp_path, pki)
        made.append(e)
        e.start()
        return e

    yield make
    for e in made:
        e.stop()


@pytest.fixture
def controllers(tmp_path: Path) -> Iterator[Any]:
    """Start ``modelcast-controller`` instances sharing one secret; stopped afterwards."""
    secret = tmp_path / "cluster-secret"
    secret.write_text(secrets.token_urlsafe(32))
    made: list[Controller] = []

    def start(store: str, n: int, more: list[str]) -> list[Controller]:
        for i in range(n):
            c = Controller(tmp_path, token=TOKEN, store=store, name=f"c{len(made)}",
                           args=["--cluster-secret-file", str(secret), *more])
            made.append(c)
            c.start()
        return made[-n:]

    yield start
    for c in made:
        c.stop()


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# -- TLS and users ----------------------------------------------------------------------------
def test_tls_with_a_client_certificate_is_required_and_used(tmp_path, etcd_factory, controllers):
    pki = make_pki(tmp_path)
    etcd = etcd_factory(pki)
    url = parse_store_url(etcd.store_url)
    with pytest.raises(StoreError):  # plain HTTP to a TLS etcd
        EtcdStore(url).grant(2)
    with pytest.raises(StoreError):  # TLS, but no client certificate: etcd refuses
        EtcdStore(url, security=EtcdSecurity(ca=pki["ca"])).grant(2)
    store = EtcdStore(url, security=EtcdSecurity(ca=pki["ca"], cert=pki["client"], key=pki["client-key"]))
    lease, _ = store.grant(2)
    assert store.campaign(b"{}", lease)[2] == lease and store.load() is None
    store.resign(lease)
    # two real instances with the options: one leads, a follower forwards, etcd holds no key
    a, b = controllers(etcd.store_url, 2, ["--etcd-ca", pki["ca"], "--etcd-cert", pki["client"],
                                           "--etcd-key", pki["client-key"]])
    assert wait_for(lambda: sorted(health(c).get("role", "") for c in (a, b)) == ["follower", "leader"], 15)
    follower = a if health(a)["role"] == "follower" else b
    r = follower.api("POST", "/v1/groups", json={"model": "m", "source": "10.0.0.1", "receivers": ["10.0.0.2"]})
    assert r.status_code == 201, r.text
    key = r.json()["key"]
    stored = b"".join((store.load() or {}).values())
    assert b"aesgcm:" in stored and key.encode() not in stored and bytes.fromhex(key) not in stored


def test_an_etcd_user_with_its_password_and_no_one_else(tmp_path, etcd_factory, controllers):
    etcd = etcd_factory()
    api = f"{etcd.client_url}/v3"
    prefix = "/modelcast/"
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    for path, body in (("auth/user/add", {"name": "root", "password": "root-pw"}),
                       ("auth/role/add", {"name": "root"}),
                       ("auth/user/grant", {"user": "root", "role": "root"}),
                       ("auth/user/add", {"name": "modelcast", "password": "mc-pw"}),
                       ("auth/role/add", {"name": "modelcast"}),
                       ("auth/role/grant", {"name": "modelcast", "perm": {
                           "permType": "READWRITE", "key": _b64(prefix), "range_end": _b64(end)}}),
                       ("auth/user/grant", {"user": "modelcast", "role": "modelcast"}),
                       ("auth/enable", {})):
        r = requests.post(f"{api}/{path}", json=body, timeout=5)
        assert r.ok, (path, r.text)
    url = parse_store_url(etcd.store_url)
    with pytest.raises(StoreError):
        EtcdStore(url).load()  # no user: refused
    with pytest.raises(StoreError):
        EtcdStore(url, security=EtcdSecurity(user="modelcast", password="wrong")).load()
    store = EtcdStore(url, security=EtcdSecurity(user="modelcast", password="mc-pw"))
    lease, _ = store.grant(2)
    _, generation, _ = store.campaign(b"{}", lease)
    store.fence = generation
    store.save({"meta": b'{"version": 1}'})
    assert store.load() == {"meta": b'{"version": 1}'}
    store.resign(lease)
    outside = EtcdStore(parse_store_url(etcd.store_url, "/other/"),
                        security=EtcdSecurity(user="modelcast", password="mc-pw"))
    with pytest.raises(StoreError):  # its role covers the prefix only
        outside.load()
    password = tmp_path / "etcd-password"
    password.write_text("mc-pw\n")
    (c,) = controllers(etcd.store_url, 1, ["--etcd-user", "modelcast", "--etcd-password-file", str(password)])
    assert wait_for(lambda: health(c).get("role") == "leader", 15)
    assert c.api("POST", "/v1/groups", json={"model": "m", "source": "10.0.0.1"}).status_code == 201


# -- the first review's attack ------------------------------------------------------------------
class Listener:
    """An HTTP server on loopback that records what it is sent (the planted "leader")."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                seen.append(dict(self.headers))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            do_GET = do_POST = do_PUT = do_DELETE = _any

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_planted_leader_key_gets_no_request_and_no_token(etcd_factory, controllers):
    etcd = etcd_factory()
    listener = Listener()
    try:
        api = f"{etcd.client_url}/v3"
        lease = int(requests.post(f"{api}/lease/grant", json={"TTL": 60}, timeout=5).json()["ID"])
        planted = json.dumps({"id": "evil", "url": listener.url}).encode()
        r = requests.post(f"{api}/kv/put", json={"key": _b64("/modelcast/leader"),
                                                 "value": base64.b64encode(planted).decode(),
                                                 "lease": str(lease)}, timeout=5)
        assert r.ok, r.text
        a, b = controllers(etcd.store_url, 2, [])
        time.sleep(3)  # several election steps
        for c in (a, b):
            assert health(c).get("leader") is None, health(c)
            r = c.api("POST", "/v1/groups", json={"model": "m", "source": "10.0.0.1"})
            assert r.status_code == 503, r.text
        assert listener.seen == []
        # the planted key gone, an instance of ours is elected and serves
        requests.post(f"{api}/kv/lease/revoke", json={"ID": lease}, timeout=5)
        assert wait_for(lambda: sorted(health(c).get("role", "") for c in (a, b)) == ["follower", "leader"], 15)
        assert a.api("POST", "/v1/groups", json={"model": "m", "source": "10.0.0.1"}).status_code == 201
        assert listener.seen == []
    finally:
        listener.close()
