"""StaticHostDiscovery and ScriptHostDiscovery, including every way a discovery script can go wrong."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from elastrain.discovery import HostDiscoveryError, HostInfo, ScriptHostDiscovery, StaticHostDiscovery


def write_script(directory: Path, body: str, *, executable: bool = True) -> Path:
    path = directory / "discover.sh"
    path.write_text("#!/bin/sh\n" + body)
    if executable:
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


class TestStatic:
    def test_mapping_and_string_agree(self) -> None:
        assert StaticHostDiscovery({"h1": 2, "h2": 1}).find_available_hosts_and_slots() == {"h1": 2, "h2": 1}
        assert StaticHostDiscovery("h1:2, h2:1").find_available_hosts_and_slots() == {"h1": 2, "h2": 1}

    def test_zero_slot_hosts_are_omitted(self) -> None:
        assert StaticHostDiscovery({"h1": 0, "h2": 3}).find_available_hosts_and_slots() == {"h2": 3}

    def test_set_hosts_replaces_the_set(self) -> None:
        discovery = StaticHostDiscovery({"h1": 2})
        discovery.set_hosts("h2:1\nh3:1")
        assert discovery.find_available_hosts() == {
            "h2": HostInfo("h2", 1),
            "h3": HostInfo("h3", 1),
        }

    @pytest.mark.parametrize(
        ("hosts", "message"),
        [
            ({"h1": -1}, "slots for host 'h1' must be an integer >= 0, got -1"),
            ({"h1": 1.5}, "must be an integer >= 0"),
            ({"h1": True}, "must be an integer >= 0"),
            ({"": 1}, "host names must be non-empty strings"),
            ("h1:two", r"slots in 'h1:two' must be an integer, e\.g\. 'h1:4'"),
            ("h1", r"entry 'h1' has no slot count; write it as 'h1:<slots>'"),
            ("h1:1,h1:2", "host 'h1' is listed twice"),
            (["h1"], "takes a mapping"),
        ],
    )
    def test_bad_hosts(self, hosts: object, message: str) -> None:
        with pytest.raises(ValueError, match=message):
            StaticHostDiscovery(hosts)  # type: ignore[arg-type]


class TestScript:
    def test_reads_host_lines(self, tmp_path: Path) -> None:
        script = write_script(tmp_path, "echo 'h1:2'\necho '# a comment'\necho\necho 'h2:1  # trailing'\n")
        assert ScriptHostDiscovery(script).find_available_hosts_and_slots() == {"h1": 2, "h2": 1}

    def test_bare_hosts_take_default_slots(self, tmp_path: Path) -> None:
        script = write_script(tmp_path, "echo h1\necho h2:3\n")
        assert ScriptHostDiscovery(script, default_slots=4).find_available_hosts_and_slots() == {
            "h1": 4,
            "h2": 3,
        }

    def test_output_can_change_between_polls(self, tmp_path: Path) -> None:
        hosts_file = tmp_path / "hosts"
        hosts_file.write_text("h1:1\n")
        script = write_script(tmp_path, f"cat {hosts_file}\n")
        discovery = ScriptHostDiscovery(script)
        assert discovery.find_available_hosts_and_slots() == {"h1": 1}
        hosts_file.write_text("h1:1\nh2:2\n")
        assert discovery.find_available_hosts_and_slots() == {"h1": 1, "h2": 2}

    def test_env_is_passed(self, tmp_path: Path) -> None:
        script = write_script(tmp_path, 'echo "$HOSTS_FROM_ENV"\n')
        discovery = ScriptHostDiscovery(script, env={"HOSTS_FROM_ENV": "h9:9"})
        assert discovery.find_available_hosts_and_slots() == {"h9": 9}

    def test_timeout(self, tmp_path: Path) -> None:
        script = write_script(tmp_path, "exec sleep 5\n")
        with pytest.raises(HostDiscoveryError, match=r"did not finish within 0\.2 s; make it faster"):
            ScriptHostDiscovery(script, timeout_s=0.2).find_available_hosts_and_slots()

    def test_non_zero_exit_shows_stderr(self, tmp_path: Path) -> None:
        script = write_script(tmp_path, "echo 'cannot reach the scheduler' >&2\nexit 3\n")
        with pytest.raises(HostDiscoveryError, match=r"exited with status 3; .*\ncannot reach the scheduler"):
            ScriptHostDiscovery(script).find_available_hosts_and_slots()

    def test_non_zero_exit_without_stderr(self, tmp_path: Path) -> None:
        script = write_script(tmp_path, "exit 1\n")
        with pytest.raises(HostDiscoveryError, match="exited with status 1 and printed nothing on stderr"):
            ScriptHostDiscovery(script).find_available_hosts_and_slots()

    @pytest.mark.parametrize(
        ("output", "message"),
        [
            ("h1:x", r"slots in 'h1:x' must be an integer"),
            ("h1", r"entry 'h1' has no slot count"),
            ("h1:-2", r"slots for host 'h1' must be an integer >= 0, got -2"),
            ("bad host:2", r"malformed entry 'bad host:2'; expected 'host:slots'"),
            (":2", r"malformed entry ':2'"),
        ],
    )
    def test_malformed_output(self, tmp_path: Path, output: str, message: str) -> None:
        script = write_script(tmp_path, f"echo '{output}'\n")
        with pytest.raises(HostDiscoveryError, match=message):
            ScriptHostDiscovery(script).find_available_hosts_and_slots()

    def test_missing_script(self, tmp_path: Path) -> None:
        with pytest.raises(ValueError, match="does not exist or is not a file"):
            ScriptHostDiscovery(tmp_path / "nope.sh")

    def test_script_not_executable(self, tmp_path: Path) -> None:
        script = write_script(tmp_path, "echo h1:1\n", executable=False)
        with pytest.raises(ValueError, match=r"is not executable; run `chmod \+x "):
            ScriptHostDiscovery(script)

    def test_bad_timeout(self, tmp_path: Path) -> None:
        script = write_script(tmp_path, "echo h1:1\n")
        with pytest.raises(ValueError, match="timeout_s must be a positive number"):
            ScriptHostDiscovery(script, timeout_s=0)
