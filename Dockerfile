# syntax=docker/dockerfile:1
# The kube-svm image: one static binary on a distroless base, running as a non-root user.
#
#   docker build -t <registry>/kube-svm:0.1.0 .
#
# Without a container engine, `make image` (hack/image.sh) builds an image of the same layout,
# reproducibly; the releases publish that one.
#
# Build stage: the musl target links everything statically (TLS is rustls, no OpenSSL).
FROM rust:1.95-alpine AS build
RUN apk add --no-cache musl-dev
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin kube-svm && \
    cp target/release/kube-svm /kube-svm

# Runtime stage: CA certificates and a nonroot user (65532), no shell, no package manager.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /kube-svm /usr/local/bin/kube-svm
USER 65532:65532
# The admin server: /metrics, /healthz, /readyz.
EXPOSE 2112
# Other subcommands: `docker run --entrypoint /usr/local/bin/kube-svm <image> crds`.
ENTRYPOINT ["/usr/local/bin/kube-svm", "controller"]
