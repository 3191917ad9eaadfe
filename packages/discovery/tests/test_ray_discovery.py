"""RayHostDiscovery and the discovery report against a real single-node Ray (GPUs are Ray resources here)."""

from __future__ import annotations

import io
import json

import pytest

from elastrain.discovery import HostDiscoveryError, HostManager, RayHostDiscovery
from elastrain.discovery._private.ray_discovery import slots_for_resources
from elastrain.discovery._private.report import main as report_main


def test_needs_ray_connection() -> None:
    with pytest.raises(HostDiscoveryError, match=r"call ray\.init\(\)"):
        RayHostDiscovery().find_available_hosts_and_slots()


@pytest.mark.usefixtures("ray_single_node")
class TestSingleNode:
    def test_cpu_slots(self) -> None:
        assert list(RayHostDiscovery().find_available_hosts_and_slots().values()) == [4]

    def test_gpu_slots(self) -> None:
        assert list(RayHostDiscovery(use_gpu=True).find_available_hosts_and_slots().values()) == [1]

    def test_cpus_per_worker(self) -> None:
        assert list(RayHostDiscovery(cpus_per_worker=3).find_available_hosts_and_slots().values()) == [1]
        assert list(RayHostDiscovery(cpus_per_worker=0.5).find_available_hosts_and_slots().values()) == [8]

    def test_host_is_keyed_by_node_id_and_knows_ip_and_hostname(self) -> None:
        import ray

        node = ray.get_runtime_context().get_node_id()
        hosts = RayHostDiscovery().find_available_hosts()
        assert list(hosts) == [node]
        host = hosts[node]
        assert host.ip == ray.util.get_node_ip_address()
        assert host.hostname
        assert host.resources["CPU"] == 4

    def test_too_many_cpus_per_worker_omits_the_host(self) -> None:
        assert RayHostDiscovery(cpus_per_worker=5).find_available_hosts_and_slots() == {}

    def test_report_table(self) -> None:
        out = io.StringIO()
        assert report_main(["--use-gpu"], out=out) == 0
        text = out.getvalue()
        assert "1 slots on 1 hosts" in text
        assert "HOST (Ray node id)" in text

    def test_report_json(self) -> None:
        out = io.StringIO()
        assert report_main(["--json", "--cpus-per-worker", "2"], out=out) == 0
        [host] = json.loads(out.getvalue())
        assert host["slots"] == 2
        assert host["resources"]["GPU"] == 1

    def test_report_rejects_bad_arguments(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert report_main(["--cpus-per-worker", "0"], out=io.StringIO()) == 2
        assert "cpus_per_worker must be a positive number" in capsys.readouterr().err

    def test_manager_polls_ray(self) -> None:
        with HostManager(RayHostDiscovery(), poll_interval_s=0.05) as manager:
            assert manager.wait_for_slots(4, timeout_s=5)
            with pytest.raises(TimeoutError, match=r"at least 5 slots; saw 4 slots on 1 hosts"):
                manager.wait_for_slots(5, timeout_s=0.3)


@pytest.mark.parametrize(
    ("resources", "kwargs", "slots"),
    [
        ({"CPU": 4, "GPU": 1}, {"use_gpu": False}, 4),
        ({"CPU": 4, "GPU": 1}, {"use_gpu": True}, 1),
        ({"CPU": 8, "GPU": 4}, {"use_gpu": True, "gpus_per_worker": 2}, 2),
        ({"CPU": 4, "GPU": 4}, {"use_gpu": True, "cpus_per_worker": 3}, 1),
        ({"CPU": 4}, {"use_gpu": True}, 0),
        ({"CPU": 4.0}, {"use_gpu": False, "cpus_per_worker": 0.1}, 40),  # 4.0 // 0.1 == 39.0 in floats
        ({"GPU": 8}, {"use_gpu": True}, 0),
    ],
)
def test_slots_for_resources(resources: dict[str, float], kwargs: dict[str, object], slots: int) -> None:
    options: dict[str, object] = {"cpus_per_worker": 1, "gpus_per_worker": 1, **kwargs}
    assert slots_for_resources(resources, **options) == slots  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cpus_per_worker": 0}, "cpus_per_worker must be a positive number, got 0"),
        ({"cpus_per_worker": -1}, "cpus_per_worker must be a positive number"),
        ({"gpus_per_worker": 0}, "gpus_per_worker must be a positive number"),
        ({"gpus_per_worker": float("nan")}, "gpus_per_worker must be a positive number"),
        ({"cpus_per_worker": True}, r"cpus_per_worker must be a positive number, got True \(bool\)"),
        ({"cpus_per_worker": "2"}, "cpus_per_worker must be a positive number"),
        ({"cpus_per_worker": 0.00001}, "below Ray's resource precision"),
        ({"use_gpu": "yes"}, "use_gpu must be True or False"),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RayHostDiscovery(**kwargs)  # type: ignore[arg-type]
