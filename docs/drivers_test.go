// Package docs_test checks that what docs/ tells a reader to do works: it runs the documented
// steps. It has its own package (and so its own test time budget), because it builds binaries.
package docs_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.yaml.in/yaml/v3"

	"github.com/authz-dev/authz/internal/pluginhost"
	"github.com/authz-dev/authz/internal/testutil"
)

// TestMain removes the authz binary the tests built and fails the package when a test leaves
// a goroutine behind.
func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// docBlocks returns the fenced code blocks of a Markdown file that follow a marker line
// `<!-- driver-test: NAME -->`, by NAME.
func docBlocks(t testing.TB, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	re := regexp.MustCompile("(?s)<!-- driver-test: (\\S+) -->\n```[a-z]*\n(.*?)\n```")
	blocks := map[string]string{}
	for _, m := range re.FindAllStringSubmatch(string(b), -1) {
		require.NotContains(t, blocks, m[1], "two blocks named %s", m[1])
		blocks[m[1]] = m[2] + "\n"
	}
	return blocks
}

// sh runs a documented shell block in dir and returns its stdout.
func sh(t testing.TB, dir, script string, env []string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-e", "-x", "-c", script)
	cmd.Dir = dir
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "in %s:\n%s\nstdout:\n%s\nstderr:\n%s", dir, script, stdout.String(), stderr.String())
	return stdout.String()
}

// TestDocumentedOutOfTreeDriver follows docs/drivers.md "Your first driver" to the letter: a
// module of its own beside a checkout of authz, the documented go.mod commands, main.go, build
// and digest, the plugins: entry with the path and digest of that build, and the documented
// request, which must be granted by `authz serve` running the driver as a pinned plugin.
func TestDocumentedOutOfTreeDriver(t *testing.T) {
	_, err := exec.LookPath("go")
	require.NoError(t, err, "the go command must be on PATH")
	blocks := docBlocks(t, "drivers.md")
	for _, name := range []string{"setup", "main.go", "build", "authz.yaml", "request.json"} {
		require.Contains(t, blocks, name, "docs/drivers.md lost its %q block", name)
	}
	root, err := filepath.Abs("..")
	require.NoError(t, err)

	// The documented layout: work/authz (the checkout) and work/daytona-driver (the driver).
	work := t.TempDir()
	require.NoError(t, os.Symlink(root, filepath.Join(work, "authz")))
	mod := filepath.Join(work, "daytona-driver")
	require.NoError(t, os.Mkdir(mod, 0o755))
	// GOFLAGS=-mod=mod lets the go command complete go.mod from the module cache; GOWORK=off
	// keeps any workspace of the machine out of it.
	env := append(testutil.EnvWithoutRace(os.Environ()), "GOWORK=off", "GOFLAGS=-mod=mod")

	sh(t, mod, blocks["setup"], env)
	require.NoError(t, os.WriteFile(filepath.Join(mod, "main.go"), []byte(blocks["main.go"]), 0o644))
	out := sh(t, mod, blocks["build"], env)

	bin := filepath.Join(mod, "daytona-driver")
	m := regexp.MustCompile(`(?m)^([0-9a-f]{64})\s+daytona-driver$`).FindStringSubmatch(out)
	require.NotNil(t, m, "the build block prints the digest; got:\n%s", out)
	digest, err := pluginhost.FileSHA256(bin)
	require.NoError(t, err)
	require.Equal(t, digest, m[1])

	// The documented plugins: entry, with the path and digest of this build.
	var cfg map[string][]map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(blocks["authz.yaml"]), &cfg))
	require.Len(t, cfg["plugins"], 1)
	entry := cfg["plugins"][0]
	assert.Equal(t, "acme.daytona", entry["id"])
	assert.Regexp(t, `^[0-9a-f]{64}$`, entry["sha256"], "the documented pin has the form of a digest")
	entry["path"], entry["sha256"] = bin, m[1]
	y, err := yaml.Marshal(cfg)
	require.NoError(t, err)
	cfgPath := filepath.Join(work, "authz.yaml")
	require.NoError(t, os.WriteFile(cfgPath, y, 0o600))

	authz := authzBinary(t) // work/authz is the checkout
	srv, addr := startServe(t, authz, "--config", cfgPath, "--addr", "127.0.0.1:0")
	base := "http://" + addr
	c := &http.Client{Timeout: 10 * time.Second}
	testutil.WaitReady(t, c, base, 60*time.Second, srv.Stderr)

	status, doc := testutil.PostJSON(t, c, base+"/v1/authorize", blocks["request.json"])
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, true, doc["allow"], "the documented request is granted: %v", doc)
	caps := doc["capabilities"].(map[string]any)
	assert.Equal(t, true, caps["duplexCommandStream"])
	assert.Equal(t, true, caps["persistentProcessSessions"], "environmentExecute, no declaration needed")

	// As documented: without apiUrl, CheckConfig refuses the config and the stream is narrowed away.
	noURL := strings.Replace(blocks["request.json"], `, "apiUrl": "https://daytona.example"`, "", 1)
	require.NotEqual(t, blocks["request.json"], noURL)
	status, doc = testutil.PostJSON(t, c, base+"/v1/authorize", noURL)
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, false, doc["allow"])
	assert.Contains(t, doc["reasons"], "capability_narrowed")

	c.CloseIdleConnections()
	srv.Signal(t, syscall.SIGINT)
	require.NoError(t, srv.WaitExit(t, 30*time.Second), "log:\n%s", srv.Stderr)
}

// listening finds the address in the JSON line the service logs when it listens.
var listening = regexp.MustCompile(`"@message":"listening"[^\n]*"addr":"([^"]+)"`)

// startServe runs `authz serve --log-json args...` as a process and returns it and the address
// it logs that it listens on.
func startServe(t testing.TB, authz string, args ...string) (*testutil.Process, string) {
	t.Helper()
	p := testutil.StartProcess(t, "", authz, append([]string{"serve", "--log-json"}, args...)...)
	return p, testutil.WaitLogged(t, p.Stderr, listening, 60*time.Second)
}
