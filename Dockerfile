# Build: docker build --build-arg OUTBOX_RELAY_COMMIT=$(git rev-parse --short=12 HEAD) -t outbox-relay .
# (.git is not copied in: the commit `outbox-relay --version` prints comes from the argument.)
FROM rust:1-bookworm AS build
ARG OUTBOX_RELAY_COMMIT=unknown
WORKDIR /src
COPY . .
# The release profile ships the binary without debug info (Cargo.toml, [profile.release]); one
# that still has line tables (a profile override in the environment) fails the build here rather
# than shipping several times the size.
RUN cargo build --release --locked -p outbox-relay \
    && ! readelf -S --wide target/release/outbox-relay | grep -qE '\.debug_(info|line)'

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 relay
COPY --from=build /src/target/release/outbox-relay /usr/local/bin/outbox-relay
USER relay
# /livez, /readyz, /metrics, /status (docs/operations.md).
ENV RELAY_HTTP__LISTEN=0.0.0.0:9464
EXPOSE 9464
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s CMD ["outbox-relay", "health"]
ENTRYPOINT ["outbox-relay"]
CMD ["run"]
