"""``fedvls deploy``: certificates and keys, the fence, a one-machine deployment, the breakdown.

Commands (see docs/deployment.md for the step-by-step guide on separate machines)::

    # a one-machine trial: CA, SuperLink certificate (SAN: the hosts + 127.0.0.1, localhost),
    # an operator client certificate and SuperNode key pairs, all in one folder
    python -m fedvls_flwr deploy certs OUT_DIR --host 10.0.0.5 [--host superlink.lab.org] --nodes 2

    # SuperLink on 127.0.0.1 behind the nginx fence, N SuperNodes dialing the fence (TLS,
    # SuperNode authentication and fence unless --no-fence / --insecure), our flwr
    # commands through the operator link, `flwr run . <connection> --stream`, the run's
    # final status, then every process it started is stopped (also on Ctrl-C, SIGTERM, failures)
    python -m fedvls_flwr deploy local --nodes 2 --run-config "num-server-rounds=3"

    # where a round's seconds went, from the timestamped logs of `local --debug-logs`
    python -m fedvls_flwr deploy breakdown WORKDIR

    # on a SuperLink host: the nginx server block of the fence
    python -m fedvls_flwr deploy fence-config --listen 0.0.0.0:9093 --superlink-port 9092 --certs DIR

    # on the operator's machine: a local port for `flwr` that presents the client certificate
    python -m fedvls_flwr deploy operator-link --superlink 10.0.0.5:9093 --ca ca.pem --cert op.pem --key op.key

"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from click import ClickException

from fedvls_flwr.config.args import seconds
from fedvls_flwr.config.run_config import parse_run_config
from fedvls_flwr.config.unread import check_given_settings_apply
from fedvls_flwr.data.node_config import check_distinct_sites, check_node_folders, parse_node_config
from fedvls_flwr.deploy.breakdown import BreakdownInputError, breakdown, print_breakdown
from fedvls_flwr.deploy.certs import CertificateError, make_certificates, missing_loopback_names, san_hosts
from fedvls_flwr.deploy.fence import FenceError, require_nginx, serve_operator_link, server_block
from fedvls_flwr.deploy.local import Terminated, evaluation_warning, node_configs, parse_config_string, report, run_local
from fedvls_flwr.experiments.check import check_run_config, project_defaults
from fedvls_flwr.ops.flower_cli import TlsFiles
from fedvls_flwr.ops.launch import PROJECT_DIR
from fedvls_flwr.ops.processes import parse_port_range

#: Debian's nginx package enables this site (port 80, every interface) when it is installed.
DEBIAN_DEFAULT_SITE = Path("/etc/nginx/sites-enabled/default")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedvls deploy", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    c = sub.add_parser("certs", help="a CA, a SuperLink certificate, an operator client certificate and "
                                     "SuperNode key pairs, all in one folder (for a trial on one machine)")
    c.add_argument("out_dir", type=Path)
    c.add_argument("--host", action="append", required=True,
                   help="IP address or DNS name SuperNodes and users dial to reach the SuperLink (repeat)")
    c.add_argument("--nodes", type=int, default=0, help="make this many SuperNode key pairs (node-0, node-1, ...)")
    c.add_argument("--node", action="append", default=[], help="make a SuperNode key pair with this name (repeat)")
    c.add_argument("--operator", action="append", default=[],
                   help="make an operator client certificate NAME.pem/NAME.key (repeat; default: one named operator)")
    c.add_argument("--days", type=int, default=365, help="validity of the certificates")

    loc = sub.add_parser("local", help="SuperLink + N SuperNodes on 127.0.0.1, one streamed run, then stop all")
    loc.add_argument("--nodes", type=int, default=2, metavar="N",
                     help="SuperNodes to start, each training on partition i of num-partitions = N of the run's "
                          "dataset (default: %(default)s; --node-data sets it to the number of folders)")
    loc.add_argument("--insecure", action="store_true",
                     help="no TLS, no SuperNode authentication, no fence (explicit opt-out)")
    loc.add_argument("--tls", action="store_true", help="TLS with generated certificates (the default)")
    loc.add_argument("--auth", action="store_true", help="SuperNode authentication (the default with TLS)")
    loc.add_argument("--no-auth", action="store_true", help="TLS without SuperNode authentication")
    loc.add_argument("--no-fence", action="store_true",
                     help="no nginx fence: SuperNodes and flwr reach the SuperLink's one port directly "
                          "(the Control API is then open to every SuperNode host)")
    loc.add_argument("--port-range", metavar="LO-HI",
                     help="take every port opened here (SuperLink, fence, operator link, SuperNodes) from LO-HI")
    loc.add_argument("--run-config", default="", help="run config overrides, as for flwr run --run-config")
    loc.add_argument("--node-data", nargs="+", metavar="DIR",
                     help="node-local data: one folder per SuperNode (sets --nodes)")
    loc.add_argument("--node-dataset", default="folder",
                     help="dataset of the --node-data folders: 'folder' (class subfolders) or a dataset name")
    loc.add_argument("--classes", help="comma-separated class names fixing label ids (folder data)")
    loc.add_argument("--test-fraction", type=float, metavar="F",
                     help="each node holds out this stratified fraction of its data as a local test split "
                          "(node config test-fraction; needed for evaluation='federated')")
    loc.add_argument("--node-config", action="append", metavar="STR",
                     help="a SuperNode's raw --node-config (repeat once per node; overrides the above)")
    loc.add_argument("--workdir", type=Path, help="certificates, Flower homes and logs (default: a new temp folder)")
    loc.add_argument("--app", type=Path, default=PROJECT_DIR, help="the Flower app folder (default: this project)")
    loc.add_argument("--timeout", type=seconds, default=3600.0, metavar="SECONDS",
                     help="stop the run after this many seconds (default: %(default)g)")
    loc.add_argument("--debug-logs", action="store_true",
                     help="FLWR_LOG_LEVEL=DEBUG everywhere (timestamped logs, for `breakdown`)")

    b = sub.add_parser("breakdown", help="seconds per round and per phase, from a `local --debug-logs` work folder")
    b.add_argument("workdir", type=Path)
    b.add_argument("--json", action="store_true")

    f = sub.add_parser("fence-config", help="print the nginx server block of the fence for a SuperLink host")
    f.add_argument("--listen", required=True, metavar="HOST:PORT",
                   help="the public address SuperNodes and operators dial, e.g. 0.0.0.0:9093")
    f.add_argument("--superlink-port", type=int, required=True,
                   help="the port of the SuperLink, started with --host 127.0.0.1 --port PORT")
    f.add_argument("--certs", type=Path, required=True,
                   help="folder holding ca.pem, server.pem and server.key (absolute paths are written)")

    o = sub.add_parser("operator-link", help="on the operator's machine: a local port for `flwr` that reaches "
                                             "the fence's Control API with the operator's client certificate")
    o.add_argument("--superlink", required=True, metavar="HOST:PORT", help="the fence's public address")
    o.add_argument("--ca", type=Path, required=True, help="the CA certificate (ca.pem)")
    o.add_argument("--cert", type=Path, required=True, help="the operator's client certificate")
    o.add_argument("--key", type=Path, required=True, help="the operator's private key")
    o.add_argument("--listen", default="127.0.0.1:9093", metavar="HOST:PORT",
                   help="where `flwr` connects (default 127.0.0.1:9093; keep it on 127.0.0.1)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    commands = {"breakdown": _breakdown, "certs": _certs, "fence-config": _fence_config,
                "operator-link": _operator_link}
    if args.command in commands:
        return commands[args.command](args)
    return _local(args, parser)


def _breakdown(args: argparse.Namespace) -> int:
    try:
        result = breakdown(args.workdir)
    except BreakdownInputError as err:
        print(f"[deploy] {err}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2)) if args.json else print_breakdown(result)
    return 0


def _certs(args: argparse.Namespace) -> int:
    names = [*args.node, *(f"node-{i}" for i in range(args.nodes))]
    try:
        made = make_certificates(args.out_dir, args.host, names, days=args.days, operators=args.operator or None)
    except CertificateError as err:
        print(f"[deploy] certs: nothing written: {err}", file=sys.stderr)
        return 2

    def state(*paths: Path) -> str:
        return "kept" if all(p in made.kept for p in paths) else "new"

    if made.ca_key in made.kept:
        print(f"[deploy] certs: {args.out_dir} already holds a CA: signing with it (every certificate it "
              "signed before stays valid); files already there are kept")
    print(f"CA certificate:      {made.tls.ca_cert}   ({state(made.tls.ca_cert)}; copy to every SuperNode and "
          "user machine)")
    print(f"CA key:              {made.ca_key}   ({state(made.ca_key)}; keep offline; needed to sign more "
          "certificates: run this command on this folder again)")
    server = state(made.tls.server_cert)
    if server == "new" and made.tls.server_key in made.kept:
        server = "signed again by the same CA for the key already there; restart the SuperLink with it"
    print(f"SuperLink cert/key:  {made.tls.server_cert} {made.tls.server_key}   "
          f"({server}; SAN: {', '.join(san_hosts(made.tls.server_cert))})")
    for name in args.operator or ["operator"]:
        pem, key = args.out_dir / (name + ".pem"), args.out_dir / (name + ".key")
        print(f"Operator {name}: {pem} {key} ({state(pem, key)}; client certificate for the Control API behind "
              "the fence; to the operator only)")
    for name, (private, public) in made.supernode_keys.items():
        print(f"SuperNode {name}: private {private} (to that SuperNode only), public {public} "
              f"(flwr supernode register) ({state(private, public)})")
    return 0


def _fence_config(args: argparse.Namespace) -> int:
    certs = TlsFiles.in_dir(args.certs.expanduser().resolve())
    missing = [str(p) for p in (certs.ca_cert, certs.server_cert, certs.server_key) if not p.is_file()]
    if missing:
        print(f"[deploy] fence-config: not found: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        lacking = missing_loopback_names(certs.server_cert)
    except ValueError as err:
        print(f"[deploy] fence-config: {certs.server_cert} is not a PEM certificate ({err})", file=sys.stderr)
        return 2
    if lacking:
        print(f"[deploy] fence-config: {certs.server_cert} does not list {' and '.join(lacking)} in its "
              "subjectAltName. Behind the fence nginx dials the SuperLink as localhost and the SuperLink's "
              "own SuperExec dials 127.0.0.1: with this certificate the SuperExec dies at start and nginx "
              "answers 502 Bad Gateway to everything. Sign it again with them added, e.g. subjectAltName="
              "IP:<public address>,IP:127.0.0.1,DNS:localhost in server.ext (docs/deployment.md, section 3), "
              "and restart the SuperLink with the new server.pem", file=sys.stderr)
        return 2
    if DEBIAN_DEFAULT_SITE.exists():
        print(f"[deploy] WARNING: nginx's default site {DEBIAN_DEFAULT_SITE} is enabled: nginx then also "
              "listens on port 80 on every interface, a second open port besides the fence's. Disable it: "
              f"sudo rm {DEBIAN_DEFAULT_SITE} && sudo nginx -s reload", file=sys.stderr)
    print(server_block(
        listen=args.listen, superlink_port=args.superlink_port, server_cert=certs.server_cert,
        server_key=certs.server_key, ca_cert=certs.ca_cert,
    ), end="")
    return 0


def _operator_link(args: argparse.Namespace) -> int:
    try:
        serve_operator_link(args.superlink, args.ca, args.cert, args.key, args.listen)
    except FenceError as err:
        print(f"[deploy] {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0


def _local(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.insecure and (args.tls or args.auth):
        parser.error("--insecure contradicts --tls/--auth")
    nodes = len(args.node_data) if args.node_data else args.nodes
    if nodes < 1:
        parser.error("--nodes must be >= 1")
    if args.node_data and args.node_dataset == "folder" and not args.classes:
        parser.error("--node-data with folder data needs --classes 'name0,name1,...' (fixes the label ids)")
    if args.node_config and args.test_fraction is not None:
        parser.error("--test-fraction does not apply to raw --node-config strings: put test-fraction=F in each")
    fence = not (args.insecure or args.no_fence)
    try:  # a bad value costs nothing: checked before any process starts
        port_range = parse_port_range(args.port_range)
        configs = node_configs(nodes, args.node_data, args.node_dataset, args.classes, args.node_config,
                               test_fraction=args.test_fraction)
        run_config = parse_config_string(args.run_config)
        # the launcher waits for all its nodes unless told otherwise (run_local's min-nodes)
        check_run_config({"min-nodes": len(configs), **run_config}, num_supernodes=len(configs), data=False,
                         app_dir=args.app)
        check_given_settings_apply(run_config, parse_run_config({**project_defaults(args.app), **run_config}).to_flower())
        specs = [parse_node_config(config) for config in configs]
        check_distinct_sites(specs)
        check_node_folders(specs)
        if fence:
            require_nginx()
    except (ValueError, FileNotFoundError, ClickException, FenceError) as err:
        print(f"[deploy] nothing started: {getattr(err, 'message', err)}", file=sys.stderr)
        return 2
    if warning := evaluation_warning(run_config, configs, app_dir=args.app):
        print(f"[deploy] WARNING: {warning}", file=sys.stderr)
    try:
        outcome, run_dir, _ = run_local(
            nodes, secure=not args.insecure, auth=not (args.insecure or args.no_auth), fence=fence,
            run_config=run_config, configs=configs,
            workdir=args.workdir, app_dir=args.app, timeout=args.timeout,
            env_extra={"FLWR_LOG_LEVEL": "DEBUG"} if args.debug_logs else None,
            port_range=port_range,
        )
    except KeyboardInterrupt:
        print("[deploy] interrupted", file=sys.stderr)
        return 130
    except Terminated as sig:
        print(f"[deploy] terminated by signal {sig.args[0]}", file=sys.stderr)
        return 128 + int(sig.args[0])
    except Exception as err:  # noqa: BLE001 - reported, processes already stopped
        print(f"[deploy] failed: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    report(outcome, run_dir)
    if warning:
        print(f"[deploy] WARNING: {warning}", file=sys.stderr)
    return 0 if outcome.completed else 1


if __name__ == "__main__":
    from fedvls_flwr.ops.processes import stopped_cleanly_on_termination

    with stopped_cleanly_on_termination("fedvls deploy"):
        raise SystemExit(main())
