"""The wheel that wheels/build.sh builds installs into a fresh virtual environment and passes
wheels/smoke.py there."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_builds_installs_and_passes_smoke(tmp_path):
    # the fresh environment must import the installed wheel, not a checkout on PYTHONPATH
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(["bash", str(ROOT / "wheels/build.sh"), str(tmp_path / "dist")],
                          capture_output=True, text=True, timeout=1500, env=env)
    out = proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.returncode == 0, out
    assert "smoke test passed" in proc.stdout, out
    wheels = list((tmp_path / "dist").glob("bubo-*.whl"))
    assert len(wheels) == 1
    # the wheel carries the native library and every extension module
    import zipfile

    names = zipfile.ZipFile(wheels[0]).namelist()
    assert any(n.endswith("libbubo.so") for n in names), names
    assert any("_kernels" in n and n.endswith(".so") for n in names), names
    # and the chat page's files
    assert {"bubo/webui/page.html", "bubo/webui/page.css", "bubo/webui/page.js"} <= set(names), names
