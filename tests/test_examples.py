"""Every examples/*.py runs as written, on tiny synthetic data it makes itself.

Each example is started the way its docstring says (``python examples/X.py`` or ``torchrun``)
as a subprocess in a temporary folder, with flags that keep it small, and its output is
checked: equal batch counts per rank, losses printed, exact resume, disjoint and complete
coverage.

The Lightning and Ray examples are marked ``heavy`` (outside the default run; ``tox -e heavy``
installs both and runs them). They skip when their package is not importable, except where
``SHARDPIPES_REQUIRE_HEAVY=1`` (set by ``tox -e heavy``): there a missing package fails.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

# The test that runs each example; test_every_example_is_tested keeps this complete.
TESTED = {
    "ddp_train.py": "test_ddp_train_equal_batches_and_exact_resume",
    "external_consumer.py": "test_external_consumer_readers_are_disjoint_and_cover_the_data",
    "s3_stream.py": "test_s3_stream_reads_every_sample_from_moto",
    "lightning_ddp.py": "test_lightning_ddp_ranks_run_equal_batches",
    "lightning_mixing.py": "test_lightning_mixing_resumes_exactly_under_ddp",
    "ray_train.py": "test_ray_train_workers_run_equal_batches",
    "telemetry_logging.py": "test_telemetry_logging_names_the_costly_stage",
    "telemetry_tensorboard.py": "test_telemetry_tensorboard_writes_the_loaders_scalars",
    "telemetry_lightning.py": "test_telemetry_lightning_logs_figures_that_report_draws",
}

TIMEOUT = 240  # seconds for one example run; longer is a hang


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # The example sees shardpipes as a user would: the package, not the tests' helpers. It is
    # this checkout's package (its pipes/ first), so a git worktree tests its own code.
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent / "pipes")
    env["GLOO_SOCKET_IFNAME"] = "lo"  # ranks talk over loopback only
    env["PYTHONUNBUFFERED"] = "1"  # output up to a hang or crash is shown
    # moto accepts the example's dummy keys; keep real AWS settings out of the way.
    for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        env.pop(var, None)
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    return env


def run_example(cmd: list[str], cwd: Path, timeout: float = TIMEOUT) -> str:
    """Run ``cmd`` in ``cwd``; return its stdout, or fail with both streams.

    The example runs in a session of its own, so that a hang kills all of it (torchrun's
    ranks, their worker processes), not only the process started here.
    """
    with subprocess.Popen(
        cmd,
        cwd=cwd,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            pytest.fail(f"{cmd} hung past {timeout} s\nstdout:\n{stdout}\nstderr:\n{stderr}")
    if proc.returncode != 0:
        pytest.fail(
            f"{cmd} exited with {proc.returncode}\n--- stdout ---\n{stdout}--- stderr ---\n{stderr}"
        )
    return stdout


def python(example: str, *args: str) -> list[str]:
    return [sys.executable, str(EXAMPLES / example), *args]


# torchrun --tee 1 prefixes each line of rank R's stdout with "[default<R>]:", line by line,
# so the ranks' lines cannot be cut into each other.
_TORCHRUN_LINE = re.compile(r"^\[default(?P<rank>\d+)\]:(?P<line>.*)$")


def torchrun(example: str, *args: str, nproc: int = 2) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", str(nproc), "--tee", "1", str(EXAMPLES / example), *args,
    ]  # fmt: skip


def rank_lines(stdout: str) -> list[str]:
    out = []
    for line in stdout.splitlines():
        m = _TORCHRUN_LINE.match(line)
        if m:
            out.append(m.group("line"))
    return out


def require(module: str) -> None:
    """Skip when ``module`` is missing, or fail where SHARDPIPES_REQUIRE_HEAVY=1."""
    if importlib.util.find_spec(module) is not None:
        return
    message = f"{module} is not installed; tox -e heavy installs it"
    if os.environ.get("SHARDPIPES_REQUIRE_HEAVY") == "1":
        pytest.fail(message)
    pytest.skip(message)


def test_every_example_is_tested():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(TESTED)
    names = set(globals())
    assert not [t for t in TESTED.values() if t not in names]


# --- ddp_train.py -------------------------------------------------------------------------------

_EPOCH = re.compile(
    r"^rank (?P<rank>\d+) epoch (?P<epoch>\d+): (?P<batches>\d+) batches"
    r"(?: \((?P<after>\d+) after the resume\))?, mean loss (?P<loss>\d+\.\d+)$"
)
_DONE = re.compile(r"^rank (?P<rank>\d+): done, weights checksum (?P<sum>-?\d+\.\d+)$")
_PREEMPTED = re.compile(
    r"^rank (?P<rank>\d+) epoch (?P<epoch>\d+): preempted after (?P<n>\d+) batches"
)


def ddp_summary(lines: list[str]) -> tuple[dict[tuple[int, int], re.Match[str]], dict[int, str]]:
    """``{(epoch, rank): epoch line}`` and ``{rank: weights checksum}``."""
    epochs = {}
    sums = {}
    for line in lines:
        if m := _EPOCH.match(line):
            epochs[int(m["epoch"]), int(m["rank"])] = m
        elif m := _DONE.match(line):
            sums[int(m["rank"])] = m["sum"]
    return epochs, sums


@pytest.mark.distributed
@pytest.mark.timeout(3 * TIMEOUT + 60)  # three torchrun runs
def test_ddp_train_equal_batches_and_exact_resume(tmp_path):
    small = [
        "--epochs",
        "2",
        "--shards",
        "5",
        "--samples",
        "40",
        "--batch-size",
        "8",
        "--workers",
        "2",
    ]

    # The uninterrupted run: 2 epochs, data written by rank 0 into --data.
    full = rank_lines(
        run_example(
            torchrun("ddp_train.py", *small, "--data", "data", "--checkpoint", "full"),
            tmp_path,
        )
    )
    epochs, sums = ddp_summary(full)
    assert sorted(epochs) == [(0, 0), (0, 1), (1, 0), (1, 1)], full
    for epoch in (0, 1):
        # Uneven shards (5 over 2 ranks x 2 workers), yet every rank runs the same steps.
        assert epochs[epoch, 0]["batches"] == epochs[epoch, 1]["batches"], full
        assert int(epochs[epoch, 0]["batches"]) > 0
    assert float(epochs[1, 0]["loss"]) < float(epochs[0, 0]["loss"]), "the loss should fall"
    assert sums[0] == sums[1], full  # DDP keeps the ranks' weights identical
    assert sorted(os.listdir(tmp_path / "full")) == ["rank0.pt", "rank1.pt"]
    assert len(list((tmp_path / "data").glob("train-*.tar"))) == 5

    # Preempted 3 batches into epoch 1 (default --data: a temporary folder, removed after)...
    steps = int(epochs[0, 0]["batches"]) + 3
    cut = rank_lines(
        run_example(
            torchrun("ddp_train.py", *small, "--checkpoint", "cut", "--preempt-after", str(steps)),
            tmp_path,
        )
    )
    preempted = [m for line in cut if (m := _PREEMPTED.match(line))]
    assert sorted((m["rank"], m["epoch"], m["n"]) for m in preempted) == [
        ("0", "1", "3"),
        ("1", "1", "3"),
    ], cut
    assert not any(_DONE.match(line) for line in cut)

    # ... then resumed: the rest of epoch 1, ending with exactly the uninterrupted weights.
    resumed = rank_lines(
        run_example(
            torchrun("ddp_train.py", *small, "--checkpoint", "cut", "--resume"),
            tmp_path,
        )
    )
    assert sum("resumed from" in line and "epoch 1, after batch 3" in line for line in resumed) == 2
    r_epochs, r_sums = ddp_summary(resumed)
    assert sorted(r_epochs) == [(1, 0), (1, 1)], resumed
    for rank in (0, 1):
        assert r_epochs[1, rank]["batches"] == epochs[1, rank]["batches"]
        assert int(r_epochs[1, rank]["after"]) == int(epochs[1, rank]["batches"]) - 3
    assert r_sums == sums, "the resumed run must end with the uninterrupted run's weights"


# --- external_consumer.py -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shards", "world", "epochs"),
    [
        (5, 1, 2),
        (3, 2, 1),  # 4 readers, 3 shards: one reader gets nothing, the others cover everything
    ],
    ids=["1rank-2workers-5shards", "2ranks-2workers-3shards"],
)
def test_external_consumer_readers_are_disjoint_and_cover_the_data(tmp_path, shards, world, epochs):
    flags = ["--shards", str(shards), "--samples", "20", "--workers", "2"]
    flags += ["--world", str(world), "--epochs", str(epochs)]
    lines = run_example(python("external_consumer.py", *flags), tmp_path).splitlines()
    total = sum(20 + 7 * i for i in range(shards))
    coverage = [ln for ln in lines if "readers disjoint" in ln]
    assert coverage == [
        f"epoch {e}: readers disjoint: True; cover all {total} samples: True" for e in range(epochs)
    ], lines
    repeatable = [ln for ln in lines if ln.endswith("the same batches when asked again: True")]
    assert len(repeatable) == epochs * world * 2, lines
    as_dataloader2 = [ln for ln in lines if "the same batches as DataLoader2" in ln]
    if world == 1:  # the example compares with DataLoader2 on one rank only
        assert as_dataloader2 == [
            f"epoch {e}: the same batches as DataLoader2 with 2 worker processes: True"
            for e in range(epochs)
        ], lines
    if epochs > 1:
        assert "epoch 1: a new order from epoch 0: True" in lines
    assert lines[-1] == "all checks passed"


# --- s3_stream.py ---------------------------------------------------------------------------------


@pytest.mark.s3
def test_s3_stream_reads_every_sample_from_moto(tmp_path):
    flags = ["--shards", "3", "--samples", "30", "--workers", "2", "--epochs", "2"]
    out = run_example(python("s3_stream.py", *flags), tmp_path)
    lines = out.splitlines()
    assert re.match(r"^moto S3 server at http://127\.0\.0\.1:\d+$", lines[0]), out
    total = 30 + 37 + 44
    assert f"uploaded 3 shards ({total} samples) to s3://" in out
    epochs = [ln for ln in lines if ln.startswith("epoch ")]
    assert len(epochs) == 2, out
    for line in epochs:
        assert re.match(
            rf"^epoch \d: {total} samples in \d+ batches, .* samples/s; every sample once: True$",
            line,
        ), line
    assert lines[-1] == "done"


# --- telemetry_*.py -----------------------------------------------------------------------------


def test_telemetry_logging_names_the_costly_stage(tmp_path):
    out = run_example(python("telemetry_logging.py", "--samples", "800", "--every", "10"), tmp_path)
    (final,) = [line for line in out.splitlines() if line.startswith("verdict: ")]
    # The augmentation (1,500 hashes a sample, 16 a batch) dwarfs the 2 ms step: the loop waits
    # for most of each step. ("data-bound" alone would also match "not data-bound".) Which stage
    # it names comes from stack samples: tests/test_telemetry.py checks that.
    assert final.startswith("verdict: data-bound at "), final


def test_telemetry_tensorboard_writes_the_loaders_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = run_example(
        python("telemetry_tensorboard.py", "--logdir", "tb", "--samples", "800"), tmp_path
    )
    assert "verdict: " in out
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"loss", "data/wait_share", "data/samples_per_s", "data/mb_per_s"} <= tags
    assert [e.step for e in events.Scalars("data/wait_share")] == [10, 20]  # 25 steps, every 10


def test_telemetry_lightning_logs_figures_that_report_draws(tmp_path):
    out = run_example(
        python("telemetry_lightning.py", "--out", "logs", "--samples", "800"), tmp_path
    )
    (metrics,) = tmp_path.glob("logs/telemetry/version_*/metrics.csv")
    assert str(metrics.relative_to(tmp_path)) in out
    report = run_example(
        [sys.executable, "-m", "shardpipes", "report", str(metrics), "-o", "picture.png"], tmp_path
    )
    assert "2 intervals drawn into picture.png" in report
    assert (tmp_path / "picture.png").stat().st_size > 0


# --- heavy: Lightning and Ray -------------------------------------------------------------------

_PER_RANK = re.compile(
    r"rank (?P<rank>\d) epoch (?P<epoch>\d+): (?P<batches>\d+) batches, mean loss (?P<loss>\d+\.\d+)"
)


@pytest.mark.heavy  # not also `distributed`: `pytest -m distributed` should not pick it up
@pytest.mark.timeout(2 * TIMEOUT)
def test_lightning_ddp_ranks_run_equal_batches(tmp_path):
    require("lightning")
    flags = ["--epochs", "2", "--shards", "3", "--samples", "20", "--workers", "1"]
    out = run_example(python("lightning_ddp.py", *flags), tmp_path)
    seen: dict[tuple[int, int], int] = {}
    for m in _PER_RANK.finditer(out):
        seen[int(m["epoch"]), int(m["rank"])] = int(m["batches"])
    assert sorted(seen) == [(0, 0), (0, 1), (1, 0), (1, 1)], out
    for epoch in (0, 1):
        assert seen[epoch, 0] == seen[epoch, 1] > 0, out


@pytest.mark.heavy
@pytest.mark.timeout(4 * TIMEOUT)
def test_lightning_mixing_resumes_exactly_under_ddp(tmp_path):
    # Straight through 20 steps (an epoch is 16); then checkpoints every 5 steps, and a run
    # resumed from step 5: every rank takes exactly the batches the first run took after it,
    # across the schedule's change at step 6 and the epoch boundary.
    require("lightning")
    data = str(tmp_path / "data")

    def run(*flags: str) -> str:
        cmd = python("lightning_mixing.py", "--data", data, "--steps", "20", *flags)
        return run_example(cmd, tmp_path, timeout=TIMEOUT)

    run("--seen", "whole")
    run("--save-every", "5")
    out = run("--resume", str(tmp_path / "ckpt" / "epoch=0-step=5.ckpt"), "--seen", "tail")
    assert sorted(out.splitlines()) == ["rank 0: 15 steps", "rank 1: 15 steps"], out
    for rank in (0, 1):
        whole = json.loads((tmp_path / f"whole-{rank}.json").read_text())
        tail = json.loads((tmp_path / f"tail-{rank}.json").read_text())
        assert len(whole) == 20 * 8 and tail == whole[5 * 8 :]


@pytest.mark.heavy
@pytest.mark.timeout(2 * TIMEOUT)
def test_ray_train_workers_run_equal_batches(tmp_path):
    require("ray")
    require("ray.train")
    flags = ["--epochs", "2", "--shards", "3", "--samples", "20", "--workers", "1"]
    out = run_example(python("ray_train.py", *flags), tmp_path)
    lines = [ln for ln in out.splitlines() if ln.startswith("epoch ")]
    assert len(lines) == 2, out
    for epoch, line in enumerate(lines):
        m = re.match(
            rf"^epoch {epoch}: rank 0: (\d+) batches, mean loss \d+\.\d+, "
            r"rank 1: (\d+) batches, mean loss \d+\.\d+$",
            line,
        )
        assert m, line
        assert m[1] == m[2] and int(m[1]) > 0, line


@pytest.mark.heavy
@pytest.mark.timeout(2 * TIMEOUT)
def test_ray_train_with_readers_on_a_ray_pool_runs_equal_batches(tmp_path):
    require("ray")
    require("ray.train")
    flags = ["--epochs", "2", "--shards", "3", "--samples", "20", "--workers", "2"]
    out = run_example(python("ray_train.py", *flags, "--ray-readers", "2"), tmp_path)
    lines = [ln for ln in out.splitlines() if ln.startswith("epoch ")]
    assert len(lines) == 2, out
    for line in lines:  # every rank the same number of batches, each epoch
        m = re.match(r"^epoch \d: rank 0: (\d+) batches, .*, rank 1: (\d+) batches, ", line)
        assert m and m[1] == m[2] and int(m[1]) > 0, line
