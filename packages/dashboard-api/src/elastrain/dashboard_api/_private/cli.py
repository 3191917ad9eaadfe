"""``elastrain-dashboard``: connect to a Ray cluster as a driver and serve the API and page with uvicorn.

The token comes from ``--token-file`` or the ``ELASTRAIN_DASHBOARD_TOKEN`` environment variable. ``--token``
still works, for scripts written before those, but every user of the machine can read a command line (``ps``),
so it prints a warning.
"""

from __future__ import annotations

import argparse
import os
import sys

from elastrain.dashboard_api._private.hosts import is_loopback, parse_allowed_hosts
from elastrain.dashboard_api._private.tokens import TOKEN_ENV, check_token, read_token_file, token_file_warning

ARGV_TOKEN_WARNING = (
    f"warning: --token puts the token on this process's command line, which every user of this machine can read "
    f"(ps, /proc); use --token-file FILE or the {TOKEN_ENV} environment variable instead"
)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="elastrain-dashboard", description="Serve elastrain's training runs API and page."
    )
    parser.add_argument("--address", default="auto", help="Ray cluster to connect to (default: auto)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    parser.add_argument("--port", type=int, default=8266, help="port (default: 8266)")
    parser.add_argument(
        "--token-file",
        default=None,
        metavar="FILE",
        help=f"file holding the bearer token the API requires (or set {TOKEN_ENV}); needed off loopback",
    )
    parser.add_argument(
        "--token", default=None, help="the token itself: visible to other users in ps, prefer --token-file"
    )
    parser.add_argument(
        "--allowed-hosts",
        default=None,
        metavar="HOST[,HOST...]",
        help="host names or addresses the page is opened by, besides localhost and 127.0.0.1 (a guard against "
        "DNS rebinding; without it, a server with a token answers any name)",
    )
    args = parser.parse_args(argv)
    args.token, warnings = _token(parser, args)
    if not 0 < args.port < 65536:
        parser.error(f"--port must be from 1 to 65535, got {args.port}")
    if not is_loopback(args.host) and args.token is None:
        parser.error(
            f"binding to {args.host} exposes the API beyond this machine: give a token with --token-file or "
            f"{TOKEN_ENV} (clients then send 'Authorization: Bearer <token>'), or bind to 127.0.0.1"
        )
    if args.allowed_hosts is not None:
        try:
            args.allowed_hosts = sorted(parse_allowed_hosts(args.allowed_hosts.split(",")))
        except ValueError as error:
            parser.error(f"--allowed-hosts: {error}")
    for warning in warnings:
        print(warning, file=sys.stderr, flush=True)
    return args


def _token(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """The token from --token-file, --token or the environment (in that order), and warnings to print."""
    if args.token_file is not None and args.token is not None:
        parser.error("give the token once: --token-file or --token, not both")
    try:
        if args.token_file is not None:
            token = read_token_file(args.token_file)
            return token, [warning for warning in [token_file_warning(args.token_file)] if warning]
        if args.token is not None:
            return check_token(args.token, "--token"), [ARGV_TOKEN_WARNING]
        if TOKEN_ENV in os.environ:
            return check_token(os.environ[TOKEN_ENV], TOKEN_ENV), []
    except ValueError as error:
        parser.error(str(error))
    return None, []


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import ray
    import uvicorn

    from elastrain.dashboard_api._private.app import create_app

    app = create_app(token=args.token, allowed_hosts=args.allowed_hosts)  # before Ray: no bad option gets that far
    ray.init(address=args.address, log_to_driver=False, namespace="elastrain-dashboard")
    try:
        shown = f"http://{args.host}:{args.port}/" + ("#token=<token>" if args.token else "")
        print(f"elastrain dashboard on {shown}", file=sys.stderr, flush=True)
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
