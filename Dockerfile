# The one image for the three Cloud Run jobs (terraform/modules/orbax2reg/jobs.tf runs
# `node dist/jobs/main.js plan|convert-group|finalize` in it).
#   docker build -t REGION-docker.pkg.dev/PROJECT/orbax2reg/orbax2reg:$(git rev-parse --short HEAD) .

ARG NODE_IMAGE=node:22-bookworm-slim

# Build stage: compiles TypeScript and the native zstd addon, then drops the dev dependencies.
FROM ${NODE_IMAGE} AS build
# zstd-napi compiles with node-gyp.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 make g++ \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY package.json package-lock.json ./
# --ignore-scripts: the package's own `prepare` needs the sources copied below; the addon is built explicitly.
RUN npm ci --ignore-scripts --no-audit --no-fund && npm rebuild zstd-napi
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
