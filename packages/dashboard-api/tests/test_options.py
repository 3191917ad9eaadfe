"""Every option of create_app, RaySource and the CLI: good values work, bad ones get an error that says what to
change (no Ray needed: options are checked before anything connects)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from elastrain.dashboard_api import RaySource, create_app, read_token_file
from elastrain.dashboard_api._private.cli import ARGV_TOKEN_WARNING, parse

TOKEN = "a-long-enough-test-token"  # noqa: S105
ANY_ADDRESS = "0.0.0.0"  # noqa: S104 - what the CLI must refuse without a token


@pytest.fixture(autouse=True)
def no_token_in_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ELASTRAIN_DASHBOARD_TOKEN", raising=False)


def cli_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        parse(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("token", "says"),
    [
        ("", "is empty"),
        ("short-token", "has 11 characters; it needs at least 16"),
        ("a token with spaces in it", "holds a space"),
        ("ünïcödé-token-of-some-length", "non-ASCII"),
        (b"a-long-enough-test-token", "must be a string, got bytes"),
    ],
)
def test_create_app_rejects_bad_tokens(token: Any, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        create_app(token=token)


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("", "is empty: remove it"),
        (" dash.example.com", "has spaces around it"),
        ("https://dash.example.com", "is a URL: give the host name alone"),
        ("dash.example.com/x", "is a URL"),
        ("dash.example.com:8266", "has a port: give the host name alone"),
        ("*.example.com", "has a wildcard: list each host name"),
        ("dash_board", "is not a host name or IP address"),
        ("-dash.example.com", "is not a host name or IP address"),
        (7, "must be strings, got 7"),
    ],
)
def test_create_app_rejects_malformed_allowed_hosts(entry: Any, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        create_app(allowed_hosts=["ok.example.com", entry])


def test_allowed_hosts_must_be_a_list_not_a_string() -> None:
    with pytest.raises(ValueError, match="wrap it in a list"):
        create_app(allowed_hosts="dash.example.com")


def test_allowed_hosts_accepts_names_and_addresses() -> None:
    create_app(allowed_hosts=["dash.example.com", "Dash.Example.com.", "10.0.0.5", "::1", "[fe80::1]", "localhost"])


@pytest.mark.parametrize(
    ("timeout", "says"),
    [(0, "above 0"), (-1.5, "above 0"), (float("nan"), "a number of seconds"), ("5", "a number"), (True, "a number")],
)
def test_ray_source_rejects_bad_timeouts(timeout: Any, says: str) -> None:
    with pytest.raises(ValueError, match=f"timeout_s must be {says}"):
        RaySource(timeout_s=timeout)
    assert RaySource(timeout_s=2).timeout_s == 2.0


def test_a_token_file_is_read_without_its_line_break(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    assert read_token_file(token_file) == TOKEN
    args = parse(["--host", ANY_ADDRESS, "--token-file", str(token_file)])
    assert args.token == TOKEN
    assert capsys.readouterr().err == ""  # mode 600: nothing to warn about
    token_file.chmod(0o644)
    parse(["--token-file", str(token_file)])
    assert "readable by other users (mode 644)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "does not exist: write the token into it"),
        ("", "is empty: write the token into it"),
        ("\n", "is empty"),
        ("short\n", "has 5 characters; it needs at least 16"),
        (f"{TOKEN}\n{TOKEN}\n", "has more than one line: keep only the token"),
        (f" {TOKEN}\n", "holds a space"),
        ("x" * 5000, "has 5000 bytes, too many for a token"),
    ],
)
def test_the_cli_rejects_bad_token_files(
    content: str | None, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token_file = tmp_path / "token"
    if content is not None:
        token_file.write_text(content)
    error = cli_error(["--token-file", str(token_file)], capsys)
    assert f"token file '{token_file}' {says}" in error
    with pytest.raises(ValueError, match=says):
        read_token_file(token_file)


def test_the_cli_rejects_a_directory_as_token_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "is not a regular file" in cli_error(["--token-file", str(tmp_path)], capsys)


def test_the_cli_takes_the_token_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ELASTRAIN_DASHBOARD_TOKEN", TOKEN)
    assert parse(["--host", ANY_ADDRESS]).token == TOKEN
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("ELASTRAIN_DASHBOARD_TOKEN", "")
    assert "ELASTRAIN_DASHBOARD_TOKEN is empty" in cli_error([], capsys)
    monkeypatch.setenv("ELASTRAIN_DASHBOARD_TOKEN", "too-short")
    assert "ELASTRAIN_DASHBOARD_TOKEN has 9 characters" in cli_error([], capsys)


def test_a_token_on_the_command_line_works_with_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse(["--host", ANY_ADDRESS, "--token", TOKEN]).token == TOKEN
    assert ARGV_TOKEN_WARNING in capsys.readouterr().err
    assert "(ps, /proc)" in ARGV_TOKEN_WARNING
    assert "--token is empty" in cli_error(["--token", ""], capsys)
    assert "not both" in cli_error(["--token", TOKEN, "--token-file", os.devnull], capsys)


def test_the_cli_refuses_to_bind_off_loopback_without_a_token(capsys: pytest.CaptureFixture[str]) -> None:
    assert "give a token with --token-file" in cli_error(["--host", ANY_ADDRESS], capsys)
    assert parse([]).host == "127.0.0.1"
    assert parse(["--host", "::1"]).token is None
    assert "--port must be from 1 to 65535" in cli_error(["--port", "0"], capsys)


def test_the_cli_checks_allowed_hosts(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse(["--allowed-hosts", "b.example.com,A.example.com"]).allowed_hosts == ["a.example.com", "b.example.com"]
    assert "--allowed-hosts: allowed host '' is empty" in cli_error(["--allowed-hosts", "a.example.com,"], capsys)
    assert "has a port" in cli_error(["--allowed-hosts", "a.example.com:80"], capsys)
    assert parse([]).allowed_hosts is None
