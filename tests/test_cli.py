"""The ``shardpipes`` command line: write, index, inspect, splits, bench (and the console script)."""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from shardpipes.cli import COMMANDS, build_parser, main
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.index import ShardIndex

TOTAL = 11 + 13 + 17 + 19 + 23 + 29 + 31  # the shard_dir fixture


def _samples(pattern: str) -> list[dict]:
    dp = (
        IterableWrapper([pattern])
        .shard_expand()
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
    )
    return list(dp)


# --- write -------------------------------------------------------------------------------------


@pytest.fixture
def files(tmp_path) -> Path:
    root = tmp_path / "files"
    (root / "sub").mkdir(parents=True)
    for i in range(5):
        (root / f"img{i}.jpg").write_bytes(bytes([i]) * (100 + i))
        (root / f"img{i}.cls").write_text(str(i))
    (root / "sub" / "deep.seg.png").write_bytes(b"png")
    (root / ".hidden").write_text("skip me")
    return root


def test_write_groups_files_by_basename_into_shards(files, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["write", str(files), "-o", f"{out}/s-%03d.tar", "--maxcount", "2"]) == 0
    text = capsys.readouterr().out
    assert "wrote 6 samples" in text and "to 3 shard(s)" in text
    assert f"{out}/s-002.tar  2 samples" in text
    assert sorted(os.listdir(out)) == ["s-000.tar", "s-001.tar", "s-002.tar"]
    samples = _samples(f"{out}/s-{{000..002}}.tar")
    assert [s["__key__"] for s in samples] == ["img0", "img1", "img2", "img3", "img4", "sub/deep"]
    assert samples[3][".jpg"] == bytes([3]) * 103 and samples[3][".cls"] == b"3"
    assert set(samples[5]) == {"__key__", "__url__", ".seg.png"}


def test_write_splits_by_size_and_takes_single_files(files, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["write", str(files / "img0.jpg"), str(files / "img0.cls"), str(files / "img1.jpg")]
    assert main([*args, "-o", f"{out}/t-%d.tar", "--maxsize", "0.1KB"]) == 0
    assert "wrote 2 samples" in capsys.readouterr().out
    assert sorted(os.listdir(out)) == ["t-0.tar", "t-1.tar"]  # 101 bytes > 100: one sample each


def test_write_rejects_a_file_without_extension(files, tmp_path, capsys):
    (files / "README").write_text("x")
    assert main(["write", str(files), "-o", f"{tmp_path}/o-%d.tar"]) == 1
    assert re.search(r"README: file name has no extension", capsys.readouterr().err)
    assert not (tmp_path / "o-0.tar").exists()


def test_write_needs_a_placeholder(files, tmp_path, capsys):
    assert main(["write", str(files), "-o", f"{tmp_path}/o.tar"]) == 1
    assert "needs a %d placeholder" in capsys.readouterr().err


# --- index -------------------------------------------------------------------------------------


def test_index_writes_the_sidecar_next_to_the_shards(shard_dir, shard_pattern, capsys):
    assert main(["index", shard_pattern, "--workers", "2", "--no-progress"]) == 0
    out = capsys.readouterr()
    sidecar = os.path.join(shard_dir, "train.index.json")
    assert f"indexed 7 shards: {TOTAL} samples" in out.out and f"wrote {sidecar}" in out.out
    assert out.err == ""
    index = ShardIndex.load(sidecar)
    assert index.num_samples == TOTAL
    assert index.shards[0].keys == [s["__key__"] for s in _samples(index.urls[0])]


def test_index_of_a_folder_to_a_chosen_file_with_progress(shard_dir, tmp_path, capsys):
    out = str(tmp_path / "idx" / "all.json")
    assert main(["index", shard_dir, "-o", out]) == 0
    assert "indexing" in capsys.readouterr().err  # the progress bar
    with open(out) as f:
        doc = json.load(f)
    assert doc["num_shards"] == 7 and doc["shards"][0]["url"] == os.path.join(
        shard_dir, "train-000000.tar"
    )


def test_index_of_a_truncated_shard_fails_naming_it(shard_dir, capsys):
    bad = os.path.join(shard_dir, "train-000002.tar")
    with open(bad, "r+b") as f:
        f.truncate(4000)
    assert main(["index", shard_dir, "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert re.search(
        rf"shardpipes index: error: {bad}: truncated tar archive at byte offset \d+", err
    )


# --- inspect -----------------------------------------------------------------------------------


def test_inspect_shows_keys_fields_and_sizes(shard_dir, capsys):
    shard = os.path.join(shard_dir, "train-000000.tar")
    assert main(["inspect", shard, "-n", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == shard
    assert re.fullmatch(
        r"  000000_000000  offset 0  size \d+  \.cls 1 B  \.json \d+ B  \.bin 64 B", lines[1]
    )
    assert lines[2].startswith("  000000_000001  offset ")
    assert lines[3] == "first 2 samples shown; the shard has more"


def test_inspect_whole_shard_and_index(shard_dir, shard_pattern, capsys):
    assert main(["inspect", shard_pattern, "-n", "50"]) == 0
    text = capsys.readouterr().out
    assert "7 shards; showing the first" in text and text.endswith("11 samples in the shard\n")
    assert main(["index", shard_dir, "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["inspect", os.path.join(shard_dir, "train.index.json"), "-n", "2"]) == 0
    text = capsys.readouterr().out
    assert f"7 shards, {TOTAL} samples" in text
    assert "train-000001.tar  13 samples" in text and "... 5 more shards" in text


# --- splits ------------------------------------------------------------------------------------


def _reader_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("  rank ")]


def test_splits_with_index_are_exact_and_equal(shard_dir, capsys):
    assert main(["index", shard_dir, "--no-progress"]) == 0
    capsys.readouterr()
    assert (
        main(["splits", shard_dir, "--world", "3", "--workers", "2", "--seed", "4", "--epoch", "1"])
        == 0
    )
    out = capsys.readouterr()
    assert "exact sample-level split, policy drop" in out.out
    per = TOTAL // 6
    assert (
        f"3 ranks x 2 workers = 6 readers; {per} samples each, {TOTAL - 6 * per} dropped" in out.out
    )
    readers = _reader_lines(out.out)
    assert len(readers) == 6 and all(f": {per} samples  " in line for line in readers)
    assert [f"rank {r}: {2 * per} samples" for r in range(3)] == [
        line for line in out.out.splitlines() if line.startswith("rank ")
    ]
    # Every range names a shard and a slice; together they read TOTAL - dropped distinct samples.
    seen = set()
    for name, start, stop in re.findall(r"(train-\d+\.tar)\[(\d+):(\d+)\]", out.out):
        seen.update((name, i) for i in range(int(start), int(stop)))
    assert len(seen) == 6 * per
    assert out.err == ""


def test_splits_pad_and_idle_warning(shard_dir, capsys):
    index = os.path.join(shard_dir, "train.index.json")
    assert (
        main(["index", os.path.join(shard_dir, "train-000000.tar"), "-o", index, "--no-progress"])
        == 0
    )
    capsys.readouterr()
    assert (
        main(["splits", "--index", index, "--world", "4", "--workers", "4", "--policy", "pad"]) == 0
    )
    out = capsys.readouterr()
    assert "16 readers; 1 samples each, 5 repeated as padding" in out.out
    assert (
        "warning: only 11 distinct samples for 16 readers: 5 readers read nothing but repeated"
        in out.err
    )
    assert main(["splits", "--index", index, "--world", "4", "--workers", "4"]) == 0
    assert "warning: 16 of 16 readers would idle" in capsys.readouterr().err


def test_splits_without_index_are_shard_level(shard_pattern, capsys):
    assert main(["splits", shard_pattern, "--world", "2", "--workers", "2", "--no-shuffle"]) == 0
    out = capsys.readouterr()
    assert "shard-level split, as sharding_filter after a seeded shard shuffle" in out.out
    assert _reader_lines(out.out) == [
        "  rank 0 worker 0: 2 shards  train-000000.tar train-000004.tar",
        "  rank 0 worker 1: 2 shards  train-000001.tar train-000005.tar",
        "  rank 1 worker 0: 2 shards  train-000002.tar train-000006.tar",
        "  rank 1 worker 1: 1 shard  train-000003.tar",
    ]
    assert "rank 0: 4 shards" in out.out and "rank 1: 3 shards" in out.out
    assert "warning: ranks get unequal shard counts [4, 3]" in out.err
    assert main(["splits", shard_pattern, "--world", "4", "--workers", "2"]) == 0
    assert "warning: 1 of 8 readers get no shard and would idle" in capsys.readouterr().err


def test_splits_index_and_urls_must_match(shard_dir, tmp_path, capsys):
    index = str(tmp_path / "i.json")
    assert (
        main(["index", os.path.join(shard_dir, "train-000000.tar"), "-o", index, "--no-progress"])
        == 0
    )
    capsys.readouterr()
    other = os.path.join(shard_dir, "train-000001.tar")
    assert main(["splits", other, "--index", index, "--world", "1", "--workers", "0"]) == 1
    assert "train-000001.tar: not in the index" in capsys.readouterr().err


# --- bench -------------------------------------------------------------------------------------


def test_bench_in_process(shard_pattern, capsys):
    assert main(["bench", shard_pattern, "--batch-size", "8", "--epochs", "2"]) == 0
    out = capsys.readouterr()
    assert "reading 7 shards in this process, batch size 8" in out.out
    assert (
        len(
            re.findall(
                rf"epoch \d: {TOTAL} samples, [\d.]+ KB in [\d.]+ s: [\d,]+ samples/s, [\d.]+ MB/s",
                out.out,
            )
        )
        == 2
    )
    assert "epoch 0" in out.err  # the progress bar


def test_bench_with_workers_and_limit(shard_pattern, capsys):
    assert (
        main(["bench", shard_pattern, "--workers", "2", "--batch-size", "4", "--no-progress"]) == 0
    )
    out = capsys.readouterr()
    assert "DataLoader2 with 2 workers" in out.out
    assert re.search(
        rf"epoch 0: {TOTAL} samples, .* samples/s, .* MB/s \(includes starting the workers\)",
        out.out,
    )
    assert out.err == ""
    assert (
        main(["bench", shard_pattern, "--limit", "20", "--batch-size", "8", "--no-progress"]) == 0
    )
    assert "epoch 0: 24 samples" in capsys.readouterr().out  # stops after the batch that passes 20


def test_bench_link_gives_the_epoch_as_a_fraction_of_the_measured_link(shard_pattern, capsys):
    args = ["bench", shard_pattern, "--link", "3", "--batch-size", "8", "--no-progress"]
    assert main(args) == 0
    out = capsys.readouterr().out
    link = re.search(r"link: ([\d,.]+) MB/s with 3 range requests of 8.4 MB at once \((.+) in", out)
    assert link, out
    assert re.search(r"of the link: [\d,.]+ MB/s of shard bytes = \d+% of [\d,.]+ MB/s", out)
    fetch = re.search(
        r"requests in flight: (\d+) learnt \(started at 6, at most 32\); read-ahead held at "
        r"most ([\d.]+) MiB of the 56 MiB budget",
        out,
    )
    assert fetch, out
    assert 1 <= int(fetch[1]) <= 32 and float(fetch[2]) <= 56
    assert main([*args, "--limit", "10"]) == 0
    assert "of the link: not compared (--limit" in capsys.readouterr().out


def test_bench_profile_prints_the_cost_of_each_stage(shard_pattern, capsys):
    args = ["bench", shard_pattern, "--profile", "--shuffle-buffer", "10", "--decode"]
    assert main(args) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^(.+) \| ([\d.]+) \| ([+-][\d.]+)$", out, re.M)
    assert [r[0].rsplit(" + ", 1)[-1] for r in rows] == ["webdataset", "decode", "shuffle", "batch"]
    assert rows[0][0].startswith("IterableWrapper + sharding_filter + open_files_by_fsspec")
    cumulative = [float(r[1]) for r in rows]
    own = [float(r[2]) for r in rows]
    assert all(c > 0 for c in cumulative)
    assert abs(sum(own) - cumulative[-1]) < 1e-6  # the own column adds up to the total printed
    assert re.search(r"total: [\d.]+ us per sample = [\d,]+ samples per CPU-second", out)


# --- the console script ------------------------------------------------------------------------


def test_console_script_help():
    script = shutil.which("shardpipes", path=os.path.dirname(sys.executable))
    assert script is not None, "the shardpipes console script is not installed next to python"
    result = subprocess.run(
        [script, "--help"], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    for command in ("demo", "write", "index", "inspect", "splits", "bench"):
        assert re.search(rf"^\s+{command}\s", result.stdout, re.MULTILINE), command


# --- registration --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", COMMANDS)
def test_each_subcommand_module_declares_the_command_it_is_named_for(name, capsys):
    module = importlib.import_module(f"shardpipes.cli.{name}")
    assert module.COMMAND.name == name
    with pytest.raises(SystemExit) as exit_info:
        main([name, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: shardpipes {name} ")
    assert module.COMMAND.description.split()[0] in out
    declared = [b for a in module.COMMAND.args for b in getattr(a, "args", (a,))]
    for a in declared:  # every declared argument (also inside one_of) reaches the parser
        shown = (
            a.names[-1] if a.names[-1].startswith("-") else a.options.get("metavar", a.names[-1])
        )
        assert shown in out


def test_one_of_refuses_two_of_its_arguments(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(
            [
                "verify",
                "i.json",
                "--world",
                "1",
                "--batch-size",
                "2",
                "--repeat",
                "1",
                "--choose",
                "3",
            ]
        )
    assert exit_info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_the_parsed_arguments_call_the_module_run():
    args = build_parser().parse_args(["inspect", "x.tar", "-n", "3"])
    assert args.func is importlib.import_module("shardpipes.cli.inspect").run
    assert (args.url, args.n) == ("x.tar", 3)
