package snapshot

import (
	"encoding/json"
)

// maxFastDepth is the nesting at which the fast decoder gives up and leaves the document to
// encoding/json (which refuses documents nested deeper than 10000 levels).
const maxFastDepth = 10000

// decodeFast decodes one JSON document the way encoding/json decodes it into an `any` with
// UseNumber: objects as map[string]any (the last of duplicate keys wins), arrays as []any,
// numbers as json.Number, strings, booleans and nil. It handles the documents requests are made
// of (ASCII strings with the short escapes) in one pass without reflection; ok is false for
// anything else (a \u escape, a byte outside printable ASCII in a string, invalid JSON, deep
// nesting), and the caller then decodes with encoding/json, so every answer and every error
// message stays that of encoding/json.
//
// The strings it returns without escapes share the memory of one copy of data (one allocation
// for every string of the document instead of one each).
func decodeFast(data []byte) (v any, ok bool) {
	d := fastDecoder{data: data, src: string(data)}
	d.skipSpace()
	v, ok = d.value(0)
	if !ok {
		return nil, false
	}
	d.skipSpace()
	if d.pos != len(d.data) {
		return nil, false
	}
	return v, true
}

type fastDecoder struct {
	data []byte
	src  string // data as a string, sliced for the strings of the document
	pos  int
}

func (d *fastDecoder) skipSpace() {
	for d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

func (d *fastDecoder) value(depth int) (any, bool) {
	if d.pos >= len(d.data) {
		return nil, false
	}
	switch c := d.data[d.pos]; {
	case c == '{':
		return d.object(depth + 1)
	case c == '[':
		return d.array(depth + 1)
	case c == '"':
		return d.str()
	case c == 't':
		return true, d.literal("true")
	case c == 'f':
		return false, d.literal("false")
	case c == 'n':
		return nil, d.literal("null")
	case c == '-' || (c >= '0' && c <= '9'):
		return d.number()
	}
	return nil, false
}

func (d *fastDecoder) literal(lit string) bool {
	if len(d.data)-d.pos < len(lit) || string(d.data[d.pos:d.pos+len(lit)]) != lit {
		return false
	}
	d.pos += len(lit)
	return true
}

func (d *fastDecoder) object(depth int) (any, bool) {
	if depth > maxFastDepth {
		return nil, false
	}
	d.pos++ // {
	m := map[string]any{}
	d.skipSpace()
	if d.pos < len(d.data) && d.data[d.pos] == '}' {
		d.pos++
		return m, true
	}
	for {
		d.skipSpace()
		if d.pos >= len(d.data) || d.data[d.pos] != '"' {
			return nil, false
		}
		k, ok := d.str()
		if !ok {
			return nil, false
		}
		d.skipSpace()
		if d.pos >= len(d.data) || d.data[d.pos] != ':' {
			return nil, false
		}
		d.pos++
		d.skipSpace()
		v, ok := d.value(depth)
		if !ok {
			return nil, false
		}
		m[k.(string)] = v
		d.skipSpace()
		if d.pos >= len(d.data) {
			return nil, false
		}
		switch d.data[d.pos] {
		case ',':
			d.pos++
		case '}':
			d.pos++
			return m, true
		default:
			return nil, false
		}
	}
}

func (d *fastDecoder) array(depth int) (any, bool) {
	if depth > maxFastDepth {
		return nil, false
	}
	d.pos++ // [
	a := []any{}
	d.skipSpace()
	if d.pos < len(d.data) && d.data[d.pos] == ']' {
		d.pos++
		return a, true
	}
	for {
		d.skipSpace()
		v, ok := d.value(depth)
		if !ok {
			return nil, false
		}
		a = append(a, v)
		d.skipSpace()
		if d.pos >= len(d.data) {
			return nil, false
		}
		switch d.data[d.pos] {
		case ',':
			d.pos++
		case ']':
			d.pos++
			return a, true
		default:
			return nil, false
		}
	}
}

// str decodes a string of printable ASCII with the short escapes; anything else is left to
// encoding/json (its handling of \u escapes, surrogates and invalid UTF-8 is not repeated here).
func (d *fastDecoder) str() (any, bool) {
	d.pos++ // opening quote
	start := d.pos
	for d.pos < len(d.data) {
		c := d.data[d.pos]
		switch {
		case c == '"':
			s := d.src[start:d.pos]
			d.pos++
			return s, true
		case c == '\\':
			return d.escaped(start)
		case c < 0x20 || c >= 0x7f:
			return nil, false
		}
		d.pos++
	}
	return nil, false
}

// escaped finishes a string from start whose first escape is at d.pos.
func (d *fastDecoder) escaped(start int) (any, bool) {
	buf := make([]byte, 0, d.pos-start+16)
	buf = append(buf, d.data[start:d.pos]...)
	for d.pos < len(d.data) {
		c := d.data[d.pos]
		switch {
		case c == '"':
			d.pos++
			return string(buf), true
		case c == '\\':
			if d.pos+1 >= len(d.data) {
				return nil, false
			}
			var r byte
			switch d.data[d.pos+1] {
			case '"':
				r = '"'
			case '\\':
				r = '\\'
			case '/':
				r = '/'
			case 'b':
				r = '\b'
			case 'f':
				r = '\f'
			case 'n':
				r = '\n'
			case 'r':
				r = '\r'
			case 't':
				r = '\t'
			default: // \u and invalid escapes
				return nil, false
			}
			buf = append(buf, r)
			d.pos += 2
			continue
		case c < 0x20 || c >= 0x7f:
			return nil, false
		}
		buf = append(buf, c)
		d.pos++
	}
	return nil, false
}

// number checks the JSON number grammar and returns the literal as a json.Number.
func (d *fastDecoder) number() (any, bool) {
	start := d.pos
	if d.data[d.pos] == '-' {
		d.pos++
	}
	switch {
	case d.pos < len(d.data) && d.data[d.pos] == '0':
		d.pos++
	case d.pos < len(d.data) && d.data[d.pos] >= '1' && d.data[d.pos] <= '9':
		d.digits()
	default:
		return nil, false
	}
	if d.pos < len(d.data) && d.data[d.pos] == '.' {
		d.pos++
		if !d.digits() {
			return nil, false
		}
	}
	if d.pos < len(d.data) && (d.data[d.pos] == 'e' || d.data[d.pos] == 'E') {
		d.pos++
		if d.pos < len(d.data) && (d.data[d.pos] == '+' || d.data[d.pos] == '-') {
			d.pos++
		}
		if !d.digits() {
			return nil, false
		}
	}
	return json.Number(d.data[start:d.pos]), true
}

// digits consumes one or more decimal digits.
func (d *fastDecoder) digits() bool {
	start := d.pos
	for d.pos < len(d.data) && d.data[d.pos] >= '0' && d.data[d.pos] <= '9' {
		d.pos++
	}
	return d.pos > start
}
