"""Start the TLS front: make sure a certificate exists, render nginx.conf, exec nginx.

The compose service ``front`` runs ``python docker/front/front.py`` (in the Yimi image,
which has nginx from Debian's packages); ``tests/e2e/test_front.py`` imports this file and uses
the same functions to run the same configuration against a real daphne.

Certificates live in ``YIMI_FRONT_TLS_DIR`` (a volume), generated on the first start and
never part of the repository or the image:

- ``ca.pem`` / ``ca-key.pem``: a local certificate authority, made once (10 years). Install
  ``ca.pem`` on the owner's devices to trust the front.
- ``server.pem`` / ``server-key.pem``: the front's certificate, signed by that CA for the
  host of ``YIMI_PUBLIC_URL``, ``YIMI_FRONT_NAMES``, ``localhost`` and ``127.0.0.1``. Made
  again at start when it is missing, expires within 30 days or names other hosts; a
  certificate put there by the owner (another issuer) is used as it is.

Only the standard library and ``cryptography`` (a dependency of the platform).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

TEMPLATE = Path(__file__).resolve().with_name("nginx.conf.template")
PLACEHOLDER = re.compile(r"@@([A-Z_]+)@@")
# A value goes into nginx.conf as one token: nothing that could end it or open a block.
SAFE_VALUE = re.compile(r"[A-Za-z0-9_./:\[\]-]+")
CA_DAYS = 3650
SERVER_DAYS = 397  # what browsers accept for a server certificate
RENEW_BEFORE = datetime.timedelta(days=30)


def render_config(values: dict[str, str], template: str | None = None) -> str:
    """The nginx configuration with every ``@@NAME@@`` replaced; any name missing from
    ``values``, any value not used and any value that is not a single safe token is an error."""
    text = TEMPLATE.read_text(encoding="utf-8") if template is None else template
    wanted = set(PLACEHOLDER.findall(text))
    if wanted != set(values):
        raise ValueError(f"template needs {sorted(wanted)}, got {sorted(values)}")
    for name, value in values.items():
        if not SAFE_VALUE.fullmatch(value):
            raise ValueError(f"{name}={value!r} is not a plain address or path")
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


def write_config(runtime_dir: Path, values: dict[str, str]) -> Path:
    """Render into ``runtime_dir/nginx.conf`` (``RUNTIME_DIR`` is filled in with it)."""
    runtime_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    conf = runtime_dir / "nginx.conf"
    conf.write_text(render_config({**values, "RUNTIME_DIR": str(runtime_dir)}), encoding="utf-8")
    return conf


def front_names(public_url: str, extra: str = "") -> list[str]:
    """Host names and addresses the server certificate is for, in a stable order."""
    names = ["localhost", "127.0.0.1"]
    host = urlsplit(public_url.strip()).hostname if public_url.strip() else None
    candidates = [host or "", *extra.split(",")]
    for name in (c.strip().lower() for c in candidates):
        if name and name not in names:
            names.append(name)
    return names


def _subject_alternative_names(names: Iterable[str]) -> list[x509.GeneralName]:
    alternatives: list[x509.GeneralName] = []
    for name in names:
        try:
            alternatives.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alternatives.append(x509.DNSName(name))
    return alternatives


def _write_private(path: Path, data: bytes) -> None:
    """Write ``path`` with mode 0600 (replacing it atomically)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _load_or_create_ca(tls_dir: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert_path, key_path = tls_dir / "ca.pem", tls_dir / "ca-key.pem"
    if cert_path.exists() and key_path.exists():
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        return x509.load_pem_x509_certificate(cert_path.read_bytes()), key
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"Yimi local CA {os.urandom(4).hex()}")])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_private(key_path, _pem_key(key))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    cert_path.chmod(0o644)
    return cert, key


def _server_needs_renewal(cert_path: Path, ca: x509.Certificate, names: list[str]) -> bool:
    if not cert_path.exists():
        return True
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    if cert.issuer != ca.subject:
        return False  # the owner's own certificate: theirs to renew
    try:
        present = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return True
    return set(present) != set(_subject_alternative_names(names)) or cert.not_valid_after_utc - _now() < RENEW_BEFORE


def ensure_certificates(tls_dir: Path, names: list[str]) -> tuple[Path, Path]:
    """The server certificate and key for ``names`` in ``tls_dir``, made (with the local CA)
    when needed. Returns ``(server.pem, server-key.pem)``."""
    tls_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    ca, ca_key = _load_or_create_ca(tls_dir)
    cert_path, key_path = tls_dir / "server.pem", tls_dir / "server-key.pem"
    if not key_path.exists() or _server_needs_renewal(cert_path, ca, names):
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, (names[2:] or names)[0][:64])]))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=SERVER_DAYS))
            .add_extension(x509.SubjectAlternativeName(_subject_alternative_names(names)), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
            )
            .sign(ca_key, hashes.SHA256())
        )
        _write_private(key_path, _pem_key(key))
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        cert_path.chmod(0o644)
    return cert_path, key_path


def container_resolver(resolv_conf: Path = Path("/etc/resolv.conf")) -> str:
    """The container's DNS server, which answers the compose service names: the first IPv4
    ``nameserver`` of ``resolv_conf`` (Docker: 127.0.0.11; podman: its network's gateway),
    else Docker's 127.0.0.11."""
    try:
        lines = resolv_conf.read_text(encoding="utf-8").splitlines()
    except OSError:
        lines = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "nameserver":
            try:
                if ipaddress.ip_address(fields[1]).version == 4:
                    return fields[1]
            except ValueError:
                continue
    return "127.0.0.11"


def main() -> None:
    env = os.environ
    tls_dir = Path(env.get("YIMI_FRONT_TLS_DIR", "/tls"))
    runtime_dir = Path(env.get("YIMI_FRONT_RUNTIME_DIR", "/tmp/yimi-front"))
    names = front_names(env.get("YIMI_PUBLIC_URL", ""), env.get("YIMI_FRONT_NAMES", ""))
    cert, key = ensure_certificates(tls_dir, names)
    conf = write_config(
        runtime_dir,
        {
            "LISTEN": env.get("YIMI_FRONT_LISTEN", "8443"),
            "UPSTREAM": env.get("YIMI_FRONT_UPSTREAM", "web:8000"),
            "RESOLVER": env.get("YIMI_FRONT_RESOLVER") or container_resolver(),
            "TLS_CERT": str(cert),
            "TLS_KEY": str(key),
            "ACCESS_LOG": env.get("YIMI_FRONT_ACCESS_LOG", "off"),
        },
    )
    print(f"yimi front: TLS for {', '.join(names)}; local CA certificate: {tls_dir / 'ca.pem'}", file=sys.stderr, flush=True)
    os.execvp("nginx", ["nginx", "-p", str(runtime_dir), "-c", str(conf), "-e", "stderr"])


if __name__ == "__main__":
    main()
