#!/bin/bash
# CI's Bazel step, after pytest: `bazel test //...` offline with Debian's bazel-bootstrap
# (Bazel 4.2.3), using the repo's .venv as the Python interpreter.
#   - installs bazel-bootstrap if `bazel` is missing;
#   - lints every BUILD/WORKSPACE/.bzl file with buildifier (npm's @bazel/buildifier, installed
#     once into ~/.cache/ps_trainer; skipped with a warning if npm cannot get it);
#   - prints Bazel's summary and a closing "bazel: N passed, N failed" line, and exits with
#     Bazel's status (or 1 if the lint failed or no test ran).
# Arguments replace the default //... (e.g. `tools/bazel_check.sh //tests:test_data`, or
# `tools/bazel_check.sh -- //... -//tests:test_launch_local`); options among them go to
# `bazel test`: CI's `--test_tag_filters=ci_smoke //...` builds every target and runs only the
# tests tagged so (pytest has run them all just before).
#
# Under CI (CI set) the clone is new each run, so its Bazel output base can never be reused:
# it is deleted at the end (`bazel clean --expunge`, which also stops the Bazel server).
set -uo pipefail

repo=$(cd -P "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
cd "$repo" || exit 1

if ! command -v bazel >/dev/null 2>&1; then
  echo "bazel_check: installing bazel-bootstrap (Debian's Bazel 4.2.3)"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bazel-bootstrap \
         >/dev/null; }; then
    echo "bazel_check: could not install bazel-bootstrap" >&2
    exit 1
  fi
fi
if [[ ! -x .venv/bin/python ]]; then
  echo "bazel_check: no .venv/bin/python in $repo: run the project's set-up first" >&2
  exit 1
fi

# Lint: buildifier's formatting, and its warnings except the ones that ask for rules_python /
# rules_shell loads (Bazel 4 has those rules built in, and they cannot be fetched offline).
BUILDIFIER_VERSION=8.2.1
buildifier_dir="${XDG_CACHE_HOME:-$HOME/.cache}/ps_trainer/buildifier-$BUILDIFIER_VERSION"
buildifier="$buildifier_dir/node_modules/.bin/buildifier"
if [[ ! -x $buildifier ]] && command -v npm >/dev/null 2>&1; then
  npm install --silent --no-audit --no-fund --prefix "$buildifier_dir" \
      "@bazel/buildifier@$BUILDIFIER_VERSION" >/dev/null 2>&1 || true
fi
lint_status=0
if [[ -x $buildifier ]]; then
  mapfile -t build_files < <(find . \( -name .git -o -name .venv -o -name 'bazel-*' \
      -o -name node_modules \) -prune -o \( -name BUILD -o -name BUILD.bazel -o -name WORKSPACE \
      -o -name '*.bzl' \) -type f -print | sort)
  if ! "$buildifier" -mode=check -lint=warn \
      -warnings=-native-py,-native-sh-binary,-native-cc,-native-java "${build_files[@]}"; then
    echo "bazel_check: buildifier: fix the above (formatting: $buildifier -mode=fix FILE)" >&2
    lint_status=1
  else
    echo "bazel_check: buildifier: ${#build_files[@]} files clean"
  fi
else
  echo "bazel_check: WARNING: buildifier unavailable (npm install @bazel/buildifier failed): lint skipped" >&2
fi

targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(//...)

log=$(mktemp "${TMPDIR:-/tmp}/bazel_check.XXXXXX")
trap 'rm -f "$log"' EXIT

# 2 cores: at most 2 tests at once (the large ones are tagged exclusive and run alone).
# Timeouts per size (small, medium, large, enormous) in seconds: small tests get 120 s, not
# Bazel's 60, because importing TensorFlow alone can take 10 s on a loaded machine.
start=$SECONDS
bazel test \
  --curses=no --color=no --show_progress_rate_limit=30 \
  --local_test_jobs=2 \
  --test_timeout=120,300,900,3600 \
  "${targets[@]}" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}

passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
failed=$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|FLAKY|INCOMPLETE|NO STATUS|REMOTE FAILURE|FAILED TO BUILD)' "$log")
echo "bazel_check: bazel test exited $status after $((SECONDS - start)) s"

if [[ -n ${CI:-} ]]; then
  bazel clean --expunge >/dev/null 2>&1 || true
fi
if [[ $status -eq 0 && $lint_status -ne 0 ]]; then
  status=$lint_status
fi
if [[ $status -eq 0 && $passed -eq 0 ]]; then
  echo "bazel_check: no test ran" >&2
  status=1
fi
echo "bazel: $passed passed, $failed failed"
exit "$status"
