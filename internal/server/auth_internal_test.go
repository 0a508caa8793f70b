package server

import (
	"bytes"
	"net"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
)

// Token authentication on plain HTTP at a routable address is warned about: the tokens would
// cross the network in clear text. (Only the address is looked at: nothing is bound.)
func TestWarnCleartextTokens(t *testing.T) {
	tests := []struct {
		name  string
		mode  string
		addr  net.Addr
		tls   bool
		warns bool
	}{
		{name: "routable, plain HTTP", mode: AuthToken, addr: &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 8181}, warns: true},
		{name: "wildcard, plain HTTP", mode: AuthToken, addr: &net.TCPAddr{IP: net.IPv4zero, Port: 8181}, warns: true},
		{name: "routable, TLS", mode: AuthToken, addr: &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 8181}, tls: true},
		{name: "loopback", mode: AuthToken, addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8181}},
		{name: "unix socket", mode: AuthToken, addr: &net.UnixAddr{Name: "/run/authz.sock", Net: "unix"}},
		{name: "no tokens", mode: AuthOff, addr: &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 8181}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			log := hclog.New(&hclog.LoggerOptions{Output: &buf, Level: hclog.Info})
			(&access{mode: tt.mode}).warnCleartext(log, tt.addr, tt.tls)
			if tt.warns {
				assert.Contains(t, buf.String(), "[WARN]  bearer tokens are sent in clear text")
			} else {
				assert.Empty(t, buf.String())
			}
		})
	}
}
