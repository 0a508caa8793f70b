package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/policy"
	"github.com/authz-dev/authz/internal/snapshot"
)

const replayUsage = `Usage: authz replay --log FILE [--bundle PATH] [--json] [--show N]

Re-decides every decision of a decision log on a policy (the embedded one, or the bundle of
--bundle, verified with --verification-key when given) and says what would change: for a policy
author, which of the real decisions a new policy grants or denies differently, before rollout.

FILE is the service's decision log (decisionLog.path, one JSON line per decision) or OPA's
decision-log events (opa.decision_logs): each line's "input" is the exact input document the
policy decided on, its "result" the answer. "-" reads stdin. Inputs are replayed as logged:
values masked in the log ("[MASKED]", by default the environment's config) are replayed masked,
and the summary counts those records; log with --decision-log-mask= for exact replays.

Exit status: 0 when no decision gains a grant, 1 when at least one does (a deny that becomes a
grant, a decision that failed when logged and now grants, or a capability that becomes true), 2
for bad flags or a log with no decision in it.

Flags:
`

// maxLogLine bounds one line of the log; a longer line is counted as unreadable, not read.
const maxLogLine = 16 << 20

// replayed is one record's outcome.
type replayed struct {
	line       int
	decisionID string
	before     decision.Document
	after      decision.Document
	failedThen string // the logged evaluation failure's code; "" when it was decided
	failedNow  string // this replay's evaluation failure's code
	masked     bool
	unreadable string // why the line is not a decision record; "" when it is
}

// Outcome kinds, in the order the summary lists them.
const (
	outUnchanged        = "unchanged"
	outDenyToGrant      = "deny → grant"
	outGrantToDeny      = "grant → deny"
	outCapsGained       = "capabilities gained"
	outCapsLost         = "capabilities lost"
	outDenyChanged      = "deny code or reasons changed"
	outFailedNow        = "evaluation fails now"
	outFailedThen       = "failed when logged"
	outUnreadable       = "not a decision record"
	outReplayedMaskedAs = "masked inputs"
)

// kind classifies r; grantAdded is true when the new policy grants something the logged
// decision did not.
func (r *replayed) kind() (kind string, grantAdded bool) {
	switch {
	case r.unreadable != "":
		return outUnreadable, false
	case r.failedThen != "":
		// The client was answered with the failure's deny: a grant now is a grant added.
		return outFailedThen, r.failedNow == "" && r.after.Allow
	case r.failedNow != "":
		return outFailedNow, false
	case !r.before.Allow && r.after.Allow:
		return outDenyToGrant, true
	case r.before.Allow && !r.after.Allow:
		return outGrantToDeny, false
	}
	gained, lost := false, false
	for _, k := range decision.CapabilityKeys {
		b, a := r.before.Capabilities.Get(k), r.after.Capabilities.Get(k)
		gained = gained || (a && !b)
		lost = lost || (b && !a)
	}
	switch {
	case gained:
		return outCapsGained, true
	case lost:
		return outCapsLost, false
	case r.before.Code != r.after.Code || !slices.Equal(r.before.Reasons, r.after.Reasons):
		return outDenyChanged, false
	}
	return outUnchanged, false
}

func runReplay(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	logPath := fs.String("log", "", "decision log to replay (JSON lines); \"-\" for stdin; required")
	asJSON := fs.Bool("json", false, "print the summary and the changed records as one JSON document")
	show := fs.Int("show", 50, "changed records to list in the text output (all of them with --json)")
	timeout := fs.Duration("timeout", 5*time.Second, "bound on each evaluation")
	var pcfg policy.Config
	policyFlags(fs, &pcfg, false)
	if ok, err := parseFlags(fs, replayUsage, args, stderr, "the log is named with --log"); !ok {
		return err
	}
	if *logPath == "" {
		return usageError("replay: --log FILE is required (the service's decision log, decisionLog.path, or \"-\" for stdin)")
	}
	in := stdin
	if *logPath != "-" {
		f, err := os.Open(*logPath)
		if err != nil {
			return usageError("replay: %v", err)
		}
		defer f.Close()
		in = f
	}
	eng, src, err := policy.Start(ctx, pcfg, decision.Options{EvalTimeout: *timeout}, policy.Options{})
	if err != nil {
		return usageError("replay: %v", err)
	}
	defer src.Close(ctx)

	start := time.Now()
	results, err := replayLog(ctx, eng, in)
	if err != nil {
		return usageError("replay: reading %s: %v", *logPath, err)
	}
	took := time.Since(start)
	rep := summarize(results, eng.Revision(), took)
	if rep.Records == 0 {
		return usageError("replay: %s holds no decision record (%d lines, none with an input and a result)", *logPath, len(results))
	}
	if *asJSON {
		if err := writeJSON(stdout, rep); err != nil {
			return err
		}
	} else if err := rep.writeText(stdout, *show); err != nil {
		return err
	}
	if rep.GrantsAdded > 0 {
		return &exitError{code: 1, msg: fmt.Sprintf("replay: %d decisions gain a grant on this policy", rep.GrantsAdded)}
	}
	return nil
}

// replayLog re-decides every line of r on eng, GOMAXPROCS lines at a time, and returns one
// outcome per line in line order.
func replayLog(ctx context.Context, eng *decision.Engine, r io.Reader) ([]replayed, error) {
	type job struct {
		line int
		raw  []byte
	}
	jobs := make(chan job, 256)
	var (
		mu  sync.Mutex
		out []replayed
	)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			var local []replayed
			for j := range jobs {
				local = append(local, replayLine(ctx, eng, j.line, j.raw))
			}
			mu.Lock()
			out = append(out, local...)
			mu.Unlock()
		})
	}
	br := bufio.NewReaderSize(r, 1<<20)
	var readErr error
	for line := 1; ; line++ {
		raw, tooLong, err := readLine(br)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			readErr = err
			break
		}
		if tooLong {
			mu.Lock()
			out = append(out, replayed{line: line, unreadable: fmt.Sprintf("longer than %d bytes", maxLogLine)})
			mu.Unlock()
			continue
		}
		if len(bytes.TrimSpace(raw)) == 0 {
			continue // a blank line is no record
		}
		jobs <- job{line, raw}
	}
	close(jobs)
	wg.Wait()
	slices.SortFunc(out, func(a, b replayed) int { return a.line - b.line })
	return out, readErr
}

// readLine returns the next line without its newline, or tooLong (and the rest of the line
// discarded) when it is longer than maxLogLine.
func readLine(br *bufio.Reader) (line []byte, tooLong bool, err error) {
	for {
		chunk, isPrefix, err := br.ReadLine()
		if err != nil {
			return nil, false, err
		}
		if !tooLong {
			if len(line)+len(chunk) > maxLogLine {
				tooLong, line = true, nil
			} else {
				line = append(line, chunk...)
			}
		}
		if !isPrefix {
			return line, tooLong, nil
		}
	}
}

// replayLine decides one logged input again.
func replayLine(ctx context.Context, eng *decision.Engine, line int, raw []byte) replayed {
	r := replayed{line: line}
	v, err := snapshot.DecodeJSON(raw)
	rec, isObject := v.(map[string]any)
	if err != nil || !isObject {
		r.unreadable = "not a JSON object"
		return r
	}
	r.decisionID, _ = rec["decision_id"].(string)
	input, hasInput := rec["input"].(map[string]any)
	result, hasResult := rec["result"]
	if !hasInput || !hasResult {
		r.unreadable = "no input or no result"
		return r
	}
	if r.before, err = decision.ReadDocument(result); err != nil {
		r.unreadable = "the result is not a decision document: " + err.Error()
		return r
	}
	r.masked = bytes.Contains(raw, []byte(`"[MASKED]"`))
	r.failedThen, _ = rec["error"].(string)
	doc, err := eng.Evaluate(ctx, snapshot.Input(input))
	r.after = doc
	if err != nil {
		r.failedNow = string(coded.CodeOf(err))
	}
	return r
}

// replayReport is the summary, and the JSON form of replay's output.
type replayReport struct {
	Revision      string          `json:"revision"`
	Records       int             `json:"records"`
	Seconds       float64         `json:"seconds"`
	RecordsPerSec float64         `json:"records_per_second"`
	Counts        map[string]int  `json:"counts"`
	Masked        int             `json:"masked"`
	GrantsAdded   int             `json:"grants_added"`
	Changed       []changedRecord `json:"changed"`
}

// changedRecord is one decision the policy answers differently (or could not answer).
type changedRecord struct {
	Line       int            `json:"line"`
	DecisionID string         `json:"decision_id"`
	Kind       string         `json:"kind"`
	Before     *decisionBrief `json:"before,omitempty"`
	After      *decisionBrief `json:"after,omitempty"`
	Error      string         `json:"error,omitempty"`
	Masked     bool           `json:"masked,omitempty"`
	Detail     string         `json:"detail,omitempty"`
}

// decisionBrief is what a decision is compared on.
type decisionBrief struct {
	Allow        bool     `json:"allow"`
	Code         string   `json:"code"`
	Reasons      []string `json:"reasons"`
	Capabilities []string `json:"capabilities"` // the true ones
}

func brief(d decision.Document) *decisionBrief {
	b := &decisionBrief{Allow: d.Allow, Code: d.Code, Reasons: d.Reasons, Capabilities: []string{}}
	for _, k := range decision.CapabilityKeys {
		if d.Capabilities.Get(k) {
			b.Capabilities = append(b.Capabilities, k)
		}
	}
	return b
}

func summarize(results []replayed, revision string, took time.Duration) replayReport {
	rep := replayReport{Revision: revision, Counts: map[string]int{}, Changed: []changedRecord{}, Seconds: took.Seconds()}
	for i := range results {
		r := &results[i]
		kind, added := r.kind()
		rep.Counts[kind]++
		if kind != outUnreadable {
			rep.Records++
		}
		if r.masked {
			rep.Masked++
		}
		if added {
			rep.GrantsAdded++
		}
		if kind == outUnchanged {
			continue
		}
		c := changedRecord{Line: r.line, DecisionID: r.decisionID, Kind: kind, Masked: r.masked, Detail: r.unreadable}
		switch kind {
		case outUnreadable:
		case outFailedThen:
			c.Error = r.failedThen
			c.After = brief(r.after)
		default:
			c.Before, c.After, c.Error = brief(r.before), brief(r.after), r.failedNow
		}
		rep.Changed = append(rep.Changed, c)
	}
	if took > 0 {
		rep.RecordsPerSec = float64(rep.Records) / took.Seconds()
	}
	return rep
}

func (rep replayReport) writeText(w io.Writer, show int) error {
	var b strings.Builder
	fmt.Fprintf(&b, "replayed %d decisions on policy %s in %.2f s (%.0f decisions/s)\n", rep.Records, rep.Revision, rep.Seconds, rep.RecordsPerSec)
	for _, k := range []string{outUnchanged, outDenyToGrant, outCapsGained, outGrantToDeny, outCapsLost, outDenyChanged, outFailedNow, outFailedThen, outUnreadable} {
		if n := rep.Counts[k]; n > 0 || k == outUnchanged || k == outDenyToGrant || k == outGrantToDeny {
			fmt.Fprintf(&b, "  %-30s %d\n", k, n)
		}
	}
	if rep.Masked > 0 {
		fmt.Fprintf(&b, "  %-30s %d (replayed with their masked values; log with --decision-log-mask= for exact replays)\n", outReplayedMaskedAs, rep.Masked)
	}
	if len(rep.Changed) > 0 {
		b.WriteString("changed:\n")
	}
	for i, c := range rep.Changed {
		if i == show {
			fmt.Fprintf(&b, "  … %d more (--show N lists more; --json lists all)\n", len(rep.Changed)-show)
			break
		}
		fmt.Fprintf(&b, "  line %d %s: %s", c.Line, c.DecisionID, c.Kind)
		switch {
		case c.Detail != "":
			fmt.Fprintf(&b, " (%s)", c.Detail)
		case c.Kind == outFailedThen:
			fmt.Fprintf(&b, " (%s); now %s", c.Error, describe(c.After))
		case c.Error != "":
			fmt.Fprintf(&b, " (%s); was %s", c.Error, describe(c.Before))
		default:
			fmt.Fprintf(&b, ": %s → %s", describe(c.Before), describe(c.After))
		}
		if c.Masked {
			b.WriteString(" [masked input]")
		}
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// describe is a decision in a few words: "grant [duplexCommandStream nativeSyncIn]" or
// "deny CODE (reason, reason)".
func describe(d *decisionBrief) string {
	if d == nil {
		return "?"
	}
	if d.Allow {
		return "grant [" + strings.Join(d.Capabilities, " ") + "]"
	}
	return fmt.Sprintf("deny %s (%s)", d.Code, strings.Join(d.Reasons, ", "))
}
