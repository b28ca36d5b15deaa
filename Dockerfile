# syntax=docker/dockerfile:1
#
# One image for every kasa process: `docker run IMAGE api|worker|banksim|migrate|...`.
# docker-compose.yml at the repository root builds it and runs each subcommand as a service.

# ---- build -------------------------------------------------------------------------------------
FROM golang:1.26 AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOFLAGS=-trimpath

# Module downloads get their own layer so a source edit does not re-download them.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download

COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    go build -ldflags="-s -w" -o /out/kasa ./cmd/kasa \
 && mkdir -p /out/data

# ---- runtime -----------------------------------------------------------------------------------
# Static binary, CA certificates and tzdata, no shell: healthchecks cannot exec a tool in here.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/kasa /kasa
# /data belongs to the nonroot user (65532) so that an empty named volume mounted there
# inherits that owner and the bank simulator can write its durable charge log.
COPY --from=build --chown=65532:65532 /out/data /data
USER 65532:65532
# Inside a container the loopback defaults of config/ would be unreachable from outside.
ENV KASA_API_ADDR=0.0.0.0:8080 \
    KASA_BANKSIM_ADDR=0.0.0.0:8090 \
    KASA_DATA_DIR=/data
EXPOSE 8080 8090
ENTRYPOINT ["/kasa"]
