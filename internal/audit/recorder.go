// Package audit records decisions: one Recorder writes every decision of the service, a
// request's or a watch's event, to the local decision log (a file, stderr or a writer, its
// lines masked and capped) and hands it, masked alike, to OPA's decision-log plugin when one is
// configured. The decision pipeline (internal/pipeline) calls it and owns what a failure means
// ("required": the decision is not used, and every watch is revoked).
package audit

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/pipeline"
)

// DecisionPath is the path of every decision below data, whatever endpoint asked for it.
const DecisionPath = "authz/decision"

// OPALogger hands decisions to OPA's decision-log plugin (*policy.Source is one).
type OPALogger interface {
	// DecisionLogs reports whether OPA's decision_logs are configured.
	DecisionLogs() bool
	LogDecision(ctx context.Context, d api.Decision) error
}

// Options are what a Recorder records to.
type Options struct {
	// Writer, when not nil, receives the decision log instead of Path (the recorder never
	// closes it).
	Writer io.Writer
	// Path is the decision log's file; "-" is stderr, "" no local log.
	Path string
	// Masks are the JSON pointers masked in every line, here and in OPA's.
	Masks []string
	// Required: a decision that could not be recorded must not be used.
	Required bool
	// OPA, when not nil, receives every decision for OPA's decision-log plugin.
	OPA OPALogger
	// Unavailable is called when a required record failed (pipeline.Recorder).
	Unavailable func()
	Logger      hclog.Logger
}

// Recorder records decisions; it implements pipeline.Recorder.
type Recorder struct {
	dlog        *decisionLog
	opa         OPALogger
	opaMasks    [][]string
	required    bool
	unavailable func()
	log         hclog.Logger
}

var _ pipeline.Recorder = (*Recorder)(nil)

// New opens the decision log of o. Errors name the setting at fault (decisionLog.path,
// decisionLog.mask).
func New(o Options) (*Recorder, error) {
	r := &Recorder{opa: o.OPA, required: o.Required, unavailable: o.Unavailable, log: o.Logger}
	if r.log == nil {
		r.log = hclog.NewNullLogger()
	}
	var err error
	switch {
	case o.Writer != nil:
		r.dlog, err = newDecisionLog(o.Writer, nil, o.Masks)
	case o.Path == "-":
		r.dlog, err = newDecisionLog(os.Stderr, nil, o.Masks)
	case o.Path != "":
		if r.dlog, err = newFileDecisionLog(o.Path, o.Masks, r.log); err != nil {
			return nil, fmt.Errorf("decisionLog.path: %w", err)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("decisionLog.mask: %w", err)
	}
	if r.opa != nil {
		for _, m := range o.Masks {
			segs, err := parseMask(m)
			if err != nil {
				return nil, fmt.Errorf("decisionLog.mask: %w", err)
			}
			r.opaMasks = append(r.opaMasks, segs)
		}
	}
	return r, nil
}

// CapLines caps a line of the local log at maxLine bytes (0: no cap), counting the members cut
// in cuts.
func (r *Recorder) CapLines(maxLine int, cuts prometheus.Counter) {
	if r.dlog != nil {
		r.dlog.maxLine, r.dlog.cuts = maxLine, cuts
	}
}

// CheckMask checks one mask of decisionLog.mask.
func CheckMask(m string) error {
	_, err := parseMask(m)
	return err
}

// Record writes rec's line to the local log and hands it to OPA's decision-log plugin. The
// error is the local log's: OPA's is logged and never changes the answer.
func (r *Recorder) Record(ctx context.Context, rec pipeline.Record) error {
	e := entryOf(rec)
	err := r.dlog.write(e)
	r.logToOPA(ctx, rec.RemoteAddr, rec.Start, e)
	return err
}

// Required reports whether a decision that could not be recorded must not be used.
func (r *Recorder) Required() bool { return r.required }

// Unavailable is called when a required record failed.
func (r *Recorder) Unavailable() {
	if r.unavailable != nil {
		r.unavailable()
	}
}

// Reopen opens the log file's path again (log rotation: SIGHUP); a log that is not a file of
// ours is left as it is.
func (r *Recorder) Reopen() error { return r.dlog.reopen() }

// Close closes the log file the recorder opened.
func (r *Recorder) Close() error { return r.dlog.close() }

// entryOf is the decision log's line of rec.
func entryOf(rec pipeline.Record) logEntry {
	e := logEntry{
		DecisionID: rec.DecisionID,
		Time:       rec.Start.UTC().Format(time.RFC3339Nano),
		Path:       rec.Path,
		Operation:  rec.Operation,
		Input:      map[string]any(rec.Input),
		Result:     rec.Result,
		Revision:   rec.Result.Revision,
		LatencyNS:  rec.Latency.Nanoseconds(),
		Error:      rec.EvalCode,
		WatchID:    rec.WatchID,
		Items:      rec.Items,
		lineCap:    rec.LineCap,
	}
	if rec.Input == nil {
		e.Input = nil
	}
	return e
}

// logToOPA hands a decision, masked like the local log, to OPA's decision-log plugin when the
// opa section configures decision_logs. OPA buffers and uploads it in the background; a failure
// is logged and never changes the answer (the local log is the one a decision can require).
func (r *Recorder) logToOPA(ctx context.Context, remoteAddr string, start time.Time, e logEntry) {
	l := r.opa
	if l == nil || !l.DecisionLogs() {
		return
	}
	if len(r.opaMasks) > 0 {
		e = maskEntry(e, r.opaMasks)
	}
	result, err := toJSONValue(e.Result)
	if err == nil {
		// Not cancelled with the request: a caller that hangs up after its answer does not take
		// the decision's log entry (and OPA's masking of it) with it.
		err = l.LogDecision(context.WithoutCancel(ctx), api.Decision{ID: e.DecisionID, Path: DecisionPath,
			Timestamp: start.UTC(), Input: e.Input, Result: result, Revision: e.Revision, RemoteAddr: remoteAddr, Error: string(e.Error)})
	}
	if err != nil {
		r.log.Error("OPA decision log: the decision could not be handed over", "decision_id", e.DecisionID, "error", err)
	}
}

// toJSONValue is v as JSON-shaped Go values (maps, slices, strings, numbers, booleans).
func toJSONValue(v any) (any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, err
	}
	return out, nil
}
