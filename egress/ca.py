"""The proxy's CA: created on first start and kept, so restored sandboxes keep
trusting it. Only its certificate ever reaches a sandbox. The leaf certificates of
intercepted hosts are issued in memory (`issue_leaf`, kept by `egress.tls`)."""

import datetime
import fcntl
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

SYSTEM_TRUST_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


@dataclass(frozen=True)
class CaFiles:
    directory: Path

    @property
    def key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def signing_key(self) -> Path:
        """The key of every leaf certificate proxy.py issues."""
        return self.directory / "signing.key"

    @property
    def leaf_dir(self) -> Path:
        return self.directory / "certificates"

    @property
    def upstream_trust(self) -> Path:
        return self.directory / "upstream-trust.pem"

    def cert_pem(self) -> str:
        return self.cert.read_text()


def _write_private(path: Path, data: bytes) -> None:
    temporary = path.with_suffix(".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(temporary, path)


def _pem(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def ensure_ca(directory: Path) -> CaFiles:
    """Creates the CA once; later calls return the existing one unchanged."""
    files = CaFiles(Path(directory))
    files.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    files.leaf_dir.mkdir(exist_ok=True, mode=0o700)
    with open(files.directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the proxy and a worker may start at once
        _create_missing(files)
    return files


def _create_missing(files: CaFiles) -> None:
    if not files.key.exists() or not files.cert.exists():
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Quor Sandbox egress CA")])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        _write_private(files.key, _pem(key))
        files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if not files.signing_key.exists():
        _write_private(files.signing_key, _pem(rsa.generate_private_key(65537, 2048)))


def write_upstream_trust(files: CaFiles, extra_bundle: str) -> Path:
    """The certificates the proxy trusts upstream: the host's store plus the extra bundle."""
    parts = [Path(SYSTEM_TRUST_BUNDLE).read_text()]
    if extra_bundle and Path(extra_bundle).resolve() != Path(SYSTEM_TRUST_BUNDLE).resolve():
        parts.append(Path(extra_bundle).read_text())
    # Whole or not at all: a proxy still running reads it as it starts a TLS context.
    partial = files.upstream_trust.with_name(files.upstream_trust.name + f".{os.getpid()}")
    partial.write_text("\n".join(parts))
    os.replace(partial, files.upstream_trust)
    return files.upstream_trust


LEAF_DAYS = 30


def issue_leaf(ca_key, ca_cert: x509.Certificate, host: str, leaf_key) -> x509.Certificate:
    """A certificate for `host` alone (an IP address as such), signed by the CA."""
    try:
        name = x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        name = x509.DNSName(host)
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
        .issuer_name(ca_cert.subject)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=LEAF_DAYS))
        .add_extension(x509.SubjectAlternativeName([name]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
