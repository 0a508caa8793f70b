package pluginhost

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/authz-dev/authz/driverplugin"
	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/configcheck"
	"github.com/authz-dev/authz/internal/logtext"
)

// Defaults of Limits. They are far above what an honest driver reports (a handful of methods,
// a few manifest entries, the nine capability keys) and small enough that no driver can make
// the host's per-decision work, memory or log grow without bound.
const (
	defaultMaxMethods         = 64
	defaultMaxManifestEntries = 256
	defaultMaxCapabilityKeys  = 32
	defaultMaxStringBytes     = 256
	defaultMaxMessageBytes    = 4 << 20
	defaultMaxLastErrorBytes  = 1024
	defaultLogLinesPerSecond  = 100
	defaultLogBurst           = 500
	defaultLogLineBytes       = 1024
	defaultMaxBrokerMessages  = 16
	defaultMaxCheckAnswer     = 64 << 10
	defaultMaxCheckConfig     = 16 << 10
)

// checkTextBytes is how much of a config check's reason or error text the host keeps (for the
// log); the rest is cut and counted.
const checkTextBytes = 4 << 10

// Limits bound what a driver may report and how much of the host its output may use. A zero
// field means its default. A start whose answers break a bound is refused: the plugin gets
// status error and a lastError that names the bound.
type Limits struct {
	// MaxMethods bounds the distinct methods of SupportedMethods (repeats are dropped first).
	MaxMethods int
	// MaxManifestEntries bounds the manifest's environmentDrivers entries.
	MaxManifestEntries int
	// MaxCapabilityKeys bounds the sandboxCapabilities keys of one manifest entry.
	MaxCapabilityKeys int
	// MaxStringBytes bounds the plugin key, every driver key, kind, method name and capability
	// key. Those strings must also be valid UTF-8 without control characters.
	MaxStringBytes int
	// MaxMessageBytes bounds one gRPC message the host accepts from a driver.
	MaxMessageBytes int
	// MaxLastErrorBytes bounds a plugin's lastError; the rest is cut and counted.
	MaxLastErrorBytes int
	// LogLinesPerSecond and LogBurst rate-limit the driver's output (stderr and stdout after
	// the handshake) relayed to the host log, per plugin; lines over the rate are dropped and
	// counted in the next line that passes.
	LogLinesPerSecond, LogBurst int
	// LogLineBytes bounds one relayed line; the rest is cut and counted.
	LogLineBytes int
	// MaxBrokerMessages is how many go-plugin broker messages the host ignores before it ends
	// the worker. The host does not offer the broker: a driver never needs it.
	MaxBrokerMessages int
	// MaxCheckAnswerBytes bounds a CheckConfig answer the host receives: its message, and the
	// header block that carries an error's text (every RPC's headers are bounded by it too). A
	// larger answer is a failed check; of what arrives, checkTextBytes of text are kept.
	MaxCheckAnswerBytes int
	// MaxCheckConfigBytes bounds the config (its canonical JSON) a config check sends and keeps
	// while it waits: a larger config is not valid without asking the driver.
	MaxCheckConfigBytes int
}

// withDefaults fills zero fields.
func (l Limits) withDefaults() Limits {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&l.MaxMethods, defaultMaxMethods)
	def(&l.MaxManifestEntries, defaultMaxManifestEntries)
	def(&l.MaxCapabilityKeys, defaultMaxCapabilityKeys)
	def(&l.MaxStringBytes, defaultMaxStringBytes)
	def(&l.MaxMessageBytes, defaultMaxMessageBytes)
	def(&l.MaxLastErrorBytes, defaultMaxLastErrorBytes)
	def(&l.LogLinesPerSecond, defaultLogLinesPerSecond)
	def(&l.LogBurst, defaultLogBurst)
	def(&l.LogLineBytes, defaultLogLineBytes)
	def(&l.MaxBrokerMessages, defaultMaxBrokerMessages)
	def(&l.MaxCheckAnswerBytes, defaultMaxCheckAnswer)
	def(&l.MaxCheckConfigBytes, defaultMaxCheckConfig)
	return l
}

// validate returns a field-named error per negative limit.
func (l Limits) validate(v *configcheck.Problems) {
	for _, f := range []struct {
		name string
		v    int
	}{
		{"maxMethods", l.MaxMethods}, {"maxManifestEntries", l.MaxManifestEntries},
		{"maxCapabilityKeys", l.MaxCapabilityKeys}, {"maxStringBytes", l.MaxStringBytes},
		{"maxMessageBytes", l.MaxMessageBytes}, {"maxLastErrorBytes", l.MaxLastErrorBytes},
		{"logLinesPerSecond", l.LogLinesPerSecond}, {"logBurst", l.LogBurst},
		{"logLineBytes", l.LogLineBytes}, {"maxBrokerMessages", l.MaxBrokerMessages},
		{"maxCheckAnswerBytes", l.MaxCheckAnswerBytes}, {"maxCheckConfigBytes", l.MaxCheckConfigBytes},
	} {
		if f.v < 0 {
			v.Add("limits."+f.name, "must not be negative (zero means the default)")
		}
	}
}

// limitsHint ends every bounds error: what to do next.
const limitsHint = `the host refuses drivers beyond its limits (see "Limits" in docs/drivers.md)`

// dedupeMethods returns methods without repeats, in first-seen order.
func dedupeMethods(methods []string) []string {
	seen := make(map[string]struct{}, min(len(methods), 1024))
	out := make([]string, 0, min(len(methods), 1024))
	for _, m := range methods {
		if _, dup := seen[m]; dup {
			continue
		}
		seen[m] = struct{}{}
		out = append(out, m)
	}
	return slices.Clip(out)
}

// checkBounds refuses a description or method list (already deduplicated) beyond the limits.
// It looks at sizes only; validateManifest checks the meaning afterwards. Field names are
// formatted only for the error.
func checkBounds(l Limits, d driverplugin.Description, methods []string) error {
	bad := func(format string, args ...any) error {
		return coded.Errorf(coded.LimitExceeded, "%s: %s", fmt.Sprintf(format, args...), limitsHint)
	}
	checkString := func(s string, field func() string) error {
		switch {
		case len(s) > l.MaxStringBytes:
			return bad("%s is %d bytes, more than the limit of %d", field(), len(s), l.MaxStringBytes)
		case plainString(s):
			return nil
		case !utf8.ValidString(s):
			return bad("%s is not valid UTF-8", field())
		case strings.IndexFunc(s, isControl) >= 0:
			return bad("%s %s holds a control character", field(), quoteShort(s))
		}
		return nil
	}
	if n := len(methods); n > l.MaxMethods {
		return bad("SupportedMethods reported %d distinct methods, more than the limit of %d", n, l.MaxMethods)
	}
	for i, m := range methods {
		if err := checkString(m, func() string { return fmt.Sprintf("SupportedMethods[%d]", i) }); err != nil {
			return err
		}
	}
	if n := len(d.EnvironmentDrivers); n > l.MaxManifestEntries {
		return bad("the manifest has %d environmentDrivers entries, more than the limit of %d", n, l.MaxManifestEntries)
	}
	if err := checkString(d.Key, func() string { return "key" }); err != nil {
		return err
	}
	for i, e := range d.EnvironmentDrivers {
		field := func(f string) func() string {
			return func() string { return fmt.Sprintf("environmentDrivers[%d].%s", i, f) }
		}
		if err := checkString(e.DriverKey, field("driverKey")); err != nil {
			return err
		}
		if err := checkString(e.Kind, field("kind")); err != nil {
			return err
		}
		if n := len(e.SandboxCapabilities); n > l.MaxCapabilityKeys {
			return bad("%s has %d keys, more than the limit of %d", field("sandboxCapabilities")(), n, l.MaxCapabilityKeys)
		}
		for k := range e.SandboxCapabilities {
			if err := checkString(k, field("sandboxCapabilities key")); err != nil {
				return err
			}
		}
	}
	return nil
}

// plainString reports whether s is printable ASCII (and tab) only: the common case, checked
// without decoding runes.
func plainString(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 && c != '\t' || c >= 0x7f {
			return false
		}
	}
	return true
}

// explainRPCError says which bound a driver's answer broke when gRPC refused it for its size.
func explainRPCError(l Limits, err error) error {
	if s, ok := status.FromError(errors.Unwrap(err)); ok && s.Code() == codes.ResourceExhausted ||
		status.Code(err) == codes.ResourceExhausted {
		return coded.Errorf(coded.LimitExceeded, "the driver's answer is larger than the limit of %d bytes per message: %s: %w", l.MaxMessageBytes, limitsHint, err)
	}
	return err
}

// unknownCapabilities summarises the capability keys the host does not know, in one warning:
// how many, and the first few (sorted) as examples.
func unknownCapabilities(d driverplugin.Description) (count int, examples []string) {
	const maxExamples = 5
	for _, e := range d.EnvironmentDrivers {
		for k := range e.SandboxCapabilities {
			if knownCapabilities[k] {
				continue
			}
			count++
			examples = append(examples, e.DriverKey+"."+k)
		}
	}
	slices.Sort(examples)
	if len(examples) > maxExamples {
		examples = examples[:maxExamples]
	}
	return count, examples
}

// capText makes a driver-influenced text safe and short for lastError and the log: one line,
// control characters escaped, at most maxBytes bytes (the rest cut and counted).
func capText(s string, maxBytes int) string {
	s = strings.ReplaceAll(s, "\n", "; ")
	s = escapeControl(s)
	if len(s) <= maxBytes {
		return s
	}
	cut := maxBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d more bytes cut)", s[:cut], len(s)-cut)
}

// quoteShort quotes s for an error message, cut to 64 bytes.
func quoteShort(s string) string {
	if len(s) > 64 {
		return fmt.Sprintf("%q…", s[:64])
	}
	return fmt.Sprintf("%q", s)
}

// isControl is logtext.IsControl: the runes escaped in driver output.
func isControl(r rune) bool { return logtext.IsControl(r) }

// escapeControl is logtext.Escape: a driver's text cannot forge or hide a line of the host's log.
func escapeControl(s string) string { return logtext.Escape(s) }
