#!/usr/bin/env bash
# Installs everything the tests and benchmarks need, on a fresh machine, into ignored folders of this repo:
#   node_modules/ (npm ci), .tools/bin/ (Go-built emulators, actionlint and, unless the machine has the pinned one,
#   terraform),
#   .venv/ (real orbax-checkpoint, pinned),
#   .venv-wfemu/ (the Workflows emulator, pinned),
#   .venv-testbench/ (Google's storage-testbench, from ORBAX2REG_STORAGE_TESTBENCH; skipped without it),
#   .venv-axlearn/ (AXLearn's own source from ORBAX2REG_AXLEARN, with what its imports need, pinned; skipped without it),
#   .venv-hf/ (torch, transformers, safetensors on CPU: the export's real consumers; ORBAX2REG_SKIP_HF=1 skips it).
# Downloads are cached under .cache/ so a second run is quick.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

# Pinned emulator versions (Go modules).
FAKE_GCS_SERVER=github.com/fsouza/fake-gcs-server@v1.56.1
# The GitHub Actions workflows' linter (test/deploy/workflows-lint.test.ts), pinned.
ACTIONLINT_VERSION=v1.7.12

export npm_config_cache="$ROOT/.cache/npm"
export GOPATH="$ROOT/.cache/go" GOMODCACHE="$ROOT/.cache/go/pkg/mod" GOFLAGS=-modcacherw GOBIN="$ROOT/.tools/bin"
export PIP_CACHE_DIR="$ROOT/.cache/pip"

step() { printf '\n== %s\n' "$*"; }
# What a source setting names, for the venv's stamp: a file by its name and sha256, a pip requirement as it is.
source_id() { if [ -f "$1" ]; then printf '%s %s' "$(basename "$1")" "$(sha256sum < "$1" | cut -d' ' -f1)"; else printf '%s' "$1"; fi; }

step "npm ci"
npm ci --no-audit --no-fund

# The Python venvs install in the background while the Go tools build: pip waits mostly on downloads, go on
# the CPU. Their output is shown once they are done (a failure stops the script with it).
mkdir -p .cache
python_log=.cache/install-python.log
(
step "Python venv with the real orbax-checkpoint -> .venv"
if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
.venv/bin/pip install --quiet --disable-pip-version-check -r test/fixtures-gen/requirements.txt

step "Workflows emulator -> .venv-wfemu"
if [ ! -x .venv-wfemu/bin/python ]; then python3 -m venv .venv-wfemu; fi
.venv-wfemu/bin/pip install --quiet --disable-pip-version-check -r tools/workflows-emulator/requirements.txt

step "storage-testbench -> .venv-testbench"
# Google's GCS emulator for its own client libraries (github.com/googleapis/storage-testbench): not on PyPI, so
# ORBAX2REG_STORAGE_TESTBENCH names it, as a path to its source tarball or a pip requirement (a git URL pinned
# to a commit). Without it the tests that need it skip, saying so.
if [ -z "${ORBAX2REG_STORAGE_TESTBENCH:-}" ]; then
  echo "skipped: ORBAX2REG_STORAGE_TESTBENCH is not set (the storage-testbench tests will skip)"
else
  source_id=$(source_id "$ORBAX2REG_STORAGE_TESTBENCH")
  if [ "$(cat .venv-testbench/.installed-from 2>/dev/null || true)" != "$source_id" ]; then
    if [ ! -x .venv-testbench/bin/python ]; then python3 -m venv .venv-testbench; fi
    .venv-testbench/bin/pip install --quiet --disable-pip-version-check "$ORBAX2REG_STORAGE_TESTBENCH"
    printf '%s\n' "$source_id" > .venv-testbench/.installed-from
  fi
  echo "storage-testbench: $source_id"
fi

step "AXLearn -> .venv-axlearn"
# AXLearn's own Checkpointer, state builders and InferenceRunner restore what orbax2reg writes in the tests. The
# PyPI `axlearn` is a 2024 snapshot, so ORBAX2REG_AXLEARN names the source: a path to a tarball of the
# repository's tree (unpacked into the venv and put on its path, as AXLearn's own docs run it from a checkout)
# or a pip requirement (a git URL pinned to a commit, installed without its dependencies). What its checkpointer,
# state_builder, inference and checkpointer_orbax import comes from test/python/axlearn-requirements.txt, at
# AXLearn's own pins. Without it the tests that need it skip, saying so.
if [ -z "${ORBAX2REG_AXLEARN:-}" ]; then
  echo "skipped: ORBAX2REG_AXLEARN is not set (the AXLearn restore tests will skip)"
else
  source_id="$(source_id "$ORBAX2REG_AXLEARN") $(sha256sum < test/python/axlearn-requirements.txt | cut -d' ' -f1)"
  if [ "$(cat .venv-axlearn/.installed-from 2>/dev/null || true)" != "$source_id" ]; then
    if [ ! -x .venv-axlearn/bin/python ]; then python3 -m venv .venv-axlearn; fi
    .venv-axlearn/bin/python -m pip install --quiet --disable-pip-version-check -r test/python/axlearn-requirements.txt
    site=$(.venv-axlearn/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    rm -rf .venv-axlearn/axlearn-src "$site/orbax2reg-axlearn.pth"
    if [ -f "$ORBAX2REG_AXLEARN" ]; then
      mkdir -p .venv-axlearn/axlearn-src
      tar -xzf "$ORBAX2REG_AXLEARN" -C .venv-axlearn/axlearn-src --strip-components=1
      printf '%s\n' "$ROOT/.venv-axlearn/axlearn-src" > "$site/orbax2reg-axlearn.pth"
    else
      .venv-axlearn/bin/python -m pip install --quiet --disable-pip-version-check --no-deps "$ORBAX2REG_AXLEARN"
    fi
    # The modules the tests use must import with these pins: a failure stops setup with Python's own message.
    JAX_PLATFORMS=cpu TF_CPP_MIN_LOG_LEVEL=3 .venv-axlearn/bin/python -W ignore -c \
      'from axlearn.common import checkpointer, checkpointer_orbax, inference, state_builder' 2>&1 | grep -v '^WARNING:absl' >&2 || true
    JAX_PLATFORMS=cpu TF_CPP_MIN_LOG_LEVEL=3 .venv-axlearn/bin/python -c \
      'from axlearn.common import checkpointer, checkpointer_orbax, inference, state_builder' >/dev/null 2>&1
    printf '%s\n' "$source_id" > .venv-axlearn/.installed-from
  fi
  echo "AXLearn: $source_id"
fi
) > "$python_log" 2>&1 &
python_pid=$!

# The Hugging Face consumers (test/hf/, bench/export-hf.mjs) in a venv of their own, in a second background job:
# torch and its CUDA libraries are ~5.6 GB of downloads (~4 min), longer than everything else here. Stamped by
# its pins, so a warm machine skips it. Without it the consumer tests skip, saying so.
hf_log=.cache/install-hf.log
(
step "Hugging Face consumers -> .venv-hf"
if [ "${ORBAX2REG_SKIP_HF:-}" = 1 ]; then
  echo "skipped: ORBAX2REG_SKIP_HF=1 (the transformers tests will skip)"
else
  hf_id=$(sha256sum < test/python/hf-requirements.txt | cut -d' ' -f1)
  if [ "$(cat .venv-hf/.installed-from 2>/dev/null || true)" != "$hf_id" ]; then
    if [ ! -x .venv-hf/bin/python ]; then python3 -m venv .venv-hf; fi
    .venv-hf/bin/pip install --quiet --disable-pip-version-check -r test/python/hf-requirements.txt
    .venv-hf/bin/python -c 'import torch, transformers, safetensors, orbax.checkpoint' >/dev/null
    printf '%s\n' "$hf_id" > .venv-hf/.installed-from
  fi
  echo "Hugging Face consumers: $(.venv-hf/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
fi
) > "$hf_log" 2>&1 &
hf_pid=$!

step "Go tools -> .tools/bin"
mkdir -p "$GOBIN"
if [ ! -x "$GOBIN/fake-gcs-server" ]; then go install "$FAKE_GCS_SERVER"; fi
if [ "$("$GOBIN/actionlint" -version 2>/dev/null | head -n1 || true)" != "$ACTIONLINT_VERSION" ]; then
  go install "github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION"
fi
# Google's in-memory Pub/Sub server (pstest), wrapped as a binary; versions pinned in its go.mod.
if [ ! -x "$GOBIN/pubsub-emulator" ]; then (cd tools/pubsub-emulator && go build -trimpath -o "$GOBIN/pubsub-emulator" .); fi
# terraform (test/terraform: fmt, validations, validate/plan), pinned: the machine's own when it is exactly this
# version, else built from the Go module proxy into .tools/bin (tools/README.md, "Terraform"; ~8 min on 2 cores).
TERRAFORM_VERSION=1.11.4
# The v1.11.4 tag's commit, as the pseudo-version of the nested modules its go.mod replaces with local directories.
TERRAFORM_NESTED=v0.0.0-20250409131005-35645b8fca68
tf_version() { TF_CLI_CONFIG_FILE=/dev/null "$1" version 2>/dev/null | head -n1 || true; }
build_terraform() {
  # `go install ...@v1.11.4` refuses a go.mod with replace directives, and the module zip leaves out the nested
  # modules they point at: build inside a copy of the module with those directories filled in from the proxy.
  local src m
  src=$(mktemp -d)
  go mod download "github.com/hashicorp/terraform@v$TERRAFORM_VERSION"
  cp -r "$GOMODCACHE/github.com/hashicorp/terraform@v$TERRAFORM_VERSION/." "$src"
  chmod -R u+w "$src"
  for m in $(sed -n 's|^replace \(github.com/hashicorp/terraform/[^ ]*\) => .*|\1|p' "$src/go.mod"); do
    go mod download "$m@$TERRAFORM_NESTED"
    rm -rf "${src:?}/${m#github.com/hashicorp/terraform/}"
    cp -r "$GOMODCACHE/$m@$TERRAFORM_NESTED" "$src/${m#github.com/hashicorp/terraform/}"
  done
  chmod -R u+w "$src"
  # Go >= 1.26 rejects its go.mod's `godebug tlskyber=0`: that TLS switch was removed from Go (its default applies).
  sed -i '/^godebug tlskyber=/d' "$src/go.mod"
  (cd "$src" && go build -trimpath -ldflags "-s -w -X github.com/hashicorp/terraform/version.dev=no" -o "$GOBIN/terraform" .)
  rm -rf "$src"
}
if [ "$(tf_version "$GOBIN/terraform")" != "Terraform v$TERRAFORM_VERSION" ]; then
  rm -f "$GOBIN/terraform"
  if [ "$(tf_version terraform)" = "Terraform v$TERRAFORM_VERSION" ]; then
    echo "terraform v$TERRAFORM_VERSION: $(command -v terraform)"
  else
    build_terraform
  fi
fi

if ! wait "$python_pid"; then
  cat "$python_log" >&2
  echo "install.sh: the Python venvs failed (above)" >&2
  exit 1
fi
if ! wait "$hf_pid"; then
  cat "$hf_log" >&2
  echo "install.sh: the Hugging Face venv failed (above)" >&2
  exit 1
fi
cat "$python_log" "$hf_log"

step "done"
