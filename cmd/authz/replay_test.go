package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
	for _, k := range decision.CapabilityKeys {
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
	b.ResetTimer()
	for range b.N {
		f, err := os.Open(logPath)
		require.NoError(b, err)
		out, err := replayLog(context.Background(), eng, f)
		f.Close()
		require.NoError(b, err)
		require.Len(b, out, records)
	}
	b.ReportMetric(float64(records*b.N)/b.Elapsed().Seconds(), "records/s")
}
