"""A STAND-IN for Kubeflow Trainer's status server (pkg/statusserver, v2.3.0): an HTTPS server on
127.0.0.1 with a certificate from its own throwaway CA, that records every POST and answers
with the status code a test chooses.

It does not check the token against a TokenReview or apply the status to a TrainJob: the real
server is exercised once the local control plane runs the Trainer controller. What it does
check is what the real one checks before that: the path it serves
(`POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/{name}/status`), an RFC 7235
`Bearer` header, and a JSON body.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

STATUS_PATH = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs/ft-job/status"


@dataclass
class Received:
    path: str
    authorization: str
    content_type: str
    body: dict[str, Any]


@dataclass
class StandInStatusServer:
    """Start with `start(directory)`; `url`, `ca_file` and `token_file` are what the
    trainjobstatus plugin would put in the trainer's environment."""

    answer: int = 200
    received: list[Received] = field(default_factory=list)
    url: str = ""
    ca_file: Path = Path()
    token_file: Path = Path()
    token: str = "stand-in-token"
    _server: ThreadingHTTPServer | None = None

    def environ(self) -> dict[str, str]:
        return {
            "KUBEFLOW_TRAINER_SERVER_URL": self.url,
            "KUBEFLOW_TRAINER_SERVER_TOKEN": str(self.token_file),
            "KUBEFLOW_TRAINER_SERVER_CA_CERT": str(self.ca_file),
        }

    def start(self, directory: Path) -> StandInStatusServer:
        cert_file, key_file = _certificates(directory)
        self.ca_file = directory / "ca.crt"
        self.token_file = directory / "token"
        # Projected token files end without a newline; a trailing one must not matter either.
        self.token_file.write_text(self.token + "\n")
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                stand_in.received.append(
                    Received(
                        path=self.path,
                        authorization=self.headers.get("Authorization", ""),
                        content_type=self.headers.get("Content-Type", ""),
                        body=json.loads(self.rfile.read(length)),
                    )
                )
                self.send_response(stand_in.answer)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: Any) -> None:
                return None

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        self._server = server
        self.url = f"https://127.0.0.1:{server.server_address[1]}{STATUS_PATH}"
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def _certificates(directory: Path) -> tuple[Path, Path]:
    """A CA (written to ca.crt) and a server certificate for 127.0.0.1 that it signed."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "stand-in status server CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    (directory / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file, key_file = directory / "server.crt", directory / "server.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file
