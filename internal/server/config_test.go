package server_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/server"
)

func TestDefaultConfigIsValid(t *testing.T) {
	cfg := server.DefaultConfig()
	require.NoError(t, cfg.Validate())
	assert.Equal(t, "127.0.0.1:8181", cfg.Addr)
	assert.Equal(t, int64(1<<20), cfg.MaxBodyBytes)
}

func TestValidateNamesTheField(t *testing.T) {
	tests := []struct {
		name   string
		change func(c *server.Config)
		want   string
	}{
		{name: "addr without port", change: func(c *server.Config) { c.Addr = "localhost" }, want: "addr: "},
		{name: "addr relative unix path", change: func(c *server.Config) { c.Addr = "unix://authz.sock" }, want: "addr: "},
		{name: "addr other scheme", change: func(c *server.Config) { c.Addr = "http://127.0.0.1:8181" }, want: "addr: "},
		{name: "tls cert without key", change: func(c *server.Config) { c.TLS.Cert = "/c.pem" }, want: "tls.key: must be set together with tls.cert"},
		{name: "tls key without cert", change: func(c *server.Config) { c.TLS.Key = "/k.pem" }, want: "tls.cert: must be set together with tls.key"},
		{name: "mask outside input", change: func(c *server.Config) {
			c.DecisionLog.Mask = []string{"/result/allow"}
		}, want: "decisionLog.mask[0]: "},
		{name: "mask with a bad escape", change: func(c *server.Config) {
			c.DecisionLog.Mask = []string{"/input/a~2b"}
		}, want: "decisionLog.mask[0]: "},
		{name: "required log without a path", change: func(c *server.Config) { c.DecisionLog.Required = true }, want: "decisionLog.required: needs decisionLog.path"},
		{name: "zero body limit", change: func(c *server.Config) { c.MaxBodyBytes = 0 }, want: "maxBodyBytes: must be positive"},
		{name: "zero shutdown timeout", change: func(c *server.Config) { c.ShutdownTimeout = 0 }, want: "shutdownTimeout: must be a positive duration"},
		{name: "negative idle timeout", change: func(c *server.Config) { c.HTTP.IdleTimeout = -time.Second }, want: "http.idleTimeout: must be a positive duration"},
		{name: "tiny header limit", change: func(c *server.Config) { c.HTTP.MaxHeaderBytes = 10 }, want: "http.maxHeaderBytes: must be at least 1024"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := server.DefaultConfig()
			tt.change(&c)
			err := c.Validate()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	c := server.DefaultConfig()
	c.Addr = "nope"
	c.MaxBodyBytes = -1
	c.HTTP.MaxHeaderBytes = 1
	err := c.Validate()
	require.Error(t, err)
	lines := strings.Split(err.Error(), "\n")
	assert.Len(t, lines, 3)
}
