#!/usr/bin/env bash
# Run webdataset 1.x's own tests against shardpipes.webdataset, offline, from a temporary folder.
#
#   tests/conformance/run-webdataset.sh [WEBDATASET_SOURCE] [pytest args...]
#
# WEBDATASET_SOURCE: a webdataset checkout, or a bare git directory of one (default: $WDS_SRC,
# else a clone of https://github.com/webdataset/webdataset at v1.0.2). Its tests/ and testdata/
# are copied to a temporary folder (never into this repo), `webdataset` is rewritten to
# `shardpipes.webdataset` in the imports, a missing testdata/imagenet-000000.tgz is replaced by
# a generated stand-in, and the tests listed in webdataset-differences.txt are deselected
# (each line there says why). Tests that need the network or features outside the scope of
# shardpipes.webdataset are deselected by file, listed in the same file.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src="${1:-${WDS_SRC:-}}"
[ $# -gt 0 ] && shift
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if [ -z "$src" ]; then
    git clone -q --depth 1 --branch v1.0.2 https://github.com/webdataset/webdataset "$work/src"
    src="$work/src"
fi
mkdir -p "$work/run"
if [ -d "$src/tests" ]; then
    cp -r "$src/tests" "$src/testdata" "$work/run/"
else  # a bare git directory
    for p in tests testdata; do
        for f in $(git --git-dir="$src" ls-tree -r --name-only HEAD "$p"); do
            mkdir -p "$work/run/$(dirname "$f")"
            git --git-dir="$src" show "HEAD:$f" > "$work/run/$f" 2>/dev/null || rm -f "$work/run/$f"
        done
    done
fi
cd "$work/run"
if ! tar tzf testdata/imagenet-000000.tgz >/dev/null 2>&1; then
    python "$here/make_webdataset_testdata.py" testdata/imagenet-000000.tgz
fi
sed -i -E \
    -e 's/^( *)import webdataset as wds/\1import shardpipes.webdataset as wds/' \
    -e 's/^( *)from webdataset(\.| )/\1from shardpipes.webdataset\2/' \
    -e 's/^( *)import webdataset$/\1import shardpipes.webdataset as webdataset/' \
    tests/*.py
files=()
deselect=()
while IFS= read -r line; do
    case "$line" in
        ""|\#*) continue ;;
        run:*) files+=("tests/${line#run:}") ;;
        *) deselect+=(--deselect "tests/${line%% *}") ;;
    esac
done < "$here/webdataset-differences.txt"
# webdataset's tests put shell commands in pipe: URLs (dd ...); shardpipes parses the common
# download commands and runs other ones only when allowed: allow them for this suite.
export SHARDPIPES_PIPE_COMMANDS=1
python -m pytest -p no:cacheprovider -q -o addopts="" -W ignore::DeprecationWarning \
    "${files[@]}" "${deselect[@]}" "$@"
