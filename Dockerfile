# The one image for the three Cloud Run jobs (terraform/modules/orbax2reg/jobs.tf runs
# `node dist/jobs/main.js plan|convert-group|finalize` in it).
#   docker build -t REGION-docker.pkg.dev/PROJECT/orbax2reg/orbax2reg:$(git rev-parse --short HEAD) .

ARG NODE_IMAGE=node:22-bookworm-slim

# Build stage: compiles TypeScript and the native zstd addon, then drops the dev dependencies.
FROM ${NODE_IMAGE} AS build
# zstd-napi compiles with node-gyp (python3, make, g++ from Debian's packages).
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 make g++ \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY package.json package-lock.json ./
# --ignore-scripts: the package's own `prepare` needs the sources copied below; the addon is built explicitly.
# From source, against the base image's own Node headers (/usr/local/include/node): its install script would
# otherwise fetch a prebuilt binary from github.com and then node-gyp would fetch the headers from nodejs.org,
# so a builder without internet access (a private Cloud Build pool, a VPC-SC perimeter) could not build it.
# Only the package registries (npm, Debian) are needed.
RUN npm ci --ignore-scripts --no-audit --no-fund \
 && npm_config_build_from_source=true npm_config_nodedir=/usr/local npm rebuild zstd-napi
COPY tsconfig.json tsconfig.build.json ./
COPY src ./src
COPY jobs ./jobs
COPY functions ./functions
RUN npx tsc -p tsconfig.build.json && npm prune --omit=dev --no-audit --no-fund

# Runtime stage: compiled code and production dependencies only, run as the unprivileged `node` user.
FROM ${NODE_IMAGE}
ENV NODE_ENV=production
WORKDIR /app
COPY --from=build --chown=root:root /app/package.json ./
COPY --from=build --chown=root:root /app/node_modules ./node_modules
COPY --from=build --chown=root:root /app/dist ./dist
USER node
ENTRYPOINT ["node"]
CMD ["dist/jobs/main.js"]
