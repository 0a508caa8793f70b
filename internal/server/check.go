package server

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/authz-dev/authz/internal/configcheck"
)

// CheckFiles reads the files cfg names with the functions New reads them with (the TLS
// certificate and key, the client CA, the bearer tokens file) and checks that the decision log
// file could be opened for appending, and keeps nothing open: `authz check` uses it to report
// every such problem without starting a server. cfg must be valid (Config.Validate). Each
// problem is a *configcheck.FieldError naming its field.
func CheckFiles(cfg Config) error {
	var p configcheck.Problems
	if _, err := tlsServerConfig(cfg); err != nil {
		p.Include(fieldError("tls.cert", err))
	}
	if cfg.TLS.Cert == "" && cfg.Authentication.mode() == AuthTLS {
		if _, err := clientCAPool(cfg.Authentication.ClientCAFile); err != nil {
			p.Include(fieldError("authentication.clientCAFile", err))
		}
	}
	if _, err := newAccess(cfg.Authentication); err != nil {
		p.Include(fieldError("authentication.tokensFile", err))
	}
	if path := cfg.DecisionLog.Path; path != "" && path != "-" {
		if err := appendable(path); err != nil {
			p.Add("decisionLog.path", "%s: %v", path, err)
		}
	}
	return p.Err()
}

// fieldError is err, whose message starts with the field it is about ("tls.key: ...",
// "authentication.tokensFile PATH: ..."), as a *configcheck.FieldError of that field; of
// field when the message names none.
func fieldError(field string, err error) error {
	msg := err.Error()
	if name, rest, ok := strings.Cut(msg, ":"); ok {
		if f, _, _ := strings.Cut(name, " "); f != "" && !strings.ContainsAny(f, "/\\") && strings.Contains(f, ".") {
			field = f
			if strings.Contains(name, " ") {
				rest = name[len(f)+1:] + ":" + rest
			}
			return &configcheck.FieldError{Field: field, Err: errors.New(strings.TrimSpace(rest))}
		}
	}
	return &configcheck.FieldError{Field: field, Err: err}
}

// appendable reports why the file at path could not be opened for appending (as New opens the
// decision log), without creating or opening it: the file, or when it does not exist its
// directory, must be writable by this process.
func appendable(path string) error {
	fi, err := os.Stat(path)
	switch {
	case err == nil && fi.IsDir():
		return errors.New("is a directory")
	case err == nil:
		if err := unix.Access(path, unix.W_OK); err != nil {
			return fmt.Errorf("not writable: %w", err)
		}
		return nil
	case !errors.Is(err, os.ErrNotExist):
		return err
	}
	dir := filepath.Dir(path)
	if err := unix.Access(dir, unix.W_OK|unix.X_OK); err != nil {
		return fmt.Errorf("cannot be created in %s: %w", dir, err)
	}
	return nil
}
