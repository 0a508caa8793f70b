package configcheck

import (
	"errors"
	"reflect"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Leaves are the problems of err one by one: the parts of every errors.Join in its tree (a
// *DocumentError's included), each kept whole. Leaves(nil) is empty.
func Leaves(err error) []error {
	if err == nil {
		return nil
	}
	if reflect.TypeOf(err) == joinType {
		var out []error
		for _, part := range err.(interface{ Unwrap() []error }).Unwrap() { //nolint:errorlint // an errors.Join has this method
			out = append(out, Leaves(part)...)
		}
		return out
	}
	var de *DocumentError
	if errors.As(err, &de) && de == err && reflect.TypeOf(de.Err) == joinType { //nolint:errorlint // the node itself
		var out []error
		for _, part := range Leaves(de.Err) {
			out = append(out, &DocumentError{Name: de.Name, Err: part})
		}
		return out
	}
	return []error{err}
}

// WithLines returns the problems of err, one per element, with the line of src (a YAML
// document) that holds each *FieldError's field filled in where the error did not tell it.
// A field src does not hold (a default, a flag) keeps line 0.
func WithLines(err error, src []byte) []error {
	var root yaml.Node
	if yaml.Unmarshal(src, &root) != nil {
		root = yaml.Node{}
	}
	leaves := Leaves(err)
	for i, leaf := range leaves {
		var fe *FieldError
		if !errors.As(leaf, &fe) || fe.Line > 0 {
			continue
		}
		if line := LineOf(&root, fe.Field); line > 0 {
			moved := *fe
			moved.Line = line
			leaves[i] = replaceField(leaf, fe, &moved)
		}
	}
	return leaves
}

// replaceField is leaf with its *FieldError old (leaf itself or below a *DocumentError) as new.
func replaceField(leaf error, old, new *FieldError) error {
	if leaf == error(old) { //nolint:errorlint // the node itself, not an error it wraps
		return new
	}
	if de, ok := leaf.(*DocumentError); ok { //nolint:errorlint // the node itself
		return &DocumentError{Name: de.Name, Err: replaceField(de.Err, old, new)}
	}
	return leaf
}

// LineOf is the line of the YAML document root (a document node as yaml.Unmarshal fills it)
// that holds field, a path the way FieldError spells it ("plugins[0].sha256",
// "decisionLog.mask[1]"): the line of the field's key, or of the element. A path that names a
// field src does not hold gives the line of the nearest enclosing field it does hold; 0 when
// it holds none.
func LineOf(root *yaml.Node, field string) int {
	n := root
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	line := 0
	for _, step := range splitPath(field) {
		next, at := child(n, step)
		if next == nil {
			return line
		}
		n, line = next, at
	}
	return line
}

// child is the node under n at step (a mapping key, or "[i]" for a sequence element) and the
// line that names it.
func child(n *yaml.Node, step string) (*yaml.Node, int) {
	switch {
	case n.Kind == yaml.SequenceNode && strings.HasPrefix(step, "["):
		i, err := strconv.Atoi(strings.Trim(step, "[]"))
		if err != nil || i < 0 || i >= len(n.Content) {
			return nil, 0
		}
		return n.Content[i], n.Content[i].Line
	case n.Kind == yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == step {
				return n.Content[i+1], n.Content[i].Line
			}
		}
	}
	return nil, 0
}

// splitPath splits "plugins[0].sha256" into "plugins", "[0]", "sha256".
func splitPath(field string) []string {
	var out []string
	for _, part := range strings.Split(field, ".") {
		for part != "" {
			i := strings.IndexByte(part[1:], '[')
			if i < 0 {
				out = append(out, part)
				break
			}
			out = append(out, part[:i+1])
			part = part[i+1:]
		}
	}
	return out
}
