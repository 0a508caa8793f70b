// Package configcheck collects the problems of a configuration, each named by its field the
// way the configuration file spells it ("tls.key: must be set together with tls.cert"), so
// that every part of the configuration reports its problems alike and all of them at once.
package configcheck

import (
	"errors"
	"fmt"
)

// Problems collects field-named problems; the zero value is ready to use.
type Problems struct{ errs []error }

// Add records a problem of field; the message is format and args as fmt.Sprintf makes it, and
// says what to write instead.
func (p *Problems) Add(field, format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
}

// Include records err, the problems a part of the configuration found on its own; nil adds
// nothing.
func (p *Problems) Include(err error) {
	if err != nil {
		p.errs = append(p.errs, err)
	}
}

// Err is every problem recorded, one per line, or nil when there was none.
func (p *Problems) Err() error { return errors.Join(p.errs...) }
