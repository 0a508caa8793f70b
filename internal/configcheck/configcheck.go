// Package configcheck collects the problems of a configuration, each named by its field the
// way the configuration file spells it ("tls.key: must be set together with tls.cert"), so
// that every part of the configuration reports its problems alike and all of them at once.
//
// A problem is a *FieldError when it belongs to a field, and otherwise an error of the
// configuration as a whole (a YAML syntax error), which a *DocumentError may tell with the
// configuration's name ("config: line 3: ..."). Under moves the problems of a configuration
// below a field of an enclosing one ("plugins.authz.addr: ..."), from this structure rather
// than from the messages' text.
package configcheck

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// Problems collects field-named problems; the zero value is ready to use.
type Problems struct{ errs []error }

// Add records a problem of field, a *FieldError; the message is format and args as
// fmt.Errorf makes it (%w wraps a cause), and says what to write instead.
func (p *Problems) Add(field, format string, args ...any) {
	p.errs = append(p.errs, &FieldError{Field: field, Err: fmt.Errorf(format, args...)})
}

// Include records err, the problems a part of the configuration found on its own; nil adds
// nothing.
func (p *Problems) Include(err error) {
	if err != nil {
		p.errs = append(p.errs, err)
	}
}

// Err is every problem recorded, one per line (errors.Join), or nil when there was none.
func (p *Problems) Err() error { return errors.Join(p.errs...) }

// FieldError is a problem of one field of a configuration. Its message is the field's path,
// then the problem: "plugins[0].sha256: must be 64 hex characters", or, when the file tells
// the line but not which of several fields on it holds the value,
// "evalTimeout or http.readTimeout (line 1): cannot unmarshal ...".
type FieldError struct {
	// Field is the field's path the way the file spells it: "plugins[0].sha256".
	Field string
	// Or are further fields that may hold the problem, when the file does not tell which.
	Or []string
	// Line is the line of the file the field is on; 0 when not known.
	Line int
	// Err is the problem.
	Err error
}

func (e *FieldError) Error() string {
	var b strings.Builder
	b.WriteString(e.Field)
	for _, f := range e.Or {
		b.WriteString(" or ")
		b.WriteString(f)
	}
	if e.Line > 0 {
		fmt.Fprintf(&b, " (line %d)", e.Line)
	}
	b.WriteString(": ")
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *FieldError) Unwrap() error { return e.Err }

// DocumentError is a problem told with the name of the configuration it is in:
// "config: line 3: did not find expected key", "config: evalTimeout (line 3): ...". Err is a
// *FieldError or a problem of the configuration as a whole.
type DocumentError struct {
	// Name is the configuration's name: "config", "plugins.authz".
	Name string
	// Err is the problem.
	Err error
}

func (e *DocumentError) Error() string { return e.Name + ": " + e.Err.Error() }

func (e *DocumentError) Unwrap() error { return e.Err }

// Under returns err, the problems of a configuration, as problems of the configuration that
// holds it at field prefix ("plugins.authz"). It walks the tree of err: every *FieldError's
// fields are named below prefix ("plugins.authz.addr: ..."); a *DocumentError gives up its
// name, and what it tells is moved; the problems of an errors.Join are each moved and joined
// again, one per line; any other error, one that wraps others included, is told as a problem
// of prefix with its message kept whole ("plugins.authz: line 3: ..."). err is left as it
// was; the errors returned wrap its problems (errors.Is, errors.As). Under(prefix, nil) is nil.
func Under(prefix string, err error) error {
	if err == nil {
		return nil
	}
	switch e := err.(type) { //nolint:errorlint // the walk looks at each node of the tree itself
	case *FieldError:
		moved := *e
		moved.Field = prefix + "." + e.Field
		moved.Or = nil
		for _, f := range e.Or {
			moved.Or = append(moved.Or, prefix+"."+f)
		}
		return &moved
	case *DocumentError:
		return Under(prefix, e.Err)
	}
	if reflect.TypeOf(err) == joinType {
		parts := err.(interface{ Unwrap() []error }).Unwrap() //nolint:errorlint // an errors.Join has this method
		moved := make([]error, len(parts))
		for i, part := range parts {
			moved[i] = Under(prefix, part)
		}
		return errors.Join(moved...)
	}
	return &DocumentError{Name: prefix, Err: err}
}

// joinType is the type of the errors errors.Join makes: one problem a line. Other errors that
// wrap several (fmt.Errorf with two %w) tell them in words of their own.
var joinType = reflect.TypeOf(errors.Join(errors.New("")))
