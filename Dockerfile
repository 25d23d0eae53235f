# outboxd in a container: a static binary (no cgo, no libc) on a minimal
# base with no shell, running as a non-root user. The image has no
# PostgreSQL server, so the embedded default is not available: give it
# DATABASE_URL. deploy_test.go lints this file; .ci/run builds it where a
# Docker engine runs.
#
#   docker build -t outboxd .
#   docker run -e DATABASE_URL=postgres://... -e OUTBOXD_ADMIN_TOKEN=... -p 8080:8080 outboxd

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
# port is published (or not) by whoever runs it.
ENV OUTBOXD_ADDR=0.0.0.0:8080
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/outboxd"]
