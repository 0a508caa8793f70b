package pluginhost

import (
	"encoding/json"
	"hash/maphash"
	"math"
	"time"
)

// A kept answer is found without the config's canonical JSON: by a hash of the config's value
// (keptKey), and then by comparing the value with the one the kept check was asked about, so
// that a decision whose check is kept takes no lock and allocates nothing for it.

// keptKey names the kept answers of one plugin, worker generation and driver key whose configs
// hash alike (hashConfig).
type keptKey struct {
	pluginID   string
	generation uint64
	driverKey  string
	sum        uint64
}

var configSeed = maphash.MakeSeed()

// Tags of the JSON kinds in hashConfig.
const (
	tagNull uint64 = iota + 1
	tagFalse
	tagTrue
	tagNumber
	tagString
	tagArray
	tagObject
	tagFloat
)

func mix(tag, h uint64) uint64 {
	h ^= tag * 0x9e3779b97f4a7c15
	h ^= h >> 31
	h *= 0xbf58476d1ce4e5b9
	return h ^ h>>29
}

// hashConfig hashes a JSON value as the request decoder makes it (objects as map[string]any,
// arrays as []any, numbers as json.Number, strings, booleans, nil; float64 too). Equal values
// (equalConfig) hash alike; the members of an object are hashed in any order, without sorting.
// ok is false for any other type, or past a depth of 64.
func hashConfig(v any, depth int) (sum uint64, ok bool) {
	if depth > 64 {
		return 0, false
	}
	switch x := v.(type) {
	case nil:
		return mix(tagNull, 0), true
	case bool:
		if x {
			return mix(tagTrue, 0), true
		}
		return mix(tagFalse, 0), true
	case json.Number:
		return mix(tagNumber, maphash.String(configSeed, string(x))), true
	case float64:
		return mix(tagFloat, math.Float64bits(x)), true
	case string:
		return mix(tagString, maphash.String(configSeed, x)), true
	case []any:
		h := uint64(len(x))
		for _, e := range x {
			eh, ok := hashConfig(e, depth+1)
			if !ok {
				return 0, false
			}
			h = h*0x100000001b3 ^ eh
		}
		return mix(tagArray, h), true
	case map[string]any:
		h := uint64(len(x))
		for k, e := range x {
			eh, ok := hashConfig(e, depth+1)
			if !ok {
				return 0, false
			}
			h += mix(maphash.String(configSeed, k), eh) // commutative: any order
		}
		return mix(tagObject, h), true
	}
	return 0, false
}

// equalConfig reports whether a and b are the same JSON value of the same Go types, so that
// their canonical JSON is the same.
func equalConfig(a, b any, depth int) bool {
	if depth > 64 {
		return false
	}
	switch x := a.(type) {
	case nil:
		return b == nil
	case bool:
		y, ok := b.(bool)
		return ok && x == y
	case json.Number:
		y, ok := b.(json.Number)
		return ok && x == y
	case float64:
		y, ok := b.(float64)
		return ok && math.Float64bits(x) == math.Float64bits(y)
	case string:
		y, ok := b.(string)
		return ok && x == y
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !equalConfig(x[i], y[i], depth+1) {
				return false
			}
		}
		return true
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, xv := range x {
			yv, ok := y[k]
			if !ok || !equalConfig(xv, yv, depth+1) {
				return false
			}
		}
		return true
	}
	return false
}

// keptAnswer looks up a kept answer for cfg without a lock: found is false when there is none
// (or cfg cannot be hashed), and the caller takes the locked path.
func (cc *configChecks) keptAnswer(pluginID string, generation uint64, driverKey string, cfg map[string]any, now time.Time) (valid bool, err error, found bool) {
	sum, ok := hashConfig(cfg, 0)
	if !ok {
		return false, nil, false
	}
	for _, e := range (*cc.kept.Load())[keptKey{pluginID: pluginID, generation: generation, driverKey: driverKey, sum: sum}] {
		if e.config != nil && equalConfig(e.config, cfg, 0) && e.usable(now) {
			return e.valid, e.err, true
		}
	}
	return false, nil, false
}
