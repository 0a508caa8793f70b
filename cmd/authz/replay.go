package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/policy"
	"github.com/authz-dev/authz/internal/snapshot"
)

const replayUsage = `Usage: authz replay --log FILE [--bundle PATH] [--json] [--show N] [--fail-on WHAT]

Re-decides every decision of a decision log on a policy (the embedded one, or the bundle of
--bundle, verified with --verification-key when given) and says what would change: for a policy
author, which of the real decisions a new policy grants or denies differently, before rollout.

FILE is the service's decision log (decisionLog.path, one JSON line per decision) or OPA's
decision-log events (opa.decision_logs): each line's "input" is the exact input document the
policy decided on, its "result" the answer. "-" reads stdin. Inputs are replayed as logged:
values masked in the log ("[MASKED]", by default the environment's config) are replayed masked,
and the summary counts those records; log with --decision-log-mask= for exact replays.

Each changed decision names the capabilities it gains (+) and loses (-); the summary counts,
per capability, the decisions that gain and lose it, and per endpoint (the record's "path")
the decisions replayed, changed, and gaining or losing a grant. The log is streamed: memory
stays bounded whatever its length (the summary and the first --show changes are kept; --json
writes every change as it is found).

Exit status, for a CI gate (--fail-on): 1 when a decision changes the way --fail-on names,
else 0; 2 for bad flags or a log with no decision in it. --fail-on grant-added (the default): a
deny that becomes a grant, a decision that failed when logged and now grants, or a capability
that becomes true. grant-removed: a grant that becomes a deny (or fails now), or a capability
that becomes false. any-change: any decision that changes at all.

Flags:
`

// maxLogLine bounds one line of the log; a longer line is counted as unreadable, not read.
const maxLogLine = 16 << 20

// replayed is one record's outcome.
type replayed struct {
	line       int
	decisionID string
	endpoint   string // the record's "path": the endpoint that decided
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
	for _, k := range api.CapabilityKeys {
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

// The values of --fail-on.
const (
	failOnGrantAdded   = "grant-added"
	failOnGrantRemoved = "grant-removed"
	failOnAnyChange    = "any-change"
)

func runReplay(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	logPath := fs.String("log", "", "decision log to replay (JSON lines); \"-\" for stdin; required")
	asJSON := fs.Bool("json", false, "print the summary and every changed record as one JSON document (the changes streamed as found)")
	show := fs.Int("show", 50, "changed records to list in the text output (all of them with --json)")
	failOn := fs.String("fail-on", failOnGrantAdded, "what makes the exit status 1, for a CI gate: grant-added, grant-removed or any-change")
	timeout := fs.Duration("timeout", 5*time.Second, "bound on each evaluation")
	var pcfg policy.Config
	policyFlags(fs, &pcfg, false)
	if ok, err := parseFlags(fs, replayUsage, args, stderr, "the log is named with --log"); !ok {
		return err
	}
	if *logPath == "" {
		return usageError("replay: --log FILE is required (the service's decision log, decisionLog.path, or \"-\" for stdin)")
	}
	switch *failOn {
	case failOnGrantAdded, failOnGrantRemoved, failOnAnyChange:
	default:
		return usageError("replay: --fail-on must be grant-added, grant-removed or any-change; got %q", *failOn)
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

	tuneReplayGC()
	sum := newReplaySummary(eng.Revision(), *show)
	var jw *jsonChanges
	if *asJSON {
		bw := bufio.NewWriterSize(stdout, 64<<10)
		defer bw.Flush()
		jw = &jsonChanges{w: bw}
		sum.onChange = jw.write
	}
	start := time.Now()
	lines, err := replayStream(ctx, eng, in, sum.add)
	if err != nil {
		return usageError("replay: reading %s: %v", *logPath, err)
	}
	sum.finish(time.Since(start))
	rep := &sum.rep
	if jw != nil {
		if err := jw.finish(rep); err != nil {
			return err
		}
	} else if err := sum.writeText(stdout); err != nil {
		return err
	}
	if rep.Records == 0 {
		return usageError("replay: %s holds no decision record (%d lines, none with an input and a result)", *logPath, lines)
	}
	switch n := rep.failing(*failOn); {
	case n == 0:
		return nil
	case *failOn == failOnGrantRemoved:
		return &exitError{code: 1, msg: fmt.Sprintf("replay: %d decisions lose a grant on this policy (--fail-on %s)", n, *failOn)}
	case *failOn == failOnAnyChange:
		return &exitError{code: 1, msg: fmt.Sprintf("replay: %d decisions change on this policy (--fail-on %s)", n, *failOn)}
	default:
		return &exitError{code: 1, msg: fmt.Sprintf("replay: %d decisions gain a grant on this policy", n)}
	}
}

// replayBatch is the number of lines a worker re-decides at a time: enough to make the hand-off
// between goroutines cheap, few enough that the lines in flight stay small.
const replayBatch = 128

// replayBatchBytes ends a batch early when its lines are long, so that the lines in flight stay
// a few MiB.
const replayBatchBytes = 1 << 20

// replayGCPercent and replayMemoryLimit tune the garbage collector for a replay (unless GOGC
// or GOMEMLIMIT are set): the live heap is small (the lines in flight and the summary), and
// at Go's default the collector would run every few hundred records, a third of the time. At
// 400 it runs a fifth as often, and the soft limit keeps the process well within 256 MiB.
const (
	replayGCPercent   = 400
	replayMemoryLimit = 192 << 20
)

// tuneReplayGC applies replayGCPercent and replayMemoryLimit, unless the environment sets them.
func tuneReplayGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(replayGCPercent)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(replayMemoryLimit)
	}
}

// replayStream re-decides every line of r on eng, on GOMAXPROCS workers, and hands each
// line's outcome to each in line order, on the calling goroutine, as soon as every line before
// it is done. Blank lines are skipped. At most a few batches per worker are in flight, so
// memory stays bounded whatever the length of r. It returns the number of lines read; an error
// from each stops the replay and is returned.
func replayStream(ctx context.Context, eng *decision.Engine, r io.Reader, each func(*replayed) error) (lines int, err error) {
	type batch struct {
		seq   int
		bytes int
		lines []int
		raws  [][]byte
		out   []replayed
	}
	workers := runtime.GOMAXPROCS(0)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	jobs := make(chan *batch, workers)
	done := make(chan *batch, workers)
	// tokens bounds the batches read and not yet handed to each (in a worker or waiting for
	// an earlier one).
	tokens := make(chan struct{}, 3*workers)

	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for b := range jobs {
				b.out = make([]replayed, 0, len(b.raws))
				for i, raw := range b.raws {
					if raw == nil {
						b.out = append(b.out, replayed{line: b.lines[i], unreadable: fmt.Sprintf("longer than %d bytes", maxLogLine)})
						continue
					}
					b.out = append(b.out, replayLine(ctx, eng, b.lines[i], raw))
				}
				b.raws = nil
				done <- b
			}
		})
	}
	var readErr error
	read := make(chan struct{})
	go func() {
		defer close(read)
		defer close(jobs)
		br := bufio.NewReaderSize(r, 1<<20)
		cur := &batch{}
		send := func() bool {
			select {
			case tokens <- struct{}{}:
			case <-ctx.Done():
				return false
			}
			jobs <- cur
			cur = &batch{seq: cur.seq + 1}
			return true
		}
		for {
			raw, tooLong, err := readLine(br)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				readErr = err
				break
			}
			lines++
			if !tooLong && len(bytes.TrimSpace(raw)) == 0 {
				continue // a blank line is no record
			}
			cur.lines = append(cur.lines, lines)
			cur.raws = append(cur.raws, raw) // nil for a line too long
			cur.bytes += len(raw)
			if (len(cur.raws) == replayBatch || cur.bytes >= replayBatchBytes) && !send() {
				return
			}
		}
		if len(cur.raws) > 0 {
			send()
		}
	}()
	go func() { wg.Wait(); close(done) }()

	// Batches come back in any order; each is handed on once every earlier one has been.
	waiting := map[int]*batch{}
	next := 0
	var eachErr error
	for b := range done {
		waiting[b.seq] = b
		for {
			b, ok := waiting[next]
			if !ok {
				break
			}
			delete(waiting, next)
			next++
			for i := range b.out {
				if eachErr == nil {
					if eachErr = each(&b.out[i]); eachErr != nil {
						cancel()
					}
				}
			}
			<-tokens
		}
	}
	<-read
	if eachErr != nil {
		return lines, eachErr
	}
	return lines, readErr
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
	r.endpoint, _ = rec["path"].(string)
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

// replaySummaryDoc is the summary: the text output's counts and the JSON output's fields
// besides "changed".
type replaySummaryDoc struct {
	Revision      string         `json:"revision"`
	Records       int            `json:"records"`
	Seconds       float64        `json:"seconds"`
	RecordsPerSec float64        `json:"records_per_second"`
	Counts        map[string]int `json:"counts"`
	Masked        int            `json:"masked"`
	// GrantsAdded are the decisions that grant something the logged one did not;
	// GrantsRemoved those that no longer grant something the logged one did; Changes every
	// decision answered differently (the records of "changed" but the unreadable lines).
	GrantsAdded   int `json:"grants_added"`
	GrantsRemoved int `json:"grants_removed"`
	Changes       int `json:"changes"`
	// Capabilities counts, per capability that changed in any decision, the decisions that
	// gain it and those that lose it.
	Capabilities map[string]*capabilityChanges `json:"capabilities"`
	// Endpoints counts, per endpoint (the record's "path"; "-" when it has none), the
	// decisions replayed and how they changed.
	Endpoints map[string]*endpointChanges `json:"endpoints"`
}

// replayReport is the JSON form of replay's output: the summary and every changed record.
type replayReport struct {
	Changed []changedRecord `json:"changed"`
	replaySummaryDoc
}

// capabilityChanges counts the decisions that gain and lose one capability.
type capabilityChanges struct {
	Gained int `json:"gained"`
	Lost   int `json:"lost"`
}

// endpointChanges counts one endpoint's decisions.
type endpointChanges struct {
	Records       int `json:"records"`
	Changed       int `json:"changed"`
	GrantsAdded   int `json:"grants_added"`
	GrantsRemoved int `json:"grants_removed"`
}

// failing is the number of decisions that make the exit status 1 under failOn.
func (s *replaySummaryDoc) failing(failOn string) int {
	switch failOn {
	case failOnGrantRemoved:
		return s.GrantsRemoved
	case failOnAnyChange:
		return s.Changes
	}
	return s.GrantsAdded
}

// changedRecord is one decision the policy answers differently (or could not answer).
type changedRecord struct {
	Line       int            `json:"line"`
	DecisionID string         `json:"decision_id"`
	Endpoint   string         `json:"endpoint,omitempty"`
	Kind       string         `json:"kind"`
	Gained     []string       `json:"gained,omitempty"` // capabilities that became true
	Lost       []string       `json:"lost,omitempty"`   // capabilities that became false
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
	for _, k := range api.CapabilityKeys {
		if d.Capabilities.Get(k) {
			b.Capabilities = append(b.Capabilities, k)
		}
	}
	return b
}

// capabilityDiff names the capabilities r's decision gains and loses. A decision that failed
// when logged granted nothing (its client was answered with the failure's deny); one that
// fails now grants nothing.
func (r *replayed) capabilityDiff() (gained, lost []string) {
	if r.unreadable != "" {
		return nil, nil
	}
	for _, k := range api.CapabilityKeys {
		b := r.failedThen == "" && r.before.Capabilities.Get(k)
		a := r.failedNow == "" && r.after.Capabilities.Get(k)
		switch {
		case a && !b:
			gained = append(gained, k)
		case b && !a:
			lost = append(lost, k)
		}
	}
	return gained, lost
}

// grantRemoved reports whether r's decision no longer grants something the logged one did: a
// grant that becomes a deny or fails now, or a capability that becomes false.
func (r *replayed) grantRemoved(lost []string) bool {
	if r.unreadable != "" || r.failedThen != "" {
		return false
	}
	return len(lost) > 0 || (r.before.Allow && (r.failedNow != "" || !r.after.Allow))
}

// replaySummary adds up the outcomes as they are handed to it, keeping the first show changed
// records for the text output and handing every one to onChange (the JSON output).
type replaySummary struct {
	rep      replaySummaryDoc
	show     int
	changed  []changedRecord
	more     int
	onChange func(*changedRecord) error
}

func newReplaySummary(revision string, show int) *replaySummary {
	return &replaySummary{show: show, rep: replaySummaryDoc{Revision: revision, Counts: map[string]int{},
		Capabilities: map[string]*capabilityChanges{}, Endpoints: map[string]*endpointChanges{}}}
}

func (s *replaySummary) add(r *replayed) error {
	rep := &s.rep
	kind, added := r.kind()
	rep.Counts[kind]++
	if kind == outUnreadable {
		return s.record(r, kind, nil, nil)
	}
	rep.Records++
	if r.masked {
		rep.Masked++
	}
	gained, lost := r.capabilityDiff()
	removed := r.grantRemoved(lost)
	endpoint := r.endpoint
	if endpoint == "" {
		endpoint = "-"
	}
	ep := rep.Endpoints[endpoint]
	if ep == nil {
		ep = &endpointChanges{}
		rep.Endpoints[endpoint] = ep
	}
	ep.Records++
	if added {
		rep.GrantsAdded++
		ep.GrantsAdded++
	}
	if removed {
		rep.GrantsRemoved++
		ep.GrantsRemoved++
	}
	for _, k := range gained {
		s.capability(k).Gained++
	}
	for _, k := range lost {
		s.capability(k).Lost++
	}
	if kind == outUnchanged {
		return nil
	}
	rep.Changes++
	ep.Changed++
	return s.record(r, kind, gained, lost)
}

func (s *replaySummary) capability(k string) *capabilityChanges {
	c := s.rep.Capabilities[k]
	if c == nil {
		c = &capabilityChanges{}
		s.rep.Capabilities[k] = c
	}
	return c
}

// record keeps (the first show) and hands on one changed record.
func (s *replaySummary) record(r *replayed, kind string, gained, lost []string) error {
	if s.onChange == nil && len(s.changed) >= s.show {
		s.more++
		return nil
	}
	c := changedRecord{Line: r.line, DecisionID: r.decisionID, Endpoint: r.endpoint, Kind: kind,
		Gained: gained, Lost: lost, Masked: r.masked, Detail: r.unreadable}
	switch kind {
	case outUnreadable:
	case outFailedThen:
		c.Error = r.failedThen
		c.After = brief(r.after)
	default:
		c.Before, c.After, c.Error = brief(r.before), brief(r.after), r.failedNow
	}
	if s.onChange != nil {
		return s.onChange(&c)
	}
	s.changed = append(s.changed, c)
	return nil
}

func (s *replaySummary) finish(took time.Duration) {
	s.rep.Seconds = took.Seconds()
	if took > 0 {
		s.rep.RecordsPerSec = float64(s.rep.Records) / took.Seconds()
	}
}

// jsonChanges writes replay's JSON document as the replay goes: {"changed": [ each changed
// record, one a line, as it is found ], then the summary's fields}.
type jsonChanges struct {
	w *bufio.Writer
	n int
}

func (j *jsonChanges) write(c *changedRecord) error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	sep := ",\n  "
	if j.n == 0 {
		sep = "{\"changed\": [\n  "
	}
	j.n++
	if _, err := j.w.WriteString(sep); err != nil {
		return err
	}
	_, err = j.w.Write(b)
	return err
}

func (j *jsonChanges) finish(rep *replaySummaryDoc) error {
	if j.n == 0 {
		_, _ = j.w.WriteString("{\"changed\": [")
	} else {
		_, _ = j.w.WriteString("\n")
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	// The summary's object, its opening brace taken by the document's.
	if _, err := j.w.WriteString("],\n  "); err != nil {
		return err
	}
	if _, err := j.w.Write(bytes.TrimSpace(b[1:])); err != nil {
		return err
	}
	if _, err := j.w.WriteString("\n"); err != nil {
		return err
	}
	return j.w.Flush()
}

func (s *replaySummary) writeText(w io.Writer) error {
	rep := &s.rep
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
	fmt.Fprintf(&b, "  %-30s %d\n  %-30s %d\n", "grants added", rep.GrantsAdded, "grants removed", rep.GrantsRemoved)
	if len(rep.Capabilities) > 0 {
		b.WriteString("capabilities (decisions that gain +, lose -):\n")
		for _, k := range api.CapabilityKeys {
			if c := rep.Capabilities[k]; c != nil {
				fmt.Fprintf(&b, "  %-30s +%d -%d\n", k, c.Gained, c.Lost)
			}
		}
	}
	if len(rep.Endpoints) > 0 {
		b.WriteString("endpoints:\n")
		for _, e := range slices.Sorted(maps.Keys(rep.Endpoints)) {
			c := rep.Endpoints[e]
			fmt.Fprintf(&b, "  %-30s %d decisions, %d changed, %d grants added, %d grants removed\n", e, c.Records, c.Changed, c.GrantsAdded, c.GrantsRemoved)
		}
	}
	if len(s.changed) > 0 {
		b.WriteString("changed:\n")
	}
	for _, c := range s.changed {
		fmt.Fprintf(&b, "  line %d %s", c.Line, c.DecisionID)
		if c.Endpoint != "" {
			fmt.Fprintf(&b, " %s", c.Endpoint)
		}
		fmt.Fprintf(&b, ": %s", c.Kind)
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
		for _, k := range c.Gained {
			b.WriteString(" +" + k)
		}
		for _, k := range c.Lost {
			b.WriteString(" -" + k)
		}
		if c.Masked {
			b.WriteString(" [masked input]")
		}
		b.WriteByte('\n')
	}
	if s.more > 0 {
		fmt.Fprintf(&b, "  … %d more (--show N lists more; --json lists all)\n", s.more)
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
