# Build: the official Rust image at the toolchain's release (rustc 1.95), on Debian 12 like
# the runtime image below (same glibc); protos compile with protox, so no protoc is needed.
FROM rust:1.95-bookworm AS build
WORKDIR /src
# The build context has no .git (.dockerignore): pass the commit for `promnorm version`
# and promnorm_build_info, e.g. --build-arg PROMNORM_REVISION=$(git rev-parse --short=12 HEAD).
ARG PROMNORM_REVISION=unknown
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto proto
COPY mappings mappings
COPY src src
COPY benches benches
# A workspace member (the benchmark tools); only its manifest is read for this build.
COPY tools tools
# No default features: the image needs no synthetic fleet generator (`testkit`).
RUN cargo build --release --locked --no-default-features --bin promnorm

# Run: distroless (glibc, CA roots, no shell) as a non-root user.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/promnorm /usr/local/bin/promnorm
USER nonroot:nonroot
EXPOSE 9201
# The embedded default configuration is used unless --config is given.
HEALTHCHECK --interval=30s --timeout=3s CMD ["/usr/local/bin/promnorm", "healthcheck", "http://127.0.0.1:9201/-/healthy"]
ENTRYPOINT ["/usr/local/bin/promnorm"]
CMD ["serve"]
