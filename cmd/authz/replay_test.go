package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/decision/decisiontest"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/specexamples"
	"github.com/authz-dev/authz/internal/testutil"
)

// exampleLog decides every contract example with the embedded policy and writes the decisions
// as decision-log lines (decision_id, input, result), each copies times. It returns the log's
// path and how many of the lines are grants.
func exampleLog(t testing.TB, copies int) (path string, grants, records int) {
	t.Helper()
	eng := decisiontest.EmbeddedEngine(t, decision.Options{})
	var b bytes.Buffer
	for range copies {
		for _, ex := range specexamples.Rows() {
			reqJSON, factsJSON := ex.Fixture().JSON()
			req, err := snapshot.ParseRequestBytes(reqJSON)
			require.NoError(t, err)
			facts, err := snapshot.ParseFacts(bytes.NewReader(factsJSON))
			require.NoError(t, err)
			doc, in, err := eng.Decide(context.Background(), req, facts)
			require.NoError(t, err)
			line, err := json.Marshal(map[string]any{"decision_id": doc.DecisionID, "input": in, "result": doc, "revision": doc.Revision})
			require.NoError(t, err)
			b.Write(line)
			b.WriteByte('\n')
			if doc.Allow {
				grants++
			}
			records++
		}
	}
	path = filepath.Join(t.TempDir(), "decisions.jsonl")
	require.NoError(t, os.WriteFile(path, b.Bytes(), 0o600))
	return path, grants, records
}

// constantPolicy is a bundle directory whose decision is doc, whatever the input.
func constantPolicy(t *testing.T, allow bool) string {
	t.Helper()
	caps := map[string]bool{}
	for _, k := range api.CapabilityKeys {
		caps[k] = allow
	}
	doc := map[string]any{"allow": allow, "code": "", "message": "", "reasons": []string{}, "capabilities": caps}
	if !allow {
		doc["code"] = "DUPLEX_CHANNEL_CAPABILITY_DENIED"
		doc["message"] = "Sandbox lease does not grant the duplex command stream capability."
		doc["reasons"] = []string{"capability_not_declared"}
	}
	b, err := json.Marshal(doc)
	require.NoError(t, err)
	dir := t.TempDir()
	testutil.WriteFile(t, dir, "constant.rego", "package authz\n\ndecision := "+string(b)+"\n")
	return dir
}

func replayJSON(t *testing.T, out string) replayReport {
	t.Helper()
	var rep replayReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	return rep
}

func TestReplay(t *testing.T) {
	logPath, grants, records := exampleLog(t, 2)
	denies := records - grants
	require.Positive(t, grants)
	require.Positive(t, denies)

	t.Run("the policy that decided: nothing changes", func(t *testing.T) {
		code, out, errOut := runCLI(t, "", "replay", "--log", logPath, "--json")
		require.Equal(t, 0, code, errOut)
		rep := replayJSON(t, out)
		assert.Equal(t, records, rep.Records)
		assert.Equal(t, records, rep.Counts[outUnchanged])
		assert.Empty(t, rep.Changed)
		assert.Zero(t, rep.GrantsAdded)
	})

	t.Run("a deny-all policy: every grant becomes a deny, exit 0", func(t *testing.T) {
		code, out, errOut := runCLI(t, "", "replay", "--log", logPath, "--bundle", constantPolicy(t, false))
		require.Equal(t, 0, code, errOut)
		assert.Contains(t, out, "grant → deny")
		code, out, _ = runCLI(t, "", "replay", "--log", logPath, "--bundle", constantPolicy(t, false), "--json")
		require.Equal(t, 0, code)
		rep := replayJSON(t, out)
		assert.Equal(t, grants, rep.Counts[outGrantToDeny])
		assert.Zero(t, rep.GrantsAdded)
	})

	t.Run("a grant-all policy: every deny becomes a grant, exit 1 and the records listed", func(t *testing.T) {
		bundle := constantPolicy(t, true)
		code, out, errOut := runCLI(t, "", "replay", "--log", logPath, "--bundle", bundle)
		require.Equal(t, 1, code, errOut)
		assert.Contains(t, errOut, "gain a grant")
		assert.Contains(t, out, "deny → grant")
		assert.Contains(t, out, "line 2 ")
		code, out, _ = runCLI(t, "", "replay", "--log", logPath, "--bundle", bundle, "--json")
		require.Equal(t, 1, code)
		rep := replayJSON(t, out)
		assert.Equal(t, denies, rep.Counts[outDenyToGrant])
		assert.Equal(t, grants, rep.Counts[outCapsGained]+rep.Counts[outUnchanged])
		assert.Equal(t, rep.Counts[outDenyToGrant]+rep.Counts[outCapsGained], rep.GrantsAdded)
		for _, c := range rep.Changed {
			if c.Kind == outDenyToGrant {
				require.NotNil(t, c.Before)
				assert.False(t, c.Before.Allow)
				assert.True(t, c.After.Allow)
				assert.NotEmpty(t, c.DecisionID)
			}
		}
	})
}

func TestReplayOddLines(t *testing.T) {
	logPath, _, records := exampleLog(t, 1)
	good, err := os.ReadFile(logPath)
	require.NoError(t, err)
	denied := strings.Split(string(good), "\n")[1] // the second example denies
	var rec map[string]any
	require.NoError(t, json.Unmarshal([]byte(denied), &rec))
	require.Equal(t, false, rec["result"].(map[string]any)["allow"])
	rec["error"] = "EVAL_TIMEOUT"
	failed, err := json.Marshal(rec)
	require.NoError(t, err)

	odd := string(good) + "\nnot json\n{\"decision_id\":\"x\"}\n" + string(failed) + "\n"
	path := testutil.WriteFile(t, t.TempDir(), "odd.jsonl", odd)
	code, out, errOut := runCLI(t, "", "replay", "--log", path, "--json")
	require.Equal(t, 0, code, errOut)
	rep := replayJSON(t, out)
	assert.Equal(t, records+1, rep.Records, "the failed record counts, the odd lines do not")
	assert.Equal(t, 2, rep.Counts[outUnreadable])
	assert.Equal(t, 1, rep.Counts[outFailedThen])
	assert.Equal(t, records, rep.Counts[outUnchanged])
	assert.Zero(t, rep.GrantsAdded, "the failed record is a deny now too")

	// A decision that failed when logged was answered with a deny: granted now, it is a grant
	// added (exit 1).
	code, out, _ = runCLI(t, "", "replay", "--log", path, "--json", "--bundle", constantPolicy(t, true))
	assert.Equal(t, 1, code)
	rep = replayJSON(t, out)
	assert.Equal(t, 1, rep.Counts[outFailedThen])
	assert.Equal(t, rep.Counts[outDenyToGrant]+rep.Counts[outCapsGained]+1, rep.GrantsAdded)

	onlyOdd := testutil.WriteFile(t, t.TempDir(), "odd.jsonl", "not json\n[]\n")
	code, _, errOut = runCLI(t, "", "replay", "--log", onlyOdd)
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "no decision record")

	code, _, errOut = runCLI(t, "", "replay")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "--log FILE is required")
}

// TestReplayServiceLog replays the log `authz serve` wrote: with its default mask the records
// are counted as masked; with no mask they replay exactly.
func TestReplayServiceLog(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mask   []string
		masked bool
	}{
		{name: "default mask", masked: true},
		{name: "no mask", mask: []string{"--decision-log-mask="}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			facts := testutil.WriteFile(t, dir, "facts.json", specFacts)
			logPath := filepath.Join(dir, "decisions.log")
			args := append([]string{"--facts", facts, "--addr", "127.0.0.1:0", "--decision-log", logPath}, tc.mask...)
			stderr, stop := startServe(t, args...)
			base := "http://" + waitListening(t, stderr)
			c := &http.Client{Timeout: 10 * time.Second}
			for range 3 {
				status, doc := testutil.PostJSON(t, c, base+"/v1/authorize", specRequest)
				require.Equal(t, http.StatusOK, status)
				require.Equal(t, true, doc["allow"])
			}
			c.CloseIdleConnections()
			require.NoError(t, stop())

			code, out, errOut := runCLI(t, "", "replay", "--log", logPath, "--json")
			require.Equal(t, 0, code, errOut)
			rep := replayJSON(t, out)
			assert.Equal(t, 3, rep.Records)
			assert.Equal(t, 3, rep.Counts[outUnchanged], out)
			if tc.masked {
				assert.Equal(t, 3, rep.Masked)
			} else {
				assert.Zero(t, rep.Masked)
			}
		})
	}
}

// BenchmarkReplay replays a log of the contract examples on the embedded policy and reports
// records per second of wall time, and the process's CPU time per record (on a busy machine the
// wall figure is the machine's, the CPU figure the replay's own).
func BenchmarkReplay(b *testing.B) {
	logPath, _, records := exampleLog(b, 1000)
	cpu := func() time.Duration {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	b.ResetTimer()
	before := cpu()
	for range b.N {
		code, err := replayForBench(logPath)
		if err != nil || code != 0 {
			b.Fatal(code, err)
		}
	}
	n := float64(records * b.N)
	b.ReportMetric(n/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(float64(cpu()-before)/n, "cpu-ns/record")
}

func replayForBench(path string) (int, error) {
	err := run(context.Background(), []string{"replay", "--log", path}, strings.NewReader(""), &bytes.Buffer{}, &bytes.Buffer{})
	if err != nil {
		return 1, err
	}
	return 0, nil
}

// BenchmarkReplayUncached replays the same log on an engine without the decision cache: every
// record is evaluated, as in a log whose decisions all differ in what the policy reads.
func BenchmarkReplayUncached(b *testing.B) {
	logPath, _, records := exampleLog(b, 200)
	eng := decisiontest.EmbeddedEngine(b, decision.Options{Cache: decision.CacheOptions{Disabled: true}})
	// The garbage collector tuned as `authz replay` tunes it (BenchmarkReplay runs the command).
	gcPercent, memoryLimit := debug.SetGCPercent(-1), debug.SetMemoryLimit(-1)
	debug.SetGCPercent(gcPercent)
	tuneReplayGC()
	b.Cleanup(func() {
		debug.SetGCPercent(gcPercent)
		debug.SetMemoryLimit(memoryLimit)
	})
	b.ReportAllocs()
	runtime.GC() // the set-up's garbage is not the replay's CPU time
	b.ResetTimer()
	before := processCPU()
	for range b.N {
		f, err := os.Open(logPath)
		require.NoError(b, err)
		n := 0
		_, err = replayStream(context.Background(), eng, f, func(*replayed) error { n++; return nil })
		f.Close()
		require.NoError(b, err)
		require.Equal(b, records, n)
	}
	n := float64(records * b.N)
	b.ReportMetric(n/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(float64(processCPU()-before)/n, "cpu-ns/record")
}

// processCPU is the CPU time (user and system) the process has used so far: on a shared machine
// the CPU time per record says more than the records per second.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// withPath is the log at path with every record's "path" set to endpoint.
func withPath(t *testing.T, path, endpoint string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var out bytes.Buffer
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec))
		rec["path"] = endpoint
		l, err := json.Marshal(rec)
		require.NoError(t, err)
		out.Write(l)
		out.WriteByte('\n')
	}
	return testutil.WriteFile(t, t.TempDir(), "with-path.jsonl", out.String())
}

// TestReplayNamesCapabilitiesAndEndpoints: each changed decision names the capabilities it
// loses or gains, and the summary counts them per capability and per endpoint, so that a
// deny → deny line that lost a capability says which.
func TestReplayNamesCapabilitiesAndEndpoints(t *testing.T) {
	t.Parallel()
	logPath, grants, records := exampleLog(t, 1)
	logPath = withPath(t, logPath, "/v1/authorize")
	denyAll := constantPolicy(t, false)

	code, out, errOut := runCLI(t, "", "replay", "--log", logPath, "--bundle", denyAll, "--json")
	require.Equal(t, 0, code, errOut)
	rep := replayJSON(t, out)
	require.Equal(t, grants, rep.Counts[outGrantToDeny])
	removed := grants + rep.Counts[outCapsLost] // a grant that becomes a deny, a deny that loses a capability
	assert.Equal(t, removed, rep.GrantsRemoved)
	ep := rep.Endpoints["/v1/authorize"]
	require.NotNil(t, ep, out)
	assert.Equal(t, records, ep.Records)
	assert.Equal(t, rep.Changes, ep.Changed)
	assert.Equal(t, removed, ep.GrantsRemoved)
	// Every grant of the log had duplexCommandStream: the deny-all policy takes it from each.
	require.NotNil(t, rep.Capabilities["duplexCommandStream"], out)
	assert.Equal(t, capabilityChanges{Lost: grants}, *rep.Capabilities["duplexCommandStream"])
	lost := 0
	for _, c := range rep.Changed {
		assert.Empty(t, c.Gained)
		assert.Equal(t, "/v1/authorize", c.Endpoint)
		if c.Kind == outGrantToDeny {
			assert.Equal(t, c.Before.Capabilities, c.Lost, "the record names every capability it lost")
		}
		lost += len(c.Lost)
	}
	sum := 0
	for _, c := range rep.Capabilities {
		sum += c.Lost
	}
	assert.Equal(t, lost, sum, "the per-capability summary adds up the records")

	code, out, _ = runCLI(t, "", "replay", "--log", logPath, "--bundle", denyAll)
	require.Equal(t, 0, code)
	assert.Regexp(t, `(?m)^  duplexCommandStream +\+0 -`+strconv.Itoa(grants)+`$`, out)
	assert.Regexp(t, `(?m)^  /v1/authorize +`+strconv.Itoa(records)+` decisions, \d+ changed, 0 grants added, `+strconv.Itoa(removed)+` grants removed$`, out)
	assert.Regexp(t, `(?m)^  line \d+ \S+ /v1/authorize: grant → deny: .* -duplexCommandStream`, out)
}

// TestReplayFailOn: --fail-on chooses what fails a CI gate: a policy that turns every grant
// into a deny passes the default (grant-added) and fails grant-removed and any-change; the
// policy that decided passes all three.
func TestReplayFailOn(t *testing.T) {
	t.Parallel()
	logPath, _, _ := exampleLog(t, 1)
	denyAll := constantPolicy(t, false)
	code, out, _ := runCLI(t, "", "replay", "--log", logPath, "--bundle", denyAll, "--json")
	require.Equal(t, 0, code)
	removed := replayJSON(t, out).GrantsRemoved
	require.Positive(t, removed)
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{name: "default: grant-added", args: []string{"--bundle", denyAll}, code: 0},
		{name: "grant-added", args: []string{"--bundle", denyAll, "--fail-on", "grant-added"}, code: 0},
		{name: "grant-removed", args: []string{"--bundle", denyAll, "--fail-on", "grant-removed"}, code: 1,
			stderr: strconv.Itoa(removed) + " decisions lose a grant"},
		{name: "any-change", args: []string{"--bundle", denyAll, "--fail-on", "any-change"}, code: 1, stderr: "decisions change"},
		{name: "same policy, any-change", args: []string{"--fail-on", "any-change"}, code: 0},
		{name: "same policy, grant-removed", args: []string{"--fail-on", "grant-removed"}, code: 0},
		{name: "unknown value", args: []string{"--fail-on", "grants"}, code: 2, stderr: "--fail-on must be"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := runCLI(t, "", append([]string{"replay", "--log", logPath}, tc.args...)...)
			assert.Equal(t, tc.code, code, errOut)
			assert.Contains(t, errOut, tc.stderr)
		})
	}
}

// endlessLog is a reader of n decision-log lines, made as they are read, that counts them.
type endlessLog struct {
	line []byte
	n    int
	read atomic.Int64
	cur  []byte
}

func (l *endlessLog) Read(p []byte) (int, error) {
	if len(l.cur) == 0 {
		if int(l.read.Load()) == l.n {
			return 0, io.EOF
		}
		l.read.Add(1)
		l.cur = l.line
	}
	k := copy(p, l.cur)
	l.cur = l.cur[k:]
	return k, nil
}

// TestReplayStreams: replay hands on each line's outcome while it reads the log, in line order,
// and never reads far ahead of what it has handed on: the lines in memory are bounded whatever
// the log's length (a log is not held until its end).
func TestReplayStreams(t *testing.T) {
	t.Parallel()
	logPath, _, _ := exampleLog(t, 1)
	b, err := os.ReadFile(logPath)
	require.NoError(t, err)
	first, _, _ := bytes.Cut(b, []byte("\n"))
	const n = 20000
	src := &endlessLog{line: append(first, '\n'), n: n}
	eng := decisiontest.EmbeddedEngine(t, decision.Options{})
	var handed, ahead int64
	lines, err := replayStream(t.Context(), eng, src, func(r *replayed) error {
		handed++
		require.Equal(t, int(handed), r.line, "in line order")
		ahead = max(ahead, src.read.Load()-handed)
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, n, lines)
	assert.Equal(t, int64(n), handed)
	bound := int64((3*runtime.GOMAXPROCS(0) + 2) * replayBatch)
	assert.LessOrEqual(t, ahead, bound, "lines read and not yet handed on")
}
