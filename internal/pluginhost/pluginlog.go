package pluginhost

import (
	"strings"

	"github.com/hashicorp/go-hclog"
)

// stderrAtInfo is the logger go-plugin gets for a worker. go-plugin logs each line a plugin
// writes to stderr through Named(<executable>): hclog JSON lines at their own level, lines
// starting with [TRACE]..[ERROR] at that level, and every other line at Debug. A driver that
// fails to start usually says why in such a plain line, which Debug hides at the default log
// level; this logger shows those lines at Info. go-plugin's own messages are unchanged.
type stderrAtInfo struct{ hclog.Logger }

// Named implements hclog.Logger: the named logger is the one go-plugin writes stderr lines to.
func (l stderrAtInfo) Named(name string) hclog.Logger { return plainLinesAtInfo{l.Logger.Named(name)} }

// plainLinesAtInfo logs a Debug message without arguments (a plain stderr line: go-plugin
// passes a JSON line's fields, at least its timestamp, as arguments) at Info, unless the line
// itself says [DEBUG].
type plainLinesAtInfo struct{ hclog.Logger }

func (l plainLinesAtInfo) Debug(msg string, args ...any) {
	if len(args) == 0 && !strings.HasPrefix(msg, "[DEBUG]") {
		l.Logger.Info(msg)
		return
	}
	l.Logger.Debug(msg, args...)
}
