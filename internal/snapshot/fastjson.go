package snapshot

import (
	"encoding/json"
	"sync"
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
// for every string of the document instead of one each), so the document never aliases data.
func decodeFast(data []byte) (v any, ok bool) {
	v, _, ok = decodeFastStats(data)
	return v, ok
}

// fastStats is what decodeFastStats saw of a document on its way, so that a caller need not
// walk the value again to learn it.
type fastStats struct {
	maxDepth  int  // deepest nesting of objects and arrays (0: a scalar document)
	maxString int  // longest string or object key, in bytes once decoded
	numbers   bool // the document holds at least one number
	exponents bool // the document holds a number with an exponent (the only ones boundNumber may rewrite)
}

// decodeFastStats is decodeFast, and also reports the document's fastStats.
func decodeFastStats(data []byte) (v any, st fastStats, ok bool) {
	d := newFastDecoder(data, false)
	defer d.release()
	v, ok = d.document()
	return v, d.st, ok
}

// newFastDecoder is a decoder of data on pooled scratch stacks; release returns them.
func newFastDecoder(data []byte, keepTop bool) fastDecoder {
	sc := scratchPool.Get().(*scratch)
	return fastDecoder{data: data, src: string(data), sc: sc, keepTop: keepTop}
}

// release returns the decoder's scratch stacks to the pool.
func (d *fastDecoder) release() {
	d.sc.put()
}

// document decodes the whole of d.data as one value.
func (d *fastDecoder) document() (any, bool) {
	d.skipSpace()
	v, ok := d.value(0)
	if !ok {
		return nil, false
	}
	d.skipSpace()
	if d.pos != len(d.data) {
		return nil, false
	}
	return v, true
}

// requestMembers are the members of a request's top-level object that a request is made of, the
// last of each when a key is repeated (as a map keeps the last of duplicate keys).
type requestMembers struct {
	operation, environment, lease, command             any
	hasOperation, hasEnvironment, hasLease, hasCommand bool
}

// member records the top-level member k: v when it is one a request is made of.
func (m *requestMembers) member(k string, v any) {
	switch k {
	case "operation":
		m.operation, m.hasOperation = v, true
	case "environment":
		m.environment, m.hasEnvironment = v, true
	case "lease":
		m.lease, m.hasLease = v, true
	case "command":
		m.command, m.hasCommand = v, true
	}
}

// decodeRequestFast decodes a request document as decodeFast does, with one saving: when the
// document is an object that inBounds accepts the fastStats of, it builds no map of the top-level
// object (the request keeps none of it) and returns its members instead, with direct true.
// Otherwise doc is the whole document, as decodeFast returns it.
func decodeRequestFast(data []byte, inBounds func(fastStats) bool) (doc any, members requestMembers, direct, ok bool) {
	d := newFastDecoder(data, true)
	defer d.release()
	if doc, ok = d.document(); !ok {
		return nil, members, false, false
	}
	if !d.topKept {
		return doc, members, false, true
	}
	// The top-level object's members are all that is left on the stacks, in document order.
	if inBounds(d.st) {
		for i := range d.sc.keys.n {
			members.member(d.sc.keys.at(i), d.sc.elems.at(i))
		}
		return nil, members, true, true
	}
	return d.makeObject(0), members, false, true
}

// scratch is the decoder's stacks, reused between documents.
type scratch struct {
	keys  chunkStack[string]
	elems chunkStack[any]
}

// maxScratchChunks bounds the chunks of each stack a scratch keeps for the next document (the
// others are dropped): 1,024 values.
const maxScratchChunks = 16

var scratchPool = sync.Pool{New: func() any { return &scratch{} }}

// put returns sc to the pool, holding no reference to the document it served.
func (sc *scratch) put() {
	sc.keys.reset(maxScratchChunks)
	sc.elems.reset(maxScratchChunks)
	scratchPool.Put(sc)
}

// chunkLen is the length of one chunk of a chunkStack: small, so that a small request costs what
// it cost on a slice (with chunks of 512, BenchmarkDecideCacheHit, whose parse this is, took 22 %
// more CPU time; with 64, no difference was measured).
const chunkLen = 64

// chunkStack is a stack kept in chunks of chunkLen values: a push never moves what is on the
// stack, so a stack that grows to n values has allocated room for about n values once. (A slice
// grown by append for a long array allocates about five times its final size on the way, every
// copy but the last garbage at once: most of what a 1 MiB array of short values cost.)
type chunkStack[T any] struct {
	chunks [][]T
	n      int
}

func (s *chunkStack[T]) push(v T) {
	c := s.n / chunkLen
	if c == len(s.chunks) {
		s.chunks = append(s.chunks, make([]T, chunkLen))
	}
	s.chunks[c][s.n%chunkLen] = v
	s.n++
}

func (s *chunkStack[T]) at(i int) T { return s.chunks[i/chunkLen][i%chunkLen] }

// popInto copies the values from base to the top into dst (of that length), in order, and
// takes them off the stack, which keeps no reference to them.
func (s *chunkStack[T]) popInto(base int, dst []T) {
	for i := base; i < s.n; {
		c, off := i/chunkLen, i%chunkLen
		end := min(chunkLen, off+(s.n-i))
		copy(dst[i-base:], s.chunks[c][off:end])
		clear(s.chunks[c][off:end])
		i += end - off
	}
	s.n = base
}

// reset0 takes the values from base to the top off the stack, which keeps no reference to them.
func (s *chunkStack[T]) reset0(base int) {
	for i := base; i < s.n; {
		c, off := i/chunkLen, i%chunkLen
		end := min(chunkLen, off+(s.n-i))
		clear(s.chunks[c][off:end])
		i += end - off
	}
	s.n = base
}

// reset empties the stack, keeping at most keep of its chunks (cleared).
func (s *chunkStack[T]) reset(keep int) {
	for i := range s.chunks {
		if i*chunkLen >= s.n {
			break
		}
		clear(s.chunks[i])
	}
	if len(s.chunks) > keep {
		clear(s.chunks[keep:])
		s.chunks = s.chunks[:keep]
	}
	s.n = 0
}

type fastDecoder struct {
	data []byte
	src  string // data as a string, sliced for the strings of the document
	pos  int
	st   fastStats
	// Scratch stacks of the members of the objects and elements of the arrays being decoded,
	// so that each object and array is allocated once at its final size (from sc, the pooled
	// scratch they are returned to).
	sc *scratch
	// keepTop leaves the members of a top-level object on the stacks, instead of a map, and
	// sets topKept.
	keepTop, topKept bool
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
		s, ok := d.str()
		if !ok {
			return nil, false
		}
		return s, true
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

// enter records the nesting of an object or array at depth and reports whether it is within
// what the fast decoder handles.
func (d *fastDecoder) enter(depth int) bool {
	d.st.maxDepth = max(d.st.maxDepth, depth)
	return depth <= maxFastDepth
}

func (d *fastDecoder) object(depth int) (any, bool) {
	if !d.enter(depth) {
		return nil, false
	}
	d.pos++ // {
	base := d.sc.keys.n
	d.skipSpace()
	if d.pos < len(d.data) && d.data[d.pos] == '}' {
		d.pos++
		return map[string]any{}, true
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
		d.sc.keys.push(k)
		d.sc.elems.push(v)
		d.skipSpace()
		if d.pos >= len(d.data) {
			return nil, false
		}
		switch d.data[d.pos] {
		case ',':
			d.pos++
		case '}':
			d.pos++
			if depth == 1 && d.keepTop {
				d.topKept = true
				return nil, true
			}
			return d.makeObject(base), true
		default:
			return nil, false
		}
	}
}

// makeObject pops the members of the object whose keys start at d.keys[base] off the stacks
// and returns them as a map: they are the tops of both stacks, in document order, and a later
// duplicate key overwrites an earlier one, as encoding/json does.
func (d *fastDecoder) makeObject(base int) map[string]any {
	n := d.sc.keys.n - base
	vbase := d.sc.elems.n - n
	m := make(map[string]any, n)
	for i := range n {
		m[d.sc.keys.at(base+i)] = d.sc.elems.at(vbase + i)
	}
	// The scratch stacks keep no reference to the document.
	d.sc.keys.reset0(base)
	d.sc.elems.reset0(vbase)
	return m
}

func (d *fastDecoder) array(depth int) (any, bool) {
	if !d.enter(depth) {
		return nil, false
	}
	d.pos++ // [
	base := d.sc.elems.n
	d.skipSpace()
	if d.pos < len(d.data) && d.data[d.pos] == ']' {
		d.pos++
		return []any{}, true
	}
	for {
		d.skipSpace()
		v, ok := d.value(depth)
		if !ok {
			return nil, false
		}
		d.sc.elems.push(v)
		d.skipSpace()
		if d.pos >= len(d.data) {
			return nil, false
		}
		switch d.data[d.pos] {
		case ',':
			d.pos++
		case ']':
			d.pos++
			a := make([]any, d.sc.elems.n-base)
			d.sc.elems.popInto(base, a)
			return a, true
		default:
			return nil, false
		}
	}
}

// str decodes a string of printable ASCII with the short escapes; anything else is left to
// encoding/json (its handling of \u escapes, surrogates and invalid UTF-8 is not repeated here).
func (d *fastDecoder) str() (string, bool) {
	d.pos++ // opening quote
	start := d.pos
	for d.pos < len(d.data) {
		c := d.data[d.pos]
		switch {
		case c == '"':
			s := d.src[start:d.pos]
			d.pos++
			d.st.maxString = max(d.st.maxString, len(s))
			return s, true
		case c == '\\':
			return d.escaped(start)
		case c < 0x20 || c >= 0x7f:
			return "", false
		}
		d.pos++
	}
	return "", false
}

// escaped finishes a string from start whose first escape is at d.pos.
func (d *fastDecoder) escaped(start int) (string, bool) {
	buf := make([]byte, 0, d.pos-start+16)
	buf = append(buf, d.data[start:d.pos]...)
	for d.pos < len(d.data) {
		c := d.data[d.pos]
		switch {
		case c == '"':
			d.pos++
			d.st.maxString = max(d.st.maxString, len(buf))
			return string(buf), true
		case c == '\\':
			if d.pos+1 >= len(d.data) {
				return "", false
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
				return "", false
			}
			buf = append(buf, r)
			d.pos += 2
			continue
		case c < 0x20 || c >= 0x7f:
			return "", false
		}
		buf = append(buf, c)
		d.pos++
	}
	return "", false
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
		d.st.exponents = true
		d.pos++
		if d.pos < len(d.data) && (d.data[d.pos] == '+' || d.data[d.pos] == '-') {
			d.pos++
		}
		if !d.digits() {
			return nil, false
		}
	}
	d.st.numbers = true
	return json.Number(d.src[start:d.pos]), true
}

// digits consumes one or more decimal digits.
func (d *fastDecoder) digits() bool {
	start := d.pos
	for d.pos < len(d.data) && d.data[d.pos] >= '0' && d.data[d.pos] <= '9' {
		d.pos++
	}
	return d.pos > start
}
