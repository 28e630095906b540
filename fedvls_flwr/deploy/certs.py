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
    kept: tuple[Path, ...] = ()  # files the folder already held, left as they were


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


class CertificateError(ValueError):
    """A certificate folder that cannot be extended as asked; the message says how to go on."""


def _load_ca(out: Path) -> tuple[Any, Any] | None:
    """(key, certificate) of the CA already in ``out``, or None when the folder has none.

    Half a CA (one file of the two) or a key that does not belong to the certificate is an
    error: making a new CA there would silently invalidate every certificate issued so far."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    cert_path, key_path = out / "ca.pem", out / "ca.key"
    if not cert_path.exists() and not key_path.exists():
        return None
    if not key_path.exists():
        raise CertificateError(
            f"{out} holds {cert_path.name} but not {key_path.name}: more certificates can only be signed "
            f"with that CA's key. Put {key_path.name} back into {out} (from where you keep it offline) and "
            "run the command again; or give a new folder to start a new CA (every certificate and node "
            "trusting the old ca.pem would then have to be given new ones)")
    if not cert_path.exists():
        raise CertificateError(
            f"{out} holds {key_path.name} but not {cert_path.name}: put the CA certificate {cert_path.name} "
            "back beside its key (every SuperNode and user machine has a copy) and run the command again")
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (ValueError, TypeError) as err:
        raise CertificateError(f"{out}: the CA files cannot be read ({err}); restore them from a copy, "
                               "or give a new folder to start a new CA") from None
    if cert.public_key().public_numbers() != key.public_key().public_numbers():  # type: ignore[union-attr]
        raise CertificateError(f"{key_path} is not the key of {cert_path}: restore the pair from one copy")
    return key, cert


def _new_ca(days: int) -> tuple[Any, Any]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

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
    return ca_key, ca_cert


def san_hosts(server_cert: Path) -> list[str]:
    """The IP addresses and DNS names the subjectAltName of ``server_cert`` lists."""
    from cryptography import x509

    certificate = x509.load_pem_x509_certificate(Path(server_cert).read_bytes())
    try:
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] + list(san.get_values_for_type(x509.DNSName))


def _san_lacks(server_cert: Path, hosts: list[str]) -> list[str]:
    """The entries of ``hosts`` that the subjectAltName of ``server_cert`` does not list."""
    listed = {h.lower() for h in san_hosts(server_cert)}
    return [h for h in hosts if h.lower() not in listed and str(_ip_or_none(h)) not in listed]


def _issued_by(cert_path: Path, ca_cert: Any) -> bool:
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature

    try:
        x509.load_pem_x509_certificate(cert_path.read_bytes()).verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _ip_or_none(host: str) -> Any:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


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

    A folder that already holds a CA keeps it and signs with it: a new CA would make every
    certificate handed out before fail to verify. Files already there are kept (listed in
    ``CertificateSet.kept``); a server certificate whose subjectAltName lacks one of ``hosts``
    is signed again, for its own key, by the same CA. Half a CA raises :class:`CertificateError`.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    if not hosts:
        raise ValueError("give at least one --host (the address SuperNodes and users dial)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM
    tls = TlsFiles.in_dir(out)
    kept: list[Path] = []
    existing = _load_ca(out)
    if existing is None:
        ca_key, ca_cert = _new_ca(days)
        _write(tls.ca_cert, ca_cert.public_bytes(pem))
        _write(out / "ca.key", _pem_key(ca_key), private=True)
    else:
        ca_key, ca_cert = existing
        kept += [tls.ca_cert, out / "ca.key"]
        # a certificate cannot outlive the CA that signed it
        days = max(1, min(days, (ca_cert.not_valid_after_utc - _dt.datetime.now(_dt.UTC)).days))

    def leaf(cert_path: Path, key_path: Path, subject: str, server_hosts: list[str] | None) -> None:
        """Keep a certificate this CA issued (for a server: listing ``server_hosts``); else
        sign one, for the key already there or a new one."""
        if cert_path.exists() and key_path.exists() and _issued_by(cert_path, ca_cert) and not (
                server_hosts and _san_lacks(cert_path, server_hosts)):
            kept.extend([cert_path, key_path])
            return
        if key_path.exists():
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
            kept.append(key_path)
            if server_hosts and cert_path.exists() and _issued_by(cert_path, ca_cert):
                # signed again for more hosts: the ones it listed stay valid
                server_hosts = list(dict.fromkeys([*server_hosts, *san_hosts(cert_path)]))
        else:
            key = ec.generate_private_key(ec.SECP256R1())
            _write(key_path, _pem_key(key), private=True)
        cert = _leaf_certificate(ca_key, ca_cert, subject, key.public_key(), server_hosts=server_hosts, days=days)
        _write(cert_path, cert.public_bytes(pem))

    leaf(tls.server_cert, tls.server_key, hosts[0], list(dict.fromkeys([*hosts, *LOOPBACK_NAMES])))
    keys = {}
    for name in nodes or []:
        private = out / f"supernode-{name}"
        public = private.with_name(private.name + ".pub")
        if private.exists() and public.exists():
            kept += [private, public]
            keys[name] = (private, public)
        else:
            keys[name] = make_supernode_key(private)
    operator_files = []
    for name in operators if operators is not None else ["operator"]:
        leaf(out / f"{name}.pem", out / f"{name}.key", name, None)
        operator_files.append((out / f"{name}.pem", out / f"{name}.key"))
    cert, key = operator_files[0] if operator_files else (None, None)
    return CertificateSet(tls, out / "ca.key", keys, operator_cert=cert, operator_key=key, kept=tuple(kept))


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
