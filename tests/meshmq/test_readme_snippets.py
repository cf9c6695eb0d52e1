"""The README's first steps work as written (issue 27): the first command installs what the
quick tour's Python snippet imports, the snippet itself replays a device against a real
broker, and the install lines name the checkout (meshmq is on no package index).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
from helpers.broker import REPO_ROOT, BrokerProc
from helpers.clients import ClientFactory, unique

pytestmark = pytest.mark.timeout(120)

README = (REPO_ROOT / "README.md").read_text()
# import name -> the distribution pip installs it from
_DISTRIBUTIONS = {"paho": "paho-mqtt"}


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def _tour_snippet() -> str:
    tour = README[README.index("## Quick tour"):]
    return re.search(r"```python\n(.*?)```", tour, flags=re.S).group(1)


def test_first_command_installs_what_the_tour_imports() -> None:
    first = _blocks("sh")[0]
    assert "pip install" in first and "-e ." in first, first
    for module in sorted(set(re.findall(r"^(?:import|from) (\w+)", _tour_snippet(), re.M))):
        if module in sys.stdlib_module_names:
            continue
        dist = _DISTRIBUTIONS.get(module, module)
        assert dist in first, (f"the quick tour imports {module!r}; the first command must "
                               f"install {dist!r}: {first.strip()}")


def test_install_lines_name_the_checkout() -> None:
    assert "pip install 'meshmq[spark]'" not in README
    assert "pip install -e '.[spark]'" in README


def test_tour_snippet_replays_a_device(tmp_path, clients: ClientFactory) -> None:
    broker = BrokerProc(tmp_path / "b", ws=False).start()
    try:
        pub = clients(broker, unique("tour")).connect()
        pub.publish("devices/d1/temp", "21.5", qos=1)
        pub.stop()
        code = _tour_snippet().replace('c.connect("127.0.0.1")',
                                       f'c.connect("127.0.0.1", {broker.port})')
        assert str(broker.port) in code, "the snippet's connect line changed: update this test"
        proc = subprocess.Popen([sys.executable, "-u", "-c", code], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 60
            line = ""
            while time.monotonic() < deadline:
                line = proc.stdout.readline()  # type: ignore[union-attr]
                if not line or "devices/d1/temp" in line:
                    break
            assert "devices/d1/temp" in line and "21.5" in line, line
        finally:
            proc.kill()
            proc.wait(10)
    finally:
        broker.stop()
