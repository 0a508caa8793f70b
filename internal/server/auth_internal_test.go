package server

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

// fakeInfo is the os.FileInfo of a file with the given mode and owner.
type fakeInfo struct {
	mode os.FileMode
	uid  uint32
}

func (f fakeInfo) Name() string       { return "tokens" }
func (f fakeInfo) Size() int64        { return 0 }
func (f fakeInfo) Mode() os.FileMode  { return f.mode }
func (f fakeInfo) ModTime() time.Time { return time.Time{} }
func (f fakeInfo) IsDir() bool        { return f.mode.IsDir() }
func (f fakeInfo) Sys() any           { return &syscall.Stat_t{Uid: f.uid} }

// The tokens file is accepted only as a regular file that group and others cannot write and
// others cannot read, owned by the service's user or by root.
func TestTokensFileInfoChecked(t *testing.T) {
	const self = 1000
	tests := []struct {
		name string
		fi   fakeInfo
		want string // "" when accepted
	}{
		{name: "0600, own", fi: fakeInfo{mode: 0o600, uid: self}},
		{name: "0400, own", fi: fakeInfo{mode: 0o400, uid: self}},
		{name: "0640, root", fi: fakeInfo{mode: 0o640, uid: 0}},
		{name: "0644", fi: fakeInfo{mode: 0o644, uid: self}, want: "has mode 0644"},
		{name: "0660", fi: fakeInfo{mode: 0o660, uid: self}, want: "has mode 0660"},
		{name: "0602", fi: fakeInfo{mode: 0o602, uid: self}, want: "has mode 0602"},
		{name: "another owner", fi: fakeInfo{mode: 0o600, uid: 4242}, want: "owned by uid 4242"},
		{name: "directory", fi: fakeInfo{mode: os.ModeDir | 0o700, uid: self}, want: "not a regular file"},
		{name: "fifo", fi: fakeInfo{mode: os.ModeNamedPipe | 0o600, uid: self}, want: "not a regular file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkSecretFileInfo("/etc/authz/tokens", "tokens file", tt.fi, self)
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.Contains(t, err.Error(), "/etc/authz/tokens")
		})
	}
}

// A failed reload of the tokens file shows in the gauges: no valid token, the failure flagged;
// a good file clears it.
func TestTokenGaugesShowAFailedReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(path, []byte("0123456789abcdef0123 decide\n"), 0o600))
	a, err := newAccess(AuthConfig{Mode: AuthToken, TokensFile: path})
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	reg.MustRegister(a.tokenMetrics()...)
	gauges := func() map[string]float64 {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		out := map[string]float64{}
		for _, mf := range mfs {
			out[mf.GetName()] = mf.GetMetric()[0].GetGauge().GetValue()
		}
		return out
	}
	assert.Equal(t, map[string]float64{"authz_auth_tokens": 1, "authz_auth_tokens_file_failed": 0}, gauges())
	require.NoError(t, os.WriteFile(path, []byte("0123456789abcdef0123 admin\n"), 0o600))
	require.Error(t, a.reloadTokens())
	assert.Equal(t, map[string]float64{"authz_auth_tokens": 0, "authz_auth_tokens_file_failed": 1}, gauges())
	require.NoError(t, os.WriteFile(path, []byte("0123456789abcdef0123 decide\n"), 0o600))
	require.NoError(t, a.reloadTokens())
	assert.Equal(t, map[string]float64{"authz_auth_tokens": 1, "authz_auth_tokens_file_failed": 0}, gauges())
}
