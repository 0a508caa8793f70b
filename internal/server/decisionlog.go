package server

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"

	"github.com/authz-dev/authz/internal/decision"
)

// MaskedValue replaces every masked value in the decision log.
const MaskedValue = "[MASKED]"

// logEntry is one line of the decision log.
type logEntry struct {
	DecisionID string            `json:"decision_id"`
	Time       string            `json:"time"`
	Path       string            `json:"path"`
	Operation  string            `json:"operation"`
	Input      any               `json:"input"`
	Result     decision.Document `json:"result"`
	Revision   string            `json:"revision"`
	LatencyNS  int64             `json:"latency_ns"`
	// Error is the evaluation failure's code (EVAL_TIMEOUT, ...) when the decision failed.
	Error string `json:"error,omitempty"`
}

// decisionLog writes one JSON line per decision. Lines are marshalled outside the lock and
// written with one Write each under it, so they never interleave.
type decisionLog struct {
	mu     sync.Mutex
	w      io.Writer
	closer io.Closer // nil when the writer is not ours to close
	masks  [][]string
}

func newDecisionLog(w io.Writer, closer io.Closer, masks []string) (*decisionLog, error) {
	l := &decisionLog{w: w, closer: closer}
	for _, m := range masks {
		segs, err := parseMask(m)
		if err != nil {
			return nil, err
		}
		l.masks = append(l.masks, segs)
	}
	return l, nil
}

// write masks the entry's input and appends its line. A nil log writes nothing.
func (l *decisionLog) write(e logEntry) error {
	if l == nil {
		return nil
	}
	if len(l.masks) > 0 {
		e = maskEntry(e, l.masks)
	}
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("encode decision log line: %w", err)
	}
	b = append(b, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	n, err := l.w.Write(b)
	if err == nil && n != len(b) {
		err = io.ErrShortWrite
	}
	if err != nil {
		return fmt.Errorf("write decision log: %w", err)
	}
	return nil
}

func (l *decisionLog) close() error {
	if l == nil || l.closer == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closer.Close()
}

// maskEntry masks the values at the masks' pointers, then every other copy of them in the
// line: the input document repeats request values (input.resolved.providerKey is the provider
// of input.environment.config, input.resolved.driver the lease's driver, ...) and the result's
// message quotes the driver. A masked string is replaced wherever it appears as a whole value
// in the input, and wherever it appears in the result's message. Only non-empty strings are
// followed to their copies: numbers and booleans are masked at their pointers only.
func maskEntry(e logEntry, masks [][]string) logEntry {
	secrets := map[string]struct{}{}
	for _, m := range masks {
		collectMasked(e.Input, m, secrets)
		e.Input = maskValue(e.Input, m)
	}
	if len(secrets) == 0 {
		return e
	}
	e.Input = maskCopies(e.Input, secrets)
	for s := range secrets {
		e.Result.Message = strings.ReplaceAll(e.Result.Message, s, MaskedValue)
	}
	return e
}

// collectMasked adds to into the non-empty strings of the values at path in v.
func collectMasked(v any, path []string, into map[string]struct{}) {
	if len(path) == 0 {
		collectStrings(v, into)
		return
	}
	seg, rest := path[0], path[1:]
	switch t := v.(type) {
	case map[string]any:
		if seg == "*" {
			for _, e := range t {
				collectMasked(e, rest, into)
			}
		} else if child, ok := t[seg]; ok {
			collectMasked(child, rest, into)
		}
	case []any:
		if seg == "*" {
			for _, e := range t {
				collectMasked(e, rest, into)
			}
			return
		}
		if i, err := strconv.Atoi(seg); err == nil && i >= 0 && i < len(t) && strconv.Itoa(i) == seg {
			collectMasked(t[i], rest, into)
		}
	}
}

func collectStrings(v any, into map[string]struct{}) {
	switch t := v.(type) {
	case string:
		if t != "" {
			into[t] = struct{}{}
		}
	case map[string]any:
		for _, e := range t {
			collectStrings(e, into)
		}
	case []any:
		for _, e := range t {
			collectStrings(e, into)
		}
	}
}

// maskCopies returns v with every string in secrets replaced by MaskedValue. Like maskValue it
// never modifies v: the objects and arrays on the way to a replaced value are copied.
func maskCopies(v any, secrets map[string]struct{}) any {
	out, _ := maskCopiesChanged(v, secrets)
	return out
}

func maskCopiesChanged(v any, secrets map[string]struct{}) (any, bool) {
	switch t := v.(type) {
	case string:
		if _, ok := secrets[t]; ok {
			return MaskedValue, true
		}
	case map[string]any:
		var out map[string]any
		for k, e := range t {
			if m, changed := maskCopiesChanged(e, secrets); changed {
				if out == nil {
					out = make(map[string]any, len(t))
					for k2, e2 := range t {
						out[k2] = e2
					}
				}
				out[k] = m
			}
		}
		if out != nil {
			return out, true
		}
	case []any:
		var out []any
		for i, e := range t {
			if m, changed := maskCopiesChanged(e, secrets); changed {
				if out == nil {
					out = append([]any(nil), t...)
				}
				out[i] = m
			}
		}
		if out != nil {
			return out, true
		}
	}
	return v, false
}

// parseMask reads a mask: a JSON pointer (RFC 6901, ~0 and ~1 escapes) into the log line that
// starts with /input, such as /input/lease/metadata/token. It returns the segments below
// /input. A segment "*" matches every member of an object and every element of an array.
func parseMask(p string) ([]string, error) {
	if p != "/input" && !strings.HasPrefix(p, "/input/") {
		return nil, fmt.Errorf("%q: a mask is a JSON pointer below /input, e.g. /input/lease/metadata/token", p)
	}
	raw := strings.Split(p, "/")[2:]
	segs := make([]string, len(raw))
	for i, s := range raw {
		if s == "" {
			return nil, fmt.Errorf("%q: empty segment", p)
		}
		if strings.Contains(strings.ReplaceAll(strings.ReplaceAll(s, "~0", ""), "~1", ""), "~") {
			return nil, fmt.Errorf("%q: ~ must be written ~0 (and / as ~1)", p)
		}
		segs[i] = strings.ReplaceAll(strings.ReplaceAll(s, "~1", "/"), "~0", "~")
	}
	return segs, nil
}

// maskValue returns v with the value at path replaced by MaskedValue. It never modifies v:
// the objects and arrays along the path are copied (the input shares maps with the request
// and with the live facts). A path that does not exist leaves v as it is.
func maskValue(v any, path []string) any {
	if len(path) == 0 {
		return MaskedValue
	}
	seg, rest := path[0], path[1:]
	switch t := v.(type) {
	case map[string]any:
		return maskObject(t, seg, rest)
	case []any:
		if seg == "*" {
			out := make([]any, len(t))
			for i, e := range t {
				out[i] = maskValue(e, rest)
			}
			return out
		}
		i, err := strconv.Atoi(seg)
		if err != nil || i < 0 || i >= len(t) || strconv.Itoa(i) != seg {
			return v
		}
		out := append([]any(nil), t...)
		out[i] = maskValue(t[i], rest)
		return out
	}
	return v
}

func maskObject(m map[string]any, seg string, rest []string) any {
	if seg == "*" {
		out := make(map[string]any, len(m))
		for k, e := range m {
			out[k] = maskValue(e, rest)
		}
		return out
	}
	child, ok := m[seg]
	if !ok {
		return m
	}
	out := make(map[string]any, len(m))
	for k, e := range m {
		out[k] = e
	}
	out[seg] = maskValue(child, rest)
	return out
}
