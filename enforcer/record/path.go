package record

import (
	"strings"
	"unicode"
)

// Path is a field path, e.g. [spec providerID].
type Path []string

func (p Path) String() string { return strings.Join(p, ".") }

// SetPath sets a nested field of an Unstructured-shaped map, creating the
// maps on the way.
func SetPath(m map[string]any, p Path, v any) {
	for _, seg := range p[:len(p)-1] {
		c, ok := m[seg].(map[string]any)
		if !ok {
			c = map[string]any{}
			m[seg] = c
		}
		m = c
	}
	m[p[len(p)-1]] = v
}

// Conditions are the entries of the list at Path whose "type" is one of
// Types, of which only Keys (strings) are read.
type Conditions struct {
	Path  Path     `json:"path"`
	Types []string `json:"types"`
	Keys  []string `json:"keys"`
}

// validTag mirrors encoding/json's rule for a key usable as a struct tag
// name; a key it would not accept would silently decode nothing.
func validTag(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		switch {
		case strings.ContainsRune("!#$%&()*+-./:;<=>?@[]^_{|}~ ", c):
		case !unicode.IsLetter(c) && !unicode.IsDigit(c):
			return false
		}
	}
	return true
}
