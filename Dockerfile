# syntax=docker/dockerfile:1
# slidegate's container image: built in the Rust image, run from a slim Debian as the
# unprivileged user `slidegate`, with the Debian package's commented rules file.
#   docker build -t slidegate .
#   docker run -p 8080:8080 slidegate
# Settings are `slidegate serve` flags as SLIDEGATE_<FLAG> variables (docs/operations.md).

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p slidegate-server --bin slidegate

FROM debian:bookworm-slim
RUN useradd --system --user-group --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin slidegate
COPY --from=build /src/target/release/slidegate /usr/bin/slidegate
COPY --chown=root:slidegate --chmod=0640 crates/slidegate-server/debian/rules.toml /etc/slidegate/rules.toml
USER slidegate
# In a container the service listens on every interface of its own network namespace.
ENV SLIDEGATE_HTTP=0.0.0.0:8080 \
    SLIDEGATE_LOG_FORMAT=json
EXPOSE 8080 8081
# SIGTERM (docker stop): requests in flight finish, then the process exits 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/slidegate"]
CMD ["serve", "--config", "/etc/slidegate/rules.toml"]
