package snapshot

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// decodeOne decodes exactly one JSON value (numbers kept exact) and refuses trailing data.
func decodeOne(r io.Reader) (any, error) {
	dec := json.NewDecoder(r)
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("empty document")
		}
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("unexpected data after the JSON value")
	}
	return v, nil
}

// DecodeJSON decodes one JSON document as encoding/json decodes it into an any with UseNumber
// (numbers kept exact), refusing trailing data; in one pass when the document allows it.
func DecodeJSON(data []byte) (any, error) {
	if v, ok := decodeFast(data); ok {
		return v, nil
	}
	return decodeOne(bytes.NewReader(data))
}

func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case json.Number, float64:
		return "a number"
	default:
		return fmt.Sprintf("%T", v)
	}
}
