package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
)

// maskedValue replaces every masked value in the decision log.
const maskedValue = "[MASKED]"

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
	Error coded.Code `json:"error,omitempty"`
	// WatchID names the watch (POST /v1/authorize/watch) whose event the decision is.
	WatchID string `json:"watch_id,omitempty"`
	// Items is the number of evaluations of an AuthZEN batch (POST /access/v1/evaluations)
	// that ask this same decision (after the batch's defaults): it was decided and logged once
	// for all of them. Absent when it is one.
	Items int `json:"items,omitempty"`
	// Cut lists the members of the input cut to keep the line within decisionLog.maxLineBytes,
	// as JSON pointers; the record does not replay as decided when it is not empty.
	Cut []string `json:"cut,omitempty"`

	// lineCap is a cap below decisionLog.maxLineBytes for this line (0: none): the lines of an
	// AuthZEN batch share the bound.
	lineCap int
}

// decisionLog writes one JSON line per decision. Lines are marshalled outside the lock and
// written with one Write each under it, so they never interleave.
//
// A log written to a file (path not empty) is kept honest about that file: before each line
// it checks that the path still names the open file (a rename or removal makes it reopen the
// path), after a line that went to a file removed meanwhile it writes the line again to the
// new one, and after a short write (a full disk) it truncates the partial line away, so the
// next line never lands glued to half a record.
type decisionLog struct {
	mu     sync.Mutex
	w      io.Writer
	closer io.Closer // nil when the writer is not ours to close
	masks  [][]string

	path string  // the file's path; "" when w is not a file we opened
	file logFile // the open file when path is set
	// partial is true when a write to a writer that cannot be truncated stopped in the
	// middle of a line: the next line starts with a newline to end it.
	partial bool
	log     hclog.Logger

	// maxLine caps a line (decisionLog.maxLineBytes; 0: no cap); cuts counts the members cut
	// to keep lines within it (nil: not counted).
	maxLine int
	cuts    prometheus.Counter
}

// logFile is what the decision log needs of its file (*os.File).
type logFile interface {
	io.WriteCloser
	Stat() (os.FileInfo, error)
	Truncate(size int64) error
}

// openLogFile opens (creating with mode 0600) the decision log file at path for appending. It
// does not follow a symbolic link, and refuses a file that is not a regular file, that others
// may read or write, or that another user owns: the log holds every decision's input.
func openLogFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, fmt.Errorf("%s is a symbolic link: name the file itself", path)
		}
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s is not a regular file (%v): name a file", path, fi.Mode().Type())
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		f.Close()
		return nil, fmt.Errorf("%s has mode %04o: the decision log must be readable and writable by its owner only (chmod 600 %s)", path, perm, path)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		f.Close()
		return nil, fmt.Errorf("%s is owned by uid %d, not by this service (uid %d): remove it or give it to this user", path, st.Uid, os.Geteuid())
	}
	return f, nil
}

func newDecisionLog(w io.Writer, closer io.Closer, masks []string) (*decisionLog, error) {
	l := &decisionLog{w: w, closer: closer, log: hclog.NewNullLogger()}
	for _, m := range masks {
		segs, err := parseMask(m)
		if err != nil {
			return nil, err
		}
		l.masks = append(l.masks, segs)
	}
	return l, nil
}

// newFileDecisionLog opens the decision log file at path (openLogFile).
func newFileDecisionLog(path string, masks []string, log hclog.Logger) (*decisionLog, error) {
	l, err := newDecisionLog(nil, nil, masks)
	if err != nil {
		return nil, err
	}
	f, err := openLogFile(path)
	if err != nil {
		return nil, err
	}
	l.setFile(path, f)
	if log != nil {
		l.log = log
	}
	return l, nil
}

func (l *decisionLog) setFile(path string, f logFile) {
	l.path, l.file, l.w, l.closer = path, f, f, f
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
	if limit := l.lineLimit(e); limit > 0 && len(b)+1 > limit {
		if b, err = l.cutLine(e, limit); err != nil {
			return fmt.Errorf("encode decision log line: %w", err)
		}
	}
	b = append(b, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.path == "" {
		return l.writeStream(b)
	}
	if err := l.followPath(); err != nil {
		return err
	}
	if err := l.writeFile(b); err != nil {
		return err
	}
	// The file may have been removed while the line was written: then it is in no file
	// anyone can read. Write it again to the file now at the path.
	if fi, err := l.file.Stat(); err == nil && nlink(fi) == 0 {
		if err := l.followPath(); err != nil {
			return err
		}
		return l.writeFile(b)
	}
	return nil
}

// writeStream writes a line to a writer that is not a file of ours (stderr, a test's writer).
func (l *decisionLog) writeStream(b []byte) error {
	prefixed := l.partial
	if prefixed {
		b = append([]byte{'\n'}, b...)
	}
	n, err := l.w.Write(b)
	if err == nil && n != len(b) {
		err = io.ErrShortWrite
	}
	if err != nil {
		if n > 0 {
			// A line was started and not finished (only the newline ending the previous
			// partial line leaves none).
			l.partial = !prefixed || n > 1
		}
		return fmt.Errorf("write decision log: %w", err)
	}
	l.partial = false
	return nil
}

// writeFile writes a line to the file; after a short write it truncates the partial line away.
func (l *decisionLog) writeFile(b []byte) error {
	n, err := l.file.Write(b)
	if err == nil && n != len(b) {
		err = io.ErrShortWrite
	}
	if err == nil {
		return nil
	}
	err = fmt.Errorf("write decision log %s: %w", l.path, err)
	if n > 0 {
		// The file was opened for appending and this is its only writer: its last n bytes
		// are the partial line.
		fi, serr := l.file.Stat()
		if serr == nil && fi.Size() >= int64(n) {
			serr = l.file.Truncate(fi.Size() - int64(n))
		} else if serr == nil {
			serr = fmt.Errorf("the file is shorter (%d bytes) than the partial line (%d bytes)", fi.Size(), n)
		}
		if serr != nil {
			return errors.Join(err, fmt.Errorf("remove the partial line from %s: %w", l.path, serr))
		}
	}
	return err
}

// followPath reopens the log file when its path no longer names the open file (it was
// renamed or removed, e.g. by a log rotation that does not signal the service).
func (l *decisionLog) followPath() error {
	cur, err := l.file.Stat()
	if err != nil {
		return fmt.Errorf("decision log %s: %w", l.path, err)
	}
	if at, err := os.Stat(l.path); err == nil && os.SameFile(cur, at) {
		return nil
	}
	if err := l.reopenLocked(); err != nil {
		return err
	}
	l.log.Warn("the decision log file was moved or removed; reopened its path", "path", l.path)
	return nil
}

// reopen opens the log file's path again (log rotation: SIGHUP). A log that is not a file
// of ours is left as it is.
func (l *decisionLog) reopen() error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.path == "" {
		return nil
	}
	return l.reopenLocked()
}

func (l *decisionLog) reopenLocked() error {
	f, err := openLogFile(l.path)
	if err != nil {
		return fmt.Errorf("reopen the decision log: %w", err)
	}
	if cerr := l.file.Close(); cerr != nil {
		l.log.Warn("closing the previous decision log file failed", "path", l.path, "error", cerr)
	}
	l.setFile(l.path, f)
	return nil
}

func nlink(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Nlink) //nolint:unconvert // Nlink is uint32 on some platforms (linux/arm64, darwin)
	}
	return 1
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
		e.Result.Message = strings.ReplaceAll(e.Result.Message, s, maskedValue)
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

// maskCopies returns v with every string in secrets replaced by maskedValue. Like maskValue it
// never modifies v: the objects and arrays on the way to a replaced value are copied.
func maskCopies(v any, secrets map[string]struct{}) any {
	out, _ := maskCopiesChanged(v, secrets)
	return out
}

func maskCopiesChanged(v any, secrets map[string]struct{}) (any, bool) {
	switch t := v.(type) {
	case string:
		if _, ok := secrets[t]; ok {
			return maskedValue, true
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

// maskValue returns v with the value at path replaced by maskedValue. It never modifies v:
// the objects and arrays along the path are copied (the input shares maps with the request
// and with the live facts). A path that does not exist leaves v as it is.
func maskValue(v any, path []string) any {
	if len(path) == 0 {
		return maskedValue
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

// lineLimit is the cap of e's line: decisionLog.maxLineBytes, or the entry's share of it.
func (l *decisionLog) lineLimit(e logEntry) int {
	if e.lineCap > 0 && (l.maxLine == 0 || e.lineCap < l.maxLine) {
		return e.lineCap
	}
	return l.maxLine
}

// cutNote is what replaces a member cut from a line; cutFloor is the size under which a member
// is never cut (its note would save little).
const (
	cutNote  = "[CUT: %d bytes over decisionLog.maxLineBytes]"
	cutFloor = 128
)

// definedMembers are the members of the input's objects the contract defines (docs/contract.md,
// "Request shape"): they are cut only after every other member that is large.
var definedMembers = map[string]map[string]bool{
	"":                {"operation": true, "environment": true, "lease": true, "command": true, "facts": true, "narrowing": true, "resolved": true, "now_ns": true},
	"/environment":    {"id": true, "driver": true, "config": true},
	"/lease":          {"id": true, "companyId": true, "leasePolicy": true, "providerLeaseId": true, "metadata": true},
	"/lease/metadata": {"driver": true, "provider": true, "pluginId": true, "driverKey": true, "sandboxProviderPlugin": true, "backend": true, "nativeFileSyncUnsupported": true},
}

// cutLine is e's line within limit bytes (its newline included): the input's members of more
// than cutFloor bytes are replaced by a note of their size, those the contract does not define
// first, largest first, until the line fits; if it still does not, the whole input is. Each cut
// is counted and named in the line's "cut".
func (l *decisionLog) cutLine(e logEntry, limit int) ([]byte, error) {
	b, err := json.Marshal(e.Input)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var in any
	if err := dec.Decode(&in); err != nil {
		return nil, err
	}
	type member struct {
		path    string
		size    int
		defined bool
		set     func(any)
	}
	var members []member
	// walk returns the size of v as json.Marshal writes it, from the sizes of its members: each
	// leaf is encoded once (encoding every member whole at every depth cost a 600 KiB member
	// four encodings).
	var walk func(v any, path string, defined bool) int
	walk = func(v any, path string, defined bool) int {
		switch t := v.(type) {
		case map[string]any:
			known, listed := definedMembers[path]
			size := 2 + max(len(t)-1, 0) // braces and commas
			for k, c := range t {
				p := path + "/" + escapePointer(k)
				def := defined && (!listed || known[k])
				cs := walk(c, p, def)
				if cs > cutFloor {
					members = append(members, member{path: p, size: cs, defined: def, set: func(x any) { t[k] = x }})
				}
				size += jsonSize(k) + 1 + cs
			}
			return size
		case []any:
			size := 2 + max(len(t)-1, 0)
			for i, c := range t {
				p := path + "/" + strconv.Itoa(i)
				cs := walk(c, p, defined)
				if cs > cutFloor {
					members = append(members, member{path: p, size: cs, defined: defined, set: func(x any) { t[i] = x }})
				}
				size += cs
			}
			return size
		default:
			return jsonSize(v)
		}
	}
	inSize := walk(in, "", true)
	// Undefined members first, the largest of each kind first; a member inside one already cut
	// is passed over (its size went with its parent's).
	sort.SliceStable(members, func(i, j int) bool {
		if members[i].defined != members[j].defined {
			return !members[i].defined
		}
		return members[i].size > members[j].size
	})
	// The line's length without encoding the input again: the line with a null input, and the
	// input's size in place of the null.
	e.Input = nil
	line, err := json.Marshal(e)
	if err != nil {
		return nil, err
	}
	over := len(line) - len("null") + inSize + 1 - limit
	var cut []string
	for _, m := range members {
		if over <= 0 {
			break
		}
		if insideAny(m.path, cut) {
			continue
		}
		note := fmt.Sprintf(cutNote, m.size)
		m.set(note)
		cut = append(cut, "/input"+m.path)
		over -= m.size - len(note) - 2
	}
	e.Input, e.Cut = in, cut
	if line, err = json.Marshal(e); err != nil {
		return nil, err
	}
	if len(line)+1 > limit {
		e.Input, e.Cut = fmt.Sprintf(cutNote, len(b)), []string{"/input"}
		if line, err = json.Marshal(e); err != nil {
			return nil, err
		}
	}
	if l.cuts != nil {
		l.cuts.Add(float64(len(e.Cut)))
	}
	return line, nil
}

// insideAny reports whether the JSON pointer p is below one of cut.
func insideAny(p string, cut []string) bool {
	for _, c := range cut {
		if strings.HasPrefix("/input"+p, c+"/") {
			return true
		}
	}
	return false
}

// jsonSize is the size of v as JSON.
func jsonSize(v any) int {
	b, err := json.Marshal(v)
	if err != nil {
		return 0
	}
	return len(b)
}

// escapePointer escapes a member name as a JSON pointer segment (RFC 6901).
func escapePointer(k string) string {
	return strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1")
}
