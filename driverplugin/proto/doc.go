// Package proto is the generated protobuf and gRPC code of the driver protocol
// (driver.proto), which driverplugin wraps; regenerate it with driverplugin/generate.sh.
// Drivers and the host use driverplugin, not this package.
package proto
