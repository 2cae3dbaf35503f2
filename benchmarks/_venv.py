"""The peers' virtualenv: torchdata 0.9, webdataset 1.0.2, wids and s3fs, created on first use.

torchdata 0.9 cannot be installed next to torchdata 0.11 (shardpipes' runtime dependency), and
its DataPipes register the same functional names as shardpipes, so the peers live in their own
environment under ``.bench/`` (ignored by git) and run in their own processes. Installing
with ``-c constraints.txt`` keeps torch at the pinned CPU wheel (any other torch pulls GBs of
CUDA packages). wids is its own distribution: webdataset 1.0.2's wheel does not ship it.
"""

from __future__ import annotations

import os
import subprocess
import sys

__all__ = ["PEER_REQUIREMENTS", "ensure_peers_venv"]

# s3fs: torchdata 0.9's open_files_by_fsspec over the loopback S3 of --s3.
PEER_REQUIREMENTS = ["torchdata==0.9.0", "webdataset==1.0.2", "wids==0.1.11", "numpy", "s3fs"]

_CHECK = (
    "import warnings; warnings.simplefilter('ignore');"
    "from importlib.metadata import version as v;"
    "import torchdata.datapipes.iter, torchdata.dataloader2, webdataset, wids, s3fs;"
    "assert v('torchdata') == '0.9.0' and v('webdataset') == '1.0.2' and v('wids') == '0.1.11', 'versions';"
    "print(v('torch'))"
)


def _python(venv: str) -> str:
    return os.path.join(venv, "bin", "python")


def ensure_peers_venv(venv: str, constraints: str, log=print) -> tuple[str | None, str]:
    """Return ``(python of the venv, "")``, creating it when missing; ``(None, reason)`` on failure."""
    py = _python(venv)
    if os.path.exists(py):
        ok = subprocess.run([py, "-c", _CHECK], capture_output=True, text=True)
        if ok.returncode == 0:
            return py, ""
        log(
            f"peers venv {venv} is incomplete ({ok.stderr.strip().splitlines()[-1:]}); reinstalling"
        )
    else:
        log(f"creating the peers venv {venv} ({', '.join(PEER_REQUIREMENTS)}); about 30 s")
        made = subprocess.run([sys.executable, "-m", "venv", venv], capture_output=True, text=True)
        if made.returncode != 0:
            return None, f"python -m venv failed: {made.stderr.strip()}"
    cmd = [py, "-m", "pip", "install", "-q", "-c", constraints, *PEER_REQUIREMENTS]
    inst = subprocess.run(cmd, capture_output=True, text=True)
    if inst.returncode != 0:
        return None, f"{' '.join(cmd)} failed: {inst.stderr.strip()[-500:]}"
    ok = subprocess.run([py, "-c", _CHECK], capture_output=True, text=True)
    if ok.returncode != 0:
        return None, f"the peers do not import: {ok.stderr.strip()[-500:]}"
    return py, ""
