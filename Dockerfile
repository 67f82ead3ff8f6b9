# The Harness Engine operator image: one static-ish Rust binary on a base with glibc,
# libgcc and CA certificates and nothing else (no shell, no package manager), running as
# 65532:65532 and fit for a read-only root filesystem (it writes only to the volumes the
# chart mounts: the data directory and, with operator-managed webhook certificates, an
# emptyDir for them).
#
# Docker users (multi-stage, compiles inside the build):
#   docker build -t harness-engine:dev --build-arg VERSION=$(git describe --always) .
#
# From a binary built beforehand (what the tests do here, without a registry, on a base
# made locally by e2e/images/build.sh; the context is a directory holding the binary):
#   buildah bud --target prebuilt --build-arg BASE_IMAGE=localhost/harness-engine/base-cc:dev \
#     --build-arg VERSION=... -f Dockerfile CONTEXT_WITH_harness-engine
#
# Build arguments:
#   RUST_IMAGE  the toolchain image of the build stage
#   BASE_IMAGE  the runtime base: glibc, libgcc_s, CA bundle, /etc/passwd with 65532
#   VERSION     stamped into the image labels (org.opencontainers.image.version) and the
#               environment (HARNESS_ENGINE_IMAGE_VERSION); `harness-engine version`
#               prints the crate version the binary was built from
#   REVISION    the source revision (org.opencontainers.image.revision)
ARG RUST_IMAGE=docker.io/library/rust:1-bookworm
ARG BASE_IMAGE=gcr.io/distroless/cc-debian12:nonroot
ARG VERSION=dev
ARG REVISION=unknown

# --- build: compile the release binary (Docker users) ---------------------------------
FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
COPY tests ./tests
RUN cargo build --release --locked --bin harness-engine \
 && cp target/release/harness-engine /harness-engine \
 && strip /harness-engine

# --- prebuilt: the same runtime image around a binary from the build context ----------
FROM ${BASE_IMAGE} AS prebuilt
ARG VERSION
ARG REVISION
LABEL org.opencontainers.image.title="harness-engine" \
      org.opencontainers.image.description="Harness Engine operator: durable state for AI-agent harnesses in disposable sandbox pods" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV HARNESS_ENGINE_IMAGE_VERSION=${VERSION}
COPY harness-engine /usr/local/bin/harness-engine
USER 65532:65532
EXPOSE 8080 8081 9443
ENTRYPOINT ["/usr/local/bin/harness-engine"]
CMD ["operator"]

# --- image (default target): the runtime image around the binary compiled above -------
FROM ${BASE_IMAGE} AS image
ARG VERSION
ARG REVISION
LABEL org.opencontainers.image.title="harness-engine" \
      org.opencontainers.image.description="Harness Engine operator: durable state for AI-agent harnesses in disposable sandbox pods" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV HARNESS_ENGINE_IMAGE_VERSION=${VERSION}
COPY --from=build /harness-engine /usr/local/bin/harness-engine
USER 65532:65532
EXPOSE 8080 8081 9443
ENTRYPOINT ["/usr/local/bin/harness-engine"]
CMD ["operator"]
