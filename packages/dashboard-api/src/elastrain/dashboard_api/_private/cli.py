"""``elastrain-dashboard``: connect to a Ray cluster as a driver and serve the API and page with uvicorn."""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys

TOKEN_ENV = "ELASTRAIN_DASHBOARD_TOKEN"  # noqa: S105 - the name of the variable, not a token


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="elastrain-dashboard", description="Serve elastrain's training runs API and page."
    )
    parser.add_argument("--address", default="auto", help="Ray cluster to connect to (default: auto)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    parser.add_argument("--port", type=int, default=8266, help="port (default: 8266)")
    parser.add_argument(
        "--token", default=None, help=f"bearer token the API requires (or set {TOKEN_ENV}); needed off loopback"
    )
    args = parser.parse_args(argv)
    args.token = args.token or os.environ.get(TOKEN_ENV) or None
    if not 0 < args.port < 65536:
        parser.error(f"--port must be from 1 to 65535, got {args.port}")
    if not is_loopback(args.host) and not args.token:
        parser.error(
            f"binding to {args.host} exposes the API beyond this machine: give a token with --token or {TOKEN_ENV} "
            "(clients then send 'Authorization: Bearer <token>'), or bind to 127.0.0.1"
        )
    if args.token is not None and len(args.token) < 16:
        parser.error("the token must have at least 16 characters")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import ray
    import uvicorn

    from elastrain.dashboard_api._private.app import create_app

    ray.init(address=args.address, log_to_driver=False, namespace="elastrain-dashboard")
    try:
        shown = f"http://{args.host}:{args.port}/" + ("#token=<token>" if args.token else "")
        print(f"elastrain dashboard on {shown}", file=sys.stderr, flush=True)
        uvicorn.run(create_app(token=args.token), host=args.host, port=args.port, log_level="warning")
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
