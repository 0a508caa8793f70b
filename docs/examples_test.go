package docs_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/testutil"
)

// The shell blocks of README.md and docs/*.md run as written (TestDocumentedShellBlocks). A
// block that cannot run in a test (a service that runs until stopped, a path of another
// machine, a system package to install, minutes of measurement) has the line
//
//	<!-- not run: REASON -->
//
// right before its fence, and the test reports it with its reason. A block marked
// `<!-- driver-test: NAME -->` is run by TestDocumentedOutOfTreeDriver. Every other ```sh block
// runs, in the order of its file, with bash -euo pipefail, in a working directory of its own
// that holds a copy of the repository's examples/, policies/, policy_test/ and
// internal/specexamples/ (and go.mod and go.sum, for `go tool opa`), so nothing is written to
// the repository. What a block names of the reader's machine is given to it by the test:
//
//   - `authz` is the binary built once for the test (first on PATH), and `go run ./cmd/authz`
//     is that binary too;
//   - 127.0.0.1:8181 and localhost:8181 are a running `authz serve` with its defaults (the
//     example driver, the embedded policy) on a free loopback port, whose decision log is
//     /var/log/authz/decisions.log;
//   - /tmp/ is the block's own directory tmp/, and the unix socket /tmp/authz/authz.sock is a
//     second `authz serve` listening there;
//   - curl fails on an HTTP error status (--fail-with-body), so that an example answered with
//     a 4xx or 5xx fails.
//
// A command whose line ends with a comment `# "KEY": true` (or false) must print "KEY":true:
// the block's output holds each such value, in the order of the block.
//
// A fence indented or written with tildes is not looked at: write shell blocks as ```sh at the
// start of a line.

// docFiles are the Markdown files whose shell blocks run, relative to docs/.
func docFiles(t testing.TB) []string {
	t.Helper()
	files, err := filepath.Glob("*.md")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	return append([]string{"../README.md"}, files...)
}

// shellBlock is a fenced ```sh block of a Markdown file.
type shellBlock struct {
	file string // as named in failures: README.md, docs/service.md
	line int    // of the opening fence
	text string
	// notRun is the reason of a `<!-- not run: REASON -->` marker before the fence.
	notRun string
	// driverTest is the name of a `<!-- driver-test: NAME -->` marker before the fence.
	driverTest string
}

var (
	fenceLine  = regexp.MustCompile("^(```+)\\s*([A-Za-z0-9_+-]*)")
	notRunLine = regexp.MustCompile(`^<!-- not run: (.+?) -->$`)
	driverLine = regexp.MustCompile(`^<!-- driver-test: (\S+) -->$`)
)

// shellBlocks returns the shell blocks of the Markdown file at path, named name. A marker
// that is not right before a fence, and a not-run marker without a reason, are errors.
func shellBlocks(t testing.TB, path, name string) []shellBlock {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := strings.Split(string(b), "\n")
	var blocks []shellBlock
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if strings.HasPrefix(line, "<!-- not run") {
			require.Regexp(t, notRunLine, line, "%s:%d: write the marker as <!-- not run: REASON -->", name, i+1)
			require.True(t, i+1 < len(lines) && fenceLine.MatchString(lines[i+1]), "%s:%d: a not-run marker must be right before a fence", name, i+1)
		}
		m := fenceLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		start := i
		var body []string
		for i++; i < len(lines) && !strings.HasPrefix(lines[i], m[1]); i++ {
			body = append(body, lines[i])
		}
		require.Less(t, i, len(lines), "%s:%d: the fence is never closed", name, start+1)
		switch m[2] {
		case "sh", "bash", "shell", "console":
		default:
			continue
		}
		blk := shellBlock{file: name, line: start + 1, text: strings.Join(body, "\n") + "\n"}
		if start > 0 {
			if r := notRunLine.FindStringSubmatch(lines[start-1]); r != nil {
				blk.notRun = r[1]
			}
			if r := driverLine.FindStringSubmatch(lines[start-1]); r != nil {
				blk.driverTest = r[1]
			}
		}
		blocks = append(blocks, blk)
	}
	return blocks
}

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// authzBinary builds cmd/authz once per test process and returns its path; TestMain removes it.
func authzBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		if binDir, buildErr = os.MkdirTemp("", "authz-docs-bin-"); buildErr != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		if _, buildErr = testutil.Go(ctx, "..", "build", "-o", filepath.Join(binDir, "authz"), "./cmd/authz"); buildErr != nil {
			return
		}
		// The blocks call `go tool opa`: it is built here, before a block's time runs.
		_, buildErr = testutil.Go(ctx, "..", "tool", "-n", "opa")
	})
	require.NoError(t, buildErr)
	return filepath.Join(binDir, "authz")
}

// copyTree copies the directory src (files and directories only) to dst.
func copyTree(t testing.TB, src, dst string) {
	t.Helper()
	require.NoError(t, os.CopyFS(dst, os.DirFS(src)))
}

// blockWorkDir is a fresh working directory with what the blocks read from a checkout.
func blockWorkDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{"examples", "policies", "policy_test", "internal/specexamples"} {
		copyTree(t, filepath.Join("..", d), filepath.Join(dir, d))
	}
	for _, f := range []string{"go.mod", "go.sum"} {
		abs, err := filepath.Abs(filepath.Join("..", f))
		require.NoError(t, err)
		require.NoError(t, os.Symlink(abs, filepath.Join(dir, f)))
	}
	require.NoError(t, os.Mkdir(filepath.Join(dir, "tmp"), 0o700))
	return dir
}

// serveForBlocks starts `authz serve` with its defaults on a free loopback port and on the
// unix socket below dir that stands for /tmp/authz/authz.sock, both writing the decision log
// log, waits until both are ready and makes one decision. It returns the TCP address.
func serveForBlocks(t testing.TB, authz, dir, log string) string {
	t.Helper()
	sockDir := filepath.Join(dir, "tmp", "authz")
	require.NoError(t, os.Mkdir(sockDir, 0o700))
	sock := filepath.Join(sockDir, "authz.sock")
	tcp, addr := startServe(t, authz, "--addr", "127.0.0.1:0", "--decision-log", log)
	unix, _ := startServe(t, authz, "--addr", "unix://"+sock, "--decision-log", log)
	c := &http.Client{Timeout: 5 * time.Second}
	testutil.WaitReady(t, c, "http://"+addr, 60*time.Second, tcp.Stderr)
	uc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}
	testutil.WaitReady(t, uc, "http://authz", 60*time.Second, unix.Stderr)
	t.Cleanup(c.CloseIdleConnections)
	t.Cleanup(uc.CloseIdleConnections)
	// One decision, so that the decision log a block replays is never empty.
	grant, err := os.ReadFile(filepath.Join("..", "examples", "grant.json"))
	require.NoError(t, err)
	status, doc := testutil.PostJSON(t, c, "http://"+addr+"/v1/authorize", string(grant))
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, true, doc["allow"], "examples/grant.json is granted by the default service: %v", doc)
	return addr
}

// blockScript is the script a block runs: the documented text with the reader's machine
// replaced by the test's, after a prelude that makes curl fail on an HTTP error.
func blockScript(text, dir, addr, log string) string {
	// strings.Replacer tries the old strings in order at each position: ./cmd/authz-opa is not
	// ./cmd/authz.
	r := strings.NewReplacer(
		"go run ./cmd/authz-opa", "go run ./cmd/authz-opa",
		"go run ./cmd/authz", "authz",
		"127.0.0.1:8181", addr,
		"localhost:8181", addr,
		"/var/log/authz/decisions.log", log,
		"/tmp/", filepath.Join(dir, "tmp")+"/",
	)
	return "curl() { command curl --fail-with-body \"$@\"; }\n" + r.Replace(text)
}

// documentedValue is a comment at the end of a command line that says what it prints.
var documentedValue = regexp.MustCompile(`(?m)^[^#\n]*[^#\s][^#\n]*#\s+"(\w+)": (true|false)\s*$`)

// printsDocumentedValues checks that out holds the values the block's comments document, in
// their order.
func printsDocumentedValues(text, out string) error {
	rest := out
	for _, m := range documentedValue.FindAllStringSubmatch(text, -1) {
		want := `"` + m[1] + `":` + m[2]
		i := strings.Index(rest, want)
		if i < 0 {
			return fmt.Errorf("the block's comment says %s: %s, but its output has no %s after the values before it:\n%s", m[1], m[2], want, out)
		}
		rest = rest[i+len(want):]
	}
	return nil
}

// runBlock runs script with bash in dir, bounded in time, and returns an error that holds its
// output when it fails.
func runBlock(dir, script string, env []string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = dir
	cmd.Env = env
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String(), fmt.Errorf("%w\nscript:\n%s\nstdout:\n%s\nstderr:\n%s", err, script, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// TestDocumentedShellBlocks runs every shell block of README.md and docs/*.md that is not
// marked as not run, and fails naming the file and line of a block that fails.
func TestDocumentedShellBlocks(t *testing.T) {
	for _, tool := range []string{"bash", "curl", "jq", "openssl", "go"} {
		_, err := exec.LookPath(tool)
		require.NoError(t, err, "the documented blocks need %s on PATH (Debian: apt-get install curl jq openssl)", tool)
	}
	var blocks []shellBlock
	for _, f := range docFiles(t) {
		name := strings.TrimPrefix(filepath.ToSlash(filepath.Join("docs", f)), "docs/../")
		blocks = append(blocks, shellBlocks(t, f, name)...)
	}
	before := checkoutStatus(t)
	authz := authzBinary(t)
	dir := blockWorkDir(t)
	log := filepath.Join(t.TempDir(), "decisions.log")
	addr := serveForBlocks(t, authz, dir, log)
	env := append(testutil.EnvWithoutRace(os.Environ()), "PATH="+filepath.Dir(authz)+string(os.PathListSeparator)+os.Getenv("PATH"), "GOWORK=off")

	var ran, notRun, elsewhere int
	for _, b := range blocks {
		where := fmt.Sprintf("%s:%d", b.file, b.line)
		switch {
		case b.notRun != "":
			notRun++
			t.Run(where+" not run", func(t *testing.T) { t.Logf("not run: %s", b.notRun) })
			continue
		case b.driverTest != "":
			elsewhere++
			t.Run(where+" run by TestDocumentedOutOfTreeDriver", func(t *testing.T) {
				t.Logf("the %q block of the driver guide, run by TestDocumentedOutOfTreeDriver", b.driverTest)
			})
			continue
		}
		ran++
		t.Run(where, func(t *testing.T) {
			start := time.Now()
			out, err := runBlock(dir, blockScript(b.text, dir, addr, log), env)
			if err != nil {
				t.Errorf("%s: the shell block fails: %v", where, err)
				return
			}
			if err := printsDocumentedValues(b.text, out); err != nil {
				t.Errorf("%s: %v", where, err)
			}
			t.Logf("ran in %v", time.Since(start).Round(time.Millisecond))
		})
	}
	t.Logf("%d shell blocks: %d run, %d marked not run, %d run by TestDocumentedOutOfTreeDriver", len(blocks), ran, notRun, elsewhere)
	require.Positive(t, ran)
	require.Equal(t, before, checkoutStatus(t), "the documented blocks must not write into the checkout")
}

// checkoutStatus is git's view of the checkout (`git status --porcelain`), or "" with a log
// line when git cannot tell: the blocks must leave it as they found it.
func checkoutStatus(t testing.TB) string {
	t.Helper()
	cmd := exec.Command("git", "status", "--porcelain", "--untracked-files=all")
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		t.Logf("git status failed (%v): the check for files written to the checkout is not made", err)
		return ""
	}
	return string(out)
}

func TestPrintsDocumentedValues(t *testing.T) {
	block := "curl a   # \"allow\": true\ncurl b  # \"allow\": false\n# \"allow\": true on a comment line is not a command\n# a comment # \"allow\": true\n"
	tests := []struct {
		name, out string
		ok        bool
	}{
		{name: "both, in order", out: `{"allow":true}{"allow":false}`, ok: true},
		{name: "in the other order", out: `{"allow":false}{"allow":true}`},
		{name: "one missing", out: `{"allow":true}`},
		{name: "nothing printed", out: ``},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := printsDocumentedValues(block, tt.out)
			if tt.ok {
				require.NoError(t, err)
			} else {
				require.Error(t, err)
			}
		})
	}
}
