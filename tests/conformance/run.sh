#!/usr/bin/env bash
# Runs torchdata 0.9's tests against shardpipes (../shared/conformance/run-torchdata09.sh), passing
# every test id of torchdata09-deselect.txt as --deselect.
#
# usage: bash tests/conformance/run.sh            # the whole suite, 0.9's selection (CI runs this)
#        bash tests/conformance/run.sh [pytest args: files, -k, -x, ...]
#
# 0.9's selection: torchdata 0.9.0 passes 166 of the 177 tests these files hold when the
# multiprocessing tests of test_dataloader2.py/test_mprs.py run with the fork context only
# (-k "not spawn and not forkserver" there) and test_distributed.py without its elastic (torchrun)
# tests; see the notes in run-torchdata09.sh. TD09_RUNNER overrides the runner's path.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
runner=${TD09_RUNNER:-$here/../../../shared/conformance/run-torchdata09.sh}
if [ ! -f "$runner" ]; then
    echo "tests/conformance/run.sh: torchdata 0.9's suite runner not found at $runner" \
        "(set TD09_RUNNER to ../shared/conformance/run-torchdata09.sh)" >&2
    exit 2
fi
args=()
while read -r id _; do
  [[ -z "$id" || "$id" == \#* ]] || args+=(--deselect "$id")
done < "$here/torchdata09-deselect.txt"
# A hang ends the run with every thread's stack (tests/_watchdog.py, a pytest plugin: -p), 300 s
# after a test's 120 s: 0.9's tests leave their loaders to the garbage collector, whose pauses
# fall in whichever test it runs in (and pytest-timeout's signal, raised inside a __del__ there,
# is ignored). Before the worker pool stopped a dropped loader's workers itself, one such pause
# took 306 s, 5 s for each of some 60 workers.
export PYTHONPATH="$here/..${PYTHONPATH:+:$PYTHONPATH}"
select=("$@")
[ ${#select[@]} -gt 0 ] || select=(test -p no:warnings -rfE
  -k "not ((test_dataloader2 or test_mprs) and (spawn or forkserver)) and not (test_distributed and elastic)")
exec bash "$runner" -p _watchdog -o watchdog_grace=300 "${select[@]}" ${args[@]+"${args[@]}"}
