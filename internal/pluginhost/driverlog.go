package pluginhost

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// driverLog relays a driver's output (stderr before and after the handshake, stdout after it)
// to the host log, bounded: every line is cut to LogLineBytes, its control characters are
// escaped, and lines over LogLinesPerSecond (with a burst of LogBurst) are dropped and counted.
// It never blocks the driver's output: go-plugin learns that a driver exited only once its
// stderr is drained, so a relay that waited would keep a dead worker looking alive.
//
// A line in hclog's JSON format keeps its level, message and fields; other lines are logged at
// debug, except those with a "[LEVEL]" prefix and a Go panic, as go-plugin does.
type driverLog struct {
	log      hclog.Logger
	rate     float64 // tokens per second
	burst    float64
	lineMax  int
	now      func() time.Time
	mu       sync.Mutex // guards the fields below
	tokens   float64
	last     time.Time
	dropped  int64
	inPanic  bool
	lastDrop time.Time
}

// maxLogFields bounds the fields relayed from one JSON line.
const maxLogFields = 16

func newDriverLog(log hclog.Logger, l Limits) *driverLog {
	return &driverLog{
		log:     log,
		rate:    float64(l.LogLinesPerSecond),
		burst:   float64(l.LogBurst),
		lineMax: l.LogLineBytes,
		now:     time.Now,
		tokens:  float64(l.LogBurst),
	}
}

// writer returns an io.Writer for one of the driver's streams. Each stream keeps its own
// partial line; all streams of a plugin share the rate.
func (d *driverLog) writer(stream string) io.Writer {
	return &lineWriter{d: d, stream: stream}
}

// flush reports lines dropped since the last relayed one. The host calls it when a worker ends.
func (d *driverLog) flush() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reportDropped()
}

// reportDropped logs and resets the count of dropped lines. Call with mu held.
func (d *driverLog) reportDropped() {
	if d.dropped == 0 {
		return
	}
	d.log.Warn("driver output over the rate limit was dropped", "lines", d.dropped,
		"limit_per_second", d.rate)
	d.dropped = 0
}

// allow takes one token, or counts a drop.
func (d *driverLog) allow() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	if !d.last.IsZero() {
		d.tokens = min(d.burst, d.tokens+now.Sub(d.last).Seconds()*d.rate)
	}
	d.last = now
	if d.tokens < 1 {
		d.dropped++
		// Tell when dropping starts and then every ten seconds while the flood lasts; the rest
		// is said with the next line that passes (or when the worker ends).
		if now.Sub(d.lastDrop) >= 10*time.Second {
			d.lastDrop = now
			d.reportDropped()
		}
		return false
	}
	d.tokens--
	d.reportDropped()
	return true
}

// line relays one complete line; cut is how many bytes of it were not kept.
func (d *driverLog) line(stream string, line []byte, cut int) {
	if !d.allow() {
		return
	}
	line = bytes.TrimRight(line, "\r")
	var suffix string
	if cut > 0 {
		suffix = fmt.Sprintf(" … (%d more bytes cut)", cut)
	}
	if cut == 0 && len(line) > 0 && line[0] == '{' {
		if d.jsonLine(stream, line) {
			return
		}
	}
	text := escapeControl(string(line)) + suffix
	// A plain line is logged at Info: a driver that fails to start usually says why in one, and
	// Debug would hide it at the default level. A line that names its level keeps it.
	level := hclog.Info
	switch {
	case strings.HasPrefix(text, "[TRACE]"):
		level = hclog.Trace
	case strings.HasPrefix(text, "[DEBUG]"):
		level = hclog.Debug
	case strings.HasPrefix(text, "[INFO]"):
		level = hclog.Info
	case strings.HasPrefix(text, "[WARN]"):
		level = hclog.Warn
	case strings.HasPrefix(text, "[ERROR]"):
		level = hclog.Error
	case strings.HasPrefix(text, "panic: "), strings.HasPrefix(text, "fatal error: "):
		d.mu.Lock()
		d.inPanic = true
		d.mu.Unlock()
		level = hclog.Error
	default:
		d.mu.Lock()
		if d.inPanic {
			level = hclog.Error
		}
		d.mu.Unlock()
	}
	d.log.Log(level, text, "stream", stream)
}

// jsonLine relays a line of hclog's JSON format and reports whether it was one.
func (d *driverLog) jsonLine(stream string, line []byte) bool {
	var entry map[string]any
	if err := json.Unmarshal(line, &entry); err != nil {
		return false
	}
	lvl, _ := entry["@level"].(string)
	msg, _ := entry["@message"].(string)
	level := hclog.LevelFromString(lvl)
	if level == hclog.NoLevel {
		return false
	}
	if cur := d.log.GetLevel(); cur != hclog.NoLevel && level < cur {
		return true // the host log would drop it anyway
	}
	args := []any{"stream", stream}
	if mod, ok := entry["@module"].(string); ok {
		args = append(args, "driver_module", escapeControl(mod))
	}
	keys := slices.Sorted(maps.Keys(entry))
	n := 0
	for _, k := range keys {
		if strings.HasPrefix(k, "@") {
			continue
		}
		if n == maxLogFields {
			args = append(args, "more_fields", len(keys)-n)
			break
		}
		n++
		// Under "driver.": a driver's fields never stand where the host's own are read
		// (decision_id, revision, result, ...), in a log that may share a stream with the
		// decision log.
		args = append(args, "driver."+logKey(k), logValue(entry[k]))
	}
	d.log.Log(level, escapeControl(msg), args...)
	return true
}

// logKey is a driver's field name as the host logs it: letters, digits, '_', '.' and '-' are
// kept, any other character becomes '_' (and an empty name is "_"), so a name with a space or
// '=' ("x decision_id") cannot read as a field of its own to a key=value parser of the text log.
func logKey(k string) string {
	if k == "" {
		return "_"
	}
	var b strings.Builder
	for _, r := range k {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '.', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}

// logValue renders a JSON value for the host log: strings escaped, numbers and booleans as
// they are, anything else as escaped JSON.
func logValue(v any) any {
	switch t := v.(type) {
	case string:
		return escapeControl(t)
	case float64, bool, nil:
		return t
	default:
		b, _ := json.Marshal(t)
		return escapeControl(string(b))
	}
}

// lineWriter splits one stream into lines, keeping at most lineMax bytes of each.
type lineWriter struct {
	d      *driverLog
	stream string
	mu     sync.Mutex
	buf    []byte
	cut    int
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		chunk := p
		if i >= 0 {
			chunk = p[:i]
		}
		keep := min(max(0, w.d.lineMax-len(w.buf)), len(chunk))
		w.buf = append(w.buf, chunk[:keep]...)
		w.cut += len(chunk) - keep
		if i < 0 {
			break
		}
		w.d.line(w.stream, w.buf, w.cut)
		w.buf, w.cut = w.buf[:0], 0
		p = p[i+1:]
	}
	return n, nil
}

// pluginLogger is the logger the host hands to go-plugin. go-plugin relays a driver's stderr
// through a sub-logger named after the executable; that one is off, because the host relays
// stderr itself (driverLog, through ClientConfig.Stderr). go-plugin's own messages, and those
// of its "stdio" sub-logger, go to the plugin's log.
type pluginLogger struct {
	hclog.Logger
}

// offLogger is a logger whose level is Off, so go-plugin skips parsing every relayed line.
var offLogger = hclog.New(&hclog.LoggerOptions{Level: hclog.Off, Output: io.Discard})

func (l pluginLogger) Named(name string) hclog.Logger {
	if name == "stdio" {
		return l.Logger.Named(name)
	}
	return offLogger
}
