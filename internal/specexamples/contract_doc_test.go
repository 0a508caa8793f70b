package specexamples_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/specexamples"
)

// contractSection returns section n of docs/contract.md ("## n. …" up to the next "## ").
func contractSection(t testing.TB, n string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "contract.md"))
	require.NoError(t, err)
	s := string(b)
	start := strings.Index(s, "\n## "+n+". ")
	require.GreaterOrEqual(t, start, 0, "docs/contract.md has no section %s", n)
	rest := s[start+1:]
	if end := strings.Index(rest[3:], "\n## "); end >= 0 {
		rest = rest[:end+3]
	}
	return rest
}

func firstJSONBlock(t testing.TB, section string) any {
	t.Helper()
	m := regexp.MustCompile("(?s)```json\n(.*?)\n```").FindStringSubmatch(section)
	require.NotNil(t, m, "no json block")
	var v any
	require.NoError(t, json.Unmarshal([]byte(m[1]), &v))
	return v
}

// TestContractDocumentMatchesTheExamples: docs/contract.md shows the same fixture, the same
// worked examples and the same messages as the data every face's tests run.
func TestContractDocumentMatchesTheExamples(t *testing.T) {
	f := specexamples.NewFixture()
	req, facts := f.JSON()
	var wantReq, wantFacts any
	require.NoError(t, json.Unmarshal(req, &wantReq))
	require.NoError(t, json.Unmarshal(facts, &wantFacts))
	assert.Equal(t, wantReq, firstJSONBlock(t, contractSection(t, "3")), "section 3 is fixture F's request")
	assert.Equal(t, wantFacts, firstJSONBlock(t, contractSection(t, "4")), "section 4 is fixture F's facts")

	// Section 7: code → message template.
	templates := map[string]*regexp.Regexp{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([A-Z_]+)` \\| `(.*)` \\|$").FindAllStringSubmatch(contractSection(t, "7"), -1) {
		pattern := "^" + strings.ReplaceAll(regexp.QuoteMeta(m[2]), "<driver>", `[^"]*`) + "$"
		templates[m[1]] = regexp.MustCompile(pattern)
	}
	require.Len(t, templates, 5)

	// Section 10: one table row per example, with its verdict and code.
	rows := regexp.MustCompile("(?m)^\\| (\\d+) \\| .*? \\| (true|false) \\| ?`?([A-Z_]*)`? ?\\|").FindAllStringSubmatch(contractSection(t, "10"), -1)
	examples := specexamples.Rows()
	require.Len(t, rows, len(examples))
	for i, ex := range examples {
		t.Run(ex.Name, func(t *testing.T) {
			assert.Equal(t, ex.Allow, rows[i][2] == "true", "row %s", rows[i][1])
			assert.Equal(t, ex.Code, rows[i][3], "row %s", rows[i][1])
			if ex.Code != "" && ex.Message != "" {
				require.Contains(t, templates, ex.Code)
				assert.Regexp(t, templates[ex.Code], ex.Message)
			}
		})
	}
}
