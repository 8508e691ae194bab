# The aqgate image (compose.yaml builds it: README.md, "With Docker").
#
# Build context: the repository root (.dockerignore keeps target/, .git and local state out).
# Everything the binary embeds at compile time is in it: config/topology.toml,
# ldap-fixtures/directory.ldif, certs/ca.pem + certs/ca.crl and certs/gateway-smime.pem +
# .key.pem (the TEST ONLY demo CA and gateway S/MIME certificate, only used next to the demo
# directory) and crates/aqgate-store/migrations/. The files under examples/ are included by
# unit tests only (#[cfg(test)]), which are not built here;
# scripts/validate-compose.sh checks that this stays so.

# ---- build -----------------------------------------------------------------------------------
FROM rust:1.95-bookworm AS build
WORKDIR /src
# The image has SAML login (the `saml` feature): samael links xmlsec1 and libxml2 and generates
# its bindings with libclang; it goes with the system OpenSSL (libssl-dev is in the rust image),
# not the vendored one of the default build.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libxmlsec1-dev libclang-dev \
    && rm -rf /var/lib/apt/lists/*
# Dependencies first, in a layer of their own: rebuilt only when Cargo.toml or Cargo.lock change.
COPY Cargo.toml Cargo.lock ./
COPY crates/aqgate-proto/Cargo.toml crates/aqgate-proto/
COPY crates/aqgate-core/Cargo.toml crates/aqgate-core/
COPY crates/aqgate-store/Cargo.toml crates/aqgate-store/
COPY crates/aqgate-directory/Cargo.toml crates/aqgate-directory/
COPY crates/aqgate-mail/Cargo.toml crates/aqgate-mail/
COPY crates/aqgate-notify/Cargo.toml crates/aqgate-notify/
COPY crates/aqgate-propagate/Cargo.toml crates/aqgate-propagate/
COPY crates/aqgate-saml/Cargo.toml crates/aqgate-saml/
COPY crates/aqgate-admin/Cargo.toml crates/aqgate-admin/
COPY crates/aqgate-http/Cargo.toml crates/aqgate-http/
COPY crates/aqgate-client/Cargo.toml crates/aqgate-client/
COPY crates/aqgate-console/Cargo.toml crates/aqgate-console/
RUN mkdir src \
    && echo 'fn main() {}' > src/main.rs \
    && for c in crates/*; do mkdir "$c/src" && touch "$c/src/lib.rs"; done \
    && cargo build --release --locked --no-default-features --features saml --bin aqgate \
    && rm -rf src crates/*/src
COPY src ./src
COPY crates ./crates
COPY config ./config
COPY ldap-fixtures ./ldap-fixtures
COPY certs ./certs
# touch: the stub's build output is newer than the copied sources, which keep their mtimes.
# strip --strip-debug: the release profile's line tables (debug = 1) would make the binary six
# times larger (135 MB); the symbols stay, so backtraces still name the functions.
RUN touch src/main.rs crates/*/src/lib.rs \
    && cargo build --release --locked --no-default-features --features saml --bin aqgate \
    && install -D -m 0755 target/release/aqgate /out/aqgate \
    && strip --strip-debug /out/aqgate

# ---- runtime ---------------------------------------------------------------------------------
FROM debian:bookworm-slim
# libssl3: the openssl crate (S/MIME) links the system OpenSSL; ca-certificates: the trust
# store of rustls-native-certs (notifications over https://, mail relays with TLS);
# libxmlsec1-openssl (with libxmlsec1 and libxml2): SAML login's signature checks.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libssl3 ca-certificates libxmlsec1-openssl \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 aqgate \
    && useradd --system --uid 10001 --gid aqgate --home-dir /var/lib/aqgate --create-home \
        --shell /usr/sbin/nologin aqgate
COPY --from=build /out/aqgate /usr/local/bin/aqgate
USER 10001:10001
# The default SQLite file (aqgate.db) and mail outbox (aqgate-outbox/) land here.
WORKDIR /var/lib/aqgate
# Listen on every address of the container. Environment rather than flags in CMD, so that
# compose.yaml (or `docker run -e`) can change any setting through AQGATE_* variables:
# a flag would take precedence over them. Plain HTTP beyond loopback is allowed here because
# the container's address is reachable only as the ports are published (compose.yaml: on
# 127.0.0.1); to face a network, set AQGATE_TLS_CERT and AQGATE_TLS_KEY (HTTPS).
ENV AQGATE_LISTEN=0.0.0.0:8470 \
    AQGATE_ALLOW_PLAIN_HTTP=true \
    AQGATE_SMTP_LISTEN=0.0.0.0:2525
# 8470: HTTP (IDAP servlet, /healthz, /readyz, /metrics); 2525: the SMTP filter.
EXPOSE 8470 2525
ENTRYPOINT ["aqgate"]
CMD ["serve"]
