package server

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/configcheck"
)

// Authentication modes (authentication.mode, --authentication), as OPA names them.
const (
	AuthOff   = "off"   // no authentication: anyone who reaches the listener may ask
	AuthToken = "token" // a bearer token from authentication.tokensFile
	AuthTLS   = "tls"   // a client certificate verified against authentication.clientCAFile
)

// Token scopes: which endpoints a bearer token opens. The health endpoints need none.
const (
	ScopeDecide  = "decide"  // POST /v1/authorize, /v1/capabilities, /v1/data/authz/decision
	ScopeInspect = "inspect" // GET /v1/facts, /v1/plugins, /metrics
)

// minTokenBytes is the shortest token accepted in a tokens file: a guessable token is no token.
const minTokenBytes = 16

// tokenSet is a parsed tokens file. Tokens are kept as SHA-256 digests, so that comparing a
// presented token costs the same whatever it shares with a stored one.
type tokenSet struct {
	digests [][sha256.Size]byte
	scopes  []map[string]bool
}

// scopesOf returns the scopes of the presented token, nil when it is not in the set. It looks
// at every stored token, with a constant-time comparison each, so its time does not depend on
// which token (if any) matched or on how much of it did.
func (t *tokenSet) scopesOf(presented string) map[string]bool {
	d := sha256.Sum256([]byte(presented))
	var found map[string]bool
	for i := range t.digests {
		if subtle.ConstantTimeCompare(d[:], t.digests[i][:]) == 1 {
			found = t.scopes[i]
		}
	}
	return found
}

// readSecretFile reads a file that holds the service's credentials (the tokens file, the TLS
// key), named what in errors. It does not follow a symbolic link and refuses a file that
// checkSecretFileInfo refuses.
func readSecretFile(path, what string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, fmt.Errorf("%s is a symbolic link: name the file itself", path)
		}
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if err := checkSecretFileInfo(path, what, fi, os.Geteuid()); err != nil {
		return nil, err
	}
	return io.ReadAll(io.LimitReader(f, maxTokensFileBytes+1))
}

// maxTokensFileBytes bounds the read of a file of credentials.
const maxTokensFileBytes = 1 << 20

// checkSecretFileInfo accepts a file of credentials (what: "tokens file", "TLS key") that is a
// regular file, that neither group nor others may write and others may not read (0600, 0640,
// 0400 or 0440), owned by euid or by root (a file root manages and the service's group reads).
// Others include every driver a root host runs as a user of its own.
func checkSecretFileInfo(path, what string, fi os.FileInfo, euid int) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file (%v): name a file", path, fi.Mode().Type())
	}
	if perm := fi.Mode().Perm(); perm&0o027 != 0 {
		return fmt.Errorf("%s has mode %04o: the %s must not be writable by group or others nor readable by others (chmod 600 %s, or 640 for a group that reads it)", path, perm, what, path)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != euid && st.Uid != 0 {
		return fmt.Errorf("%s is owned by uid %d, not by this service (uid %d) or root: give it to this user (chown)", path, st.Uid, euid)
	}
	return nil
}

// loadTokens reads a tokens file: one token per line, followed by white space and its scopes,
// comma-separated (decide, inspect). Blank lines and lines starting with # are ignored; a file
// with no token is valid and makes every request that needs one refused. Errors name the file
// and the line, never the token.
func loadTokens(path string) (*tokenSet, error) {
	b, err := readSecretFile(path, "tokens file")
	if err != nil {
		return nil, fmt.Errorf("authentication.tokensFile %s: %w", path, err)
	}
	if len(b) > maxTokensFileBytes {
		return nil, fmt.Errorf("authentication.tokensFile %s: larger than %d bytes", path, maxTokensFileBytes)
	}
	set := &tokenSet{}
	seen := map[[sha256.Size]byte]int{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		where := fmt.Sprintf("authentication.tokensFile %s line %d", path, n)
		if len(fields) != 2 {
			return nil, fmt.Errorf("%s: want a token, white space and its scopes (decide, inspect or decide,inspect)", where)
		}
		tok := fields[0]
		if len(tok) < minTokenBytes {
			return nil, fmt.Errorf("%s: the token is shorter than %d characters; generate one with: openssl rand -hex 32", where, minTokenBytes)
		}
		scopes := map[string]bool{}
		for _, s := range strings.Split(fields[1], ",") {
			if s != ScopeDecide && s != ScopeInspect {
				return nil, fmt.Errorf("%s: unknown scope %q: the scopes are %s and %s", where, s, ScopeDecide, ScopeInspect)
			}
			scopes[s] = true
		}
		d := sha256.Sum256([]byte(tok))
		if first, dup := seen[d]; dup {
			return nil, fmt.Errorf("%s: the same token as on line %d: give each token once, with all its scopes", where, first)
		}
		seen[d] = n
		set.digests = append(set.digests, d)
		set.scopes = append(set.scopes, scopes)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("authentication.tokensFile %s: %w", path, err)
	}
	return set, nil
}

// clientCAPool reads the PEM certificates that sign accepted client certificates.
func clientCAPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("authentication.clientCAFile: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("authentication.clientCAFile %s: no PEM certificate in the file", path)
	}
	return pool, nil
}

// access is the access control in front of every endpoint: the Host check against DNS
// rebinding, then authentication and the token's scope.
type access struct {
	mode         string
	tokensFile   string
	tokens       atomic.Pointer[tokenSet]
	tokensFailed atomic.Bool // the last reload of the tokens file failed: no token is valid
	allowedHosts []string    // lower case, without port
	anyHost      bool
}

func newAccess(cfg AuthConfig) (*access, error) {
	a := &access{mode: cfg.mode(), tokensFile: cfg.TokensFile}
	for _, h := range cfg.AllowedHosts {
		if h == "*" {
			a.anyHost = true
			continue
		}
		a.allowedHosts = append(a.allowedHosts, strings.ToLower(h))
	}
	if a.mode == AuthToken {
		set, err := loadTokens(cfg.TokensFile)
		if err != nil {
			return nil, err
		}
		a.tokens.Store(set)
	}
	return a, nil
}

// reloadTokens reads the tokens file again and makes its tokens the valid ones. A file that
// cannot be read, is refused or does not parse revokes every token: a revocation must never
// be undone by a mistake in the file. The error says so.
func (a *access) reloadTokens() error {
	if a.mode != AuthToken {
		return nil
	}
	set, err := loadTokens(a.tokensFile)
	if err != nil {
		a.tokens.Store(&tokenSet{})
		a.tokensFailed.Store(true)
		return fmt.Errorf("%w; every bearer token is refused until the file is fixed and the service reloaded (SIGHUP)", err)
	}
	a.tokens.Store(set)
	a.tokensFailed.Store(false)
	return nil
}

// tokenMetrics are the gauges of the bearer tokens: how many are valid, and whether the last
// reload of the tokens file failed (every token then refused).
func (a *access) tokenMetrics() []prometheus.Collector {
	if a.mode != AuthToken {
		return nil
	}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "authz_auth_tokens",
			Help: "Bearer tokens currently valid (authentication.tokensFile).",
		}, func() float64 { n, _ := a.tokensState(); return float64(n) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "authz_auth_tokens_file_failed",
			Help: "1 when the last reload of the tokens file failed and every bearer token is refused, else 0.",
		}, func() float64 {
			if _, failed := a.tokensState(); failed {
				return 1
			}
			return 0
		}),
	}
}

// tokensState is the state of the bearer tokens: how many are valid, and whether the last
// reload of the tokens file failed (every token is then refused).
func (a *access) tokensState() (valid int, failed bool) {
	if set := a.tokens.Load(); set != nil {
		valid = len(set.digests)
	}
	return valid, a.tokensFailed.Load()
}

// check answers whether r may reach an endpoint that needs scope ("" for the health
// endpoints). It returns nil when it may, else the error to answer.
func (a *access) check(r *http.Request, scope string) error {
	if err := a.checkHost(r); err != nil {
		return err
	}
	if scope == "" || a.mode == AuthOff {
		return nil
	}
	switch a.mode {
	case AuthTLS:
		// The TLS handshake already required and verified the certificate; this is a second
		// lock in case the handler is ever served without that listener configuration.
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
			return coded.Errorf(coded.Unauthorized, "a client certificate signed by the configured client CA is required")
		}
		return nil
	case AuthToken:
		tok, ok := bearerToken(r)
		if !ok {
			return coded.Errorf(coded.Unauthorized, "authentication required: send Authorization: Bearer <token>")
		}
		scopes := a.tokens.Load().scopesOf(tok)
		if scopes == nil {
			return coded.Errorf(coded.Unauthorized, "the bearer token is not valid")
		}
		if !scopes[scope] {
			return coded.Errorf(coded.Forbidden, "the bearer token does not have the %q scope this endpoint needs", scope)
		}
		return nil
	}
	return coded.Errorf(coded.Internal, "unknown authentication mode")
}

// bearerToken reads "Authorization: Bearer <token>" (the scheme in any case, RFC 7235).
func bearerToken(r *http.Request) (string, bool) {
	h := r.Header.Values("Authorization")
	if len(h) != 1 {
		return "", false
	}
	scheme, tok, ok := strings.Cut(h[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// checkHost refuses, on a plain-HTTP connection that arrived at a loopback address, a Host
// header that does not name this service: localhost, 127.0.0.1 or [::1] with the port the
// connection arrived at (or no port when that is 80), or one of authentication.allowedHosts.
// A web page that made its name resolve to 127.0.0.1 (DNS rebinding) sends its own name and is
// refused. TLS connections and unix sockets are not concerned: a browser cannot be steered to
// them that way.
func (a *access) checkHost(r *http.Request) error {
	if a.anyHost {
		return nil
	}
	return CheckLoopbackHost(r, a.allowedHosts)
}

// CheckLoopbackHost is the Host check of the gate's listener (DNS rebinding) for another
// listener, such as OPA's under `authz run`: on a plain-HTTP connection that arrived at a
// loopback address, the Host header must be localhost, 127.0.0.1 or [::1] with the port the
// connection arrived at (or no port on port 80), or one of allowedHosts (lower case, without
// port). It returns nil when r may pass, else a coded.HostNotAllowed error.
func CheckLoopbackHost(r *http.Request, allowedHosts []string) error {
	if r.TLS != nil {
		return nil
	}
	local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return nil
	}
	tcp, ok := local.(*net.TCPAddr)
	if !ok || !tcp.IP.IsLoopback() {
		return nil
	}
	host, port := r.Host, ""
	if h, p, err := net.SplitHostPort(r.Host); err == nil {
		host, port = h, p
	} else {
		host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	}
	host = strings.ToLower(host)
	wantPort := strconv.Itoa(tcp.Port)
	portOK := port == wantPort || (port == "" && tcp.Port == 80)
	switch {
	case portOK && (host == "localhost" || host == "127.0.0.1" || host == "::1"):
		return nil
	case (portOK || port == "") && slices.Contains(allowedHosts, host):
		return nil
	}
	return coded.Errorf(coded.HostNotAllowed, "Host %q is not a name of this service on a loopback address: use localhost:%s or 127.0.0.1:%s, or add the name to authentication.allowedHosts", r.Host, wantPort, wantPort)
}

// tlsServerConfig builds the listener's TLS configuration: the certificate (its key read as
// readSecretFile reads credentials), and with
// authentication mode tls the client CA whose certificates are required and verified.
func tlsServerConfig(cfg Config) (*tls.Config, error) {
	if cfg.TLS.Cert == "" {
		return nil, nil
	}
	certPEM, err := os.ReadFile(cfg.TLS.Cert)
	if err != nil {
		return nil, fmt.Errorf("tls.cert: load the certificate: %w", err)
	}
	key, err := readSecretFile(cfg.TLS.Key, "TLS key")
	if err != nil {
		return nil, fmt.Errorf("tls.key: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, key)
	if err != nil {
		return nil, fmt.Errorf("tls.cert: load the certificate and key: %w", err)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if cfg.Authentication.mode() == AuthTLS {
		pool, err := clientCAPool(cfg.Authentication.ClientCAFile)
		if err != nil {
			return nil, err
		}
		tc.ClientCAs = pool
		tc.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return tc, nil
}

// validate checks the authentication block; add reports a field's problem.
func (c AuthConfig) validate(tlsOn bool, v *configcheck.Problems) {
	switch c.mode() {
	case AuthOff:
	case AuthToken:
		if c.TokensFile == "" {
			v.Add("authentication.tokensFile", "needed with authentication.mode %s: a file of bearer tokens and their scopes", AuthToken)
		}
	case AuthTLS:
		if !tlsOn {
			v.Add("authentication.mode", "%s needs tls.cert and tls.key: client certificates are checked in the TLS handshake", AuthTLS)
		}
		if c.ClientCAFile == "" {
			v.Add("authentication.clientCAFile", "needed with authentication.mode %s: the PEM CA certificate(s) that sign client certificates", AuthTLS)
		}
	default:
		v.Add("authentication.mode", "must be %s, %s or %s; got %q", AuthOff, AuthToken, AuthTLS, c.Mode)
	}
	if c.mode() != AuthToken && c.TokensFile != "" {
		v.Add("authentication.tokensFile", "is used only with authentication.mode %s", AuthToken)
	}
	if c.mode() != AuthTLS && c.ClientCAFile != "" {
		v.Add("authentication.clientCAFile", "is used only with authentication.mode %s", AuthTLS)
	}
	for i, h := range c.AllowedHosts {
		if h == "" || (strings.ContainsAny(h, ":/ []") && net.ParseIP(h) == nil) {
			v.Add(fmt.Sprintf("authentication.allowedHosts[%d]", i), "must be a host name or IP address without port or scheme, or *; got %q", h)
		}
	}
}

// warnCleartext warns when bearer tokens would cross a network in clear text: token
// authentication on plain HTTP at an address that is not loopback.
func (a *access) warnCleartext(log hclog.Logger, addr net.Addr, tlsOn bool) {
	tcp, ok := addr.(*net.TCPAddr)
	if a.mode != AuthToken || tlsOn || !ok || tcp.IP.IsLoopback() {
		return
	}
	log.Warn("bearer tokens are sent in clear text on this address: serve TLS (tls.cert, tls.key) or listen on loopback or a unix socket",
		"addr", addr.String())
}

// stillDecides reports whether the bearer token tok (as a watch was opened with it) still has
// the decide scope; true when the service does not authenticate by token (a client
// certificate was verified for the whole connection, and no reload changes it).
func (a *access) stillDecides(tok string) bool {
	if a.mode != AuthToken {
		return true
	}
	return a.tokens.Load().scopesOf(tok)[ScopeDecide]
}
