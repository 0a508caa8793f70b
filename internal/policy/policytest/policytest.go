// Package policytest builds policy bundles (signed, tampered, broken) and serves them from a
// loopback bundle server, for the tests of the policy sources. It is never linked into authz.
package policytest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/util"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/testutil"
	"github.com/authz-dev/authz/policies"
)

// KeyPair is an RSA key: its private PEM signs bundles, its public PEM file verifies them.
type KeyPair struct {
	Private string
	Public  string
}

var (
	keysOnce sync.Once
	keyA     KeyPair
	keyB     KeyPair
)

func Keys(tb testing.TB) (a, b KeyPair) {
	tb.Helper()
	keysOnce.Do(func() {
		keyA, keyB = newKeyPair(tb), newKeyPair(tb)
	})
	return keyA, keyB
}

func newKeyPair(tb testing.TB) KeyPair {
	tb.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(tb, err)
	pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	require.NoError(tb, err)
	return KeyPair{
		Private: string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)})),
		Public:  string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})),
	}
}

// Signing says how a test bundle is signed; the zero value leaves it unsigned.
type Signing struct {
	Key   string // private PEM; "" for unsigned
	Alg   string // RS256 when empty
	KeyID string // the JWT's kid; "" for none
	Scope string // the scope claim
	// IssuedAt is the iat claim (seconds since the epoch), as `opa build --claims-file` sets
	// it; none when zero.
	IssuedAt int64
	// Claims are further claims of the claims file ("keyid": the key's name, as the docs'
	// recipe writes it).
	Claims map[string]any
}

// claimsFile writes the claims of sign as `opa build --claims-file` reads them; "" when the
// signature has no claims of its own.
func claimsFile(tb testing.TB, sign Signing) string {
	tb.Helper()
	claims := map[string]any{}
	if sign.Scope != "" {
		claims["scope"] = sign.Scope
	}
	if sign.IssuedAt != 0 {
		claims["iat"] = sign.IssuedAt
	}
	maps.Copy(claims, sign.Claims)
	if len(claims) == 0 {
		return ""
	}
	b, err := json.Marshal(claims)
	require.NoError(tb, err)
	return testutil.WriteFile(tb, tb.TempDir(), "claims.json", string(b))
}

// BundleSpec describes a test bundle.
type BundleSpec struct {
	Revision string
	Roots    []string          // the manifest's roots; none (all of data) when nil
	Modules  map[string]string // path → source; the embedded policy when nil
	Data     map[string]any
	Sign     Signing
	// after signing: Tamper replaces a module's source, Extra adds a module.
	Tamper map[string]string
	Extra  map[string]string
}

// EmbeddedModules is the shipped policy, the modules of a working bundle.
func EmbeddedModules(tb testing.TB) map[string]string {
	tb.Helper()
	mods, err := policies.Modules()
	require.NoError(tb, err)
	out := map[string]string{}
	for p, src := range mods {
		out[strings.TrimPrefix(p, "policies/")] = src
	}
	return out
}

// MakeBundle builds the bundle of spec as OPA's bundle writer (`opa build`) writes it: a
// .tar.gz with data.json, the modules, .manifest and, when signed, .signatures.json.
func MakeBundle(tb testing.TB, spec BundleSpec) []byte {
	tb.Helper()
	var buf bytes.Buffer
	require.NoError(tb, bundle.NewWriter(&buf).Write(*NewBundle(tb, spec)))
	return buf.Bytes()
}

// NewBundle is the bundle of spec, before it is written (see MakeBundle).
func NewBundle(tb testing.TB, spec BundleSpec) *bundle.Bundle {
	tb.Helper()
	mods := spec.Modules
	if mods == nil {
		mods = EmbeddedModules(tb)
	}
	b := bundle.Bundle{Manifest: bundle.Manifest{Revision: spec.Revision}, Data: spec.Data}
	if spec.Roots != nil {
		b.Manifest.Roots = &spec.Roots
	}
	if b.Data == nil {
		b.Data = map[string]any{}
	}
	add := func(path, src string) {
		m, _ := ast.ParseModuleWithOpts(path, src, ast.ParserOptions{RegoVersion: ast.RegoV1})
		b.Modules = append(b.Modules, bundle.ModuleFile{URL: "/" + path, Path: "/" + path, Raw: []byte(src), Parsed: m})
	}
	for p, src := range mods {
		add(p, src)
	}
	if spec.Sign.Key != "" {
		alg := spec.Sign.Alg
		if alg == "" {
			alg = "RS256"
		}
		require.NoError(tb, b.GenerateSignature(bundle.NewSigningConfig(spec.Sign.Key, alg, claimsFile(tb, spec.Sign)), spec.Sign.KeyID, false))
	}
	for p, src := range spec.Tamper {
		for i := range b.Modules {
			if b.Modules[i].Path == "/"+p {
				b.Modules[i].Raw = []byte(src)
			}
		}
	}
	for p, src := range spec.Extra {
		add(p, src)
	}
	return &b
}

// Untar writes the files of a bundle .tar.gz into dir (a bundle directory).
func Untar(tb testing.TB, tgz []byte, dir string) {
	tb.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(tgz))
	require.NoError(tb, err)
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		require.NoError(tb, err)
		b, err := io.ReadAll(tr)
		require.NoError(tb, err)
		testutil.WriteFile(tb, dir, strings.TrimPrefix(h.Name, "/"), string(b))
	}
}

// entrypointOnly is a policy whose decision carries its revision marker in the code, so a
// decision shows which policy made it.
func MarkerModules(marker string) map[string]string {
	caps := make([]string, len(api.CapabilityKeys))
	for i, k := range api.CapabilityKeys {
		caps[i] = strconv.Quote(k) + ": false"
	}
	return map[string]string{"authz/decision.rego": fmt.Sprintf(`package authz

decision := {"allow": false, "code": %q, "message": "marker", "reasons": ["marker"], "capabilities": {%s}}
`, marker, strings.Join(caps, ", "))}
}

// BundleServer is a loopback bundle server: it serves the published bundle with an ETag,
// answers 304 to a matching If-None-Match, and holds a long poll (Prefer: wait=N) until a new
// bundle is published or the wait ends.
type BundleServer struct {
	*httptest.Server
	mu      sync.Mutex
	body    []byte
	etag    string
	changed chan struct{}
	served  int
	waiting int // long polls held now
}

func NewBundleServer(tb testing.TB) *BundleServer {
	tb.Helper()
	s := &BundleServer{changed: make(chan struct{})}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	tb.Cleanup(s.Close)
	return s
}

// Publish makes body the bundle served from now on.
func (s *BundleServer) Publish(body []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.body = body
	s.etag = fmt.Sprintf(`"%d-%d"`, time.Now().UnixNano(), len(body))
	close(s.changed)
	s.changed = make(chan struct{})
}

// Waiting is the number of long polls the server holds now, waiting for a new bundle.
func (s *BundleServer) Waiting() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waiting
}

func (s *BundleServer) serve(w http.ResponseWriter, r *http.Request) {
	wait := 0
	for _, p := range strings.Split(r.Header.Get("Prefer"), ";") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(p), "wait="); ok {
			wait, _ = strconv.Atoi(v)
		}
	}
	s.mu.Lock()
	etag, body, changed := s.etag, s.body, s.changed
	s.mu.Unlock()
	if wait > 0 {
		w.Header().Set("Content-Type", "application/vnd.openpolicyagent.bundles")
	}
	if body != nil && strings.Contains(r.Header.Get("If-None-Match"), etag) && wait > 0 {
		s.mu.Lock()
		s.waiting++
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			s.waiting--
			s.mu.Unlock()
		}()
		select {
		case <-changed:
		case <-time.After(time.Duration(wait) * time.Second):
		case <-r.Context().Done():
			return
		}
		s.mu.Lock()
		etag, body = s.etag, s.body
		s.mu.Unlock()
	}
	if body == nil {
		http.Error(w, "no bundle published", http.StatusNotFound)
		return
	}
	w.Header().Set("ETag", etag)
	if strings.Contains(r.Header.Get("If-None-Match"), etag) {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	s.mu.Lock()
	s.served++
	s.mu.Unlock()
	if wait == 0 {
		w.Header().Set("Content-Type", "application/gzip")
	}
	_, _ = w.Write(body)
}

// WaitFor polls cond until it holds or the time is up.
func WaitFor(tb testing.TB, what string, d time.Duration, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// WriteBundleDir writes the bundle of spec as a bundle directory at dir (replacing it), signed
// as `opa sign --bundle DIR` signs a directory: every file is named by its path including DIR.
// Tamper and Extra are applied after signing.
func WriteBundleDir(tb testing.TB, dir string, spec BundleSpec) {
	tb.Helper()
	sign, tamper, extra := spec.Sign, spec.Tamper, spec.Extra
	spec.Sign, spec.Tamper, spec.Extra = Signing{}, nil, nil
	require.NoError(tb, os.RemoveAll(dir))
	Untar(tb, MakeBundle(tb, spec), dir)
	if sign.Key != "" {
		signDir(tb, dir, sign)
	}
	for p, src := range tamper {
		testutil.WriteFile(tb, dir, p, src)
	}
	for p, src := range extra {
		testutil.WriteFile(tb, dir, p, src)
	}
}

func signDir(tb testing.TB, dir string, sign Signing) {
	tb.Helper()
	h, err := bundle.NewSignatureHasher(bundle.SHA256)
	require.NoError(tb, err)
	dl := bundle.NewDirectoryLoader(dir)
	var files []bundle.FileInfo
	for {
		f, err := dl.NextFile()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(tb, err)
		var buf bytes.Buffer
		_, err = f.Read(&buf, bundle.DefaultSizeLimitBytes)
		f.Close()
		if err != nil && !errors.Is(err, io.EOF) {
			require.NoError(tb, err)
		}
		path := f.URL()
		var v any = buf.Bytes()
		if bundle.IsStructuredDoc(path) {
			var doc any
			require.NoError(tb, util.Unmarshal(buf.Bytes(), &doc))
			v = doc
		}
		sum, err := h.HashFile(v)
		require.NoError(tb, err)
		files = append(files, bundle.NewFile(strings.TrimPrefix(path, "/"), hex.EncodeToString(sum), string(bundle.SHA256)))
	}
	alg := sign.Alg
	if alg == "" {
		alg = "RS256"
	}
	token, err := bundle.GenerateSignedToken(files, bundle.NewSigningConfig(sign.Key, alg, claimsFile(tb, sign)), sign.KeyID)
	require.NoError(tb, err)
	b, err := json.Marshal(map[string]any{"signatures": []string{token}})
	require.NoError(tb, err)
	testutil.WriteFile(tb, dir, ".signatures.json", string(b))
}

// DenyAllModule is a policy (package authz) that allows nothing, with the contract's
// document: the capability deny of openDuplexChannel, reason capability_not_declared, every
// capability false. Tests activate it to take a grant away.
const DenyAllModule = `package authz

decision := {
	"allow": false,
	"code": "DUPLEX_CHANNEL_CAPABILITY_DENIED",
	"message": "Sandbox lease does not grant the duplex command stream capability.",
	"reasons": ["capability_not_declared"],
	"capabilities": {k: false | some k in ["reusableLeases", "nativeSyncIn", "nativeSyncOut", "persistentProcessSessions",
		"independentControlCommands", "incrementalSessionOutput", "concurrentSyncOperations", "duplexCommandStream",
		"runnerWebSocketIngress"]},
}
`
