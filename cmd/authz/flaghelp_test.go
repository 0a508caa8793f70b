package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The flag help names each flag's argument with one word: a back-quoted phrase in a usage text
// would become the argument's name ("-bundle opa build").
func TestFlagHelpNamesEachArgumentWithOneWord(t *testing.T) {
	for _, cmd := range []string{"serve", "check", "decide", "replay"} {
		t.Run(cmd, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			_ = run(t.Context(), []string{cmd, "-h"}, strings.NewReader(""), &stdout, &stderr)
			help := stdout.String() + stderr.String()
			assert.Contains(t, help, "  -bundle PATH\n", "the argument of --bundle is a path")
			for _, line := range strings.Split(help, "\n") {
				if strings.HasPrefix(line, "  -") {
					assert.LessOrEqual(t, len(strings.Fields(line)), 2, "flag line %q", line)
				}
			}
		})
	}
}
