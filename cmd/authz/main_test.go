package main

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind (a server, a plugin client).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
