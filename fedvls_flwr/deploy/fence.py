"""A fence in front of the SuperLink: SuperNodes reach only the Fleet API, the Control API
needs the operator's client certificate, the Runtime API stays on the SuperLink host.

Why: Flower 1.41 serves the Fleet API (SuperNodes), the Control API (``flwr`` CLI: register
nodes, start and list runs) and the Runtime API (the ServerApp) over HTTP(S) on one port,
and the Control API has no authentication in the open-source SuperLink. Whoever can reach
that port and holds the CA certificate (a public file every site has) can register nodes
and start runs, i.e. run code on every SuperNode. SuperNode authentication checks nodes
only. Flower itself cannot be changed here, so the SuperLink listens on 127.0.0.1 only
and nginx (a Debian package) listens on the public address in front of it:

* ``/v1/fleet/...``   -> passed on (SuperNode authentication still applies there);
* ``/v1/control/...`` -> passed on only when the TLS client presented a certificate
  signed by the CA with the ``clientAuth`` purpose (the operator's); else 403;
* anything else (``/v1/runtime/...``, ``/docs``, ``/openapi.json``) -> 403: the ServerApp
  and its SuperExec reach the Runtime API on 127.0.0.1 directly.

The ``flwr`` CLI of Flower 1.41 cannot present a client certificate, so the operator runs
:func:`serve_operator_link` (``python -m fedvls_flwr deploy operator-link``) on their own
machine: it listens on 127.0.0.1 and forwards each connection to the fence over TLS with
the operator's certificate; the ``flwr`` connection points at it. The same nginx server
block serves the one-machine launcher (:class:`NginxFence`) and a real SuperLink host
(``python -m fedvls_flwr deploy fence-config``, see docs/deployment.md).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from fedvls_flwr.ops.processes import wait_for_port

if TYPE_CHECKING:
    from fedvls_flwr.ops.launch import LocalSuperLink

FLEET_PREFIX = "/v1/fleet/"
CONTROL_PREFIX = "/v1/control/"
NGINX_CANDIDATES = ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")
INSTALL_HINT = (
    "nginx is needed for the fence that keeps SuperNodes off the Control API: install it "
    "(Debian/Ubuntu: apt-get install nginx) or, for a one-machine trial only, pass --no-fence"
)
DENIED = (
    '{"detail": "fedvls fence: %s. The Control API needs the operator client certificate '
    '(python -m fedvls_flwr deploy operator-link); see docs/deployment.md"}'
)


class FenceError(RuntimeError):
    """The fence cannot be set up; the message says what is missing."""


def find_nginx() -> str | None:
    """Path of the nginx binary (PATH first, then the usual sbin folders), or None."""
    found = shutil.which("nginx")
    if found:
        return found
    return next((p for p in NGINX_CANDIDATES if os.access(p, os.X_OK)), None)


def require_nginx() -> str:
    nginx = find_nginx()
    if nginx is None:
        raise FenceError(INSTALL_HINT)
    return nginx


def server_block(
    *, listen: str, superlink_port: int, server_cert: Path, server_key: Path, ca_cert: Path,
    access_log: Path | str = "/var/log/nginx/fedvls-fence.access.log",
    error_log: Path | str = "/var/log/nginx/fedvls-fence.error.log",
) -> str:
    """The nginx ``upstream`` + ``server`` blocks (http context) of the fence.

    ``listen``: the public ``host:port`` SuperNodes and the operator dial. The SuperLink
    must run with ``--host 127.0.0.1 --port <superlink_port>`` and TLS with a certificate
    whose subjectAltName includes ``DNS:localhost`` (nginx verifies it by that name) and
    ``IP:127.0.0.1`` (the SuperLink's own SuperExec dials that address). ``error_log`` is
    kept at level info: a SuperNode or operator whose TLS handshake fails (e.g. a wrong CA
    file) leaves no trace in the SuperLink's log, but a line here naming its address.
    """
    upstream = f"fedvls_superlink_{superlink_port}"
    return f"""\
# fedvls-flwr fence: SuperNodes reach only the Fleet API; the Control API needs the
# operator's client certificate; everything else (Runtime API, docs) stays on 127.0.0.1.
log_format fedvls_fence '$remote_addr [$time_local] "$request" $status $body_bytes_sent '
                        'client_cert=$ssl_client_verify "$ssl_client_s_dn" ${{request_time}}s';

upstream {upstream} {{
    server 127.0.0.1:{superlink_port};
    keepalive 32;
}}

server {{
    listen {listen} ssl;
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_certificate {server_cert};
    ssl_certificate_key {server_key};
    # Ask every client for a certificate; only the Control API insists on one. OpenSSL
    # checks the clientAuth purpose, so the SuperLink's own serverAuth certificate fails.
    ssl_client_certificate {ca_cert};
    ssl_verify_client optional;
    ssl_verify_depth 2;
    access_log {access_log} fedvls_fence;
    error_log {error_log} info;      # failed TLS handshakes: "alert unknown ca", client address

    client_max_body_size 0;          # model updates and app bundles
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_set_header Host $host;
    proxy_set_header X-Forwarded-For $remote_addr;
    proxy_request_buffering off;
    proxy_buffering off;             # `flwr log --stream`, `flwr run --stream`
    proxy_read_timeout 1h;
    proxy_send_timeout 1h;
    proxy_ssl_server_name on;
    proxy_ssl_name localhost;
    proxy_ssl_verify on;
    proxy_ssl_trusted_certificate {ca_cert};
    proxy_ssl_session_reuse on;
    default_type application/json;

    location {FLEET_PREFIX} {{
        proxy_pass https://{upstream};
    }}
    location {CONTROL_PREFIX} {{
        if ($ssl_client_verify != SUCCESS) {{
            return 403 '{DENIED % "no valid operator client certificate"}';
        }}
        proxy_pass https://{upstream};
    }}
    location / {{
        return 403 '{DENIED % "only the Fleet API is served here"}';
    }}
}}
"""


def standalone_config(prefix: Path, body: str) -> str:
    """A whole nginx.conf for a private nginx (no system files touched), run in the foreground."""
    prefix = Path(prefix)
    temp = prefix / "tmp"
    user = "user root;\n" if os.geteuid() == 0 else ""  # workers must read our private folders
    return f"""\
{user}worker_processes 1;
daemon off;
pid {prefix / 'nginx.pid'};
error_log {prefix / 'error.log'} notice;
events {{ worker_connections 1024; }}
http {{
    client_body_temp_path {temp / 'body'};
    proxy_temp_path {temp / 'proxy'};
    fastcgi_temp_path {temp / 'fastcgi'};
    uwsgi_temp_path {temp / 'uwsgi'};
    scgi_temp_path {temp / 'scgi'};
{_indent(body, 4)}
}}
"""


def _indent(text: str, n: int) -> str:
    pad = " " * n
    return "\n".join(pad + line if line.strip() else line for line in text.splitlines())


def write_standalone_config(
    prefix: Path, *, listen: str, superlink_port: int, server_cert: Path, server_key: Path, ca_cert: Path,
) -> Path:
    """Write ``prefix/nginx.conf`` (and its temp folders); returns the file."""
    prefix = Path(prefix).resolve()
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (prefix / "tmp" / sub).mkdir(parents=True, exist_ok=True)
    body = server_block(
        listen=listen, superlink_port=superlink_port, server_cert=Path(server_cert).resolve(),
        server_key=Path(server_key).resolve(), ca_cert=Path(ca_cert).resolve(), access_log=prefix / "access.log",
        error_log=prefix / "error.log",
    )
    conf = prefix / "nginx.conf"
    conf.write_text(standalone_config(prefix, body))
    return conf


def nginx_command(nginx: str, conf: Path, *, test: bool = False) -> list[str]:
    prefix = conf.parent
    return [nginx, *(["-t", "-q"] if test else []), "-p", str(prefix), "-e", str(prefix / "error.log"), "-c", str(conf)]


def check_nginx_config(nginx: str, conf: Path) -> None:
    """``nginx -t`` on the file: a clear error before anything is started."""
    res = subprocess.run(nginx_command(nginx, conf, test=True), capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        raise FenceError(f"nginx rejected {conf}:\n{res.stderr.strip() or res.stdout.strip()}")


# ---------------------------------------------------------------------------
# the operator's side: a local forwarder that presents the client certificate


def client_context(ca_cert: Path, cert: Path, key: Path) -> ssl.SSLContext:
    """TLS client context: trust only ``ca_cert``, present ``cert``/``key``."""
    for label, path in (("CA certificate", ca_cert), ("client certificate", cert), ("client key", key)):
        if not Path(path).is_file():
            raise FenceError(f"operator link: {label} {path} not found")
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca_cert))
    except ssl.SSLError as err:
        raise FenceError(f"operator link: CA certificate {ca_cert} holds no PEM certificate ({err}); "
                         "pass the ca.pem that signed the SuperLink's certificate") from None
    try:
        ctx.load_cert_chain(str(cert), str(key))
    except ssl.SSLError as err:
        raise FenceError(f"operator link: {cert} and {key} do not form a certificate + key pair ({err})") from None
    _require_client_auth(Path(cert))
    return ctx


def _require_client_auth(cert: Path) -> None:
    """nginx answers 400 on every path to a certificate whose extended key usage excludes
    client authentication (a server certificate, say): name that here, not per request."""
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    certificate = x509.load_pem_x509_certificate(cert.read_bytes())
    try:
        usage = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return  # no restriction: valid for client authentication
    if ExtendedKeyUsageOID.CLIENT_AUTH not in usage:
        purposes = ", ".join(getattr(oid, "_name", oid.dotted_string) for oid in usage)
        raise FenceError(
            f"operator link: {cert} is not a client certificate (its extended key usage is {purposes}); "
            "the fence admits only a certificate signed for clientAuth: the operator's "
            "(`deploy certs --operator NAME`, or docs/deployment.md section 3)"
        )


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def _serve(
    listen_host: str, listen_port: int, host: str, port: int, ctx: ssl.SSLContext, log: Callable[..., None]
) -> None:
    async def handle(local_reader: asyncio.StreamReader, local_writer: asyncio.StreamWriter) -> None:
        try:
            remote_reader, remote_writer = await asyncio.open_connection(host, port, ssl=ctx, server_hostname=host)
        except (OSError, ssl.SSLError) as err:
            log(f"[operator-link] cannot reach the fence at {host}:{port}: {err}")
            local_writer.close()
            return
        await asyncio.gather(_pipe(local_reader, remote_writer), _pipe(remote_reader, local_writer))

    try:
        server = await asyncio.start_server(handle, listen_host, listen_port)
    except OSError as err:
        raise FenceError(
            f"operator link: cannot listen on {listen_host}:{listen_port} ({err.strerror or err}); another "
            "process holds that port (on the SuperLink host, the fence itself): pass another --listen "
            "port and use it in the `flwr` connection's address"
        ) from None
    async with server:
        log(f"[operator-link] listening on {listen_host}:{listen_port}, forwarding to https://{host}:{port} "
            "with the operator certificate", flush=True)
        await server.serve_forever()


def check_operator_link(host: str, port: int, ctx: ssl.SSLContext, timeout: float = 10.0) -> None:
    """One TLS handshake with the fence, so a wrong CA or address fails at start-up."""
    import socket

    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            with ctx.wrap_socket(sock, server_hostname=host):
                pass
    except ssl.SSLCertVerificationError as err:
        raise FenceError(
            f"operator link: the certificate served at {host}:{port} does not verify against the CA "
            f"({err.verify_message}); check that the CA file is the one that signed the SuperLink's "
            "certificate and that its subjectAltName lists this address"
        ) from None
    except (OSError, ssl.SSLError) as err:
        raise FenceError(f"operator link: cannot reach the fence at {host}:{port}: {err}") from None


def serve_operator_link(
    superlink: str, ca_cert: Path, cert: Path, key: Path, listen: str = "127.0.0.1:9093", log: Callable[..., None] = print,
) -> None:
    """Forward ``listen`` (plain, loopback) to the fence at ``superlink`` over TLS with the
    operator's certificate, until interrupted."""
    host, port = split_address(superlink, "--superlink")
    listen_host, listen_port = split_address(listen, "--listen")
    ctx = client_context(ca_cert, cert, key)
    check_operator_link(host, port, ctx)
    asyncio.run(_serve(listen_host, listen_port, host, port, ctx, log))


def split_address(address: str, what: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise FenceError(f"{what} {address!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def operator_link_command(superlink: str, ca_cert: Path, cert: Path, key: Path, listen: str) -> list[str]:
    """The ``operator-link`` command line, for starting it as a process of its own."""
    return [
        sys.executable, "-m", "fedvls_flwr", "deploy", "operator-link", "--superlink", superlink,
        "--ca", str(ca_cert), "--cert", str(cert), "--key", str(key), "--listen", listen,
    ]


def start_fence(link: LocalSuperLink, operator_cert: Path, operator_key: Path, timeout: float = 30.0) -> LocalSuperLink:
    """nginx in front of ``link``'s (TLS) SuperLink, and the operator link for our ``flwr`` commands.

    After this, SuperNodes started here dial the fence, which passes only the Fleet API
    on; ``flwr`` commands of ``link`` go through the operator link (127.0.0.1,
    plain) that presents ``operator_cert`` to the fence, where the Control API is
    passed on only to such a client certificate.
    """
    if link.tls is None:
        raise ValueError("the fence needs a SuperLink started with tls=TlsFiles(...)")
    nginx = require_nginx()
    fence_port = link.new_port()
    conf = write_standalone_config(
        link.home / "fence", listen=f"127.0.0.1:{fence_port}", superlink_port=link.port,
        server_cert=link.tls.server_cert, server_key=link.tls.server_key, ca_cert=link.tls.ca_cert,
    )
    check_nginx_config(nginx, conf)
    log = link.home / "fence" / "nginx.out"
    proc = link.spawn(nginx_command(nginx, conf), log)
    wait_for_port(fence_port, timeout, proc, log)
    link.fence_port = fence_port

    link_port = link.new_port()
    log = link.home / "operator-link.log"
    proc = link.spawn(
        operator_link_command(f"127.0.0.1:{fence_port}", link.tls.ca_cert, operator_cert, operator_key,
                              f"127.0.0.1:{link_port}"),
        log,
    )
    wait_for_port(link_port, timeout, proc, log)
    link.control_port = link_port
    # Plain on 127.0.0.1 up to the operator link; TLS with the client certificate beyond.
    link.write_connection(insecure=True, port=link_port)
    return link
