#!/usr/bin/env bash
# Installs everything the tests and benchmarks need, on a fresh machine, into ignored folders of this repo:
#   node_modules/ (npm ci), .tools/bin/ (Go-built emulators, pinned), .venv/ (real orbax-checkpoint, pinned),
#   .venv-wfemu/ (the Workflows emulator, pinned).
# Downloads are cached under .cache/ so a second run is quick.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

# Pinned emulator versions (Go modules).
FAKE_GCS_SERVER=github.com/fsouza/fake-gcs-server@v1.56.1

export npm_config_cache="$ROOT/.cache/npm"
export GOPATH="$ROOT/.cache/go" GOMODCACHE="$ROOT/.cache/go/pkg/mod" GOFLAGS=-modcacherw GOBIN="$ROOT/.tools/bin"
export PIP_CACHE_DIR="$ROOT/.cache/pip"

step() { printf '\n== %s\n' "$*"; }

step "npm ci"
npm ci --no-audit --no-fund

step "Go tools -> .tools/bin"
mkdir -p "$GOBIN"
if [ ! -x "$GOBIN/fake-gcs-server" ]; then go install "$FAKE_GCS_SERVER"; fi
# Google's in-memory Pub/Sub server (pstest), wrapped as a binary; versions pinned in its go.mod.
if [ ! -x "$GOBIN/pubsub-emulator" ]; then (cd tools/pubsub-emulator && go build -trimpath -o "$GOBIN/pubsub-emulator" .); fi
# `terraform fmt -check` offline: hclwrite.Format over terraform/ (no terraform binary is obtainable).
if [ ! -x "$GOBIN/hclfmt" ]; then (cd tools/hclfmt && go build -trimpath -o "$GOBIN/hclfmt" .); fi

step "Python venv with the real orbax-checkpoint -> .venv"
if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
.venv/bin/pip install --quiet --disable-pip-version-check -r test/fixtures-gen/requirements.txt

step "Workflows emulator -> .venv-wfemu"
if [ ! -x .venv-wfemu/bin/python ]; then python3 -m venv .venv-wfemu; fi
.venv-wfemu/bin/pip install --quiet --disable-pip-version-check -r tools/workflows-emulator/requirements.txt

step "done"
