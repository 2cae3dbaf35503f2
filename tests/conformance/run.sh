#!/usr/bin/env bash
# Runs torchdata 0.9's tests against shardpipes (../shared/conformance/run-torchdata09.sh), passing
# every test id of torchdata09-deselect.txt as --deselect. Usage: bash tests/conformance/run.sh [pytest args]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
runner=${TD09_RUNNER:-$here/../../../shared/conformance/run-torchdata09.sh}
args=()
while read -r id _; do
  [[ -z "$id" || "$id" == \#* ]] || args+=(--deselect "$id")
done < "$here/torchdata09-deselect.txt"
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(test/test_iterdatapipe.py test/test_mapdatapipe.py test/test_local_io.py
  test/test_serialization.py test/test_fsspec.py test/test_tfrecord.py test/test_linter.py)
exec bash "$runner" "${files[@]}" ${args[@]+"${args[@]}"}
