# Herald's image: one `herald` binary; every role is a subcommand (`herald api`, `herald poller`,
# `herald worker --job-type send`, ...). Runs as the non-root uid 65532, as the chart expects.
#
#   docker build -t herald:dev .                      # from source, public base images
#   scripts/image                                     # the same with buildah, or from a base made
#                                                     # of Debian's packages where no registry is
#                                                     # reachable (see the script)
#
# The binary is built without the `dev` feature: `herald dev` and the test kit it needs are for
# a source checkout (scripts/dev), not for production.
#
# The bases are arguments so a user can pin them by digest or take them from a mirror:
#   RUST_IMAGE     the build stage (a Rust toolchain on Debian bookworm)
#   RUNTIME_IMAGE  the runtime (glibc and libgcc_s, nothing else is linked; distroless by default)
#   BINARY_FROM    `build` compiles here; `prebuilt` takes bin/herald from the build context
#                  instead (a binary built on a bookworm host, as scripts/image --prebuilt does)
ARG RUST_IMAGE=docker.io/library/rust:1-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot
ARG BINARY_FROM=build

FROM ${RUST_IMAGE} AS build
# etcd-client compiles etcd's protobuf definitions; protoc imports the well-known types.
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      protobuf-compiler libprotobuf-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p herald --bin herald --no-default-features \
 && install -D -m 0755 target/release/herald /out/herald

FROM scratch AS prebuilt
COPY bin/herald /out/herald

FROM ${BINARY_FROM} AS binary

FROM ${RUNTIME_IMAGE}
LABEL org.opencontainers.image.title="herald" \
      org.opencontainers.image.description="A message pipeline that never drops a message" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=binary /out/herald /usr/local/bin/herald
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/herald"]
CMD ["--help"]
