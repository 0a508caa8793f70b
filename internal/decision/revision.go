package decision

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// ContentRevision is the revision of policy content that carries none of its own (the embedded
// policy, a bundle without a manifest revision): "sha256:" and 16 hex digits of a digest of the
// modules (path → source) and, when data is given (nil included), of the data as JSON. It does
// not depend on map order.
func ContentRevision(modules map[string]string, data ...map[string]any) string {
	h := sha256.New()
	for _, n := range slices.Sorted(maps.Keys(modules)) {
		fmt.Fprintf(h, "%d:%s%d:%s", len(n), n, len(modules[n]), modules[n])
	}
	if len(data) > 0 {
		b, _ := json.Marshal(data[0]) // map keys are sorted by encoding/json
		h.Write(b)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))[:16]
}

// JoinRevisions is the revision of a policy made of several bundles, from the revision of each
// by name: the revision alone for one bundle, else NAME=REVISION pairs sorted by name and
// joined by commas.
func JoinRevisions(revs map[string]string) string {
	names := slices.Sorted(maps.Keys(revs))
	if len(names) == 1 {
		return revs[names[0]]
	}
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = n + "=" + revs[n]
	}
	return strings.Join(parts, ",")
}
