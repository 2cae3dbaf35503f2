"""The peers' virtualenv: torchdata 0.9, webdataset 1.0.2, wids, s3fs, LitData, MosaicML streaming,
Megatron-Energon and DALI, created on first use.

torchdata 0.9 cannot be installed next to torchdata 0.11 (shardpipes' runtime dependency), and
its DataPipes register the same functional names as shardpipes, so the peers live in their own
environment under ``.bench/`` (ignored by git) and run in their own processes. Installing
with ``-c constraints.txt`` keeps torch at the pinned CPU wheel (any other torch pulls GBs of
CUDA packages). wids is its own distribution: webdataset 1.0.2's wheel does not ship it.

mosaicml-streaming requires torchvision, and pip brings the index's torchvision wheel, which is
built against CUDA torch: its ``_C.so`` links ``libtorch_cuda.so``, which the CPU torch does not
have, so ``import torchvision`` fails (``operator torchvision::nms does not exist``), and with
it ``import streaming``. No torchvision that loads can be had beside this torch, so the venv
does not keep it (``pip uninstall torchvision`` after the install) rather than carry a broken
package or a stand-in; ``_peers.mosaic_base`` imports Mosaic's reader and writer
(``streaming.base``, which never uses torchvision) without the package ``__init__`` that pulls
``streaming.vision`` in. LitData, Energon and DALI import without torchvision.
"""

from __future__ import annotations

import os
import subprocess
import sys

__all__ = ["PEER_REQUIREMENTS", "ensure_peers_venv"]

# s3fs: torchdata 0.9's open_files_by_fsspec over the loopback S3 of --s3.
PEER_REQUIREMENTS = [
    "torchdata==0.9.0",
    "webdataset==1.0.2",
    "wids==0.1.11",
    "numpy",
    "s3fs",
    "pillow",
    "litdata==0.2.76",
    "mosaicml-streaming==0.13.0",
    "megatron-energon==7.4.1",
    "nvidia-dali-cuda120==2.4.0",
]

_CHECK = (
    "import warnings; warnings.simplefilter('ignore');"
    "from importlib.metadata import version as v;"
    "import torchdata.datapipes.iter, torchdata.dataloader2, webdataset, wids, s3fs, PIL;"
    "import litdata, megatron.energon, nvidia.dali.fn, importlib.util as u;"
    "assert u.find_spec('streaming') is not None, 'mosaicml-streaming';"
    "assert u.find_spec('torchvision') is None, 'torchvision (broken beside CPU torch) is installed';"
    "assert v('torchdata') == '0.9.0' and v('webdataset') == '1.0.2' and v('wids') == '0.1.11', 'versions';"
    "assert v('litdata') == '0.2.76' and v('mosaicml-streaming') == '0.13.0', 'versions';"
    "assert v('megatron-energon') == '7.4.1' and v('nvidia-dali-cuda120') == '2.4.0', 'versions';"
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
        log(f"creating the peers venv {venv} ({', '.join(PEER_REQUIREMENTS)}); a few minutes")
        made = subprocess.run([sys.executable, "-m", "venv", venv], capture_output=True, text=True)
        if made.returncode != 0:
            return None, f"python -m venv failed: {made.stderr.strip()}"
    cmd = [py, "-m", "pip", "install", "-q", "-c", constraints, *PEER_REQUIREMENTS]
    inst = subprocess.run(cmd, capture_output=True, text=True)
    if inst.returncode != 0:
        return None, f"{' '.join(cmd)} failed: {inst.stderr.strip()[-500:]}"
    # see the module docstring: the index's torchvision cannot load beside the CPU torch
    subprocess.run([py, "-m", "pip", "uninstall", "-y", "-q", "torchvision"], capture_output=True)
    ok = subprocess.run([py, "-c", _CHECK], capture_output=True, text=True)
    if ok.returncode != 0:
        return None, f"the peers do not import: {ok.stderr.strip()[-500:]}"
    return py, ""
