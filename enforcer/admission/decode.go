package admission

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash"
	"io"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// admissionReview is an AdmissionReview v1 as every route reads it: only
// what the rule reads (operation, kind, name, the user's name and groups, the
// Node in oldObject, and in object for the registration routes) and what the
// answer needs (uid). Every other field (the user's extra, options,
// resource) is skipped by the decoder without being built, so a review costs
// about its own bytes, whatever it carries.
type admissionReview struct {
	APIVersion string       `json:"apiVersion"`
	Kind       string       `json:"kind"`
	Request    requestField `json:"request"`
}

// requestField is the request, decoded in place (its Node and groups
// decoders set up beforehand), noting whether the review had one.
type requestField struct {
	present bool
	admissionRequest
}

func (r *requestField) UnmarshalJSON(b []byte) error {
	if bytes.Equal(b, []byte("null")) {
		return nil
	}
	r.present = true
	type plain admissionRequest // its own methods: no recursion
	return json.Unmarshal(b, (*plain)(&r.admissionRequest))
}

type admissionRequest struct {
	UID       types.UID               `json:"uid"`
	Kind      metav1.GroupVersionKind `json:"kind"`
	Name      string                  `json:"name"`
	Operation string                  `json:"operation"`
	UserInfo  struct {
		Username string  `json:"username"`
		Groups   *groups `json:"groups"`
	} `json:"userInfo"`
	OldObject *node `json:"oldObject"`
	// Object is read by the registration routes only (nil: skipped).
	Object *node `json:"object"`
	// DryRun: a denial Event is a side effect, never recorded on a dry run.
	DryRun *bool `json:"dryRun"`
}

// groups decodes a user's groups one at a time: each goes into a hash
// (reviews of different users must not share a decision) and only those
// keep says the rule reads are kept. A forged user in 100,000 groups then
// costs a pass over its bytes, not 100,000 strings.
type groups struct {
	keep func(string) bool
	sum  hash.Hash
	n    uint64
	kept []string
}

func newGroups(keep func(string) bool) *groups {
	return &groups{keep: keep, sum: sha256.New()}
}

func (g *groups) UnmarshalJSON(b []byte) error {
	if bytes.Equal(b, []byte("null")) {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('[') {
		return fmt.Errorf("userInfo.groups: want a list of strings")
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return fmt.Errorf("userInfo.groups: %w", err)
		}
		s, ok := t.(string)
		if !ok {
			return fmt.Errorf("userInfo.groups: want a list of strings, got %v", t)
		}
		g.n++
		field(g.sum, s)
		if g.keep == nil || g.keep(s) {
			g.kept = append(g.kept, s)
		}
	}
	return nil
}

// digest is what identifies the groups: their count and hash.
func (g *groups) digest() []byte {
	if g == nil {
		return nil
	}
	out := binary.BigEndian.AppendUint64(nil, g.n)
	return g.sum.Sum(out)
}

// node decodes oldObject into only the fields the link model declares
// (rule.Model.NodeShape): a hostile Node costs a scan of its bytes.
type node struct {
	model *rule.Model // nil: not read, skipped
	field string      // "oldObject" or "object", for errors
	obj   *unstructured.Unstructured
	// raw is oldObject's bytes, a part of the review's body (held until the
	// answer is written): a denial reads the Node's UID from it.
	raw []byte
}

func (n *node) UnmarshalJSON(b []byte) error {
	if n.model == nil || bytes.Equal(b, []byte("null")) {
		return nil
	}
	rec, err := n.model.NodeShape().FromJSON(b)
	if err != nil {
		return &nodeError{field: n.field, err: fmt.Errorf("Node: %w", err)}
	}
	n.obj, n.raw = rec.Unstructured(), b
	return nil
}

// bytes is oldObject as the review carried it; nil without one.
func (n *node) bytes() []byte {
	if n == nil {
		return nil
	}
	return n.raw
}

// nodeError is an oldObject or object that is JSON but not a Node the rule
// can read (a declared field that is not a string).
type nodeError struct {
	field string
	err   error
}

func (e *nodeError) Error() string { return e.err.Error() }
func (e *nodeError) Unwrap() error { return e.err }

// decodeReview decodes an AdmissionReview body into what the rule reads,
// object too when asked. A null oldObject or groups leaves that field nil.
func decodeReview(body []byte, model *rule.Model, keep func(string) bool, object bool) (*admissionReview, error) {
	var review admissionReview
	review.Request.OldObject = &node{model: model, field: "oldObject"}
	review.Request.Object = &node{field: "object"}
	if object {
		review.Request.Object.model = model
	}
	review.Request.UserInfo.Groups = newGroups(keep)
	if err := json.Unmarshal(body, &review); err != nil {
		return nil, err
	}
	return &review, nil
}

// field writes s, length-prefixed, so no two sequences of fields write the
// same bytes.
func field(w io.Writer, s string) {
	_ = binary.Write(w, binary.BigEndian, uint64(len(s)))
	_, _ = io.WriteString(w, s)
}
