"""Certificates and keys for a deployment: a CA, the SuperLink's server certificate, operators'
client certificates and SuperNode key pairs (``fedvls deploy certs``).

Made with the ``cryptography`` package (a Flower dependency): an EC P-256 CA, a server
certificate whose subjectAltName lists every ``--host`` (IP addresses as IP entries, names as
DNS entries), ``clientAuth`` certificates for operators, and EC P-384 SuperNode keys in OpenSSH
format, the format ``flwr supernode register`` and ``flower-supernode
--auth-supernode-private-key`` read. Private keys are written with mode 0600.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedvls_flwr.ops.flower_cli import TlsFiles


@dataclass(frozen=True)
class CertificateSet:
    tls: TlsFiles
    ca_key: Path
    supernode_keys: dict[str, tuple[Path, Path]]  # name -> (private key, public key)
    operator_cert: Path | None = None  # the client certificate the fence admits to the Control API
    operator_key: Path | None = None


# The SuperLink behind the fence listens on 127.0.0.1: its own SuperExec dials that IP and
# nginx verifies it under the name localhost, so the server certificate always lists both.
LOOPBACK_NAMES = ("127.0.0.1", "localhost")


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if private:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(path, 0o600)
    else:
        path.write_bytes(data)


def _san_entries(hosts: list[str]) -> list:
    from cryptography import x509

    entries: list[x509.GeneralName] = []
    for host in hosts:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            entries.append(x509.DNSName(host))
    return entries


def _pem_key(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _leaf_certificate(
    ca_key: Any, ca_cert: Any, subject: str, public_key: Any, *, server_hosts: list[str] | None, days: int
) -> Any:
    """A certificate signed by the CA: for a TLS server (subjectAltName = ``server_hosts``,
    serverAuth) when ``server_hosts`` is given, else for a TLS client (clientAuth)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = _dt.datetime.now(_dt.UTC) - _dt.timedelta(minutes=5)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=server_hosts is not None,
                data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server_hosts is not None else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
                ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
            ),
            critical=False,
        )
    )
    if server_hosts is not None:
        builder = builder.add_extension(x509.SubjectAlternativeName(_san_entries(server_hosts)), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def missing_loopback_names(server_cert: Path) -> list[str]:
    """The entries of :data:`LOOPBACK_NAMES` that ``server_cert``'s subjectAltName lacks,
    as ``IP:127.0.0.1`` / ``DNS:localhost``.

    Behind the fence nginx dials the SuperLink as ``localhost`` and the SuperLink's own
    SuperExec dials ``127.0.0.1``: a certificate without them fails far from its cause (the
    SuperExec dies at start, nginx answers 502 to everything, SuperNodes log only
    "Connection attempt failed")."""
    from cryptography import x509

    certificate = x509.load_pem_x509_certificate(Path(server_cert).read_bytes())
    try:
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return ["IP:127.0.0.1", "DNS:localhost"]
    ips = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    names = {name.lower() for name in san.get_values_for_type(x509.DNSName)}
    return [label for label, present in (("IP:127.0.0.1", "127.0.0.1" in ips), ("DNS:localhost", "localhost" in names))
            if not present]


def make_certificates(
    out_dir: Path, hosts: list[str], nodes: list[str] | None = None, days: int = 365,
    operators: list[str] | None = None,
) -> CertificateSet:
    """Everything in one folder, for a trial on one machine (on separate machines each key
    is made on its own host: docs/deployment.md, section 3).

    Writes ``ca.pem``/``ca.key``, ``server.pem``/``server.key`` (subjectAltName = ``hosts``
    plus 127.0.0.1 and localhost, for the fence), per name in ``nodes`` a SuperNode key pair
    ``supernode-<name>`` + ``.pub``, and per name in ``operators`` (default: one,
    ``operator``) a client certificate ``<name>.pem`` + ``<name>.key`` that the fence
    admits to the Control API.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    if not hosts:
        raise ValueError("give at least one --host (the address SuperNodes and users dial)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    now = _dt.datetime.now(_dt.UTC) - _dt.timedelta(minutes=5)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedvls-flwr CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    server_key = ec.generate_private_key(ec.SECP256R1())
    san = list(dict.fromkeys([*hosts, *LOOPBACK_NAMES]))
    server_cert = _leaf_certificate(ca_key, ca_cert, hosts[0], server_key.public_key(), server_hosts=san, days=days)

    tls = TlsFiles.in_dir(out)
    pem = serialization.Encoding.PEM
    _write(tls.ca_cert, ca_cert.public_bytes(pem))
    _write(out / "ca.key", _pem_key(ca_key), private=True)
    _write(tls.server_cert, server_cert.public_bytes(pem))
    _write(tls.server_key, _pem_key(server_key), private=True)
    keys = {name: make_supernode_key(out / f"supernode-{name}") for name in (nodes or [])}
    operator_files = []
    for name in operators if operators is not None else ["operator"]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _leaf_certificate(ca_key, ca_cert, name, key.public_key(), server_hosts=None, days=days)
        _write(out / f"{name}.pem", cert.public_bytes(pem))
        _write(out / f"{name}.key", _pem_key(key), private=True)
        operator_files.append((out / f"{name}.pem", out / f"{name}.key"))
    first = operator_files[0] if operator_files else (None, None)
    return CertificateSet(tls, out / "ca.key", keys, *first)


def make_supernode_key(path: Path) -> tuple[Path, Path]:
    """An EC P-384 key pair in OpenSSH format: ``path`` (private, 0600) and ``path.pub``.

    Same as ``ssh-keygen -t ecdsa -b 384 -N "" -f path``.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    path = Path(path)
    _write(
        path,
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()),
        private=True,
    )
    pub = path.with_name(path.name + ".pub")
    _write(pub, key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n")
    return path, pub
