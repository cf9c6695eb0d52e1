"""The `meshmq` CLI as a subprocess, and the two log formats."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(args: list[str], env: dict[str, str] | None = None,
        stdin: str = "") -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MESHMQ_")}
    return subprocess.run([sys.executable, *args], input=stdin, text=True, capture_output=True,
                          cwd=ROOT, env={**base, **(env or {})}, timeout=60)


def test_version():
    result = run(["-m", "meshmq", "version"])
    assert result.returncode == 0
    assert re.fullmatch(r"meshmq \d+\.\d+\.\d+.*\n", result.stdout)


def test_no_command_prints_help_and_exits_2():
    result = run(["-m", "meshmq"])
    assert result.returncode == 2 and "serve" in result.stderr


def test_serve_config_error_is_one_line_exit_2():
    result = run(["-m", "meshmq", "serve"], env={"MESHMQ_MQTT__MAX_INFLIGHT": "abc"})
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == ('config error: mqtt.max_inflight: expected an integer between 1 '
                             'and 65535, got "abc" (from MESHMQ_MQTT__MAX_INFLIGHT)\n')


def test_serve_missing_config_file(tmp_path):
    result = run(["-m", "meshmq", "serve", "-c", str(tmp_path / "none.toml")])
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "cannot read" in result.stderr


def test_serve_rejects_bad_flag_values():
    result = run(["-m", "meshmq", "serve", "--log-format", "xml"])
    assert result.returncode == 2 and "invalid choice" in result.stderr


EMIT = """
import logging, sys
from meshmq.logs import setup_logging
setup_logging(sys.argv[1], sys.argv[2])
log = logging.getLogger("broker.router")
log.debug("hidden")
log.info("client connected", extra={"client_id": "abc", "peer": "127.0.0.1:5555"})
log.warning("two words", extra={"reason": "queue full", "n": 3})
try:
    1 / 0
except ZeroDivisionError:
    log.exception("boom")
"""


def test_text_log_format():
    result = run(["-c", EMIT, "info", "text"])
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO broker\.router client "
                        r"connected client_id=abc peer=127\.0\.0\.1:5555", lines[0])
    assert lines[1].endswith('WARNING broker.router two words reason="queue full" n=3')
    assert "ERROR broker.router boom" in lines[2]
    assert "ZeroDivisionError" in result.stderr
    assert "hidden" not in result.stderr and result.stdout == ""


def test_json_log_format():
    result = run(["-c", EMIT, "debug", "json"])
    assert result.returncode == 0, result.stderr
    docs = [json.loads(line) for line in result.stderr.splitlines()]
    assert [d["msg"] for d in docs] == ["hidden", "client connected", "two words", "boom"]
    info = docs[1]
    assert info["level"] == "info" and info["logger"] == "broker.router"
    assert info["client_id"] == "abc" and info["peer"] == "127.0.0.1:5555"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", info["ts"])
    assert docs[2]["n"] == 3
    assert "ZeroDivisionError" in docs[3]["exc"]
