# outboxd in a container: a static binary (no cgo, no libc) on a minimal
# base with no shell, running as a non-root user. The image has no
# PostgreSQL server, so the embedded default is not available: give it
# DATABASE_URL. deploy_test.go lints this file; .ci/run builds it where a
# Docker engine runs.
#
#   docker build -t outboxd .
#   docker run -e DATABASE_URL=postgres://... -e OUTBOXD_ADMIN_TOKEN="$(openssl rand -hex 32)" \
#     -e OUTBOXD_PUBLIC_URL=https://outboxd.example.com \
#     -e OUTBOXD_TRUSTED_PROXIES=10.0.0.5 -p 8080:8080 outboxd

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/outboxd .

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/outboxd /usr/local/bin/outboxd
USER nonroot:nonroot
# Listen on every interface of the container's own network namespace; the
# port is published (or not) by whoever runs it. Beyond loopback outboxd
# wants TLS or the word that something in front terminates it: a
# container is reached through its platform's proxy or port mapping, so
# the image says so; mount a certificate and set OUTBOXD_TLS_CERT and
# OUTBOXD_TLS_KEY to serve HTTPS itself. OUTBOXD_ADMIN_TOKEN must be set,
# and strong (docs/security.md, the admin token). Set OUTBOXD_PUBLIC_URL
# to the https URL browsers use: served plain HTTP, outboxd learns only
# from it that its session cookie must be Secure, and sends HSTS. Set
# OUTBOXD_TRUSTED_PROXIES to the proxy's address, so that the throttle on
# wrong tokens counts each client's address rather than the proxy's;
# none is trusted by default, as the image cannot know which is in front.
ENV OUTBOXD_ADDR=0.0.0.0:8080 \
    OUTBOXD_INSECURE_HTTP=1
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/outboxd"]
