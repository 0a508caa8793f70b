package main

import (
	"fmt"
	"io"
	"runtime/debug"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/policies"
)

// version is the module version of the build, or "devel".
func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}

// policyRevision is the revision of the embedded policy: the "revision" of every decision this
// binary makes with it.
func policyRevision() (string, error) {
	mods, err := policies.Modules()
	if err != nil {
		return "", fmt.Errorf("read the embedded policy: %w", err)
	}
	return decision.ContentRevision(mods), nil
}

func printVersion(w io.Writer) error {
	rev, err := policyRevision()
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "authz %s\npolicy %s\n", version(), rev)
	return err
}
