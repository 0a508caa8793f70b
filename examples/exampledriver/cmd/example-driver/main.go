// Command example-driver is the example sandbox provider as a standalone driver plugin binary.
// authz starts it; see docs/drivers.md.
package main

import (
	"os"

	"github.com/authz-dev/authz/examples/exampledriver"
)

func main() {
	os.Exit(exampledriver.Main(os.Args[1:]))
}
