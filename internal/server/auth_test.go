package server_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/server"
)

const (
	decideToken  = "d3c1de-0123456789abcdef"
	inspectToken = "1nspect-0123456789abcdef"
	bothToken    = "b0th-0123456789abcdef0123"
)

// writeTokens writes a tokens file and returns its path.
func writeTokens(t testing.TB, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	return path
}

func withTokens(t testing.TB) option {
	path := writeTokens(t, "# scopes after the token\n"+decideToken+" decide\n\n"+inspectToken+" inspect\n"+bothToken+" decide,inspect\n")
	return withConfig(func(c *server.Config) {
		c.Authentication.Mode = server.AuthToken
		c.Authentication.TokensFile = path
	})
}

// call makes one request with the given headers (and Host, when not empty).
func call(t testing.TB, c *http.Client, method, url, host string, header map[string]string, body string) answer {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	require.NoError(t, err)
	if host != "" {
		req.Host = host
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{status: resp.StatusCode, header: resp.Header, body: b}
}

func bearer(tok string) map[string]string { return map[string]string{"Authorization": "Bearer " + tok} }

// With token authentication, each endpoint needs a token with its scope: decide for the three
// decision endpoints, inspect for facts, plugins and metrics. Health stays open.
func TestTokenAuthentication(t *testing.T) {
	url := startHTTP(t, newServer(t, withTokens(t)))
	// Every face that decides needs the decide scope, the OPA-style paths included.
	decisions := []string{"/v1/authorize", "/v1/capabilities", "/v1/data/authz/decision",
		"/v1/data/authz/decision/allow", "/v1/data/authz/decision/capabilities/duplexCommandStream", "/"}
	inspections := []string{"/v1/facts", "/v1/plugins", "/metrics"}
	body := func(path string) string {
		if strings.HasPrefix(path, "/v1/data/") {
			return `{"input":` + fixture(t, nil) + `}`
		}
		return fixture(t, nil)
	}
	tests := []struct {
		name       string
		header     map[string]string
		wantDecide int
		wantInsp   int
		wantCode   coded.Code
	}{
		{name: "no token", wantDecide: 401, wantInsp: 401, wantCode: coded.Unauthorized},
		{name: "unknown token", header: bearer("n0t-a-token-0123456789"), wantDecide: 401, wantInsp: 401, wantCode: coded.Unauthorized},
		{name: "a prefix of a token", header: bearer(decideToken[:len(decideToken)-1]), wantDecide: 401, wantInsp: 401, wantCode: coded.Unauthorized},
		{name: "basic scheme", header: map[string]string{"Authorization": "Basic " + decideToken}, wantDecide: 401, wantInsp: 401, wantCode: coded.Unauthorized},
		{name: "decide token", header: bearer(decideToken), wantDecide: 200, wantInsp: 403, wantCode: coded.Forbidden},
		{name: "inspect token", header: bearer(inspectToken), wantDecide: 403, wantInsp: 200, wantCode: coded.Forbidden},
		{name: "both scopes", header: bearer(bothToken), wantDecide: 200, wantInsp: 200},
		{name: "scheme in lower case", header: map[string]string{"Authorization": "bearer " + bothToken}, wantDecide: 200, wantInsp: 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, p := range decisions {
				a := call(t, testClient, http.MethodPost, url+p, "", tt.header, body(p))
				require.Equal(t, tt.wantDecide, a.status, "%s: %s", p, a.body)
				if tt.wantDecide != 200 {
					requireAPIError(t, a, tt.wantDecide, tt.wantCode)
					assert.Equal(t, false, a.json(t)["allow"], "a refused decision request reads as a deny")
				}
				if tt.wantDecide == 401 {
					assert.Equal(t, `Bearer realm="authz"`, a.header.Get("WWW-Authenticate"))
				}
			}
			for _, p := range inspections {
				a := call(t, testClient, http.MethodGet, url+p, "", tt.header, "")
				require.Equal(t, tt.wantInsp, a.status, "%s: %s", p, a.body)
				if tt.wantInsp != 200 {
					requireAPIError(t, a, tt.wantInsp, tt.wantCode)
					assert.NotContains(t, string(a.body), "test.plugin")
				}
			}
			for _, p := range []string{"/health", "/health/ready"} {
				assert.Equal(t, http.StatusOK, call(t, testClient, http.MethodGet, url+p, "", tt.header, "").status, p)
			}
		})
	}
}

// A refused request is answered before its body is read, and is not a decision: no log line.
func TestTokenAuthenticationRefusesBeforeDeciding(t *testing.T) {
	var buf lockedBuffer
	url := startHTTP(t, newServer(t, withTokens(t), withDecisionLog(&buf)))
	a := call(t, testClient, http.MethodPost, url+"/v1/authorize", "", bearer(inspectToken), fixture(t, nil))
	require.Equal(t, http.StatusForbidden, a.status)
	assert.Empty(t, buf.lines(t))
	a = call(t, testClient, http.MethodPost, url+"/v1/authorize", "", bearer(decideToken), fixture(t, nil))
	require.Equal(t, http.StatusOK, a.status)
	assert.Len(t, buf.lines(t), 1)
}

func TestReloadTokens(t *testing.T) {
	path := writeTokens(t, decideToken+" decide\n")
	s := newServer(t, withConfig(func(c *server.Config) {
		c.Authentication.Mode = server.AuthToken
		c.Authentication.TokensFile = path
	}))
	url := startHTTP(t, s)
	require.Equal(t, http.StatusOK, call(t, testClient, http.MethodPost, url+"/v1/authorize", "", bearer(decideToken), fixture(t, nil)).status)

	require.NoError(t, os.WriteFile(path, []byte(bothToken+" decide\n"), 0o600))
	require.NoError(t, s.Reload())
	assert.Equal(t, http.StatusUnauthorized, call(t, testClient, http.MethodPost, url+"/v1/authorize", "", bearer(decideToken), fixture(t, nil)).status, "revoked")
	assert.Equal(t, http.StatusOK, call(t, testClient, http.MethodPost, url+"/v1/authorize", "", bearer(bothToken), fixture(t, nil)).status)
}

// TestReloadRevokesEveryToken: SIGHUP (Reload) with an emptied, deleted, unreadable or
// malformed tokens file, or one whose permissions are refused, leaves no token valid: not the
// tokens in use before, not a token the bad file still lists. The failure is an error naming
// the file (and the line), and a valid file brings the tokens back.
func TestReloadRevokesEveryToken(t *testing.T) {
	tests := []struct {
		name   string
		change func(t *testing.T, path string)
		want   string // "" when the reload succeeds
	}{
		{name: "emptied", change: func(t *testing.T, path string) {
			require.NoError(t, os.WriteFile(path, []byte("# every token revoked\n"), 0o600))
		}},
		{name: "deleted", change: func(t *testing.T, path string) {
			require.NoError(t, os.Remove(path))
		}, want: "no such file"},
		{name: "typo on another line", change: func(t *testing.T, path string) {
			require.NoError(t, os.WriteFile(path, []byte(decideToken+" decide\n"+bothToken+" decide,inspekt\n"), 0o600))
		}, want: "line 2: unknown scope"},
		{name: "readable by others", change: func(t *testing.T, path string) {
			require.NoError(t, os.Chmod(path, 0o644))
		}, want: "has mode 0644"},
		{name: "symbolic link", change: func(t *testing.T, path string) {
			target := writeTokens(t, decideToken+" decide\n")
			require.NoError(t, os.Remove(path))
			require.NoError(t, os.Symlink(target, path))
		}, want: "symbolic link"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeTokens(t, decideToken+" decide\n"+bothToken+" decide\n")
			s := newServer(t, withConfig(func(c *server.Config) {
				c.Authentication.Mode = server.AuthToken
				c.Authentication.TokensFile = path
			}))
			url := startHTTP(t, s)
			decide := func(tok string) int {
				return call(t, testClient, http.MethodPost, url+"/v1/authorize", "", bearer(tok), fixture(t, nil)).status
			}
			require.Equal(t, http.StatusOK, decide(decideToken))
			require.Equal(t, http.StatusOK, decide(bothToken))

			tt.change(t, path)
			err := s.Reload()
			if tt.want == "" {
				require.NoError(t, err)
			} else {
				require.ErrorContains(t, err, tt.want)
				assert.Contains(t, err.Error(), path, "the error names the file")
				assert.NotContains(t, err.Error(), decideToken, "errors never show a token")
			}
			assert.Equal(t, http.StatusUnauthorized, decide(decideToken), "revoked")
			assert.Equal(t, http.StatusUnauthorized, decide(bothToken), "revoked")

			if err := os.Remove(path); !os.IsNotExist(err) {
				require.NoError(t, err)
			}
			require.NoError(t, os.WriteFile(path, []byte(bothToken+" decide\n"), 0o600))
			require.NoError(t, s.Reload())
			assert.Equal(t, http.StatusUnauthorized, decide(decideToken))
			assert.Equal(t, http.StatusOK, decide(bothToken), "a valid file brings its tokens back")
		})
	}
}

// TestEmptyTokensFileRefusesEveryToken: a tokens file without a token is accepted at start:
// no token is valid, every request that needs one is refused, the health endpoints answer.
func TestEmptyTokensFileRefusesEveryToken(t *testing.T) {
	path := writeTokens(t, "# no token yet\n")
	url := startHTTP(t, newServer(t, withConfig(func(c *server.Config) {
		c.Authentication.Mode = server.AuthToken
		c.Authentication.TokensFile = path
	})))
	assert.Equal(t, http.StatusUnauthorized, call(t, testClient, http.MethodPost, url+"/v1/authorize", "", bearer(decideToken), fixture(t, nil)).status)
	assert.Equal(t, http.StatusOK, call(t, testClient, http.MethodGet, url+"/health", "", nil, "").status)
}

func TestTokensFileRejected(t *testing.T) {
	tests := []struct{ name, body, want string }{
		{name: "no scope", body: decideToken + "\n", want: "line 1: want a token, white space and its scopes"},
		{name: "unknown scope", body: decideToken + " admin\n", want: `line 1: unknown scope "admin"`},
		{name: "short token", body: "abc decide\n", want: "line 1: the token is shorter than 16 characters"},
		{name: "duplicate", body: decideToken + " decide\n\n" + decideToken + " inspect\n", want: "line 3: the same token as on line 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.Authentication.Mode = server.AuthToken
			cfg.Authentication.TokensFile = writeTokens(t, tt.body)
			_, err := server.New(cfg, testEngine(t), staticFacts(t, "facts.json"), server.Options{})
			require.ErrorContains(t, err, tt.want)
			assert.NotContains(t, err.Error(), decideToken, "errors never show a token")
		})
	}
}

func TestAuthenticationConfig(t *testing.T) {
	tests := []struct {
		name   string
		change func(c *server.Config)
		want   string // "" means valid
	}{
		{name: "off by default", change: func(*server.Config) {}},
		{name: "unknown mode", change: func(c *server.Config) { c.Authentication.Mode = "basic" },
			want: `authentication.mode: must be off, token or tls; got "basic"`},
		{name: "token without a file", change: func(c *server.Config) { c.Authentication.Mode = "token" },
			want: "authentication.tokensFile: needed with authentication.mode token"},
		{name: "tls without a certificate", change: func(c *server.Config) {
			c.Authentication.Mode, c.Authentication.ClientCAFile = "tls", "/ca.pem"
		}, want: "authentication.mode: tls needs tls.cert and tls.key"},
		{name: "tls without a client CA", change: func(c *server.Config) {
			c.Authentication.Mode, c.TLS.Cert, c.TLS.Key = "tls", "/c.pem", "/k.pem"
		}, want: "authentication.clientCAFile: needed with authentication.mode tls"},
		{name: "tokens file in tls mode", change: func(c *server.Config) {
			c.Authentication.Mode, c.TLS.Cert, c.TLS.Key, c.Authentication.ClientCAFile = "tls", "/c.pem", "/k.pem", "/ca.pem"
			c.Authentication.TokensFile = "/tokens"
		}, want: "authentication.tokensFile: is used only with authentication.mode token"},
		{name: "allowed host with a port", change: func(c *server.Config) { c.Authentication.AllowedHosts = []string{"authz.internal:8181"} },
			want: "authentication.allowedHosts[0]: must be a host name or IP address without port"},
		{name: "allowed hosts", change: func(c *server.Config) { c.Authentication.AllowedHosts = []string{"authz.internal", "::1", "*"} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := server.DefaultConfig()
			tt.change(&c)
			err := c.Validate()
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.want)
		})
	}
}

// On a plain-HTTP connection to a loopback address, the Host header must name this service: a
// page whose name was made to resolve to 127.0.0.1 (DNS rebinding) is refused.
func TestHostHeaderOnLoopback(t *testing.T) {
	url := startHTTP(t, newServer(t, withConfig(func(c *server.Config) {
		c.Authentication.AllowedHosts = []string{"authz.internal"}
	})))
	_, port, err := net.SplitHostPort(strings.TrimPrefix(url, "http://"))
	require.NoError(t, err)
	tests := []struct {
		host string
		want int
	}{
		{host: "127.0.0.1:" + port, want: 200},
		{host: "localhost:" + port, want: 200},
		{host: "LOCALHOST:" + port, want: 200},
		{host: "[::1]:" + port, want: 200},
		{host: "authz.internal", want: 200},
		{host: "authz.internal:" + port, want: 200},
		{host: "attacker.example:" + port, want: 403},
		{host: "attacker.example", want: 403},
		{host: "localhost", want: 403},
		{host: "localhost:1", want: 403},
		{host: "127.0.0.1.nip.io:" + port, want: 403},
		{host: "authz.internal:1", want: 403},
	}
	for _, tt := range tests {
		t.Run(tt.host, func(t *testing.T) {
			for _, p := range []string{"/v1/facts", "/health"} {
				a := call(t, testClient, http.MethodGet, url+p, tt.host, nil, "")
				require.Equal(t, tt.want, a.status, "%s: %s", p, a.body)
				if tt.want == 403 {
					requireAPIError(t, a, http.StatusForbidden, coded.HostNotAllowed)
				}
			}
			a := call(t, testClient, http.MethodPost, url+"/v1/authorize", tt.host, nil, fixture(t, nil))
			require.Equal(t, tt.want, a.status)
			if tt.want == 403 {
				assert.Equal(t, false, a.json(t)["allow"])
			}
		})
	}

	any := startHTTP(t, newServer(t, withConfig(func(c *server.Config) { c.Authentication.AllowedHosts = []string{"*"} })))
	assert.Equal(t, http.StatusOK, call(t, testClient, http.MethodGet, any+"/v1/facts", "attacker.example", nil, "").status)
}

// testPKI is a CA with a server certificate for 127.0.0.1 and client certificates.
type testPKI struct {
	dir        string
	caFile     string
	serverCert string
	serverKey  string
	ca         *x509.Certificate
	caKey      *ecdsa.PrivateKey
}

func newTestPKI(t testing.TB) *testPKI {
	t.Helper()
	p := &testPKI{dir: t.TempDir()}
	p.ca, p.caKey, p.caFile = p.issue(t, "ca", nil, nil, func(c *x509.Certificate) {
		c.IsCA, c.BasicConstraintsValid = true, true
		c.KeyUsage = x509.KeyUsageCertSign
	})
	_, _, p.serverCert = p.issue(t, "server", p.ca, p.caKey, func(c *x509.Certificate) {
		c.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	})
	p.serverKey = filepath.Join(p.dir, "server.key")
	return p
}

// issue makes a certificate (self-signed when parent is nil) and writes NAME.pem and NAME.key.
func (p *testPKI) issue(t testing.TB, name string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, shape func(*x509.Certificate)) (*x509.Certificate, *ecdsa.PrivateKey, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	shape(tmpl)
	signer, signerKey := tmpl, key
	if parent != nil {
		signer, signerKey = parent, parentKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certFile := filepath.Join(p.dir, name+".pem")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(p.dir, name+".key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600))
	return cert, key, certFile
}

// client is an HTTPS client that trusts the test CA and presents the named certificate (none
// when name is "").
func (p *testPKI) client(t testing.TB, name string) *http.Client {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AddCert(p.ca)
	tc := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if name != "" {
		cert, err := tls.LoadX509KeyPair(filepath.Join(p.dir, name+".pem"), filepath.Join(p.dir, name+".key"))
		require.NoError(t, err)
		tc.Certificates = []tls.Certificate{cert}
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
}

// With authentication mode tls, only a client certificate signed by the client CA gets an
// answer; the TLS handshake refuses the others.
func TestMutualTLS(t *testing.T) {
	pki := newTestPKI(t)
	pki.issue(t, "client", pki.ca, pki.caKey, func(c *x509.Certificate) {
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	})
	otherCA, otherKey, _ := pki.issue(t, "other-ca", nil, nil, func(c *x509.Certificate) {
		c.IsCA, c.BasicConstraintsValid = true, true
		c.KeyUsage = x509.KeyUsageCertSign
	})
	pki.issue(t, "stranger", otherCA, otherKey, func(c *x509.Certificate) {
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	})
	pki.issue(t, "expired", pki.ca, pki.caKey, func(c *x509.Certificate) {
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		c.NotBefore, c.NotAfter = time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour)
	})

	s := newServer(t, withConfig(func(c *server.Config) {
		c.TLS.Cert, c.TLS.Key = pki.serverCert, pki.serverKey
		c.Authentication.Mode = server.AuthTLS
		c.Authentication.ClientCAFile = pki.caFile
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	stop := serveOn(t, s, ln)
	base := "https://" + ln.Addr().String()

	good := pki.client(t, "client")
	a := call(t, good, http.MethodPost, base+"/v1/authorize", "", nil, fixture(t, nil))
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	assert.Equal(t, true, a.json(t)["allow"])
	assert.Equal(t, http.StatusOK, call(t, good, http.MethodGet, base+"/v1/facts", "", nil, "").status)
	assert.Equal(t, http.StatusOK, call(t, good, http.MethodGet, base+"/health", "evil.example", nil, "").status,
		"the Host check is for plain HTTP only")

	for _, name := range []string{"", "stranger", "expired"} {
		t.Run("refused "+name, func(t *testing.T) {
			c := pki.client(t, name)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/health", nil)
			require.NoError(t, err)
			resp, err := c.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			require.Error(t, err, "the handshake must fail without a valid client certificate")
			c.CloseIdleConnections()
		})
	}
	good.CloseIdleConnections()
	require.NoError(t, stop())
}

// Token authentication over TLS: the token travels encrypted; both locks apply.
func TestTokenAuthenticationOverTLS(t *testing.T) {
	pki := newTestPKI(t)
	s := newServer(t, withTokens(t), withConfig(func(c *server.Config) {
		c.TLS.Cert, c.TLS.Key = pki.serverCert, pki.serverKey
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	stop := serveOn(t, s, ln)
	base := "https://" + ln.Addr().String()
	c := pki.client(t, "")
	assert.Equal(t, http.StatusUnauthorized, call(t, c, http.MethodPost, base+"/v1/authorize", "", nil, fixture(t, nil)).status)
	assert.Equal(t, http.StatusOK, call(t, c, http.MethodPost, base+"/v1/authorize", "", bearer(decideToken), fixture(t, nil)).status)
	c.CloseIdleConnections()
	require.NoError(t, stop())
}

// A TLS key that others may read, or group or others may write, is refused at start: drivers
// and other local users must not read the service's private key.
func TestTLSKeyFileModeChecked(t *testing.T) {
	pki := newTestPKI(t)
	for _, mode := range []os.FileMode{0o644, 0o604, 0o620} {
		t.Run(fmt.Sprintf("%04o", mode), func(t *testing.T) {
			require.NoError(t, os.Chmod(pki.serverKey, mode))
			cfg := testConfig()
			cfg.TLS.Cert, cfg.TLS.Key = pki.serverCert, pki.serverKey
			_, err := server.New(cfg, testEngine(t), staticFacts(t, "facts.json"), server.Options{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), "tls.key")
			assert.Contains(t, err.Error(), fmt.Sprintf("has mode %04o", mode))
			assert.Contains(t, err.Error(), "chmod 600 "+pki.serverKey)
		})
	}
	require.NoError(t, os.Chmod(pki.serverKey, 0o640))
	cfg := testConfig()
	cfg.TLS.Cert, cfg.TLS.Key = pki.serverCert, pki.serverKey
	s, err := server.New(cfg, testEngine(t), staticFacts(t, "facts.json"), server.Options{})
	require.NoError(t, err)
	assert.NoError(t, s.Close())
}
