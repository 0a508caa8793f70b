#!/usr/bin/env bash
# Regenerates the Go code of driverplugin/proto/driver.proto.
#
# The code generators are the Go tools pinned in go.mod (protoc-gen-go, protoc-gen-go-grpc);
# protoc itself is Debian's protobuf-compiler (apt-get install -y protobuf-compiler). The
# output is deterministic for a given protoc version, so CI can run this script and then
# `git diff --exit-code driverplugin/proto`.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

if ! command -v protoc >/dev/null 2>&1; then
	echo "generate.sh: protoc not found; install it with: apt-get install -y protobuf-compiler" >&2
	exit 1
fi

bin="$(mktemp -d)"
trap 'rm -rf "$bin"' EXIT

# Build the generators pinned by the tool directives in go.mod (the same code `go tool` runs).
go build -o "$bin/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go
go build -o "$bin/protoc-gen-go-grpc" google.golang.org/grpc/cmd/protoc-gen-go-grpc

protoc \
	--plugin=protoc-gen-go="$bin/protoc-gen-go" \
	--plugin=protoc-gen-go-grpc="$bin/protoc-gen-go-grpc" \
	--proto_path=. \
	--go_out=. --go_opt=paths=source_relative \
	--go-grpc_out=. --go-grpc_opt=paths=source_relative \
	driverplugin/proto/driver.proto
