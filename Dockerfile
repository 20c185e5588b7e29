# Build: docker build -t outbox-relay .
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p outbox-relay

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 relay
COPY --from=build /src/target/release/outbox-relay /usr/local/bin/outbox-relay
USER relay
ENTRYPOINT ["outbox-relay"]
CMD ["run"]
