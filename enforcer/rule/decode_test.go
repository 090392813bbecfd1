package rule

import (
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type inner struct {
	Name string `json:"name"`
}

type outer struct {
	inner
	Flag    bool     `json:"flag"`
	Items   []inner  `json:"items"`
	Set     []string `json:"set"`
	Maybe   *bool    `json:"maybe,omitempty"`
	Absent  string   `json:"absent,omitempty"`
	Skipped string   `json:"-"`
}

func TestDecodeFillsByTheJSONTags(t *testing.T) {
	v := ast.MustParseTerm(`{"name": "n", "flag": true, "items": [{"name": "a"}, {"name": "b"}], "set": {"z", "y"}, "maybe": false, "Skipped": "x", "extra": 1}`).Value
	var got outer
	require.NoError(t, decode(v, &got))
	no := false
	assert.Equal(t, outer{inner: inner{Name: "n"}, Flag: true, Items: []inner{{"a"}, {"b"}}, Set: []string{"y", "z"}, Maybe: &no}, got)
}

func TestDecodeRefusesWhatDoesNotFit(t *testing.T) {
	for src, want := range map[string]string{
		`{"flag": true, "items": [], "set": []}`:                         `field "name" is missing`,
		`{"name": 1, "flag": true, "items": [], "set": []}`:              `field "name": want a string, got number 1`,
		`{"name": "n", "flag": "yes", "items": [], "set": []}`:           `field "flag": want a boolean, got string "yes"`,
		`{"name": "n", "flag": true, "items": [{"name": 2}], "set": []}`: `field "items": [0]: field "name": want a string, got number 2`,
		`{"name": "n", "flag": true, "items": {"name": "a"}, "set": []}`: `field "items": want an array, got object`,
		`["n"]`: `want an object, got array`,
	} {
		var got outer
		assert.ErrorContains(t, decode(ast.MustParseTerm(src).Value, &got), want, src)
	}
	assert.ErrorContains(t, decode(ast.String("x"), outer{}), "want a non-nil pointer")
	assert.ErrorContains(t, decode(ast.String("x"), nil), "want a non-nil pointer")
	var n int
	assert.ErrorContains(t, decode(ast.Number("1"), &n), "cannot decode into int")
}

func TestInputLeavesOutWhatIsNil(t *testing.T) {
	params, err := NewParameters(map[string]any{"exemptUsers": []any{"a"}})
	require.NoError(t, err)
	in, err := InputValue(map[string]any{"review": map[string]any{"name": "n"}, "inventory": map[string]any(nil),
		"parameters": Parameters{}, "grace": nil, "now": "t", "on": true, "p": params, "v": ast.String("s")})
	require.NoError(t, err)
	want := ast.MustParseTerm(`{"review": {"name": "n"}, "now": "t", "on": true, "p": {"exemptUsers": ["a"]}, "v": "s"}`).Value
	assert.Zero(t, want.Compare(in), "%v", in)
}
