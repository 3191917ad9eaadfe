"""``elastrain-discovery``: print the hosts and slots a job would get on a Ray cluster, and watch changes."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import TextIO

from elastrain.discovery._private.events import HostEvent
from elastrain.discovery._private.hosts import HostInfo
from elastrain.discovery._private.manager import HostManager
from elastrain.discovery._private.ray_discovery import RayHostDiscovery


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="elastrain-discovery",
        description="Show the hosts and worker slots elastrain finds on a Ray cluster.",
    )
    parser.add_argument(
        "--address",
        default=None,
        help="Ray cluster to connect to ('auto', 'ray://host:10001', ...). Default: RAY_ADDRESS, "
        "else a running local cluster, else a new local Ray instance that is shut down afterwards.",
    )
    parser.add_argument("--use-gpu", action="store_true", help="Count slots by GPUs as well as CPUs.")
    parser.add_argument("--cpus-per-worker", type=float, default=1.0, metavar="N")
    parser.add_argument("--gpus-per-worker", type=float, default=1.0, metavar="N")
    parser.add_argument("--json", action="store_true", help="Print the hosts as JSON instead of a table.")
    parser.add_argument(
        "--watch",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="After the report, print host changes for this many seconds.",
    )
    return parser


def format_hosts(hosts: dict[str, HostInfo]) -> str:
    header = ("HOST (Ray node id)", "IP", "HOSTNAME", "CPU", "GPU", "SLOTS")
    rows = [
        (
            host.host_id,
            host.ip or "-",
            host.hostname or "-",
            f"{host.resources.get('CPU', 0):g}",
            f"{host.resources.get('GPU', 0):g}",
            str(host.slots),
        )
        for host in hosts.values()
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in [header, *rows]]
    total = sum(host.slots for host in hosts.values())
    lines.append(f"{total} slots on {len(hosts)} hosts")
    return "\n".join(line.rstrip() for line in lines)


def _print_events(events: list[HostEvent], out: TextIO) -> None:
    for event in events:
        suffix = " (blacklisted)" if event.blacklisted else ""
        print(
            f"{time.strftime('%H:%M:%S')} {event.change.value}: {event.host_id} "
            f"slots {event.old_slots} -> {event.new_slots}{suffix}",
            file=out,
            flush=True,
        )


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout) -> int:
    args = _parser().parse_args(argv)
    try:
        discovery = RayHostDiscovery(
            use_gpu=args.use_gpu, cpus_per_worker=args.cpus_per_worker, gpus_per_worker=args.gpus_per_worker
        )
    except ValueError as error:
        print(f"elastrain-discovery: {error}", file=sys.stderr)
        return 2

    import ray

    started_here = not ray.is_initialized()
    if started_here:
        context = ray.init(address=args.address, include_dashboard=False, log_to_driver=False)
        address_info: dict[str, str] = getattr(context, "address_info", {})
        print(f"Connected to Ray at {address_info.get('gcs_address', '?')}", file=out)
    try:
        manager = HostManager(discovery, poll_interval_s=0.5)
        manager.refresh()
        hosts = manager.current_hosts
        if args.json:
            payload = [
                {
                    "host_id": h.host_id,
                    "ip": h.ip,
                    "hostname": h.hostname,
                    "slots": h.slots,
                    "resources": dict(h.resources),
                }
                for h in hosts.values()
            ]
            print(json.dumps(payload, indent=2), file=out)
        else:
            print(format_hosts(hosts), file=out)
        if args.watch > 0:
            print(f"Watching for host changes for {args.watch:g} s ...", file=out, flush=True)
            manager.add_listener(lambda events: _print_events(events, out))
            with manager:
                time.sleep(args.watch)
    finally:
        if started_here:
            ray.shutdown()
    return 0
