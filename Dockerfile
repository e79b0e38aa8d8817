# The one image: the orbax2reg CLI (its ENTRYPOINT) and the three Cloud Run jobs, which replace the entry point
# with `node --max-semi-space-size=1 --initial-old-space-size=64 dist/jobs/main.js plan|convert-group|finalize`
# (terraform/modules/orbax2reg/jobs.tf sets the container's command and args).
#   docker build --build-arg ORBAX2REG_COMMIT=$(git rev-parse HEAD) -t orbax2reg:$(git rev-parse --short HEAD) .
#   docker run --rm orbax2reg:TAG convert gs://bucket/run/step_00001000 gs://bucket/run/regular
# The commit `orbax2reg --version` reports: ORBAX2REG_COMMIT, else a build-info.json in the context (`npm run
# build` writes it), else "unknown" (.git is not sent to the build). Running it: README.md, "Install".
# `terraform apply` builds it with Cloud Build (terraform/modules/orbax2reg/build.tf: the files .dockerignore lets
# in, zipped by terraform, tagged with their identity).
# Fetches the base image (NODE_IMAGE), Debian packages and the lockfile's npm packages, nothing else. A builder without
# public egress (a private Cloud Build pool with NO_PUBLIC_EGRESS) reaches none of those: it names copies it can reach,
# NODE_IMAGE, DEBIAN_MIRROR and NPM_REGISTRY below (terraform: image_build_node_image, debian_mirror, npm_registry).

ARG NODE_IMAGE=node:22-bookworm-slim

# Build stage: compiles TypeScript and the native zstd addon, then keeps only what the jobs and the CLI load.
FROM ${NODE_IMAGE} AS build
# Package mirrors, empty for the public ones. DEBIAN_MIRROR serves Debian's archive paths (<url>/debian,
# <url>/debian-security): it replaces the scheme and host of every URIs line of the base image's deb822 sources.
# NPM_REGISTRY: npm installs the lockfile's packages from it (the lockfile names versions and integrity hashes, no
# download URLs, so npm asks the configured registry and checks what it gets against the hashes).
ARG DEBIAN_MIRROR=
ARG NPM_REGISTRY=
# zstd-napi compiles with node-gyp (python3, make, g++ from Debian's packages).
RUN if [ -n "$DEBIAN_MIRROR" ]; then \
      sed -i -E "s#^(URIs:[[:space:]]*)https?://[^/]+/#\\1${DEBIAN_MIRROR%/}/#" /etc/apt/sources.list.d/debian.sources; \
    fi \
 && apt-get update \
 && apt-get install -y --no-install-recommends python3 make g++ \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY package.json package-lock.json ./
# --ignore-scripts: the package's own `prepare` needs the sources copied below; the addon is built explicitly.
# From source, against the base image's own Node headers (/usr/local/include/node): its install script would
# otherwise fetch a prebuilt binary from github.com and then node-gyp would fetch the headers from nodejs.org,
# so a builder without internet access (a private Cloud Build pool, a VPC-SC perimeter) could not build it.
# Only the package registries (npm, Debian, or their mirrors above) are needed.
RUN npm ci --ignore-scripts --no-audit --no-fund ${NPM_REGISTRY:+--registry=$NPM_REGISTRY} \
 && npm_config_build_from_source=true npm_config_nodedir=/usr/local npm rebuild zstd-napi
COPY tsconfig.json tsconfig.build.json ./
COPY src ./src
COPY jobs ./jobs
COPY bin ./bin
COPY assets ./assets
# terraform's build context carries assets/ in base64 (build.tf: its archive takes text only); a checkout's is as is.
RUN find assets -name '*.b64' -exec sh -c 'base64 -d "$1" > "${1%.b64}" && rm "$1"' _ {} \;
COPY scripts/image-deps.mjs scripts/build-info.mjs ./scripts/
# build-info.json only if the context has one (the pattern may match nothing).
COPY package.json build-info.jso[n] ./
ARG ORBAX2REG_COMMIT=
# No source maps or declarations: nothing at run time reads them. Then only the dependencies the jobs' and the
# CLI's code import (scripts/image-deps.mjs: not the trigger function's, functions-framework and express), and
# of those nothing that is only for compilers and editors (*.d.ts, source maps, @types) or left by the addon's
# build (its objects, the zstd sources it compiled; their licences stay).
RUN npx tsc -p tsconfig.build.json --sourceMap false --declaration false --incremental false \
 && node scripts/build-info.mjs \
 && node scripts/image-deps.mjs --write \
 && npm prune --omit=dev --no-audit --no-fund \
 && rm -rf node_modules/@types node_modules/zstd-napi/src \
 && find node_modules -type f \( -name '*.map' -o -name '*.d.ts' -o -name '*.d.cts' -o -name '*.d.mts' \) -delete \
 && find node_modules/zstd-napi/build -mindepth 1 -maxdepth 1 ! -name Release -exec rm -rf {} + \
 && find node_modules/zstd-napi/build/Release -mindepth 1 -maxdepth 1 ! -name binding.node -exec rm -rf {} + \
 && find node_modules/zstd-napi/deps -type f ! -name 'LICENSE*' ! -name 'COPYING*' -delete \
 && find node_modules -mindepth 1 -type d -empty -delete \
 && node -e 'require("zstd-napi")' && node --input-type=module -e 'await import("./dist/src/cloud/job/run.js")' \
 && node bin/orbax2reg.js --version

# Runtime stage: compiled code and the dependencies it loads, run as the unprivileged `node` user.
FROM ${NODE_IMAGE}
ENV NODE_ENV=production
# As bin/orbax2reg.js starts the CLI: one malloc arena, V8's young generation at most 1 MiB a semi-space and its
# old generation from 64 MiB (the job moves bytes and keeps little alive; see the launcher's comment and
# bench/README.md).
ENV MALLOC_ARENA_MAX=1
WORKDIR /app
COPY --from=build --chown=root:root /app/package.json /app/build-info.json ./
COPY --from=build --chown=root:root /app/node_modules ./node_modules
COPY --from=build --chown=root:root /app/dist ./dist
COPY --from=build --chown=root:root /app/bin ./bin
# AXLearn's sentencepiece vocabularies, which export-hf writes as the export's tokenizer (assets/tokenizers/).
COPY --from=build --chown=root:root /app/assets ./assets
USER node
# The CLI, by absolute path so that `--workdir` can name the user's mounted folder for local paths; with no
# arguments, its help. The jobs replace both (jobs.tf: command `node --max-semi-space-size=1 --initial-old-space-size=64`, args
# `dist/jobs/main.js PHASE`, run from this WORKDIR).
ENTRYPOINT ["node", "--max-semi-space-size=1", "--initial-old-space-size=64", "/app/bin/orbax2reg.js"]
CMD ["--help"]
